"""What the engine reports about a run: metric points and the status its driver is in.

Both arrive two ways: posted by the driver's reporter to the ingest endpoints
(api/ingest.py), or, when the site was down as the driver ended, read from the spool it
left behind (runs/reconcile.py). Each way validates against the same `PointIn` and
records through the same `do_*` functions, so the two cannot drift apart.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Annotated, Any, Literal, NotRequired

from django.db import transaction
from pydantic import AfterValidator, ConfigDict, Field, StringConstraints, TypeAdapter, ValidationError
from typing_extensions import TypedDict

from foundation.errors import Forbidden
from runs import events, lineage, tracking
from runs.actions import do_set_run_status
from runs.models import Checkpoint, MetricPoint, Run, RunSchedule
from workers.run.failures import DETAIL_MAX, KINDS
from workers.run.reporter import PHASE_DETAIL_MAX, PHASES, STATUSES

logger = logging.getLogger(__name__)

SERIES_PATTERN = r"^[a-z0-9_./@-]{1,64}$"
# The error a failed run gets when its driver reported none.
NO_REASON = "failed (the driver gave no reason)"
# The status each of the engine's words stands for: the same word on the site.
REPORTED = {word: Run.Status(word) for word in STATUSES}
# The engine's words for its statuses and for what a running run is doing.
ReportedStatus = Literal[STATUSES]  # type: ignore[valid-type]
ReportedPhase = Literal[PHASES]  # type: ignore[valid-type]
FailureKind = Literal[KINDS]  # type: ignore[valid-type]
# Failures a resume may cure: with `checkpoint.max_restarts` left and a checkpoint, the
# site resumes the run from its latest checkpoint (as reconcile does a lost driver). A
# lost node is not the run's doing; a hang (the watchdog's) may be a stuck collective
# or device that fresh processes do not meet again.
RESUMABLE = frozenset({"node_lost", "hang"})
# A record's facts (an actor, a node, a quoted exception line) are short.
FACT_MAX = 2_000
# MetricPoint.step is a bigint: a larger step would fail the write, not the check.
MAX_STEP = 2**63 - 1


def _no_nul(text: str) -> str:
    if "\x00" in text:
        raise ValueError("must not contain a NUL character (\\x00): no text column stores one")
    return text


# For free text the engine reports, stored in text columns (after the length check).
NO_NUL = AfterValidator(_no_nul)


class PointIn(TypedDict):
    """One metric point as the engine sends it. TypedDicts validate straight into dicts:
    no model object per point, which the ingest's throughput needs."""

    __pydantic_config__ = ConfigDict(extra="forbid")  # type: ignore[misc]

    series: Annotated[str, StringConstraints(pattern=SERIES_PATTERN)]
    step: Annotated[int, Field(ge=0, le=MAX_STEP)]
    value: Annotated[float, Field(allow_inf_nan=False)]
    time: Annotated[float, Field(allow_inf_nan=False)]


POINT_IN = TypeAdapter(PointIn)


class FailureIn(TypedDict):
    """A failure's record as the engine posts it (workers.run.failures.Failure.fields)."""

    __pydantic_config__ = ConfigDict(extra="forbid")  # type: ignore[misc]

    kind: FailureKind
    message: Annotated[str, Field(max_length=20_000), NO_NUL]
    actor: NotRequired[Annotated[str, Field(max_length=FACT_MAX), NO_NUL]]
    actor_name: NotRequired[Annotated[str, Field(max_length=FACT_MAX), NO_NUL]]
    node: NotRequired[Annotated[str, Field(max_length=FACT_MAX), NO_NUL]]
    operation: NotRequired[Annotated[str, Field(max_length=FACT_MAX), NO_NUL]]
    error: NotRequired[Annotated[str, Field(max_length=FACT_MAX), NO_NUL]]
    traceback: NotRequired[Annotated[str, Field(max_length=DETAIL_MAX), NO_NUL]]


# What the site keeps of a record where everyone who sees the run sees it: not the traceback.
FAILURE_SHOWN = ("kind", "actor", "actor_name", "node", "operation", "error")


class StatusIn(TypedDict):
    """A status as the engine reports it: posted to the ingest, or spooled by a driver
    that could not post it."""

    __pydantic_config__ = ConfigDict(extra="forbid")  # type: ignore[misc]

    status: ReportedStatus
    # Why a run failed, for people (workers.run.failures), and the traceback behind it,
    # which the run's page shows folded; the engine cuts it to this bound.
    error: NotRequired[Annotated[str, Field(max_length=20_000), NO_NUL]]
    error_detail: NotRequired[Annotated[str, Field(max_length=DETAIL_MAX), NO_NUL]]
    # Which of workers.run.failures.KINDS the failure is: a run that lost a node is resumed.
    error_kind: NotRequired[FailureKind]
    # The failure as the engine recorded it (workers.run.failures.Failure.fields): its
    # traceback is kept for the site's admins, the rest shown with the run.
    failure: NotRequired[FailureIn]
    # What the run is doing now (workers.run.reporter.PHASES), sent with "running".
    phase: NotRequired[ReportedPhase]
    phase_detail: NotRequired[Annotated[str, Field(max_length=PHASE_DETAIL_MAX), NO_NUL]]


STATUS_IN = TypeAdapter(StatusIn)


def valid_points(points: Iterable[Any]) -> list[PointIn]:
    """The points that are valid `PointIn`s (for input read from disk, point by point:
    one bad line does not cost the others)."""
    out = []
    for p in points:
        try:
            out.append(POINT_IN.validate_python(p))
        except ValidationError:
            logger.warning("dropping an invalid metric point: %r", p)
    return out


def do_record_points(run: Run, points: Sequence[PointIn]) -> int:
    """Store points idempotently (one row per run, series, step) and stream them to the
    run's page. `points` are {"series", "step", "value", "time"} dicts, already valid."""
    written = MetricPoint.objects.upsert(run.pk, ((p["series"], p["step"], p["value"], p["time"]) for p in points))
    transaction.on_commit(lambda: events.send_points(run.pk, points))
    transaction.on_commit(lambda: tracking.ask_export(run.pk))
    return written


def do_record_reported_status(
    run: Run,
    reported: str,
    error: str = "",
    error_detail: str = "",
    *,
    error_kind: str = "",
    failure: FailureIn | None = None,
    only_from: Iterable[str] | None = None,
) -> bool:
    """Take in the status the run's driver reported (a key of REPORTED). Only a failure
    keeps an error (`NO_REASON` when the driver gave none), its detail and its record
    (`failure`: its kind wins over `error_kind`); a failure of a RESUMABLE kind is
    resumed from the run's latest checkpoint while `checkpoint.max_restarts` allows
    (`do_resume_failed`). A status the run may not enter (a late "running" on a finished
    run) changes nothing. Returns whether the row changed."""
    status = REPORTED[reported]
    if status != Run.Status.FAILED:
        return do_set_run_status(run, status, only_from=only_from)
    if failure is not None:
        error_kind = failure["kind"]
    with transaction.atomic():
        changed = do_fail_run(run, error or NO_REASON, error_detail, failure=failure, only_from=only_from)
        if changed and error_kind in RESUMABLE:
            do_resume_failed(run)
    return changed


def do_resume_failed(run: Run) -> Run | None:
    """A child run that resumes the just failed `run` from its latest checkpoint, counted
    against the chain's `checkpoint.max_restarts` (runs/lineage.py); the run's error says
    so. None when no restart is left or there is no checkpoint, or when its launcher may
    no longer launch runs in its team (its error then says that it was not resumed, and
    why)."""
    checkpoint = lineage.auto_resume_checkpoint(run)
    if checkpoint is None:
        return None
    try:
        child = lineage.do_auto_resume(run, checkpoint)
    except Forbidden as exc:
        run.error = f"{run.error} It was {exc.message}."
        Run.objects.filter(pk=run.pk).update(error=run.error)
        logger.warning("run %s failed (%s); %s", run.pk, "resumable", exc.message)
        return None
    run.error = (
        f"{run.error} It was resumed as run {child.pk} from its checkpoint at step {checkpoint.step} "
        f"(restart {child.restarts} of checkpoint.max_restarts={lineage.max_restarts(run)})."
    )
    Run.objects.filter(pk=run.pk).update(error=run.error)
    logger.warning("run %s failed (%s); resumed as run %s from step %s", run.pk, "resumable", child.pk, checkpoint.step)
    return child


def do_fail_run(
    run: Run,
    error: str,
    detail: str = "",
    *,
    failure: FailureIn | Mapping[str, str] | None = None,
    only_from: Iterable[str] | None = None,
) -> bool:
    """Mark the run failed with `error` (why, in a sentence or two), `detail` (what that
    was worked out from: the failure's facts, what reconcile saw) and the engine's record
    of it (`failure`: shown without its traceback, which only the site's admins see).
    One transaction, so the run's watchers, told once it commits, get it all. Returns
    whether the row changed."""
    with transaction.atomic():
        changed = do_set_run_status(run, Run.Status.FAILED, error=error, only_from=only_from)
        fields: dict[str, Any] = {}
        if changed and detail:
            fields["error_detail"] = detail
        if changed and failure:
            record = dict(failure)
            fields["failure"] = {k: record[k] for k in FAILURE_SHOWN if record.get(k)}
            fields["error_traceback"] = record.get("traceback", "")
        if fields:
            Run.objects.filter(pk=run.pk).update(**fields)
            for name, value in fields.items():
                setattr(run, name, value)
    return changed


def do_record_phase(run: Run, phase: str, detail: str = "") -> bool:
    """Store the phase the driver reported (a ReportedPhase, already valid) and tell the
    run's watchers once the transaction commits. Only a run that is starting or running
    takes a phase (a late one after the end changes nothing), and the same phase and
    detail again change nothing: the reporter re-sends what it could not deliver.
    Returns whether the row changed."""
    detail = detail[:PHASE_DETAIL_MAX]
    changed = (
        Run.objects.filter(pk=run.pk, status__in=[Run.Status.STARTING, Run.Status.RUNNING])
        .exclude(phase=phase, phase_detail=detail)
        .update(phase=phase, phase_detail=detail)
        == 1
    )
    run.refresh_from_db(fields=["phase", "phase_detail"])
    if changed:
        transaction.on_commit(lambda: events.send_status(run))
    return changed


class CheckpointIn(TypedDict):
    """A checkpoint the run's trainer finished writing (workers.run.reporter.post_checkpoint),
    and the older ones it pruned (`checkpoint.keep_last`), by location."""

    __pydantic_config__ = ConfigDict(extra="forbid")  # type: ignore[misc]

    step: Annotated[int, Field(ge=0, le=MAX_STEP)]
    location: Annotated[str, Field(min_length=1, max_length=1000), NO_NUL]
    bytes: Annotated[int, Field(ge=0, le=MAX_STEP)]
    sha256: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
    pruned: NotRequired[Annotated[list[Annotated[str, Field(max_length=1000), NO_NUL]], Field(max_length=1000)]]


CHECKPOINT_IN = TypeAdapter(CheckpointIn)


def do_record_checkpoint(run: Run, checkpoint: dict) -> Checkpoint:
    """Record a checkpoint (idempotent: a resend of the same step updates its row) and
    forget the ones the engine pruned."""
    with transaction.atomic():
        row, _ = Checkpoint.objects.update_or_create(
            run=run,
            step=checkpoint["step"],
            defaults={k: checkpoint[k] for k in ("location", "bytes", "sha256")},
        )
        pruned = checkpoint.get("pruned") or []
        if pruned:
            Checkpoint.objects.filter(run=run, location__in=pruned).exclude(pk=row.pk).delete()
    return row


class ActorPlace(TypedDict):
    """Where one actor of the run runs (workers.run.actors.where_am_i)."""

    __pydantic_config__ = ConfigDict(extra="forbid")  # type: ignore[misc]

    actor: Annotated[str, Field(min_length=1, max_length=100), NO_NUL]
    node_id: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{1,64}$")]
    node_ip: Annotated[str, Field(max_length=100), NO_NUL]
    labels: Annotated[
        dict[Annotated[str, Field(max_length=100), NO_NUL], Annotated[str, Field(max_length=100), NO_NUL]],
        Field(max_length=50),
    ]
    gpu_ids: Annotated[list[Annotated[str, Field(max_length=50), NO_NUL]], Field(max_length=64)]
    cuda_visible_devices: Annotated[str, Field(max_length=500), NO_NUL]
    pid: Annotated[int, Field(ge=0, le=2**31)]
    # torch's intra-op threads in a computing actor (inference worker, trainer, rank).
    threads: NotRequired[Annotated[int, Field(ge=1, le=4096)] | None]


class PlacementIn(TypedDict):
    """Where the run's actors run, as the driver reports once they are up
    (workers.run.reporter.post_placement)."""

    __pydantic_config__ = ConfigDict(extra="forbid")  # type: ignore[misc]

    actors: Annotated[list[ActorPlace], Field(max_length=2000)]


PLACEMENT_IN = TypeAdapter(PlacementIn)


def do_record_placement(run: Run, placement: dict) -> bool:
    """Keep where the run's actors run (the latest report replaces an earlier one).
    Returns whether the row changed."""
    actors = placement["actors"]
    return Run.objects.filter(pk=run.pk).exclude(placement=actors).update(placement=actors) == 1


# --- schedule ------------------------------------------------------------------------

# A long run's schedule is a few hundred bytes a step: the ingest's body limit
# (ROLLWAY_MAX_INGEST_BODY_BYTES) bounds what one report holds; these bound the lists'
# lengths before that, as the other reports' do.
SCHEDULE_MAX_ADMISSIONS = 2_000_000
SCHEDULE_MAX_BATCHES = 1_000_000
SCHEDULE_MAX_BATCH_GROUPS = 100_000
Count = Annotated[int, Field(ge=0, le=2**62)]
GroupId = Annotated[str, Field(min_length=1, max_length=200), NO_NUL]


class ScheduleIn(TypedDict):
    """The schedule a run recorded (workers.run.schedule.schedule_json), as its driver
    reports once its loops have stopped (workers.run.reporter.post_schedule)."""

    __pydantic_config__ = ConfigDict(extra="forbid")  # type: ignore[misc]

    # [worker, version its call started on, groups admitted]
    admissions: Annotated[list[tuple[Count, Count, Count]], Field(max_length=SCHEDULE_MAX_ADMISSIONS)]
    # [version, [group id, ...] in the order trained]
    batches: Annotated[
        list[tuple[Count, Annotated[list[GroupId], Field(max_length=SCHEDULE_MAX_BATCH_GROUPS)]]],
        Field(max_length=SCHEDULE_MAX_BATCHES),
    ]
    # [worker, call, decode step, version]: weights loaded inside a generate call
    loads: NotRequired[Annotated[list[tuple[Count, Count, Count, Count]], Field(max_length=SCHEDULE_MAX_ADMISSIONS)]]
    # [worker, call, [group id, ...]]: the stale groups a call took to generate again
    requeues: NotRequired[
        Annotated[
            list[tuple[Count, Count, Annotated[list[GroupId], Field(max_length=SCHEDULE_MAX_BATCH_GROUPS)]]],
            Field(max_length=SCHEDULE_MAX_ADMISSIONS),
        ]
    ]
    bytes: NotRequired[Count]
    bytes_per_step: NotRequired[Annotated[float, Field(ge=0, allow_inf_nan=False)]]


SCHEDULE_IN = TypeAdapter(ScheduleIn)


def do_record_schedule(run: Run, schedule: dict) -> RunSchedule:
    """Keep the run's schedule (a later report replaces an earlier one)."""
    kept = {
        "admissions": [list(a) for a in schedule["admissions"]],
        "batches": [[version, list(ids)] for version, ids in schedule["batches"]],
        "loads": [list(x) for x in schedule.get("loads", [])],
        "requeues": [[worker, call, list(ids)] for worker, call, ids in schedule.get("requeues", [])],
    }
    size = len(json.dumps(kept, separators=(",", ":")))
    row, _ = RunSchedule.objects.update_or_create(
        run=run, defaults={**kept, "bytes": size, "steps": len(kept["batches"])}
    )
    return row
