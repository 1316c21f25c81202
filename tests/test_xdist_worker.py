"""tests/xdist_worker.py: what each pytest-xdist worker of `make test` gets of its own."""

from __future__ import annotations

import os

import pytest

from tests.xdist_worker import REPO, worker_env, worker_threads

MAKE_TEST = {"REDIS_URL": "redis://127.0.0.1:6379/1", "CELERY_BROKER_URL": "redis://127.0.0.1:6379/2"}


def test_each_worker_moves_both_redis_databases_past_the_previous_workers():
    seen = []
    for index in range(4):
        env = worker_env(MAKE_TEST, index)
        seen += [env["REDIS_URL"], env["CELERY_BROKER_URL"]]
    assert seen == [f"redis://127.0.0.1:6379/{db}" for db in range(1, 9)]


def test_a_worker_gets_a_home_of_its_own_under_the_sessions():
    assert worker_env(MAKE_TEST, 2)["ROLLWAY_HOME"] == str(REPO / "var" / "xdist-gw2")
    assert worker_env({"ROLLWAY_HOME": "/srv/rw"}, 0) == {"ROLLWAY_HOME": "/srv/rw/xdist-gw0"}


def test_settings_that_are_not_redis_are_left_alone_and_a_url_without_a_database_is_db_0():
    env = worker_env({"REDIS_URL": "redis://h:6379", "CELERY_BROKER_URL": "filesystem://"}, 3)
    assert env["REDIS_URL"] == "redis://h:6379/3" and "CELERY_BROKER_URL" not in env


def test_a_worker_past_the_servers_databases_is_refused_naming_the_setting():
    with pytest.raises(pytest.UsageError, match="REDIS_URL: xdist worker gw8 would need Redis database 17"):
        worker_env(MAKE_TEST, 8)


def test_the_workers_share_the_cores_for_torch():
    assert [worker_threads(2, 2), worker_threads(2, 3), worker_threads(16, 4), worker_threads(6, 4)] == [1, 1, 4, 1]
    assert worker_threads(1, 0) == 1


def test_this_worker_computes_on_its_share_of_the_cores():
    import torch

    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers is None:
        pytest.skip("not in a pytest-xdist worker (make test runs them)")
    assert torch.get_num_threads() == worker_threads(os.cpu_count() or 1, int(workers))


# A plugin for the collection below: prints each test's xdist group after tests/conftest.py
# has given them (trylast), one line per test.
GROUPS_PLUGIN = """
import pytest

@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items):
    for item in items:
        marker = item.get_closest_marker("xdist_group")
        print("GROUP", item.nodeid, marker.args[0] if marker else "-")
"""


@pytest.mark.slow  # a pytest subprocess collecting test modules that import Django and torch
def test_the_end_to_end_tests_go_to_one_worker_and_a_shared_fixtures_file_to_another(tmp_path):
    import subprocess
    import sys

    from tests.conftest import STACK_GROUP

    (tmp_path / "print_groups.py").write_text(GROUPS_PLUGIN)
    files = ["tests/integration/test_up.py", "tests/integration/test_faults.py", "tests/engine/test_learning.py"]
    collect = ["--collect-only", "-q", "-p", "print_groups", "-p", "no:cacheprovider", *files]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *collect],
        cwd=REPO, env={**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"}, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    groups = dict(line.split()[1:] for line in done.stdout.splitlines() if line.startswith("GROUP "))
    assert groups, done.stdout + done.stderr
    end_to_end = {group for nodeid, group in groups.items() if nodeid.startswith("tests/integration/")}
    assert end_to_end == {STACK_GROUP}, groups
    assert len([n for n in groups if n.startswith("tests/integration/")]) > 2
    learning = {group for nodeid, group in groups.items() if nodeid.startswith("tests/engine/test_learning.py")}
    assert learning == {"tests/engine/test_learning.py"}  # its module-scoped warm start


def test_the_bench_scripts_and_the_workers_take_one_ray_start_lock(tmp_path, monkeypatch):
    """workers.core.run_actors.init_local_ray (the bench scripts') holds the file
    RAY_START_LOCK_ENV names while Ray starts, the same flock as the workers' fixtures
    take: while one holds it, another process cannot."""
    import subprocess
    import sys

    from workers.core.run_actors import RAY_START_LOCK_ENV, ray_start_lock

    path = str(tmp_path / "ray-start.lock")
    probe = (
        "import fcntl, sys\n"
        "f = open(sys.argv[1], 'w')\n"
        "try:\n    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)\nexcept BlockingIOError:\n    sys.exit(3)\n"
    )

    def other_process_gets_it() -> bool:
        return subprocess.run([sys.executable, "-c", probe, path], timeout=60).returncode == 0

    monkeypatch.setenv(RAY_START_LOCK_ENV, path)
    with ray_start_lock():
        assert not other_process_gets_it()
    assert other_process_gets_it()
    monkeypatch.delenv(RAY_START_LOCK_ENV)
    with ray_start_lock():  # no lock named: nothing is locked or made
        pass
    assert os.listdir(tmp_path) == ["ray-start.lock"]
