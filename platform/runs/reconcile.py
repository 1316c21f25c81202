"""Reconciling the Run rows with Ray (beat runs it every 15 s).

The row is the source of truth for a run's state, but the run itself lives in Ray, and
messages get lost: a launch sent while the worker was down, a cancel that hit a Ray
error, a driver that died, or one that ended while the site was down and could only
spool its last points and status. Reconcile finds each of these from the rows and
either sends the task again or settles the run.

A run it settles as lost says what reconcile knows (`lost_reason`): the driver actor is
gone from Ray, since when the run was silent and what it last reported. It never settles
a run while Ray cannot be asked: an unreachable Ray is no proof that a run is lost.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from pydantic import ValidationError

from foundation.errors import Forbidden
from runs import dispatch, in_ray, lineage, queue
from runs.actions import do_set_run_status
from runs.models import Checkpoint, MetricPoint, Run
from runs.reports import STATUS_IN, do_fail_run, do_record_points, do_record_reported_status, valid_points
from workers.run.reporter import STATUSES, clear_spool, read_spool, read_spooled_status

logger = logging.getLogger(__name__)

# A run the queue scheduled that no worker has claimed by then gets its launch message
# sent again (the first may have been lost with the worker); launching is idempotent.
QUEUED_RESEND_S = 60
# A cancel still in flight this long after it was asked for is sent again.
CANCEL_RETRY_S = 30
# What a driver may spool as its end: the engine's statuses that end a run ("running" is
# not one: such a run is still lost).
SPOOLED_ENDS = tuple(word for word in STATUSES if Run.Status(word) in Run.TERMINAL)

Status = Run.Status


def do_reconcile_runs() -> dict[str, int]:
    """Bring the DB in line with Ray: runs whose driver actor is gone fail as lost (after
    a grace period for starting ones) unless their spool holds the final status they
    could not deliver (it is taken in, with the spooled points), cancelling runs whose
    actor is gone become cancelled, stuck cancels and launches are sent again. Returns
    how many runs each of these happened to."""
    now = timezone.now()
    counts = {"lost": 0, "cancelled": 0, "resent": 0, "recovered": 0, "resumed": 0}
    counts["resent"] += _resend_queue_messages(now)

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

    lifecycle = in_ray.ray_lifecycle()
    try:
        in_ray.record_capacity(lifecycle.cluster_capacity(ray_address=settings.RAY_ADDRESS))
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
        outcome = _settle_gone(run, now)
        if outcome:
            counts[outcome] += 1
    return counts


def _resend_queue_messages(now: datetime) -> int:
    """Send again the launch of each run scheduled long ago that no worker claimed, and
    have the scheduler look while runs wait; how many launches were sent."""
    stuck = Run.objects.filter(
        status=Status.QUEUED, phase=queue.SCHEDULED, status_changed_at__lt=now - timedelta(seconds=QUEUED_RESEND_S)
    )
    resent = 0
    for run in stuck:
        # Touch the clock so a worker that is down gets one message a minute, not a pile.
        Run.objects.filter(pk=run.pk, status=Status.QUEUED).update(status_changed_at=now)
        dispatch.send(dispatch.LAUNCH_RUN, run.pk)
        resent += 1
    if Run.objects.filter(status=Status.QUEUED).exclude(phase=queue.SCHEDULED).exists():
        # The queue's state is all in the rows: whatever message was lost (a restart of
        # web, worker or beat), this pass sees the waiting runs and schedules them.
        dispatch.send(dispatch.SCHEDULE_QUEUE)
    return resent


def _settle_gone(run: Run, now: datetime) -> str:
    """Settle a run whose driver actor is gone: "recovered" from its spool, "cancelled",
    "resumed" from its checkpoint or "lost"; "" if it ended meanwhile."""
    # Whatever the driver left in its scratch directory goes too.
    in_ray.remove_run_scratch(run.pk)
    if do_take_in_spool(run):
        return "recovered"
    if run.status == Status.CANCELLING:
        return "cancelled" if do_set_run_status(run, Status.CANCELLED, only_from=[Status.CANCELLING]) else ""
    if run.status == Status.RUNNING and (checkpoint := lineage.auto_resume_checkpoint(run)):
        return do_resume_lost(run, checkpoint, now)
    # only_from the state we saw: a run that just finished keeps its real outcome
    if do_fail_run(run, *lost_reason(run, now), only_from=[run.status]):
        logger.warning("run %s lost: %s", run.pk, run.error)
        return "lost"
    return ""


def do_resume_lost(run: Run, checkpoint: Checkpoint, now: datetime) -> str:
    """A running run whose driver is gone, with restarts left (`checkpoint.max_restarts`):
    it fails saying so, and a child run resumes it from `checkpoint` (runs/lineage.py),
    in one transaction: "resumed". When its launcher may no longer launch runs in its
    team it fails as lost, its error saying why it was not resumed: "lost". "" if the
    run changed meanwhile (it is left alone)."""
    error, detail = lost_reason(run, now)  # the facts stay either way
    with transaction.atomic():
        if not do_fail_run(run, "", detail, only_from=[run.status]):
            return ""
        try:
            child = lineage.do_auto_resume(run, checkpoint)
        except Forbidden as exc:
            message, outcome = f"{error} It was {exc.message}.", "lost"
        else:
            message, outcome = (
                f"The run's driver died; it was resumed as run {child.pk} from its checkpoint at step "
                f"{checkpoint.step} (restart {child.restarts} of checkpoint.max_restarts={lineage.max_restarts(run)}).",
                "resumed",
            )
        Run.objects.filter(pk=run.pk).update(error=message)
        run.error = message
    if outcome == "resumed":
        logger.warning("run %s lost; resumed as run %s from step %s", run.pk, child.pk, checkpoint.step)
    else:
        logger.warning("run %s lost: %s", run.pk, run.error)
    return outcome


def lost_reason(run: Run, now: datetime) -> tuple[str, str]:
    """(error, detail) for a run whose driver actor Ray does not have: what is known of
    how it went, in a sentence for the run's page and the facts behind it."""
    # The name its launch recorded (workers.core.run_actors names it; importing that here
    # would load Ray into every process that imports the reconcile).
    actor = f"Ray actor {run.ray_actor}" if run.ray_actor else "its Ray actor"
    where = f"Ray at {settings.RAY_ADDRESS}" if settings.RAY_ADDRESS else "the local Ray cluster"
    last_step = (
        MetricPoint.objects.filter(run=run, series="policy/version")
        .order_by("-step")
        .values_list("step", "time")
        .first()
    )
    if run.status == Status.STARTING:
        error = (
            f"The run's driver ({actor}) never appeared in {where} within "
            f"ROLLWAY_STARTING_GRACE_S={settings.ROLLWAY_STARTING_GRACE_S} s of its launch: the launch was lost "
            "or the driver died as it started. Launch the run again."
        )
    else:
        heard = ", ".join([*([run.phase] if run.phase else []), f"step {last_step[0]}" if last_step else "no step"])
        error = (
            f"The run's driver ({actor}) is gone from {where} without reporting how the run ended "
            f"(last heard: {heard}): it was killed, crashed or lost its node. Launch the run again; the "
            "driver's log in Ray may say more."
        )
    facts = [
        f"Reconcile at {now.isoformat()}: {where} has no live driver actor for run {run.pk} "
        f"({run.ray_actor or 'no actor name recorded'}).",
        f"Status {run.status} since {run.status_changed_at.isoformat()}; launched at "
        f"{run.launched_at.isoformat() if run.launched_at else '-'}, running since "
        f"{run.started_at.isoformat() if run.started_at else '-'}.",
        f"Last phase reported: {run.phase or '-'}{f' ({run.phase_detail})' if run.phase_detail else ''}.",
        f"Last trained step: {last_step[0]} at unix time {last_step[1]:.0f}."
        if last_step
        else "No trained step was reported.",
    ]
    return error, "\n".join(facts)


def do_take_in_spool(run: Run) -> bool:
    """Take in what the gone driver of `run` could not deliver (the site was down when
    it ended): its spooled points, and its final status. True if that ended the run."""
    points, _ = read_spool(run.pk, settings.ROLLWAY_CACHE_DIR)
    status = spooled_status(run)
    if not points and status is None:
        return False
    valid = valid_points(points)
    if valid:
        do_record_points(run, valid)
    ended = False
    if status is not None and status["status"] in SPOOLED_ENDS:
        ended = do_record_reported_status(
            run,
            status["status"],
            status.get("error", ""),
            status.get("error_detail", ""),
            error_kind=status.get("error_kind", ""),
            failure=status.get("failure"),
            only_from=[run.status],
        )
    clear_spool(run.pk, settings.ROLLWAY_CACHE_DIR)
    logger.info(
        "run %s: took in %d spooled points%s",
        run.pk,
        len(valid),
        f" and status {status['status']}" if status else "",
    )
    return ended


def spooled_status(run: Run) -> dict | None:
    """The final status the gone driver of `run` spooled, validated as a posted status
    is (runs.reports.StatusIn), or None (none, or not valid: logged)."""
    spooled = read_spooled_status(run.pk, settings.ROLLWAY_CACHE_DIR)
    if spooled is None:
        return None
    # The spool keeps an unset phase as "", which a post leaves out.
    body = {key: value for key, value in spooled.items() if value != "" or key == "status"}
    try:
        return STATUS_IN.validate_python(body)
    except ValidationError as exc:
        logger.warning("run %s: ignoring an invalid spooled status: %s", run.pk, exc)
        return None
