"""Personas and fakes for the platform tests.

Personas (healthchecks style): `owner` and `teammate` belong to team "Lab"; `outsider`
belongs to team "Elsewhere" only. Celery never runs here: `enqueued` records the tasks
sent; tasks are called directly, with Ray replaced by `FakeLifecycle` (below).
"""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from compare import league
from runs import queue
from runs.models import Experiment, Run
from teams.models import Membership, Team
from workers.config.presets import build
from workers.run.admission import Capacity


@pytest.fixture
def short_league_simulations(monkeypatch):
    """The league's simulated runs two steps long, not 20, for the fuzzes: each request the
    league's simulate routes accept simulates every configuration at each of the league's
    four scales, and what a fuzz checks (no 5xx, nothing logged) is the routes' handling,
    whatever the simulations' length; the league's figures are test_league.py's. With it,
    `pytest -n 0 tests/platform/test_fuzz.py -k league` took 17.6 s against 43.7 s, and
    test_openapi_fuzz.py's generated requests 31.5 s against 40.8 s."""
    monkeypatch.setattr(league, "SIMULATED_STEPS", 2)


@pytest.fixture(autouse=True)
def fast_password_hashing(settings):
    # PBKDF2 costs ~0.5 s per user on this machine; tests need no real hashing.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def static_files_found_per_request(settings):
    # Each Django test Client loads the middleware anew, and WhiteNoise, serving from the
    # static finders (WHITENOISE_USE_FINDERS), walks every static file at each load: a new
    # Client's first request took 13.0 ms here against 0.8 ms without the walk, for a Client
    # or more per test. In its autorefresh mode WhiteNoise finds a file when one is asked
    # for instead: the same files through the same finders.
    settings.WHITENOISE_AUTOREFRESH = True


@pytest.fixture(autouse=True)
def in_memory_channel_layer(settings):
    # Also resets the layer between tests (channels listens to setting_changed), so no
    # queue outlives the event loop of the test that made it.
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}


@pytest.fixture(autouse=True)
def no_hugging_face_hub(monkeypatch):
    # No test reaches the real Hub: a config naming a Hub id gets the offline refusal (a
    # 400), whatever network the machine has. tests/fake_hub.py stands in for an online Hub.
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)


@pytest.fixture(autouse=True)
def enqueued(monkeypatch):
    """[(task name, run_id)] for every task the platform sends, e.g. ("launch_run", 7),
    ("schedule_queue", None).

    The actions layer sends tasks by name through the Celery app (runs/dispatch.py), so
    that is where they are caught; a name no task is registered under fails the test,
    since the broker would take the message and no worker would ever run it."""
    from rollway.celery import app
    from runs import tasks  # registers the run tasks with the app

    registered = set(app.tasks)
    assert tasks.launch_run.name in registered
    calls: list[tuple[str, int]] = []

    class _Result:
        id = "fake-task-id"

    def send_task(name, args=(), **options):
        assert name in registered, f"no task is registered as {name!r}"
        run_id = args[0] if args else None  # the queue's scheduler takes no run id
        calls.append((name.rsplit(".", 1)[-1], run_id))
        return _Result()

    monkeypatch.setattr(app, "send_task", send_task)
    return calls


def _user(username: str):
    return get_user_model().objects.create_user(username, password="pw-" + username)


@pytest.fixture
def team(db):
    return Team.objects.create(name="Lab")


@pytest.fixture
def owner(team):
    user = _user("olga")
    Membership.objects.create(team=team, user=user, role=Membership.Role.ADMIN)
    return user


@pytest.fixture
def teammate(team):
    user = _user("tom")
    Membership.objects.create(team=team, user=user, role=Membership.Role.MEMBER)
    return user


@pytest.fixture
def outsider(db):
    user = _user("oscar")
    other = Team.objects.create(name="Elsewhere")
    Membership.objects.create(team=other, user=user, role=Membership.Role.ADMIN)
    Experiment.objects.create(team=other, name="theirs")
    return user


@pytest.fixture
def experiment(team, owner):
    return Experiment.objects.create(team=team, name="async-vs-sync", created_by=owner)


@pytest.fixture
def make_run(experiment, owner):
    def make(status: str = Run.Status.QUEUED, preset: str = "async", **fields) -> Run:
        return Run.objects.create(
            experiment=fields.pop("experiment", experiment),
            name=fields.pop("name", f"{preset} run"),
            preset=preset,
            config=fields.pop("config", None) or build(preset).model_dump(mode="json"),
            status=status,
            launched_by=fields.pop("launched_by", owner),
            **fields,
        )

    return make


@pytest.fixture
def run(make_run):
    return make_run()


@pytest.fixture
def client_for(db):
    def login(user) -> Client:
        client = Client()
        client.force_login(user)
        return client

    return login


class FakeLifecycle:
    """workers.run.lifecycle as the platform calls it. Records calls; `alive` holds the run
    ids whose actor exists."""

    def __init__(self):
        self.calls: list[tuple] = []
        self.alive: set[int] = set()
        self.fail_with: Exception | None = None
        self.capacity = Capacity(cpus=2.0, memory_bytes=16 * 2**30)
        self.available: Capacity | None = None  # what is free now; None: all of `capacity`
        self.confinements: list = []
        self.resumed_from: dict[int, str | None] = {}  # run id → the checkpoint it was launched from
        self.replayed: dict[int, dict | None] = {}  # run id → the schedule it was launched to follow

    def cluster_capacity(self, *, ray_address):
        if self.fail_with:
            raise self.fail_with
        return self.capacity

    def available_capacity(self, *, ray_address):
        if self.fail_with:
            raise self.fail_with
        return self.available if self.available is not None else self.capacity

    def launch(
        self, run_id, config, *, ingest_url, token, cache_dir, ray_address, confinement, resume_from=None, replay=None
    ):
        self.calls.append(("launch", run_id, config, ingest_url, token, cache_dir, ray_address))
        self.confinements.append(confinement)
        self.resumed_from[run_id] = resume_from
        self.replayed[run_id] = replay
        if self.fail_with:
            raise self.fail_with
        self.alive.add(run_id)
        return f"run-{run_id}"

    def cancel(self, run_id, *, ray_address, timeout_s=10.0):
        self.calls.append(("cancel", run_id))
        if self.fail_with:
            raise self.fail_with
        found = run_id in self.alive
        self.alive.discard(run_id)
        return found

    def is_alive(self, run_id, *, ray_address):
        self.calls.append(("is_alive", run_id))
        if self.fail_with:
            raise self.fail_with
        return run_id in self.alive

    def named(self, name):
        return [c for c in self.calls if c[0] == name]


@pytest.fixture
def driver(monkeypatch, settings, tmp_path):
    """A FakeLifecycle in place of workers.run.lifecycle (runs.in_ray's seam to Ray)."""
    from runs import in_ray

    settings.ROLLWAY_PUBLIC_URL = "http://127.0.0.1:8123"
    settings.RAY_ADDRESS = None
    settings.ROLLWAY_CACHE_DIR = str(tmp_path / "cache")  # where drivers spool
    fake = FakeLifecycle()
    monkeypatch.setattr(in_ray, "ray_lifecycle", lambda: fake)
    return fake


def _fresh_sync_thread() -> None:
    """In the forked server: a new thread for asgiref's sync_to_async. The parent's
    executor comes across the fork with its worker thread recorded but not running, so
    once an earlier test in this process used it (any consumer test does), every
    database call of the child's consumers queued forever and no socket ever opened."""
    from concurrent.futures import ThreadPoolExecutor

    from asgiref.sync import SyncToAsync

    SyncToAsync.single_thread_executor = ThreadPoolExecutor(max_workers=1)


@pytest.fixture
def daphne_url(transactional_db):
    """The site served by daphne (HTTP and WebSockets, as `manage.py up` serves it) in a
    forked process on the test database: PostgreSQL only, as the fork cannot share an
    in-memory SQLite database."""
    from daphne.testing import DaphneProcess
    from django.db import connection

    if connection.vendor == "sqlite" and connection.is_in_memory_db():
        pytest.skip("the daphne test needs DATABASE_URL pointing at PostgreSQL (`make test` sets it)")
    from channels.routing import get_default_application

    server = DaphneProcess("127.0.0.1", get_default_application, setup=_fresh_sync_thread)
    server.start()
    try:
        assert server.ready.wait(30), "daphne did not start"
        yield f"http://127.0.0.1:{server.port.value}"
    finally:
        server.terminate()
        server.join(10)


@pytest.fixture
def schedule(driver, django_capture_on_commit_callbacks):
    """do_schedule_queue, with what it sends on commit sent (tests never commit)."""

    def run() -> list[int]:
        with django_capture_on_commit_callbacks(execute=True):
            return queue.do_schedule_queue()

    return run
