"""Reconciling the Run rows with Ray (beat runs it every 15 s).

The row is the source of truth for a run's state, but the run itself lives in Ray, and
messages get lost: a launch sent while the worker was down, a cancel that hit a Ray
error, a driver that died, or one that ended while the site was down and could only
spool its last points and status. Reconcile finds each of these from the rows and
either sends the task again or settles the run.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from runs import admission, dispatch, engine, queue
from runs.actions import do_set_run_status
from runs.models import ClusterCapacity, Run
from runs.reports import do_record_points, do_record_reported_status, valid_points
from workers.reporter import clear_spool, read_spool

logger = logging.getLogger(__name__)

# A run the queue admitted that no worker has claimed by then gets its launch message
# sent again (the first may have been lost with the worker); launching is idempotent.
QUEUED_RESEND_S = 60
# A cancel still in flight this long after it was asked for is sent again.
CANCEL_RETRY_S = 30
# What a driver may spool as its end ("running" is not one: such a run is still lost).
SPOOLED_ENDS = ("succeeded", "failed")

Status = Run.Status


def do_reconcile_runs() -> dict[str, int]:
    """Bring the DB in line with Ray: runs whose driver actor is gone fail as lost (after
    a grace period for starting ones) unless their spool holds the final status they
    could not deliver (it is taken in, with the spooled points), cancelling runs whose
    actor is gone become cancelled, stuck cancels and launches are sent again. Returns
    how many runs each of these happened to."""
    now = timezone.now()
    counts = {"lost": 0, "cancelled": 0, "resent": 0, "recovered": 0}

    stuck = Run.objects.filter(
        status=Status.QUEUED, phase=queue.ADMITTED, status_changed_at__lt=now - timedelta(seconds=QUEUED_RESEND_S)
    )
    for run in stuck:
        # Touch the clock so a worker that is down gets one message a minute, not a pile.
        Run.objects.filter(pk=run.pk, status=Status.QUEUED).update(status_changed_at=now)
        dispatch.send(dispatch.LAUNCH_RUN, run.pk)
        counts["resent"] += 1
    if Run.objects.filter(status=Status.QUEUED).exclude(phase=queue.ADMITTED).exists():
        # The queue's state is all in the rows: whatever message was lost (a restart of
        # web, worker or beat), this pass sees the waiting runs and schedules them.
        dispatch.send(dispatch.SCHEDULE_QUEUE)

    grace = timedelta(seconds=settings.ROLLWAY_STARTING_GRACE_S)
    candidates = [
        run
        for run in Run.objects.filter(status__in=[Status.STARTING, Status.RUNNING, Status.CANCELLING]).select_related(
            "experiment__team"
        )
        if not (run.status == Status.STARTING and now - run.status_changed_at < grace)
    ]
    if not candidates:
        return counts  # nothing to ask Ray: do not even connect to it

    lifecycle = engine.ray_lifecycle()
    try:
        ClusterCapacity.record(lifecycle.cluster_capacity(ray_address=settings.RAY_ADDRESS))
    except Exception:
        # Only the launch check's view of the cluster goes stale; settling runs goes on.
        logger.warning("reconcile: cannot read the cluster's capacity", exc_info=True)
    for run in candidates:
        try:
            alive = lifecycle.is_alive(run.pk, ray_address=settings.RAY_ADDRESS)
        except Exception:
            # Any error reaching Ray is no proof a run is lost: settle nothing this time.
            logger.exception("reconcile: cannot ask Ray about run %s; trying next time", run.pk)
            return counts
        if alive:
            if run.status == Status.CANCELLING and now - run.status_changed_at > timedelta(seconds=CANCEL_RETRY_S):
                dispatch.send(dispatch.CANCEL_RUN, run.pk)
                counts["resent"] += 1
            continue
        # The driver is gone: whatever it left in its scratch directory goes too.
        admission.remove_run_scratch(run.pk)
        if do_take_in_spool(run):
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


def do_take_in_spool(run: Run) -> bool:
    """Take in what the gone driver of `run` could not deliver (the site was down when
    it ended): its spooled points, and its final status. True if that ended the run."""
    points, status = read_spool(run.pk, settings.ROLLWAY_CACHE_DIR)
    if not points and status is None:
        return False
    valid = valid_points(points)
    if valid:
        do_record_points(run, valid)
    ended = False
    if status is not None and status[0] in SPOOLED_ENDS:
        reported, error = status
        ended = do_record_reported_status(run, reported, error, only_from=[run.status])
    clear_spool(run.pk, settings.ROLLWAY_CACHE_DIR)
    logger.info(
        "run %s: took in %d spooled points%s",
        run.pk,
        len(valid),
        f" and status {status[0]}" if status else "",
    )
    return ended
