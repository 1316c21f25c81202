"""`python manage.py up`: the whole product on one machine, with clean shutdown.

Starts, as children in their own process groups: a local Ray head (unless RAY_ADDRESS
names an existing cluster), then with RAY_ADDRESS set for them a Celery worker, Celery
beat and daphne serving the ASGI app. Before that it migrates and, when the site is bound to
loopback only (or `--demo` asks), makes sure the demo login exists; a start that makes no
demo login leaves an existing demo user unable to log in. Ctrl-C or SIGTERM stops web,
beat and worker, then the Ray head (by signalling its `ray start --block`, never
`ray stop`), and waits until no process of theirs is left. If any child dies, the rest
are stopped and `up` exits non-zero.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from foundation.production import is_loopback
from ops.ray_head import make_head
from ops.supervisor import Supervisor

ASGI_APPLICATION = "rollway.asgi:application"
DEMO_USERNAME = "demo"
DEMO_PASSWORD = "demo"

# Ray start (GCS + raylet + agents) takes ~8 s on 2 idle cores; allow for a busy machine.
RAY_READY_TIMEOUT_S = 120
WEB_READY_TIMEOUT_S = 60


# The command lines below are the product's entry points; deploy/ (compose, k8s) runs
# the same ones, which tests/test_deploy.py checks.


# Defaults for the web process's environment (an operator's own value wins). glibc gives
# threads their own malloc arenas (up to 8 per core) and each arena keeps the memory
# freed in it; daphne runs every request's Django code in a new thread, so what one
# request frees is often not reused by the next. Two arenas held its anonymous memory
# lower in bench runs of the soak's web load (71 vs 86 MB after 8 minutes). deploy/ sets
# the same.
WEB_ENV = {"MALLOC_ARENA_MAX": "2"}


def web_env(env: dict[str, str]) -> dict[str, str]:
    """`env` for daphne: WEB_ENV's defaults under it."""
    return {**WEB_ENV, **env}


def daphne_args(host: str, port: int) -> list[str]:
    return ["-b", host, "-p", str(port), ASGI_APPLICATION]


def celery_worker_args(concurrency: int) -> list[str]:
    # Threads: tasks are short and mostly wait on Ray or the database.
    return ["-A", "rollway", "worker", "--pool", "threads", "--concurrency", str(concurrency), "--loglevel", "INFO"]


def celery_beat_args(schedule: str) -> list[str]:
    return ["-A", "rollway", "beat", "--loglevel", "INFO", "--schedule", schedule]


def wants_demo(host: str, demo: bool, no_demo: bool) -> bool:
    """Whether this start makes the demo login. Its password is public (README), so by
    default only a site nobody else can reach gets one; `--demo` asks for it anyway."""
    if no_demo:
        return False
    return demo or is_loopback(host)


def ensure_demo_login() -> None:
    """The demo user (password reset to `demo` on every start), its team and experiment."""
    from runs.actions import do_ensure_demo

    user, created = get_user_model().objects.get_or_create(username=DEMO_USERNAME)
    if created or not user.check_password(DEMO_PASSWORD):
        user.set_password(DEMO_PASSWORD)
        user.save(update_fields=["password"])
    do_ensure_demo(user)


def lock_demo_login() -> bool:
    """Leave the demo user, if an earlier start made one, unable to log in (its runs and
    team stay). Returns whether a usable password was removed."""
    user = get_user_model().objects.filter(username=DEMO_USERNAME).first()
    if user is None or not user.has_usable_password():
        return False
    user.set_unusable_password()
    user.save(update_fields=["password"])
    return True


def settle_demo_login(host: str, demo: bool, no_demo: bool) -> tuple[bool, list[str]]:
    """Make or lock the demo login for a start bound to `host`. Returns whether the demo
    login works, and the lines `up` prints about it."""
    notes = []
    if wants_demo(host, demo, no_demo):
        ensure_demo_login()
        if not is_loopback(host):
            notes.append(f"the demo login {DEMO_USERNAME}/{DEMO_PASSWORD} is open to anyone who reaches {host}")
        return True, notes
    if lock_demo_login():
        notes.append(
            f"the demo user can no longer log in (its password is removed; --demo resets it to {DEMO_PASSWORD})"
        )
    if not is_loopback(host) and not no_demo:
        notes.append(
            f"no demo login on {host}, which is not loopback: "
            "`manage.py first_admin USERNAME --email ADDRESS --team NAME` makes the first site admin and their team"
        )
    return False, notes


def child_env(public_url: str, ray_env: dict[str, str]) -> dict[str, str]:
    """The environment every child shares: import paths, one ROLLWAY_HOME, Ray access."""
    repo = Path(settings.REPO_ROOT)
    env = dict(os.environ)
    paths = [str(repo / "platform"), str(repo)]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["DJANGO_SETTINGS_MODULE"] = os.environ.get("DJANGO_SETTINGS_MODULE", "rollway.settings")
    env["ROLLWAY_HOME"] = str(settings.ROLLWAY_HOME)
    env.setdefault("ROLLWAY_PUBLIC_URL", public_url)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(ray_env)
    return env


def wait_http_ok(url: str, timeout_s: float, child_alive) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and child_alive():
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status < 500:
                    return True
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.3)
    return False


class Command(BaseCommand):
    help = "Start Rollway: Ray head, Celery worker, Celery beat and the web server (daphne)."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1", help="web bind address")
        parser.add_argument("--port", type=int, default=8000, help="web port (default 8000)")
        parser.add_argument(
            "--worker-concurrency",
            type=int,
            default=2,
            help="Celery worker threads (tasks are short: launch, cancel, reconcile)",
        )
        parser.add_argument("--ray-cpus", type=int, default=2, help="CPUs the local Ray head offers")
        demo = parser.add_mutually_exclusive_group()
        demo.add_argument(
            "--demo",
            action="store_true",
            help="make the demo login (demo/demo) even when --host is not loopback",
        )
        demo.add_argument(
            "--no-demo",
            action="store_true",
            help="make no demo login and lock an existing one (the default off loopback)",
        )

    def handle(self, *args, **opts):
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())

        call_command("migrate", interactive=False, verbosity=0)
        host, port = opts["host"], opts["port"]
        demo, notes = settle_demo_login(host, opts["demo"], opts["no_demo"])
        browse_host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
        url = f"http://{browse_host}:{port}/"
        home = Path(settings.ROLLWAY_HOME)
        python = sys.executable
        bindir = Path(python).parent
        sup = Supervisor(sys.stdout)
        for note in notes:
            sup.write("up", note)
        exit_code = 0
        try:
            if os.environ.get("RAY_ADDRESS"):
                ray_env = {}
                sup.write("up", f"joining the Ray cluster at RAY_ADDRESS={os.environ['RAY_ADDRESS']}")
            else:
                head = make_head(home, num_cpus=opts["ray_cpus"])
                ray_env = head.env()
                ray_child = sup.start(
                    "ray",
                    head.command(),
                    env=child_env(url.rstrip("/"), head.head_env()),
                    cwd=str(settings.REPO_ROOT),
                    ready_when=head.is_ready_line,
                    stop_leader_only=True,
                )
                if not self._wait_ready(ray_child, RAY_READY_TIMEOUT_S, stop):
                    if stop.is_set():
                        return
                    raise CommandError("the Ray head did not start; see the `ray` lines above")
                sup.write("up", f"Ray head at {head.address} (files in {head.temp_dir})")

            env = child_env(url.rstrip("/"), ray_env)
            cwd = str(settings.REPO_ROOT)
            # Ray installs a fatal-signal handler in every process that joins a cluster:
            # in the worker it would turn SIGTERM (warm shutdown) into a trace and exit -6.
            sup.start(
                "worker",
                [python, "-m", "celery", *celery_worker_args(opts["worker_concurrency"])],
                env={**env, "RAY_DISABLE_FAILURE_SIGNAL_HANDLER": "1"},
                cwd=cwd,
            )
            sup.start(
                "beat", [python, "-m", "celery", *celery_beat_args(str(home / "celerybeat-schedule"))], env=env, cwd=cwd
            )
            web = sup.start("web", [str(bindir / "daphne"), *daphne_args(host, port)], env=web_env(env), cwd=cwd)
            if not wait_http_ok(f"{url}healthz", WEB_READY_TIMEOUT_S, web.alive):
                raise CommandError(f"the web server did not answer at {url}healthz")
            login = "" if not demo else f"  log in as {DEMO_USERNAME} / {DEMO_PASSWORD}"
            sup.write("up", f"Rollway is up at {url}{login}  (Ctrl-C stops everything)")

            while not stop.wait(0.5):
                dead = sup.first_dead()
                if dead is not None:
                    sup.write("up", f"{dead.name} exited ({dead.popen.returncode}); stopping the rest")
                    exit_code = 1
                    break
        finally:
            sup.stop_all()
        if exit_code:
            sys.exit(exit_code)

    def _wait_ready(self, child, timeout_s: float, stop: threading.Event) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not stop.is_set():
            if child.ready.wait(0.2):
                return True
            if not child.alive():
                return False
        return False
