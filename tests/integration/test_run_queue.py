"""The run queue against the real services: with one slot (ROLLWAY_MAX_RUNNING=1) a
second run waits in the queue, first in line, through restarts of the web process and
the Celery worker, and starts as soon as the first run ends (cancelled by its user) and
succeeds. Everything the queue knows is in the database, so no restart loses a waiting
run.
"""

from __future__ import annotations

import pytest

from tests.integration.helpers import launch, overrides, status, waiting_on_tools
from tests.integration.stack import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ONE_SLOT = {"ROLLWAY_MAX_RUNNING": "1"}


@pytest.fixture
def member(db):
    from django.contrib.auth import get_user_model

    from runs.actions import do_ensure_demo

    user = get_user_model().objects.create_user("quinn", password="pw-quinn")
    team, experiment = do_ensure_demo(user, team_name="Queue")
    return user, experiment


@pytest.fixture
def one_slot_worker(stack):
    """A worker whose scheduler schedules one run at a time; the session's worker after."""
    stack.restart_worker(**ONE_SLOT)
    yield
    stack.restart_worker()


def test_a_second_run_waits_through_restarts_and_starts_when_the_first_ends(
    stack, member, one_slot_worker, show_logs_on_failure
):
    from runs.actions import do_cancel_run
    from runs.models import Run

    # It trains until its user cancels it after both restarts below, however long those
    # take: an end it reached by itself (a step or minute limit) would be a race with them.
    first = launch(member, "async", waiting_on_tools(max_steps=100_000, max_minutes=30))
    wait_for(lambda: status(first) == Run.Status.RUNNING, 300, f"run {first.pk} to be running")
    second = launch(member, "async", overrides(max_steps=4, max_minutes=4))

    def waiting_reason():
        second.refresh_from_db()
        return second.waiting_for() == "1 run is active (ROLLWAY_MAX_RUNNING=1)"

    wait_for(waiting_reason, 30, f"the scheduler to say why run {second.pk} waits")
    assert (second.status, second.queue_position()) == (Run.Status.QUEUED, 1)

    stack.restart_web()
    stack.restart_worker(**ONE_SLOT)
    assert status(first) == Run.Status.RUNNING, "the first run should still be training"
    assert status(second) == Run.Status.QUEUED
    assert second.queue_position() == 1

    assert do_cancel_run(member[0], first)
    wait_for(lambda: status(first) in Run.TERMINAL, 300, f"run {first.pk} to end")
    assert first.status == Run.Status.CANCELLED, f"run {first.pk} {first.status}: {first.error}"
    wait_for(lambda: status(second) in Run.TERMINAL, 300, f"run {second.pk} to end")
    assert second.status == Run.Status.SUCCEEDED, f"run {second.pk} {second.status}: {second.error}"
    first.refresh_from_db()
    second.refresh_from_db()
    assert second.launched_at >= first.finished_at, "the second run started before the first ended"
