"""A run's life in Ray, the site's one seam to it: start a queued run's driver actor, stop
a cancelling run's actors, and what the cluster has.

The run lives in Ray as the detached actor "run-<id>", not in the Celery task that
starts it: a task as long as its run would be redelivered after the broker's visibility
timeout and launch it twice. So each call here is short and idempotent, and the Run row
is reconciled to the actor afterwards (runs/reconcile.py).

Every call into Ray goes through `ray_lifecycle()`: workers.run.lifecycle (connect, launch,
cancel, is_alive) is all the platform needs of it. Tests put a fake in its place.
"""

from __future__ import annotations

import logging
import time

from django.conf import settings
from django.db import DatabaseError

from configs import policy
from configs.models import ClusterCapacity
from runs import lineage
from runs.actions import do_set_run_status
from runs.models import Run
from runs.reports import do_fail_run
from workers.run.failures import explain
from workers.run.paths import remove_scratch

logger = logging.getLogger(__name__)

Status = Run.Status


def ray_lifecycle():
    """The module workers.run.lifecycle, imported on first use: it pulls in Ray, which the
    web process never needs."""
    from workers.run import lifecycle

    return lifecycle


def load_run(run_id: int) -> Run | None:
    """The run with its team, or None (logged) if it was deleted since it was enqueued."""
    run = Run.objects.select_related("experiment__team", "resume_from").filter(pk=run_id).first()
    if run is None:
        logger.warning("run %s does not exist (deleted?)", run_id)
    return run


def record_capacity(capacity) -> None:
    """Remember what the cluster has, for the web's config checks (configs/policy.py).
    Best effort: a busy database (SQLite's "database is locked" under load) must not fail
    the launch it is part of; the next look at the cluster records it."""
    try:
        ClusterCapacity.record(capacity)
    except DatabaseError:
        logger.warning("could not record the cluster's capacity this time", exc_info=True)


def remove_run_scratch(run_id: int) -> bool:
    """Remove run `run_id`'s scratch directory (its driver removes it itself when it can;
    this covers a driver that was killed or lost). True if there was one."""
    return remove_scratch(policy.confinement().scratch_dir(run_id))


def do_start_in_ray(run_id: int) -> None:
    """Claim a queued run (queued → starting) and start its driver actor in Ray. A launch
    that fails marks the run failed with the reason, unless its user cancelled it
    meanwhile (its cancel ends it)."""
    run = load_run(run_id)
    if run is None:
        return
    if run.status == Status.QUEUED and run.phase != Run.QUEUE_SCHEDULED:
        # Only the queue's scheduler lets a run start (a message from before the queue,
        # or a stray resend, must not get past its limits); scheduling is never undone
        # while a run is queued, so this check cannot race with it.
        logger.info("run %s is not scheduled by the queue yet: not launching it", run_id)
        return
    # The claim: starting may be entered from queued only, and the UPDATE is conditional,
    # so of two deliveries of this task exactly one goes on.
    if not do_set_run_status(run, Status.STARTING):
        logger.info("run %s is %s: not launching it again", run_id, run.status)
        return
    # The queue's mark has done its job; the driver reports the phases of a starting run.
    Run.objects.filter(pk=run.pk, phase=Run.QUEUE_SCHEDULED).update(phase="", phase_detail="")
    lifecycle = ray_lifecycle()
    started = time.monotonic()
    try:
        # Checked again against the cluster as it is now (the launch saw the last
        # capacity recorded, or none): nothing that can never fit reaches Ray.
        capacity = lifecycle.cluster_capacity(ray_address=settings.RAY_ADDRESS)
        record_capacity(capacity)
        refused = policy.config_errors(run.run_config, capacity)
        if refused:
            reason = "; ".join(f"{name}: {message}" for name, message in refused.items())
            logger.warning("run %s refused before start: %s", run_id, reason)
            do_set_run_status(run, Status.FAILED, error=f"refused: {reason}")
            return
        # A resumed run (runs/lineage.py) starts from its parent's checkpoint; a replay
        # follows its parent's schedule.
        resume = {"resume_from": run.resume_from.location} if run.resume_from is not None else {}
        schedule = lineage.replayed_schedule(run)
        replay = {"replay": schedule} if schedule is not None else {}
        # The driver's own token, issued now: the site keeps only its hash, so this is
        # the one moment the clear token exists, and each launch (a retry's, a resume's)
        # gets its own.
        token = run.issue_ingest_token()
        actor = lifecycle.launch(
            run.pk,
            run.run_config,
            ingest_url=settings.ROLLWAY_PUBLIC_URL,
            token=token,
            cache_dir=settings.ROLLWAY_CACHE_DIR,
            ray_address=settings.RAY_ADDRESS,
            confinement=policy.confinement(),
            **resume,
            **replay,
        )
    except Exception as exc:
        if _cancelled_meanwhile(run):
            # The user cancelled while the driver was being created, and cancel_run's kill
            # is what stopped the launch (the driver died under it): the run ends as its
            # user asked, cancelled by cancel_run, not failed with the kill as its reason.
            logger.info("run %s was cancelled during launch, which then stopped: %r", run_id, exc)
            return
        # Whatever stopped the launch (Ray unreachable, a driver that would not start) is
        # this run's failure: the user sees the reason instead of a run stuck starting.
        logger.exception("run %s: launch failed", run_id)
        failure = explain(exc, ray_address=settings.RAY_ADDRESS, what="The launch")
        do_fail_run(run, failure.message, failure.detail, failure=failure.fields())
        return
    Run.objects.filter(pk=run.pk).update(ray_actor=str(actor or ""))
    logger.info("run %s: driver actor %s up in %.1f s", run_id, actor, time.monotonic() - started)

    if _cancelled_meanwhile(run):
        # The user cancelled while the actor was being created; cancel_run may have found
        # nothing to stop yet, so stop what this call just started.
        logger.info("run %s was cancelled during launch; stopping its actors", run_id)
        lifecycle.cancel(run.pk, ray_address=settings.RAY_ADDRESS)


def _cancelled_meanwhile(run: Run) -> bool:
    """Whether the user cancelled `run` while this task was launching it (its status as
    stored now, not as this task loaded it)."""
    run.refresh_from_db(fields=["status"])
    return run.status in (Status.CANCELLING, Status.CANCELLED)


def do_stop_in_ray(run_id: int) -> None:
    """Stop a cancelling run's actors, then mark it cancelled. On a Ray error the run
    stays cancelling and reconcile tries again."""
    run = load_run(run_id)
    if run is None:
        return
    if run.status != Status.CANCELLING:
        logger.info("run %s is %s: nothing to cancel", run_id, run.status)
        return
    try:
        found = ray_lifecycle().cancel(run.pk, ray_address=settings.RAY_ADDRESS, timeout_s=10.0)
    except Exception:
        # Ray unreachable or actors outliving the timeout: the run stays cancelling, and
        # reconcile sends the cancel again, so nothing is lost by not raising here.
        logger.exception("run %s: cancel failed; reconcile will retry", run_id)
        return
    logger.info("run %s: driver %s", run_id, "stopped" if found else "was not running")
    # A driver stopped gracefully removed its scratch; one that had to be killed did not.
    remove_run_scratch(run.pk)
    do_set_run_status(run, Status.CANCELLED, only_from=[Status.CANCELLING])
