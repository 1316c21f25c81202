"""A run lives in Ray, not in Celery: killing the Celery worker that launched it does not
stop it, and a restarted worker can still cancel it, leaving no actor behind. (A run
launched through Celery to its end, its points stored: tests/integration/test_cli_live.py.)
"""

from __future__ import annotations

import re
import signal
import time
from datetime import datetime

import pytest

from tests.integration.helpers import launch, status, waiting_on_tools
from tests.integration.stack import RayProbe, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

# How long the test waits for a cancelled run's actors to go before it calls them left behind.
CANCEL_WAIT_S = 120.0


@pytest.fixture
def member(db):
    """A user with a team and an experiment, as `manage.py up` sets up the demo login."""
    from django.contrib.auth import get_user_model

    from runs.actions import do_ensure_demo

    user = get_user_model().objects.create_user("ilse", password="pw-ilse")
    team, experiment = do_ensure_demo(user, team_name="Integration")
    return user, experiment


def point_count(run, series: str | None = None) -> int:
    from runs.models import MetricPoint

    points = MetricPoint.objects.filter(run_id=run.pk)
    return (points.filter(series=series) if series else points).count()


def task_received_at(stack, task: str) -> float:
    """When the worker logged receiving the latest `task` (epoch seconds)."""
    stamps = re.findall(
        rf"^worker +\| (\S+ \S+) INFO celery.worker.strategy: Task runs.tasks.{task}\[",
        stack.log_path.read_text(errors="replace"),
        re.M,
    )
    assert stamps, f"the worker never logged receiving {task}"
    return datetime.strptime(stamps[-1], "%Y-%m-%d %H:%M:%S,%f").timestamp()


@pytest.fixture(scope="module")
def ray_probe(stack):
    probe = RayProbe(stack.ray_address, stack.env)
    yield probe
    probe.close()


def test_the_run_outlives_its_celery_worker_and_a_new_worker_cancels_it(stack, member, ray_probe, show_logs_on_failure):
    from runs.actions import do_cancel_run
    from runs.models import Run

    worker = stack.ensure_worker()
    run = launch(member, "async", waiting_on_tools(max_steps=10_000, max_minutes=5))
    wait_for(lambda: point_count(run, "loss") >= 2, 300, f"run {run.pk} to train 2 steps")
    assert status(run) == Run.Status.RUNNING

    worker.signal(signal.SIGKILL)  # no warm shutdown: the worker is simply gone
    wait_for(lambda: not worker.alive(), 10, "the killed worker to exit")
    steps_before = point_count(run, "loss")
    wait_for(
        lambda: point_count(run, "loss") >= steps_before + 2, 120, "training steps to keep arriving without the worker"
    )
    assert status(run) == Run.Status.RUNNING
    assert ray_probe.driver_alive(run.pk)

    stack.ensure_worker()  # a fresh worker process picks up the cancel
    asked = time.time()
    do_cancel_run(member[0], Run.objects.get(pk=run.pk))
    wait_for(lambda: status(run) == Run.Status.CANCELLED, 120, f"run {run.pk} to be cancelled")
    # Every run actor goes. The wait is long because it bounds a hang, not a speed (how
    # fast a loaded host tears a Ray actor down is not what this test is about); an
    # actor the cancel left behind stays and fails it.
    wait_for(lambda: not ray_probe.actor_names(run.pk), CANCEL_WAIT_S, f"run-{run.pk}* actors to go")
    # The new worker took the cancel, after it was asked for (its log's clock is ours, to
    # the millisecond).
    assert task_received_at(stack, "cancel_run") >= asked - 0.001
    settled = point_count(run)
    time.sleep(2)
    assert point_count(run) == settled, "points still arrive after the run was cancelled"
