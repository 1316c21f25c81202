"""Launching, cancelling and reconciling runs (runs/in_ray.py, runs/reconcile.py, the
Celery tasks that wrap them) against a fake workers.run.lifecycle in place of Ray."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from runs import dispatch, in_ray, queue, reconcile, tasks
from runs.models import Run

Status = Run.Status


@pytest.fixture
def run(make_run):
    """A queued run the queue has scheduled: what launch_run is sent for."""
    return make_run(phase=queue.SCHEDULED)


def status_of(run) -> str:
    run.refresh_from_db()
    return run.status


def ago(seconds: float):
    return timezone.now() - timedelta(seconds=seconds)


# --- launch -------------------------------------------------------------------------


def test_launch_claims_the_run_and_starts_its_driver_actor(driver, run, settings):
    in_ray.do_start_in_ray(run.pk)
    run.refresh_from_db()
    assert run.status == Status.STARTING
    assert (run.phase, run.phase_detail) == ("", "")  # the queue's mark is gone
    assert run.ray_actor == f"run-{run.pk}"
    [(_, run_id, config, url, token, cache_dir, address)] = driver.named("launch")
    assert (run_id, config, url) == (run.pk, run.run_config, "http://127.0.0.1:8123")
    # The driver's token is issued at launch, and only its hash is stored.
    assert run.is_ingest_token(token) and token not in run.ingest_digest
    assert not run.is_ingest_token(run.ingest_token)  # the one the run was made with
    assert config.model_dump(mode="json") == run.config  # the stored config, typed
    assert cache_dir == settings.ROLLWAY_CACHE_DIR and address is None


def test_a_redelivered_launch_does_nothing(driver, run):
    in_ray.do_start_in_ray(run.pk)
    in_ray.do_start_in_ray(run.pk)
    assert len(driver.named("launch")) == 1


def test_launch_does_not_start_a_queued_run_the_queue_has_not_scheduled(driver, make_run):
    run = make_run()
    in_ray.do_start_in_ray(run.pk)
    assert driver.calls == []
    assert status_of(run) == Status.QUEUED


def test_launch_does_not_start_a_cancelled_run(driver, make_run):
    run = make_run(status=Status.CANCELLING)
    in_ray.do_start_in_ray(run.pk)
    assert driver.calls == []
    assert status_of(run) == Status.CANCELLING


def test_a_failed_launch_marks_the_run_failed_with_the_reason(driver, run):
    driver.fail_with = ConnectionError("Ray head not reachable at 10.0.0.9:6380")
    in_ray.do_start_in_ray(run.pk)
    run.refresh_from_db()
    assert run.status == Status.FAILED
    assert run.error == "Ray at 10.0.0.9:6380 is unreachable: check RAY_ADDRESS and that the Ray head is running."
    assert "error: ConnectionError: Ray head not reachable at 10.0.0.9:6380" in run.error_detail  # its facts
    assert (run.failure["kind"], run.failure["operation"]) == ("ray_unreachable", "the launch")
    assert "Traceback (most recent call last)" in run.error_traceback  # for admins only


def test_a_busy_database_while_recording_the_clusters_capacity_does_not_fail_the_launch(driver, run, monkeypatch):
    from django.db import OperationalError

    from configs.models import ClusterCapacity

    def locked(capacity):
        raise OperationalError("database is locked")

    monkeypatch.setattr(ClusterCapacity, "record", locked)
    in_ray.do_start_in_ray(run.pk)
    assert status_of(run) == Status.STARTING and len(driver.named("launch")) == 1


def test_a_cancel_during_launch_stops_the_new_actor(driver, run, monkeypatch):
    real_launch = driver.launch

    def launch_then_user_cancels(*args, **kwargs):
        name = real_launch(*args, **kwargs)
        Run.objects.get(pk=run.pk).transition(Status.CANCELLING)
        return name

    monkeypatch.setattr(driver, "launch", launch_then_user_cancels)
    in_ray.do_start_in_ray(run.pk)
    assert driver.named("cancel") == [("cancel", run.pk)]
    assert run.pk not in driver.alive


def test_a_cancel_whose_kill_stops_the_launch_ends_the_run_cancelled_not_failed(driver, run, monkeypatch):
    """The order the end-to-end stack met: the user cancels while the launch waits for
    the new driver, cancel_run (on another worker thread) kills it, the launch raises
    Ray's error for the killed actor, and only then does cancel_run mark the run. The run
    is not failed with the kill as its reason: it ends cancelled."""
    real_launch = driver.launch

    def launch_killed_by_the_cancel(*args, **kwargs):
        real_launch(*args, **kwargs)
        Run.objects.get(pk=run.pk).transition(Status.CANCELLING)
        driver.cancel(run.pk, ray_address=None)  # cancel_run's kill
        raise RuntimeError(f"The actor run-{run.pk} died: it was killed (ray.kill)")

    monkeypatch.setattr(driver, "launch", launch_killed_by_the_cancel)
    in_ray.do_start_in_ray(run.pk)
    assert status_of(run) == Status.CANCELLING
    in_ray.do_stop_in_ray(run.pk)  # the rest of cancel_run: it marks the run
    run.refresh_from_db()
    assert (run.status, run.error) == (Status.CANCELLED, "")
    assert run.pk not in driver.alive


def test_a_launch_that_fails_before_the_cancel_stops_anything_leaves_the_run_to_its_cancel(driver, run, monkeypatch):
    def launch_fails_as_the_user_cancels(*args, **kwargs):
        Run.objects.get(pk=run.pk).transition(Status.CANCELLING)
        raise ConnectionError("Ray head not reachable at 10.0.0.9:6380")

    monkeypatch.setattr(driver, "launch", launch_fails_as_the_user_cancels)
    in_ray.do_start_in_ray(run.pk)
    assert status_of(run) == Status.CANCELLING  # cancel_run (or reconcile's retry) ends it
    in_ray.do_stop_in_ray(run.pk)
    assert status_of(run) == Status.CANCELLED


def test_launching_a_deleted_run_is_harmless(driver, db):
    in_ray.do_start_in_ray(424242)
    assert driver.calls == []


# --- cancel -------------------------------------------------------------------------


def test_cancel_stops_the_actor_and_marks_the_run_cancelled(driver, make_run):
    run = make_run(status=Status.CANCELLING)
    driver.alive.add(run.pk)
    in_ray.do_stop_in_ray(run.pk)
    assert driver.named("cancel") == [("cancel", run.pk)]
    run.refresh_from_db()
    assert run.status == Status.CANCELLED and run.finished_at is not None


def test_cancel_of_a_run_that_already_finished_does_nothing(driver, make_run):
    run = make_run(status=Status.SUCCEEDED)
    in_ray.do_stop_in_ray(run.pk)
    assert driver.calls == []
    assert status_of(run) == Status.SUCCEEDED


def test_a_failed_cancel_leaves_the_run_cancelling_for_reconcile(driver, make_run):
    run = make_run(status=Status.CANCELLING)
    driver.fail_with = TimeoutError("ray")
    in_ray.do_stop_in_ray(run.pk)
    assert status_of(run) == Status.CANCELLING


def test_cancel_action_marks_cancelling_and_enqueues_the_task(run, owner, enqueued, django_capture_on_commit_callbacks):
    from runs.actions import do_cancel_run

    with django_capture_on_commit_callbacks(execute=True):
        assert do_cancel_run(owner, run) is True
    assert run.status == Status.CANCELLING
    assert enqueued == [("cancel_run", run.pk)]


# --- reconcile ------------------------------------------------------------------------


def test_reconcile_fails_a_running_run_whose_actor_is_gone(driver, make_run):
    run = make_run(status=Status.RUNNING)
    assert reconcile.do_reconcile_runs()["lost"] == 1
    run.refresh_from_db()
    assert run.status == Status.FAILED
    assert run.error.startswith("The run's driver (its Ray actor) is gone from the local Ray cluster")


def _spool_as_a_driver_would(run, settings, status: str, error: str = "") -> list[dict]:
    """A real MetricsReporter whose site is down: it ends by spooling points and status."""
    from workers.run.reporter import MetricsReporter, read_spool

    rep = MetricsReporter(run.pk, "http://127.0.0.1:9", run.ingest_token, settings.ROLLWAY_CACHE_DIR, timeout_s=0.2)
    for step in range(1, 4):
        rep.add("reward/mean", step, 0.25 * step)
    rep.post_status(status, error)
    assert rep.close(timeout_s=0.3) is False
    points, spooled = read_spool(run.pk, settings.ROLLWAY_CACHE_DIR)
    assert spooled == (status, error) and len(points) == 3
    return points


@pytest.mark.parametrize("status", ["succeeded", "failed"])
def test_reconcile_takes_in_what_a_driver_spooled_when_the_site_was_down(driver, make_run, settings, status):
    from runs.models import MetricPoint
    from workers.run.reporter import read_spool, spool_path

    run = make_run(status=Status.RUNNING)
    _spool_as_a_driver_would(run, settings, status, "boom" if status == "failed" else "")
    with open(spool_path(settings.ROLLWAY_CACHE_DIR, run.pk), "a") as f:  # a corrupt point
        f.write('{"series": "reward/mean", "step": -1, "value": 1.0, "time": 0}\n')
    counts = reconcile.do_reconcile_runs()
    run.refresh_from_db()
    assert counts["recovered"] == 1 and counts["lost"] == 0
    assert run.status == (Status.SUCCEEDED if status == "succeeded" else Status.FAILED)
    assert run.error == ("boom" if status == "failed" else "")
    values = sorted(MetricPoint.objects.filter(run=run, series="reward/mean").values_list("step", "value"))
    assert values == [(1, 0.25), (2, 0.5), (3, 0.75)]
    assert read_spool(run.pk, settings.ROLLWAY_CACHE_DIR) == ([], None)  # taken in once


def test_reconcile_still_calls_a_run_lost_whose_spool_has_no_end(driver, make_run, settings):
    run = make_run(status=Status.RUNNING)
    _spool_as_a_driver_would(run, settings, "running")
    assert reconcile.do_reconcile_runs()["lost"] == 1
    run.refresh_from_db()
    assert run.status == Status.FAILED and "is gone from the local Ray cluster" in run.error


def test_reconcile_leaves_live_runs_alone(driver, make_run):
    run = make_run(status=Status.RUNNING)
    driver.alive.add(run.pk)
    reconcile.do_reconcile_runs()
    assert status_of(run) == Status.RUNNING


def test_reconcile_gives_a_starting_run_a_grace_period(driver, make_run, settings):
    settings.ROLLWAY_STARTING_GRACE_S = 60
    fresh = make_run(status=Status.STARTING, status_changed_at=ago(10))
    old = make_run(status=Status.STARTING, status_changed_at=ago(120))
    reconcile.do_reconcile_runs()
    assert status_of(fresh) == Status.STARTING
    assert status_of(old) == Status.FAILED
    assert ("is_alive", fresh.pk) not in driver.calls


def test_reconcile_completes_a_cancel_whose_actor_is_gone(driver, make_run):
    run = make_run(status=Status.CANCELLING)
    assert reconcile.do_reconcile_runs()["cancelled"] == 1
    assert status_of(run) == Status.CANCELLED


def test_reconcile_retries_a_stuck_cancel(driver, make_run, enqueued):
    stuck = make_run(status=Status.CANCELLING, status_changed_at=ago(reconcile.CANCEL_RETRY_S + 5))
    recent = make_run(status=Status.CANCELLING)
    driver.alive |= {stuck.pk, recent.pk}
    reconcile.do_reconcile_runs()
    assert enqueued == [("cancel_run", stuck.pk)]


def test_reconcile_resends_a_launch_nobody_picked_up(driver, make_run, enqueued):
    old = make_run(phase=queue.SCHEDULED, status_changed_at=ago(reconcile.QUEUED_RESEND_S + 5))
    make_run(phase=queue.SCHEDULED)  # just scheduled: the worker has it
    reconcile.do_reconcile_runs()
    assert enqueued == [("launch_run", old.pk)]
    reconcile.do_reconcile_runs()  # its clock was reset: not sent again right away
    assert enqueued == [("launch_run", old.pk)]


def test_reconcile_asks_the_scheduler_to_look_while_runs_wait_in_the_queue(driver, make_run, enqueued):
    make_run(status_changed_at=ago(reconcile.QUEUED_RESEND_S + 5))  # waits: never sent to a worker
    reconcile.do_reconcile_runs()
    assert enqueued == [("schedule_queue", None)]


def test_reconcile_does_not_ask_the_scheduler_when_nothing_waits(driver, make_run, enqueued):
    make_run(status=Status.SUCCEEDED)
    make_run(phase=queue.SCHEDULED)
    reconcile.do_reconcile_runs()
    assert enqueued == []


def test_reconcile_does_not_call_a_run_lost_when_ray_is_unreachable(driver, make_run):
    run = make_run(status=Status.RUNNING)
    driver.fail_with = ConnectionError("no Ray")
    reconcile.do_reconcile_runs()
    assert status_of(run) == Status.RUNNING


def test_reconcile_does_not_touch_ray_without_active_runs(monkeypatch, make_run):
    make_run(status=Status.SUCCEEDED)
    monkeypatch.setattr(in_ray, "ray_lifecycle", lambda: pytest.fail("Ray was asked"))
    assert reconcile.do_reconcile_runs() == {"lost": 0, "cancelled": 0, "resent": 0, "recovered": 0, "resumed": 0}


def test_reconcile_does_not_fail_a_run_that_just_succeeded(driver, make_run, monkeypatch):
    run = make_run(status=Status.RUNNING)

    def finished_meanwhile(run_id, *, ray_address):
        Run.objects.get(pk=run_id).transition(Status.SUCCEEDED)  # the driver's last post
        return False

    monkeypatch.setattr(driver, "is_alive", finished_meanwhile)
    reconcile.do_reconcile_runs()
    run.refresh_from_db()
    assert (run.status, run.error) == (Status.SUCCEEDED, "")


def test_the_beat_schedule_reconciles_every_15_seconds(settings):
    from rollway.celery import app

    entry = app.conf.beat_schedule["reconcile-runs"]
    assert entry["task"] == "runs.tasks.reconcile_runs" == tasks.reconcile_runs.name
    assert entry["schedule"] == 15.0
    assert app.conf.worker_redirect_stdouts is False


def test_each_task_is_registered_under_the_name_the_platform_sends_it_by():
    from rollway.celery import app

    sent = {
        dispatch.LAUNCH_RUN: tasks.launch_run,
        dispatch.CANCEL_RUN: tasks.cancel_run,
        dispatch.RECONCILE_RUNS: tasks.reconcile_runs,
        dispatch.SCHEDULE_QUEUE: tasks.schedule_queue,
    }
    # Stable names: messages already queued and the beat schedule name these.
    assert set(sent) == {
        "runs.tasks.launch_run",
        "runs.tasks.cancel_run",
        "runs.tasks.reconcile_runs",
        "runs.tasks.schedule_queue",
    }
    for name, task in sent.items():
        assert task.name == name and name in app.tasks


def test_the_task_wrappers_call_their_actions(monkeypatch):
    called = []
    monkeypatch.setattr(tasks, "do_start_in_ray", lambda run_id: called.append(("start", run_id)))
    monkeypatch.setattr(tasks, "do_stop_in_ray", lambda run_id: called.append(("stop", run_id)))
    monkeypatch.setattr(tasks, "do_reconcile_runs", lambda: {"lost": 3})
    monkeypatch.setattr(tasks, "do_schedule_queue", lambda: [5, 6])
    tasks.launch_run(7)
    tasks.cancel_run(8)
    assert called == [("start", 7), ("stop", 8)]
    assert tasks.reconcile_runs() == {"lost": 3}
    assert tasks.schedule_queue() == [5, 6]


def test_sending_a_task_name_nobody_registered_fails_the_test(enqueued):
    with pytest.raises(AssertionError, match="no task is registered"):
        dispatch.send("runs.tasks.lunch_run", 1)
    assert enqueued == []
