"""The real services for end-to-end tests: a Ray head, daphne and a Celery worker.

Each runs as a separate process started the way `manage.py up` starts it (the same
`ops.supervisor` and `ops.ray_head`), pointed at pytest-django's PostgreSQL test
database and at Redis (broker + channel layer), so what the tests see is what a user of
a production-style deployment sees. Output goes to log files under the session's home;
a failing test prints their tails.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from ops.management.commands.up import celery_worker_args, daphne_args, web_env
from ops.ray_head import make_head
from ops.supervisor import Child, Supervisor
from tests.xdist_worker import worker_index

REPO = Path(__file__).resolve().parents[2]
WEB_PORTS = range(8020, 8040)  # this suite's share of the machine's web ports

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], timeout_s: float, what: str, interval_s: float = 0.2) -> T:
    """Poll `predicate` until it returns something truthy; fail naming `what`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(interval_s)


def free_web_port() -> int:
    # Each xdist worker probes its own ports of the range (gw1 of 3: 8021, 8024, ...): two
    # workers probing one port at once could both find it free before either daphne binds.
    index, count = worker_index() or 0, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    for port in WEB_PORTS[index::count]:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {WEB_PORTS.start}-{WEB_PORTS.stop - 1}")


def short_home() -> Path:
    """A short ROLLWAY_HOME: Ray's socket paths under it must stay under 107 bytes."""
    return Path(tempfile.mkdtemp(prefix="rw-it-"))


def db_url(settings_dict: dict) -> str:
    """A DATABASE_URL for the database Django is connected to (the test database)."""
    user = settings_dict.get("USER") or ""
    password = settings_dict.get("PASSWORD") or ""
    auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    host = settings_dict.get("HOST") or "127.0.0.1"
    port = settings_dict.get("PORT") or 5432
    return f"postgres://{auth}{host}:{port}/{settings_dict['NAME']}"


def child_env(user_dir: Path | None = None, **settings: str) -> dict[str, str]:
    """The environment of a stack's process; `user_dir`: a folder whose modules it may
    import, as a checkout's root is (docs/first-model.md writes `my_rewards` there)."""
    env = dict(os.environ)
    # The shipped examples' task modules and reward functions (examples/) and that
    # user's package, allowed in the web, the worker and the Ray head alike, as a site
    # that runs them is set up.
    env.setdefault("ROLLWAY_TASK_MODULES", "examples.arithmetic.task,my_rewards")
    paths = [str(REPO / "platform"), str(REPO)] + ([str(user_dir)] if user_dir is not None else [])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["PYTHONUNBUFFERED"] = "1"
    env["DJANGO_SETTINGS_MODULE"] = "rollway.settings"
    env.update(settings)
    return env


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


# Runs in its own process: Ray reads RAY_AUTH_MODE / the token once per process, so the
# test process (which may have used a local Ray already) cannot join a token-auth head.
_PROBE = """
import json, sys
from workers.run import lifecycle
from workers.core import run_actors
lifecycle.connect(sys.argv[1])
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    run_id = int(line)
    print(json.dumps({"names": run_actors.run_actor_names(run_id),
                      "alive": lifecycle.is_alive(run_id, ray_address=sys.argv[1])}), flush=True)
"""


class RayProbe:
    """A process joined to the test head that answers: which `run-<id>*` actors live?"""

    def __init__(self, address: str, env: dict[str, str]):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _PROBE, address],
            env=env,
            cwd=str(REPO),
            text=True,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        assert json.loads(self._readline())["ready"]

    def _readline(self) -> str:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the Ray probe exited ({self.proc.poll()})")
        return line

    def ask(self, run_id: int) -> dict:
        self.proc.stdin.write(f"{run_id}\n")
        self.proc.stdin.flush()
        return json.loads(self._readline())

    def actor_names(self, run_id: int) -> list[str]:
        return self.ask(run_id)["names"]

    def driver_alive(self, run_id: int) -> bool:
        return self.ask(run_id)["alive"]

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Stack:
    """Processes of one test session; `stop()` ends every one of them."""

    def __init__(self, home: Path):
        self.home = home
        self.user_dir = home / "user"  # on every process's import path (child_env)
        self.user_dir.mkdir(exist_ok=True)
        self.log_path = home / "stack.log"
        self._log = open(self.log_path, "w", buffering=1)
        self.sup = Supervisor(self._log)
        self.ray_env: dict[str, str] = {}
        self.ray_address = ""
        self.env: dict[str, str] = {}  # what web and worker run with (set by the fixture)
        self.url = ""
        self.worker: Child | None = None
        self.web: Child | None = None
        self.web_port = 0

    def start_ray_head(self, num_cpus: int = 2, timeout_s: float = 120) -> Child:
        head = make_head(self.home, num_cpus=num_cpus)
        self.ray_env, self.ray_address = head.env(), head.address
        child = self.sup.start(
            "ray",
            head.command(),
            env=child_env(self.user_dir, **head.head_env()),
            cwd=str(REPO),
            ready_when=head.is_ready_line,
            stop_leader_only=True,
        )
        wait_for(lambda: child.ready.is_set() or not child.alive(), timeout_s, "the Ray head")
        assert child.alive(), f"the Ray head exited:\n{self.log_tail(30)}"
        return child

    def start_web(self, env: dict[str, str], port: int, timeout_s: float = 60) -> Child:
        child = self.sup.start(
            "web",
            [str(Path(sys.executable).parent / "daphne"), *daphne_args("127.0.0.1", port)],
            env=web_env(env),
            cwd=str(REPO),
        )
        wait_for(
            lambda: http_ok(f"http://127.0.0.1:{port}/healthz") or not child.alive(),
            timeout_s,
            "daphne to answer /healthz",
        )
        assert child.alive(), f"daphne exited; see {self.log_path}"
        self.web, self.web_port = child, port
        return child

    def restart_web(self) -> Child:
        """Stop daphne (SIGTERM, as a deploy would) and start a new one on the same port."""
        assert self.web is not None, "start_web first"
        self.web.stop(timeout_s=20)
        return self.start_web(self.env, self.web_port)

    def restart_worker(self, **settings: str) -> Child:
        """Stop the worker if one runs and start a new one with `settings` added to its
        environment (none: the session's own)."""
        if self.worker is not None:
            self.worker.stop(timeout_s=30)
        self.worker = self.start_worker({**self.env, **settings})
        return self.worker

    def start_worker(self, env: dict[str, str], timeout_s: float = 90) -> Child:
        """`celery -A rollway worker` as `manage.py up` runs it; waits until it consumes."""
        child = self.sup.start(
            "worker",
            [
                sys.executable,
                "-m",
                "celery",
                *celery_worker_args(2),
                "-n",
                f"it-{uuid.uuid4().hex[:6]}@%h",
                "--without-gossip",
                "--without-mingle",
            ],
            env={**env, "RAY_DISABLE_FAILURE_SIGNAL_HANDLER": "1"},  # as `up` runs it
            cwd=str(REPO),
            ready_when=lambda line: " ready." in line,
        )
        wait_for(lambda: child.ready.is_set() or not child.alive(), timeout_s, "the Celery worker")
        assert child.alive(), f"the Celery worker exited; see {self.log_path}"
        return child

    def ensure_worker(self) -> Child:
        """The running worker, or a new one if there is none (or it was killed)."""
        if self.worker is None or not self.worker.alive():
            self.worker = self.start_worker(self.env)
        return self.worker

    def log_tail(self, lines: int = 80) -> str:
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def stop(self) -> None:
        self.sup.stop_all(timeout_s=40)
        self._log.close()
