"""What the load benches (ws_fanout, ingest_load, soak) share: a throwaway site on a
PostgreSQL database and Redis, its bench user and runs, logging in over HTTP, WebSocket
viewers of a run's page that time each point on receipt, and percentiles.

The bench process sets Django up on the same database as the site it starts, so it can
create users and runs (and read their ingest tokens, which no API hands out) directly.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BENCH_PASSWORD = "bench-load-pw"
# One team and experiment hold every load bench's runs, apart from the demo's.
BENCH_TEAM = "Bench load"


def reexec_with_platform_path() -> None:
    """The Django side is a source root (platform/), not an installed package: run the
    script again with it on PYTHONPATH, as `manage.py` and `up` do for their children."""
    if importlib.util.find_spec("rollway") is None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "platform"), str(REPO)])}
        os.execve(sys.executable, [sys.executable, *sys.argv], env)


# ---- flags -----------------------------------------------------------------------------


def add_site_args(p: argparse.ArgumentParser, *, url: bool = True) -> None:
    if url:
        p.add_argument(
            "--url",
            help="a site already running on --database-url (default: start one on a free port)",
        )
    p.add_argument(
        "--database-url",
        default=os.environ.get("DATABASE_URL", ""),
        help="PostgreSQL database of the site (default $DATABASE_URL); the bench writes its runs there",
    )
    p.add_argument(
        "--redis-url",
        default=os.environ.get("REDIS_URL", ""),
        help="Redis for the channel layer (default $REDIS_URL)",
    )
    p.add_argument(
        "--broker-url",
        default=os.environ.get("CELERY_BROKER_URL", ""),
        help="Celery broker of the site (default $CELERY_BROKER_URL; filesystem:// or unset: the embedded one)",
    )
    p.add_argument(
        "--site-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a setting for the site the bench starts (repeatable), e.g. ROLLWAY_MAX_POINTS_PER_SERIES=500",
    )
    p.add_argument(
        "--keep", action="store_true", help="keep the bench's runs and points, and the site's home (its log)"
    )


def check_site_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse what cannot work before anything starts, naming the flag and the fix."""
    if not args.database_url.startswith(("postgres://", "postgresql://")):
        p.error(
            "--database-url (or $DATABASE_URL) must name a PostgreSQL database, "
            "e.g. postgres://root@127.0.0.1:5432/bench; got " + repr(args.database_url or "nothing")
        )
    if not args.redis_url.startswith(("redis://", "rediss://", "unix://")):
        p.error(
            "--redis-url (or $REDIS_URL) must name a Redis database for the channel layer, "
            "e.g. redis://127.0.0.1:6379/11; got " + repr(args.redis_url or "nothing")
        )
    for pair in args.site_env:
        name, eq, _ = pair.partition("=")
        if not eq or not name.isidentifier():
            p.error(f"--site-env takes NAME=VALUE, e.g. ROLLWAY_MAX_POINTS_PER_SERIES=500; got {pair!r}")
    if getattr(args, "url", None) and not args.url.startswith(("http://", "https://")):
        p.error(f"--url must start with http:// or https://; got {args.url!r}")


def site_settings(args: argparse.Namespace, home: str) -> dict[str, str]:
    """The environment the site and this process share (same database, same home)."""
    env = {
        "ROLLWAY_HOME": home,
        "DATABASE_URL": args.database_url,
        "REDIS_URL": args.redis_url,
        "ROLLWAY_LOG_LEVEL": "WARNING",  # the figures, not every request
    }
    if args.broker_url:
        env["CELERY_BROKER_URL"] = args.broker_url
    env.update(pair.split("=", 1) for pair in args.site_env)
    return env


def short_home() -> str:
    """A short ROLLWAY_HOME: Ray's socket paths under it must stay under 107 bytes."""
    return tempfile.mkdtemp(prefix="rw-load-")


def remove_home(home: str, keep: bool) -> None:
    """After a clean finish the site's home (its log, Ray's session files) goes too; a
    failed or kept bench leaves it for a look."""
    if not keep:
        shutil.rmtree(home, ignore_errors=True)


def setup_django(settings: dict[str, str]) -> None:
    """Django in this process, on the site's database, migrated."""
    # This process only reads and writes the database: the site's own settings module
    # and import paths (--site-env may change the site's) are not needed here.
    os.environ.update({k: v for k, v in settings.items() if k not in ("DJANGO_SETTINGS_MODULE", "PYTHONPATH")})
    os.environ["DJANGO_SETTINGS_MODULE"] = "rollway.settings"
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import OperationalError, connection

    try:
        connection.ensure_connection()
    except OperationalError as exc:
        sys.exit(f"cannot reach the database {settings['DATABASE_URL']}: {exc}".strip())
    call_command("migrate", interactive=False, verbosity=0)


# ---- the site --------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http_ok(url: str, timeout_s: float, alive) -> bool:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and alive():
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2, trust_env=False).status_code == 200:
                return True
        time.sleep(0.3)
    return False


class Site:
    """A site the bench starts: daphne alone (`web`), or the whole product (`up`: Ray
    head, Celery worker and beat, daphne). Children run under ops.supervisor, so they die
    with the bench; their output goes to `<home>/site.log`."""

    def __init__(self, home: str, settings: dict[str, str]):
        from ops.supervisor import Supervisor

        self.home = home
        self.log_path = Path(home) / "site.log"
        self._log = open(self.log_path, "w", buffering=1)
        self.sup = Supervisor(self._log)
        env = dict(os.environ)
        env.pop("RAY_ADDRESS", None)  # `up` starts a private head instead of joining one
        # Only the broker the bench was given: a worker on another site's broker would
        # take that site's tasks.
        env.pop("CELERY_BROKER_URL", None)
        env.update(settings)
        # --site-env may add import paths and name another settings module (to try a
        # setting that is not an environment variable); the site's own come first.
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(REPO / "platform"), str(REPO), settings.get("PYTHONPATH")) if p
        )
        env.setdefault("DJANGO_SETTINGS_MODULE", "rollway.settings")
        env["PYTHONUNBUFFERED"] = "1"
        self.env = env
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.child = None

    def start_web(self, timeout_s: float = 90) -> Site:
        from ops.management.commands.up import daphne_args, web_env

        daphne = str(Path(sys.executable).parent / "daphne")
        argv = [daphne, *daphne_args("127.0.0.1", self.port)]
        self.child = self.sup.start("web", argv, env=web_env(self.env), cwd=str(REPO))
        self._wait(timeout_s, "daphne")
        return self

    def start_up(self, timeout_s: float = 300) -> Site:
        argv = [sys.executable, "manage.py", "up", "--port", str(self.port)]
        # SIGTERM to `up` alone: it stops web, beat, worker and the Ray head in order.
        self.child = self.sup.start("up", argv, env=self.env, cwd=str(REPO), stop_leader_only=True)
        self._wait(timeout_s, "manage.py up")
        return self

    def _wait(self, timeout_s: float, what: str) -> None:
        if not wait_http_ok(f"{self.url}/healthz", timeout_s, self.child.alive):
            tail = self.log_path.read_text()[-3000:]
            self.stop()
            sys.exit(f"{what} did not answer {self.url}/healthz within {timeout_s:.0f} s; its log:\n{tail}")

    def processes(self) -> dict[str, int]:
        """pid of each of `up`'s children by role: web (daphne), worker, beat, ray."""
        import psutil

        if self.child is None:
            return {}
        found = {"web": self.child.pid} if "daphne" in " ".join(self.child.argv) else {}
        for proc in psutil.Process(self.child.pid).children():
            with contextlib.suppress(psutil.Error):
                line = " ".join(proc.cmdline())
                if "daphne" in line:
                    found["web"] = proc.pid
                elif "celery" in line and " worker" in line:
                    found["worker"] = proc.pid
                elif "celery" in line and " beat" in line:
                    found["beat"] = proc.pid
                elif "ray" in line and "start" in line:
                    found["ray"] = proc.pid
        return found

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.sup.stop_all(timeout_s=60)
        self._log.close()


# ---- the bench's user and runs ---------------------------------------------------------


def bench_user(username: str):
    """A user with a known password, owner of the bench team; returns (user, experiment)."""
    from django.contrib.auth import get_user_model

    from runs.models import Experiment
    from teams.models import Membership, Team

    user, _ = get_user_model().objects.get_or_create(username=username)
    user.set_password(BENCH_PASSWORD)
    user.save()
    team, _ = Team.objects.get_or_create(slug="bench-load", defaults={"name": BENCH_TEAM})
    Membership.objects.get_or_create(team=team, user=user, defaults={"role": Membership.Role.ADMIN})
    experiment, _ = Experiment.objects.get_or_create(team=team, name="load", defaults={"created_by": user})
    return user, experiment


def new_run(experiment, name: str, status: str = "running"):
    """A run row fed by the bench instead of an engine (nothing is launched in Ray)."""
    from django.utils import timezone

    from runs.models import Run
    from workers.config.presets import build

    return Run.objects.create(
        experiment=experiment,
        name=name,
        preset="async",
        config=build("async").model_dump(mode="json"),
        status=status,
        started_at=timezone.now(),
    )


def delete_runs(ids: list[int]) -> None:
    """Remove the bench's runs with their points and rollups (cascade)."""
    from runs.models import Run

    Run.objects.filter(pk__in=ids).delete()


def login_cookies(url: str, username: str, password: str = BENCH_PASSWORD) -> dict[str, str]:
    """Log in through the site's login form, as a browser does; returns its cookies
    (`sessionid`, and `csrftoken` for the API's POSTs)."""
    import httpx

    with httpx.Client(base_url=url, timeout=60, trust_env=False) as client:
        client.get("/accounts/login/")
        r = client.post(
            "/accounts/login/",
            data={"username": username, "password": password, "csrfmiddlewaretoken": client.cookies["csrftoken"]},
            headers={"Referer": f"{url}/accounts/login/"},
        )
        if "sessionid" not in client.cookies:
            sys.exit(f"login as {username!r} at {url} failed (HTTP {r.status_code})")
        return {name: client.cookies[name] for name in ("sessionid", "csrftoken")}


def session_cookie(url: str, username: str, password: str = BENCH_PASSWORD) -> str:
    return login_cookies(url, username, password)["sessionid"]


# ---- WebSocket viewers -----------------------------------------------------------------


@dataclass
class Viewer:
    """One browser's socket on a run page: what arrived and how late.

    `ages` holds, per points message, the receive time minus the newest point's `time`
    field (the emit time when the sender stamps it just before posting); `by_step`
    counts the points received per step; `frames` names each points message received, in
    order (a hash of its text, which the site encodes once for every viewer of the run),
    so a message one viewer got and another did not shows."""

    index: int
    messages: int = 0
    points: int = 0
    ages: list[float] = field(default_factory=list)
    by_step: dict[int, int] = field(default_factory=dict)
    frames: list[int] = field(default_factory=list)
    latency_by_step: dict[int, float] = field(default_factory=dict)
    foreign: int = 0  # points of series this viewer does not watch for
    closed: str = ""  # why the socket ended before the bench closed it
    connected: asyncio.Event = field(default_factory=asyncio.Event)
    failed: asyncio.Event = field(default_factory=asyncio.Event)

    async def opened(self) -> bool:
        """Wait until the socket is open or has failed to open; whether it is open."""
        waits = [asyncio.ensure_future(self.connected.wait()), asyncio.ensure_future(self.failed.wait())]
        _, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for w in pending:
            w.cancel()
        return self.connected.is_set()

    def take(self, raw: str | bytes, now: float, series: frozenset[str] | None) -> None:
        msg = json.loads(raw)
        if msg.get("type") != "points":
            return
        self.messages += 1
        self.frames.append(hash(raw))
        newest = 0.0
        for p in msg["points"]:
            if series is not None and p["series"] not in series:
                self.foreign += 1
                continue
            self.points += 1
            self.by_step[p["step"]] = self.by_step.get(p["step"], 0) + 1
            self.latency_by_step.setdefault(p["step"], now - p["time"])
            newest = max(newest, p["time"])
        if newest:
            self.ages.append(now - newest)

    async def watch(
        self,
        ws_url: str,
        cookie: str,
        origin: str,
        gate: asyncio.Semaphore,
        stop: asyncio.Event,
        series: frozenset[str] | None = None,
    ) -> None:
        from websockets.asyncio.client import connect
        from websockets.exceptions import ConnectionClosed

        try:
            async with gate:
                ws = await connect(
                    ws_url,
                    origin=origin,
                    additional_headers={"Cookie": f"sessionid={cookie}"},
                    proxy=None,
                    open_timeout=60,
                    max_size=None,
                )
            self.connected.set()
        except Exception as exc:  # any refusal (HTTP 403, a reset, a timeout) is a figure, not a crash
            self.closed = f"connect failed: {exc!r}"[:200]
            self.failed.set()
            return
        receiver = asyncio.ensure_future(self._receive(ws, series))
        stopper = asyncio.ensure_future(stop.wait())
        await asyncio.wait({receiver, stopper}, return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
        receiver.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionClosed):
            await receiver
        with contextlib.suppress(Exception):
            await ws.close()

    async def _receive(self, ws, series) -> None:
        from websockets.exceptions import ConnectionClosed

        try:
            async for raw in ws:
                self.take(raw, time.time(), series)
        except ConnectionClosed as exc:
            self.closed = f"closed by the site: code {exc.rcvd.code if exc.rcvd else '?'}"
            self.failed.set()
            return
        self.closed = f"closed by the site: code {ws.close_code}"
        self.failed.set()


def ws_url(base_url: str, run_id: int) -> str:
    return base_url.replace("http", "ws", 1).rstrip("/") + f"/ws/runs/{run_id}/"


async def loop_lag(stop: asyncio.Event, worst: list[float], tick_s: float = 0.01) -> None:
    """The longest this process's event loop was busy past a 10 ms tick: time the bench
    itself adds before it can read a frame (a floor under every latency it reports)."""
    while not stop.is_set():
        t = time.perf_counter()
        await asyncio.sleep(tick_s)
        worst[0] = max(worst[0], time.perf_counter() - t - tick_s)


# ---- figures ---------------------------------------------------------------------------


def summary(values: list[float]) -> dict[str, float]:
    """p50, p95, p99 and max of `values` (inclusive quantiles: exact at small n)."""
    if not values:
        return {"n": 0, "p50": float("nan"), "p95": float("nan"), "p99": float("nan"), "max": float("nan")}
    if len(values) == 1:
        v = values[0]
        return {"n": 1, "p50": v, "p95": v, "p99": v, "max": v}
    q = statistics.quantiles(values, n=100, method="inclusive")
    return {"n": len(values), "p50": q[49], "p95": q[94], "p99": q[98], "max": max(values)}


def ms(stats: dict[str, float], keys: tuple[str, ...] = ("p50", "p95", "p99", "max")) -> str:
    return "  ".join(f"{k} {stats[k] * 1000:.0f} ms" for k in keys)


def cpu_seconds(pid: int | None = None) -> float:
    """User + system CPU seconds a process (default: this one) has used so far; nan
    when there is none to see."""
    import psutil

    try:
        t = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return float("nan")
    return t.user + t.system


def load_line() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} cores"


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def stop_on_sigterm() -> None:
    """SIGTERM as Ctrl-C, so `finally:` blocks (the site's shutdown, the bench runs'
    cleanup) run either way."""
    signal.signal(signal.SIGTERM, _interrupt)


def require_positive(p: argparse.ArgumentParser, args: argparse.Namespace, *flags: str) -> None:
    """p.error naming the first of `flags` (argparse dests) that is not > 0."""
    for flag in flags:
        if getattr(args, flag) <= 0:
            p.error(f"--{flag.replace('_', '-')} must be > 0")


def prepare(p: argparse.ArgumentParser, args: argparse.Namespace, username: str):
    """What every load bench does once its own flags are checked: check the site flags,
    run again with the platform on the path, stop cleanly on SIGTERM, make a short home,
    set Django up on the site's settings and make the bench user. (home, settings, user,
    experiment)."""
    check_site_args(p, args)
    reexec_with_platform_path()
    stop_on_sigterm()
    home = short_home()
    settings = site_settings(args, home)
    setup_django(settings)
    user, experiment = bench_user(username)
    return home, settings, user, experiment
