"""Private servers for fault injection, and the bookkeeping to check what survived.

The fault tests stop and restart PostgreSQL, Redis, the web process and Ray, which other
tests on this machine use at the same time; so every server a test breaks is its own:
a PostgreSQL cluster initdb'ed into a temporary directory, a redis-server, a daphne
serving the site on both, each on a free port, each a child of the test process (own
session, SIGTERM if the test process dies: ops.supervisor). A `Sender` posts a known
sequence of points through the engine's own `MetricsReporter`, so a test can compare
what was sent with what the database holds, point by point.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import psycopg

from ops.ray_head import free_port, make_head
from ops.supervisor import Child, _own_session_and_die_with_parent
from tests.integration.stack import REPO, Stack, child_env, free_web_port, wait_for
from workers.run.reporter import MetricsReporter

PG_BIN = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"))
REDIS_SERVER = shutil.which("redis-server")
PASSWORD = "pw-faults"  # the private site's user logs in with it


def skip_reason() -> str | None:
    """Why the private servers cannot run here, or None."""
    if not PG_BIN:
        return "no PostgreSQL server binaries under /usr/lib/postgresql/*/bin"
    if REDIS_SERVER is None:
        return "redis-server is not installed"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root without a `postgres` user to run PostgreSQL as (it refuses root)"
    return None


def _as_user(name: str):
    """Popen keywords that run the child as `name` (initdb and postgres refuse root)."""
    if os.geteuid() != 0:
        return {}
    entry = pwd.getpwnam(name)
    return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}


class PrivatePostgres:
    """A PostgreSQL cluster of its own: trust auth, user root, on a free port.

    `stop()` is a fast shutdown (SIGINT: open sessions are cut, as `pg_ctl restart`
    does); `start()` brings the same data directory back on the same port."""

    def __init__(self, stack: Stack):
        self.stack = stack
        self.bin = PG_BIN[-1].parent
        # The server runs as `postgres` (it refuses root): it must own the directory.
        self.dir = Path(tempfile.mkdtemp(prefix="rw-pg-"))
        self.owner = _as_user("postgres")
        if self.owner:
            os.chown(self.dir, self.owner["user"], self.owner["group"])
        self.port = free_port()
        self.child: Child | None = None
        subprocess.run(
            [str(self.bin / "initdb"), "-D", str(self.dir / "data"), "-A", "trust", "-U", "root", "--no-sync"],
            check=True,
            capture_output=True,
            **self.owner,
        )

    @property
    def url(self) -> str:
        return f"postgres://root@127.0.0.1:{self.port}/postgres"

    def start(self, timeout_s: float = 30) -> None:
        argv = [
            str(self.bin / "postgres"),
            "-D",
            str(self.dir / "data"),
            "-p",
            str(self.port),
            "-k",
            str(self.dir),
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            "fsync=off",  # a throwaway cluster: durability across a crash is not tested here
        ]
        popen = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            preexec_fn=_own_session_and_die_with_parent,  # runs after the switch to postgres
            **self.owner,
        )
        self.child = Child("pg", argv, popen, stop_leader_only=True)
        self.stack.sup.children.append(self.child)
        threading.Thread(target=self._forward, args=(self.child,), daemon=True).start()
        wait_for(lambda: self.accepts() or not self.child.alive(), timeout_s, "PostgreSQL to accept connections")
        assert self.child.alive(), f"PostgreSQL exited; see {self.stack.log_path}"

    def _forward(self, child: Child) -> None:
        for raw in iter(child.popen.stdout.readline, b""):
            self.stack.sup.write(child.name, raw.decode("utf-8", errors="replace"))

    def accepts(self) -> bool:
        try:
            with psycopg.connect(self.url, connect_timeout=2) as conn:
                conn.execute("select 1")
        except psycopg.OperationalError:
            return False
        return True

    def stop(self, timeout_s: float = 30) -> None:
        """Fast shutdown: the postmaster cuts every session, checkpoints and exits."""
        if self.child is None or not self.child.alive():
            return
        self.child.signal(signal.SIGINT)
        self.child.popen.wait(timeout=timeout_s)

    def rows(self, sql: str, *params) -> list[tuple]:
        with psycopg.connect(self.url, connect_timeout=5) as conn:
            return conn.execute(sql, params).fetchall()

    def remove(self) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class PrivateRedis:
    """A redis-server of its own (no persistence) on a free port; stop() and start()
    keep the port, as a restarted server would."""

    def __init__(self, stack: Stack):
        self.stack = stack
        self.port = free_port()
        self.child: Child | None = None

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def start(self, timeout_s: float = 15) -> None:
        argv = [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        self.child = self.stack.sup.start(
            "redis",
            argv,
            env=dict(os.environ),
            cwd=str(self.stack.home),
            ready_when=lambda line: "Ready to accept" in line,
        )
        wait_for(lambda: self.child.ready.is_set() or not self.child.alive(), timeout_s, "redis-server to start")
        assert self.child.alive(), f"redis-server exited; see {self.stack.log_path}"

    def stop(self) -> None:
        if self.child is not None:
            self.child.stop(timeout_s=10)

    def ensure_up(self) -> None:
        if self.child is None or not self.child.alive():
            self.start()


# Runs in a child with the private site's settings: the schema, a user in a team, and
# `runs` running runs with their ingest tokens (the engine's side is played by the test).
_SEED = """
import json, sys
import django
django.setup()
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.utils import timezone
from runs.actions import do_ensure_demo
from runs.models import Run
from workers.config.presets import build

call_command("migrate", verbosity=0)
username, password, names = sys.argv[1], sys.argv[2], sys.argv[3:]
user = get_user_model().objects.create_user(username, password=password)
_, experiment = do_ensure_demo(user, team_name="Faults")
config = build("async", {"stop": {"max_steps": 10_000}}).model_dump(mode="json")
runs = {}
for name in names:
    run = Run.objects.create(
        experiment=experiment, name=name, preset="async", config=config, launched_by=user,
        status=Run.Status.RUNNING, started_at=timezone.now(),
    )
    runs[name] = {"id": run.pk, "token": run.ingest_token}
print(json.dumps(runs))
"""


class PrivateSite:
    """daphne serving the site on a private PostgreSQL and a private Redis (channel layer
    and broker), with a user and running runs seeded for the tests."""

    def __init__(self, run_names: list[str]):
        self.home = Path(tempfile.mkdtemp(prefix="rw-fault-"))
        self.stack = Stack(self.home)
        self.pg = PrivatePostgres(self.stack)
        self.redis = PrivateRedis(self.stack)
        self.username = "faults"
        self.runs: dict[str, dict] = {}
        self.run_names = run_names

    def start(self) -> PrivateSite:
        self.pg.start()
        self.redis.start()
        port = free_web_port()
        self.url = f"http://127.0.0.1:{port}"
        self.env = child_env(
            DATABASE_URL=self.pg.url,
            REDIS_URL=self.redis.url(0),
            CELERY_BROKER_URL=self.redis.url(1),  # nobody consumes it: no task reaches a stranger
            ROLLWAY_HOME=str(self.home),
            ROLLWAY_PUBLIC_URL=self.url,
            DJANGO_SECRET_KEY="rollway-fault-tests",
            DJANGO_DEBUG="false",
        )
        seeded = subprocess.run(
            [sys.executable, "-c", _SEED, self.username, PASSWORD, *self.run_names],
            env=self.env,
            cwd=str(REPO),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert seeded.returncode == 0, seeded.stderr[-3000:]
        self.runs = json.loads(seeded.stdout.strip().splitlines()[-1])
        self.stack.env = self.env
        self.stack.start_web(self.env, port)
        return self

    def points(self, run_id: int) -> dict[tuple[str, int], float]:
        """Every stored point of the run, {(series, step): value}; raises if a (series,
        step) is stored twice (the unique constraint forbids it: checked, not assumed)."""
        rows = self.pg.rows("select series, step, value from runs_metricpoint where run_id = %s", run_id)
        stored = {(series, step): value for series, step, value in rows}
        assert len(stored) == len(rows), f"{len(rows) - len(stored)} points stored twice"
        return stored

    def stop(self) -> None:
        self.stack.stop()
        self.pg.remove()
        shutil.rmtree(self.home, ignore_errors=True)


def running_in_group(pgid: int) -> list[int]:
    """Pids of process group `pgid` that still run (killed ones wait as zombies until
    whoever inherited them reaps them)."""
    running = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                running.append(proc.pid)
    return running


RUN_ACTOR_TITLES = ("ray::RunDriver", "ray::TrainerActor", "ray::InferenceWorker", "ray::BufferActor")


def run_actor_processes(ray_address: str) -> list[str]:
    """The processes on this machine that run a run's actor for the Ray cluster at
    `ray_address` ("ray::<class> (pid)"): Ray gives each worker its own process group,
    so a crash of the head's group leaves them to notice on their own."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            title = " ".join(proc.info["cmdline"] or []).strip()  # Ray pads its titles
            if title.startswith(RUN_ACTOR_TITLES) and proc.environ().get("RAY_ADDRESS") == ray_address:
                found.append(f"{title} ({proc.pid})")
    return found


class PrivateRayHead:
    """A Ray head of its own (`ray start --head --block`, token auth, free ports) that a
    test may crash and bring back on the same address, as a head pod restarts."""

    def __init__(self, stack: Stack):
        self.stack = stack
        self.head = make_head(stack.home)
        self.child: Child | None = None

    @property
    def address(self) -> str:
        return self.head.address

    @property
    def env(self) -> dict[str, str]:
        return self.head.env()

    def start(self, timeout_s: float = 120) -> None:
        self.child = self.stack.sup.start(
            "ray",
            self.head.command(),  # fresh free ports for everything but the GCS address
            env=child_env(**self.env),
            cwd=str(REPO),
            ready_when=self.head.is_ready_line,
            stop_leader_only=True,
        )
        wait_for(lambda: self.child.ready.is_set() or not self.child.alive(), timeout_s, "the Ray head")
        assert self.child.alive(), f"the Ray head exited; see {self.stack.log_path}"

    def crash(self) -> None:
        """SIGKILL to the head's whole process group: GCS, raylet and every worker process
        (the run's driver and actors) die at once, with no drain."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.child.pid, signal.SIGKILL)
        self.child.popen.wait(timeout=10)
        wait_for(lambda: not running_in_group(self.child.pid), 10, "the Ray head's processes to die")


# Control of a Ray head the test process cannot join itself (Ray reads the token once per
# process): a child joined to it, with the site's settings, that lists and kills a run's
# actors and runs reconcile when asked, one JSON line per command and per answer.
_CONTROL = """
import json, sys, traceback
import django
django.setup()
import ray
from runs.in_ray import do_start_in_ray
from runs.reconcile import do_reconcile_runs
from workers.run import lifecycle
from workers.core import run_actors
lifecycle.connect(sys.argv[1])
print(json.dumps({"out": "ready"}), flush=True)
for line in sys.stdin:
    cmd = json.loads(line)
    try:
        if cmd["op"] == "names":
            out = run_actors.run_actor_names(cmd["run"])
        elif cmd["op"] == "kill":
            ray.kill(ray.get_actor(cmd["name"], namespace=run_actors.NAMESPACE), no_restart=True)
            out = cmd["name"]
        elif cmd["op"] == "reconcile":
            out = do_reconcile_runs()
        elif cmd["op"] == "start":  # the launch_run task's body, as the Celery worker runs it
            out = do_start_in_ray(cmd["run"])
        print(json.dumps({"out": out}), flush=True)
    except Exception:
        print(json.dumps({"error": traceback.format_exc()}), flush=True)
"""


class RayControl:
    """A process joined to a Ray head with `env` (the site's settings and the head's
    token): `names(run)`, `kill(name)` (ray.kill, no restart), `reconcile()` (the
    reconcile beat's function, called directly) and `start(run)` (what the launch_run
    task does for a scheduled run)."""

    def __init__(self, address: str, env: dict[str, str], log_path: Path):
        with open(log_path, "a") as log:  # its logging (reconcile's, Ray's) beside the services'
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _CONTROL, address],
                env=env,
                cwd=str(REPO),
                text=True,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
            )
        assert self._answer() == "ready"

    def _answer(self):
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the Ray control process exited ({self.proc.poll()})")
        answer = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"the Ray control process failed:\n{answer['error']}")
        return answer["out"]

    def _ask(self, **cmd):
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self._answer()

    def names(self, run_id: int) -> list[str]:
        return self._ask(op="names", run=run_id)

    def kill(self, name: str) -> None:
        self._ask(op="kill", name=name)

    def reconcile(self) -> dict[str, int]:
        return self._ask(op="reconcile")

    def start(self, run_id: int) -> None:
        self._ask(op="start", run=run_id)

    def close(self, timeout_s: float = 15) -> None:
        """Let it leave Ray and exit; killed after `timeout_s` (0: at once, for a process
        whose head is gone and whose exit would wait on it)."""
        with contextlib.suppress(BrokenPipeError):
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


SERIES = ("reward/mean", "buffer/depth", "loss")


def value_of(series: str, step: int) -> float:
    """The value the sender sends for (series, step): distinct per point, so a point
    stored under the wrong step or series shows."""
    return step + SERIES.index(series) / 10


class Sender:
    """Posts SERIES at steps 1, 2, … through a `MetricsReporter`, `rate` steps per
    second, flushing after each step as the driver does every poll (its retries, backoff
    and spool are what the faults exercise). `sent` is every point handed to it."""

    def __init__(self, url: str, run: dict, cache_dir: Path, rate: float = 10.0):
        self.reporter = MetricsReporter(run["id"], url, run["token"], str(cache_dir), timeout_s=2.0)
        self.period = 1.0 / rate
        self._sent: dict[tuple[str, int], float] = {}
        self._lock = threading.Lock()
        self.step = 0
        # time.monotonic() when the reporter first found the site down, and when a post
        # first got through after that
        self.down_at: float | None = None
        self.up_again_at: float | None = None
        self.first_error = ""  # what the reporter met first: the site's answer, or the socket's error
        self._stop = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="sender", daemon=True)

    def start(self) -> Sender:
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            step = self.step + 1
            with self._lock:
                for series in SERIES:
                    self.reporter.add(series, step, value_of(series, step))
                    self._sent[(series, step)] = value_of(series, step)
                self.step = step
            self.reporter.flush()
            self._note_site(time.monotonic())
            self._stop.wait(max(0.0, self.period - (time.monotonic() - t0)))

    def _note_site(self, now: float) -> None:
        if self.reporter.site_down and self.down_at is None:
            self.down_at, self.first_error = now, self.reporter.last_error
        elif not self.reporter.site_down and self.down_at is not None and self.up_again_at is None:
            self.up_again_at = now

    def sent(self, up_to_step: int | None = None) -> dict[tuple[str, int], float]:
        """What was handed to the reporter, {(series, step): value} (up to a step)."""
        with self._lock:
            return {k: v for k, v in self._sent.items() if up_to_step is None or k[1] <= up_to_step}

    def wait_steps(self, n: int, timeout_s: float = 30) -> None:
        """Wait until `n` more steps have been handed to the reporter."""
        target = self.step + n
        wait_for(lambda: self.step >= target, timeout_s, f"the sender to reach step {target}")

    def stop(self, close_timeout_s: float = 60) -> bool:
        """Stop adding points, then deliver what is left (the reporter's close: retries up
        to `close_timeout_s`); True if nothing was left undelivered."""
        self._stop.set()
        self._thread.join(timeout=30)
        if self._closed:
            return True
        self._closed = True
        return self.reporter.close(timeout_s=close_timeout_s)

    def __enter__(self) -> Sender:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop(close_timeout_s=0)  # a failed test: stop posting, whatever is left
