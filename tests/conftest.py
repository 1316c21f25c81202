"""What the whole suite shares: how `make test` spreads it over pytest-xdist workers, and
the packages its processes hide from transformers."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from tests.xdist_worker import ray_start_lock_path, run_root
from workers.core import worker_process
from workers.core.run_actors import RAY_START_LOCK_ENV

# Every pytest process collects test modules that import transformers' model classes,
# which import scikit-learn and SciPy when they are installed; no test uses either. Hidden
# here as a run's Ray workers hide them (workers/core/worker_process.py), before any test
# module is imported; full collections wait, as there, until the tests are collected
# (pytest_collection_finish).
worker_process.setup()

# A Ray raylet starts a worker for the first driver that connects, in case it submits
# tasks; a test's runs start actors only, each in a worker of its own, so that worker
# idled until its cluster stopped: 66 such workers and 115 s of CPU in one whole suite
# (bench/suite_cpu.py, "Ray workers that never held an actor"). Every Ray cluster the
# tests start (in-process, or a `ray start` child) inherits this.
os.environ.setdefault("RAY_prestart_worker_first_driver", "0")
# Ray's log monitor globs its node's log folder for new files every 0.1 s until it holds
# 1,000 (3 ms a glob at 350 files): its three busiest spent 358 s of CPU in a whole suite
# at b31dd5f. From 0 files on it looks every LOG_NAME_UPDATE_INTERVAL_S instead; no test
# reads a run's logs through it (every driver has log_to_driver off). At 207 files, idle:
# 1.25 s of CPU in 30 s before, 0.56 s after.
os.environ.setdefault("RAY_LOG_MONITOR_MANY_FILES_THRESHOLD", "0")
os.environ.setdefault("LOG_NAME_UPDATE_INTERVAL_S", "5")

ENGINE = Path(__file__).parent / "engine"
# The end-to-end tests' stack (tests/integration/conftest.py) is held for the session: a
# Ray head, daphne and a Celery worker, and the warm starts its runs build under its own
# home. Their tests go to one worker, which starts it once.
INTEGRATION = Path(__file__).parent / "integration"
STACK_GROUP = "integration-stack"
# Fixtures held for a module or class (a vLLM engine, a private PostgreSQL, a trained
# checkpoint) cost seconds to minutes each; a worker that runs one of their tests starts
# its own copy.
SHARED_SCOPES = ("module", "class")


@pytest.fixture(scope="session", autouse=True)
def ray_starts_in_turn(tmp_path_factory) -> None:
    """Every Ray cluster this run starts, in the workers' fixtures (tests.xdist_worker's
    `ray_start_lock`) or in the bench scripts and subprocesses they start
    (workers.core.run_actors.init_local_ray, through RAY_START_LOCK_ENV), starts while
    holding one lock: a bench's cluster starting beside a worker's missed Ray's 30 s for a
    raylet to register (test_run_cost_prints_each_actor_kind_per_run, once)."""
    os.environ[RAY_START_LOCK_ENV] = ray_start_lock_path(tmp_path_factory)


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> str:
    """The runs' cache, for the engine's runs and the bench scripts' alike: each warm start
    (keyed by what shapes it) is built once per pytest run, by whichever worker needs it
    first (workers.train.warmstart locks each build, so another worker that needs the same
    one waits for it instead of building it too)."""
    cache = run_root(tmp_path_factory) / "run-cache"
    cache.mkdir(exist_ok=True)
    return str(cache)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """Where ROLLWAY_TEST_SPANS names a file, a line per test (setup, call and teardown):
    this process's pid, the test and its wall-clock start and end, from which
    bench/suite_cpu.py charges each test the CPU of every process it started."""
    start = time.time()
    yield
    spans = os.environ.get("ROLLWAY_TEST_SPANS")
    if spans:
        test = item.nodeid.split("@", 1)[0]  # without the xdist_group pytest-xdist appends
        line = json.dumps({"pid": os.getpid(), "test": test, "start": start, "end": time.time()})
        with open(spans, "a") as f:  # one short append per line: workers' lines never interleave
            f.write(line + "\n")


def pytest_collection_finish(session: pytest.Session) -> None:
    """Collection imported what the tests use: the end of this process's start-up."""
    worker_process.started()


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's worker reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under `--dist loadgroup`: the tests of a file that use a module- or class-scoped
    fixture of that file go to one worker (xdist_group named by the file), so the fixture
    starts once; every other test goes to whichever worker is free. A test on the engine's
    in-process Ray cluster (tests/engine/conftest.py) is marked slow: it starts Ray, and
    `make test-fast` leaves it out.

    The end-to-end tests (tests/integration) go to one worker, which starts their stack
    once: spread over two, each worker started a stack and built the default run's warm
    start again under its own home (4 min and 1.5 min of a whole suite's wall time on a
    slow host).

    Each worker runs its engine tests on a Ray cluster of its own. They are not gathered
    on one worker: on this 2-core host the engine's whole runs are most of the suite, and
    one worker running them all would be its critical path (seven multi-agent and task
    runs took 87 s on one worker, 75 s spread over two)."""
    for item in items:
        if not isinstance(item, pytest.Function):
            continue
        if "cluster" in item.fixturenames and item.path.is_relative_to(ENGINE):
            item.add_marker(pytest.mark.slow)
        if item.path.is_relative_to(INTEGRATION):
            item.add_marker(pytest.mark.xdist_group(STACK_GROUP))
            continue
        if item.get_closest_marker("xdist_group"):
            continue
        path = item.nodeid.split("::", 1)[0]
        # pytest keeps no public map of an item's fixture definitions; _fixtureinfo is what
        # pytest-xdist and pytest-django read too.
        for defs in item._fixtureinfo.name2fixturedefs.values():
            if any(d.scope in SHARED_SCOPES and d.baseid == path for d in defs):
                item.add_marker(pytest.mark.xdist_group(path))
                break
