"""Celery tasks: launch, cancel and reconcile runs. Each is short and idempotent.

A task never lives as long as its run (a long task is redelivered after the broker's
visibility timeout and launches twice): the run lives in Ray as the detached actor
"run-<id>" that `workers.lifecycle` launches, and the Run row is reconciled to it.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from runs.actions import NO_REASON, do_record_points, do_set_run_status, valid_points
from runs.models import Run

logger = logging.getLogger(__name__)

# A queued run the worker has not claimed by then gets its launch message sent again
# (the first may have been lost with the web process); launch_run is idempotent.
QUEUED_RESEND_S = 60
# A cancel still in flight this long after it was asked for is sent again.
CANCEL_RETRY_S = 30

Status = Run.Status


def _driver():
    # Imported on use: it pulls in Ray, which the web process never needs.
    from workers import lifecycle

    return lifecycle


def _load(run_id: int) -> Run | None:
    run = Run.objects.select_related("experiment__team").filter(pk=run_id).first()
    if run is None:
        logger.warning("run %s does not exist (deleted?)", run_id)
    return run


@shared_task(ignore_result=True)
def launch_run(run_id: int) -> None:
    """Claim a queued run (queued → starting) and start its driver actor in Ray."""
    run = _load(run_id)
    if run is None:
        return
    if not do_set_run_status(run, Status.STARTING, only_from=[Status.QUEUED]):
        logger.info("run %s is %s: not launching it again", run_id, run.status)
        return
    driver = _driver()
    started = time.monotonic()
    try:
        actor = driver.launch(
            run.pk,
            run.config,
            ingest_url=settings.ROLLWAY_PUBLIC_URL,
            token=run.ingest_token,
            cache_dir=settings.ROLLWAY_CACHE_DIR,
            ray_address=settings.RAY_ADDRESS,
        )
    except Exception as exc:  # noqa: BLE001 - any failure is the run's, with its reason
        logger.exception("run %s: launch failed", run_id)
        do_set_run_status(run, Status.FAILED, error=f"launch failed: {type(exc).__name__}: {exc}")
        return
    Run.objects.filter(pk=run.pk).update(ray_actor=str(actor or ""))
    logger.info("run %s: driver actor %s up in %.1f s", run_id, actor, time.monotonic() - started)

    run.refresh_from_db(fields=["status"])
    if run.status in (Status.CANCELLING, Status.CANCELLED):
        # The user cancelled while the actor was being created; cancel_run may have found
        # nothing to stop yet, so stop what this task just started.
        logger.info("run %s was cancelled during launch; stopping its actors", run_id)
        driver.cancel(run.pk, ray_address=settings.RAY_ADDRESS)


@shared_task(ignore_result=True)
def cancel_run(run_id: int) -> None:
    """Stop a cancelling run's actors, then mark it cancelled. On a Ray error the run
    stays cancelling and reconcile_runs tries again."""
    run = _load(run_id)
    if run is None:
        return
    if run.status != Status.CANCELLING:
        logger.info("run %s is %s: nothing to cancel", run_id, run.status)
        return
    try:
        found = _driver().cancel(run.pk, ray_address=settings.RAY_ADDRESS, timeout_s=10.0)
    except Exception:  # noqa: BLE001
        logger.exception("run %s: cancel failed; reconcile will retry", run_id)
        return
    logger.info("run %s: driver %s", run_id, "stopped" if found else "was not running")
    do_set_run_status(run, Status.CANCELLED, only_from=[Status.CANCELLING])


@shared_task(ignore_result=True)
def reconcile_runs() -> dict[str, int]:
    """Bring the DB in line with Ray (run every 15 s by beat): runs whose driver actor
    is gone fail as lost (after a grace period for starting ones) unless their spool
    holds the final status they could not deliver (it is taken in, with the spooled
    points), cancelling runs whose actor is gone become cancelled, stuck cancels and
    launches are sent again."""
    now = timezone.now()
    counts = {"lost": 0, "cancelled": 0, "resent": 0, "recovered": 0}

    for run in Run.objects.filter(
        status=Status.QUEUED, status_changed_at__lt=now - timedelta(seconds=QUEUED_RESEND_S)
    ):
        # Touch the clock so a worker that is down gets one message a minute, not a pile.
        Run.objects.filter(pk=run.pk, status=Status.QUEUED).update(status_changed_at=now)
        launch_run.delay(run.pk)
        counts["resent"] += 1

    grace = timedelta(seconds=settings.ROLLWAY_STARTING_GRACE_S)
    candidates = [
        run
        for run in Run.objects.filter(
            status__in=[Status.STARTING, Status.RUNNING, Status.CANCELLING]
        ).select_related("experiment__team")
        if not (run.status == Status.STARTING and now - run.status_changed_at < grace)
    ]
    if not candidates:
        return counts  # nothing to ask Ray: do not even connect to it

    driver = _driver()
    for run in candidates:
        try:
            alive = driver.is_alive(run.pk, ray_address=settings.RAY_ADDRESS)
        except Exception:  # noqa: BLE001 - Ray unreachable is no proof a run is lost
            logger.exception("reconcile: cannot ask Ray about run %s; trying next time", run.pk)
            return counts
        if alive:
            if (
                run.status == Status.CANCELLING
                and now - run.status_changed_at > timedelta(seconds=CANCEL_RETRY_S)
            ):
                cancel_run.delay(run.pk)
                counts["resent"] += 1
            continue
        if _recover_from_spool(run):
            counts["recovered"] += 1
            continue
        if run.status == Status.CANCELLING:
            if do_set_run_status(run, Status.CANCELLED, only_from=[Status.CANCELLING]):
                counts["cancelled"] += 1
        # only_from the state we saw: a run that just finished keeps its real outcome
        elif do_set_run_status(run, Status.FAILED, error=Run.LOST_REASON, only_from=[run.status]):
            logger.warning("run %s lost: its driver actor is gone", run.pk)
            counts["lost"] += 1
    return counts


# What a driver may report as its end (workers.reporter.STATUSES minus "running").
SPOOLED_END = {"succeeded": Status.SUCCEEDED, "failed": Status.FAILED}


def _recover_from_spool(run: Run) -> bool:
    """Take in what the gone driver of `run` could not deliver (the site was down when
    it ended): its spooled points, and its final status. True if that ended the run."""
    from workers.reporter import clear_spool, read_spool

    points, status = read_spool(run.pk, settings.ROLLWAY_CACHE_DIR)
    if not points and status is None:
        return False
    valid = valid_points(points)
    if valid:
        do_record_points(run, valid)
    ended = False
    if status is not None and status[0] in SPOOLED_END:
        end = SPOOLED_END[status[0]]
        error = (status[1] or NO_REASON) if end == Status.FAILED else ""
        ended = do_set_run_status(run, end, error=error, only_from=[run.status])
    clear_spool(run.pk, settings.ROLLWAY_CACHE_DIR)
    logger.info("run %s: took in %d spooled points%s", run.pk, len(valid), f" and status {status[0]}" if status else "")
    return ended
