"""Run status transitions, visibility, metric upserts and the demo workspace."""

from __future__ import annotations

import pytest

from runs.actions import do_ensure_demo
from runs.models import MetricPoint, Run
from teams.models import Team

Status = Run.Status


def test_a_new_run_is_queued_with_its_own_ingest_token(make_run):
    first, second = make_run(), make_run()
    assert first.status == Status.QUEUED
    assert len(first.ingest_token) >= 32
    assert first.ingest_token != second.ingest_token


def test_only_one_launch_claims_a_queued_run(run):
    stale_copy = Run.objects.get(pk=run.pk)
    assert run.transition(Status.STARTING) is True
    assert stale_copy.transition(Status.STARTING) is False
    run.refresh_from_db()
    assert run.status == Status.STARTING
    assert run.launched_at is not None


def test_running_sets_started_at_once(make_run):
    run = make_run(status=Status.STARTING)
    assert run.transition(Status.RUNNING) is True
    started = run.started_at
    assert started is not None
    assert run.transition(Status.RUNNING) is False  # repeated report: no change
    assert run.started_at == started


@pytest.mark.parametrize("terminal", [Status.CANCELLED, Status.SUCCEEDED, Status.FAILED])
@pytest.mark.parametrize(
    "late", [Status.RUNNING, Status.STARTING, Status.CANCELLING, Status.SUCCEEDED, Status.FAILED, Status.CANCELLED]
)
def test_terminal_states_stick(make_run, terminal, late):
    run = make_run(status=terminal)
    assert run.transition(late, error="late writer") is False
    run.refresh_from_db()
    assert run.status == terminal
    assert run.error == ""


def test_a_stale_instance_cannot_resurrect_a_cancelled_run(make_run):
    run = make_run(status=Status.RUNNING)
    writer_a = Run.objects.get(pk=run.pk)  # e.g. the ingest view, loaded while running
    assert run.transition(Status.CANCELLED) is True
    assert writer_a.status == Status.RUNNING
    assert writer_a.transition(Status.SUCCEEDED) is False
    assert writer_a.status == Status.CANCELLED  # refreshed to the truth


def test_finishing_sets_finished_at_and_keeps_the_error(make_run):
    run = make_run(status=Status.RUNNING)
    assert run.transition(Status.FAILED, error="trainer crashed: OOM") is True
    assert run.finished_at is not None
    assert run.error == "trainer crashed: OOM"
    assert run.is_terminal and not run.can_cancel


def test_a_run_that_finishes_while_cancelling_keeps_its_outcome(make_run):
    run = make_run(status=Status.CANCELLING)
    assert run.transition(Status.SUCCEEDED) is True
    assert run.transition(Status.CANCELLED) is False


def test_every_status_says_where_it_may_come_from():
    assert set(Run.ALLOWED_FROM) == set(Status) - {Status.QUEUED}
    for allowed in Run.ALLOWED_FROM.values():
        assert not allowed & Run.TERMINAL  # nothing ever leaves a terminal state


def test_members_see_their_teams_runs_and_outsiders_do_not(run, owner, teammate, outsider):
    assert list(Run.objects.visible_to(owner)) == [run]
    assert list(Run.objects.visible_to(teammate)) == [run]
    assert list(Run.objects.visible_to(outsider)) == []


def test_upsert_never_duplicates_a_point(run):
    MetricPoint.objects.upsert(run.pk, [("reward/mean", 1, 0.1, 10.0), ("loss", 1, 2.0, 10.0)])
    MetricPoint.objects.upsert(run.pk, [("reward/mean", 1, 0.5, 11.0), ("reward/mean", 2, 0.6, 12.0)])
    stored = {(s, step): v for s, step, v in run.points.values_list("series", "step", "value")}
    assert stored == {("reward/mean", 1): 0.5, ("loss", 1): 2.0, ("reward/mean", 2): 0.6}


@pytest.mark.parametrize("path", ["database's own", "portable ORM"])
def test_both_upsert_paths_overwrite_instead_of_duplicating(run, path):
    points = MetricPoint.objects
    upsert = points.all()._upsert_orm if path == "portable ORM" else None
    for batch in ({("loss", 1): (1.0, 1.0)}, {("loss", 1): (0.5, 2.0), ("loss", 2): (0.4, 3.0)}):
        if upsert:
            upsert(run.pk, batch)
        else:
            points.upsert(run.pk, [(s, step, v, t) for (s, step), (v, t) in batch.items()])
    assert list(run.points.order_by("step").values_list("step", "value", "time")) == [(1, 0.5, 2.0), (2, 0.4, 3.0)]


def test_upsert_keeps_the_last_of_duplicates_within_one_batch(run):
    written = MetricPoint.objects.upsert(run.pk, [("loss", 3, 1.0, 1.0), ("loss", 3, 0.7, 2.0)])
    assert written == 1
    assert run.points.get().value == 0.7


def test_ensure_demo_is_idempotent_and_makes_the_user_owner(db, django_user_model):
    user = django_user_model.objects.create_user("demo", password="demo")
    team, experiment = do_ensure_demo(user)
    again_team, again_experiment = do_ensure_demo(user)
    assert (team, experiment) == (again_team, again_experiment)
    assert team.role_of(user) == "admin"
    assert Team.objects.count() == 1
    assert experiment.team == team
