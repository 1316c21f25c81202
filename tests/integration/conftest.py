"""Session-wide real services for the end-to-end tests (see stack.py).

They need PostgreSQL (a separate worker process must see committed rows, which
pytest-django's in-memory SQLite cannot give) and Redis (Celery broker and channel
layer shared by web and worker). `make test` exports DATABASE_URL, CELERY_BROKER_URL
and REDIS_URL; without them these tests are skipped, saying so.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import time
import warnings

import psutil
import pytest

from tests.integration.stack import REPO, Stack, child_env, db_url, free_web_port, short_home
from tests.xdist_worker import ray_start_lock
from workers.core.run_actors import ACTOR_CLASSES

REQUIRED = {"DATABASE_URL": "postgres", "CELERY_BROKER_URL": "redis", "REDIS_URL": "redis"}


def require_services() -> None:
    missing = [k for k, scheme in REQUIRED.items() if not os.environ.get(k, "").startswith(scheme)]
    if missing:
        pytest.skip(f"end-to-end tests need {', '.join(missing)} pointing at PostgreSQL/Redis (`make test` sets them)")


@pytest.fixture(scope="session")
def stack(django_db_setup, tmp_path_factory):
    """Ray head + daphne (+ a Celery worker on demand) on the session's test database."""
    require_services()
    from django.db import connection

    from rollway.celery import app as celery_app

    celery_app.control.purge()  # a message left by an aborted session would launch a stranger
    home = short_home()
    st = Stack(home)
    try:
        with ray_start_lock(tmp_path_factory):  # not beside an engine cluster's start
            st.start_ray_head()
        port = free_web_port()
        st.url = f"http://127.0.0.1:{port}"
        st.env = child_env(
            st.user_dir,
            DATABASE_URL=db_url(connection.settings_dict),
            REDIS_URL=os.environ["REDIS_URL"],
            CELERY_BROKER_URL=os.environ["CELERY_BROKER_URL"],
            ROLLWAY_HOME=str(home),
            ROLLWAY_PUBLIC_URL=st.url,
            DJANGO_SECRET_KEY="rollway-integration-tests",
            DJANGO_DEBUG="false",
            **st.ray_env,
        )
        st.start_web(st.env, port)
        yield st
    finally:
        st.stop()
        shutil.rmtree(home, ignore_errors=True)


# A run's actors, by the process title Ray gives them: `ray::<name>:<Class>.<method>` while
# the constructor runs, `ray::<Class>[.<method>]` after.
RUN_ACTOR = re.compile(rf"^ray::(run-[^:\s]*:)?({'|'.join(ACTOR_CLASSES)})\b")
# How long a run's actors may take to go once its test has ended: a cancel or a stop
# reaches them through the Celery worker and the driver's own shutdown.
LEFT_RUNNING_GRACE_S = 30.0


def run_actor_processes() -> dict[int, str]:
    """This process's descendants that are a run's Ray actors: pid → title."""
    found = {}
    for child in psutil.Process().children(recursive=True):
        try:
            # Ray pads its titles with spaces to the length of the original command line.
            title = " ".join(" ".join(child.cmdline()).split())
        except psutil.Error:
            continue
        if RUN_ACTOR.match(title):
            found[child.pid] = title
    return found


@pytest.fixture(autouse=True)
def no_run_left_running(request):
    """A test on the stack ends every run it started: a run left training burns the cores
    every later test needs until its own limits stop it (these tests' runs stop after
    3 minutes or at 10,000 steps), charged to the tests that happen to follow. What
    is still there LEFT_RUNNING_GRACE_S after the test is killed, with a warning naming
    it in pytest's summary (a warning, not a failure: how long a stop takes on a loaded
    host is not what these tests check)."""
    yield
    if "stack" not in request.fixturenames and "site" not in request.fixturenames:
        return
    deadline = time.monotonic() + LEFT_RUNNING_GRACE_S
    while (left := run_actor_processes()) and time.monotonic() < deadline:
        time.sleep(0.5)
    for pid in left:
        with contextlib.suppress(psutil.Error):
            psutil.Process(pid).kill()
    if left:
        warnings.warn(f"the test left a run's actors running (killed now): {sorted(left.values())}", stacklevel=1)


@pytest.fixture
def show_logs_on_failure(request, stack):
    """Print the services' last log lines when the test fails."""
    yield
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        print(f"--- last lines of {stack.log_path} ---\n{stack.log_tail()}")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


@pytest.fixture
def cli_env(stack, tmp_path):
    """What a person's shell holds after `rollway login`: the site and a member token."""
    from django.contrib.auth import get_user_model

    from runs.actions import do_ensure_demo
    from teams import tokens

    user = get_user_model().objects.create_user("cleo", password="pw-cleo")
    team, _ = do_ensure_demo(user, team_name="Command line")
    _, secret = tokens.do_create(user, team, "member", "live test")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROLLWAY_")}
    env.update(
        ROLLWAY_URL=stack.url,
        ROLLWAY_TOKEN=secret,
        ROLLWAY_CONFIG_DIR=str(tmp_path / "config"),
        PYTHONPATH=str(REPO),  # the CLI needs nothing of the site's source root
        COLUMNS="100",
        TERM="xterm-256color",
    )
    return env, team
