"""A run's config and series, exported to experiment trackers while it runs: MLflow,
TensorBoard and W&B, each a sink behind one interface, fed by one loop.

Why the platform and not the engine: every series already reaches the platform (the
driver's reporter posts it to the ingest), so exporting from here needs nothing of the
engine, no tracker credentials on the Ray cluster, and no tracker client in its image;
a tracker that is down slows no training step; and the export can be checked against
what the platform stored. The cost is a lag of about one reporter batch.

Each sink the operator turned on (settings: ROLLWAY_MLFLOW_TRACKING_URI,
ROLLWAY_TENSORBOARD_DIR, ROLLWAY_WANDB_PROJECT) gets every run whose launch chose no
trackers, and the runs that named it (`Run.trackers`): its config once, then its
points (series name, step, value, measurement time). The ingest asks for an export at
most every EXPORT_EVERY_S per run (the Celery task `export_run_metrics`), and the run's
end asks for a last one that also closes the run in each tracker with its outcome.

Each export sends a sink the points stored since its cursor, in order of their row id,
and the sink records the last id it took with them (MLflow: the run's tag
`rollway.exported_point_id`; TensorBoard: a file beside the event files; W&B: a summary
key), so an export that fails half way resumes where it stopped, and a sink that was down
catches up without holding the others back. A point the reporter sends again (an upsert
of the same row) keeps its id and is not sent twice; a point that replaces another at the
same step is not sent again either.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

from django.db import connection, transaction

from runs import dispatch, sinks
from runs.models import MetricPoint, Run
from runs.sinks.base import BATCH, Point, flatten

__all__ = ["EXPORT_EVERY_S", "ask_export", "do_export_run", "enabled", "flatten"]

logger = logging.getLogger(__name__)

# How often the ingest asks for an export of one run: more often → more Celery tasks and
# tracker requests per run; less often → the trackers' charts lag further behind.
EXPORT_EVERY_S = 5.0
# pg_try_advisory_xact_lock's first key: this module's exports, one lock per run.
_LOCK_CLASS = 0x524C_4D46  # "RLMF"

_last_asked: dict[int, float] = {}


def enabled() -> bool:
    """Whether this site exports runs to any tracker."""
    return bool(sinks.configured())


def ask_export(run_id: int, *, final: bool = False) -> None:
    """Have the Celery worker export the run's new points (and close its tracker runs
    when `final`), at most every EXPORT_EVERY_S per run unless final. Call once the
    points or the run's end are committed."""
    if not enabled():
        return
    now = time.monotonic()
    if not final and now - _last_asked.get(run_id, -EXPORT_EVERY_S) < EXPORT_EVERY_S:
        return
    _last_asked[run_id] = now
    if final:
        _last_asked.pop(run_id, None)
    dispatch.send_or_log(dispatch.FINISH_RUN_METRICS if final else dispatch.EXPORT_RUN_METRICS, run_id)


def _new_points(run_id: int, after_id: int) -> Iterator[list[Point]]:
    """The run's points stored after row `after_id`, BATCH at a time, in row order."""
    while True:
        rows = list(
            MetricPoint.objects.filter(run_id=run_id, pk__gt=after_id)
            .order_by("pk")
            .values_list("pk", "series", "step", "value", "time")[:BATCH]
        )
        if not rows:
            return
        yield rows
        after_id = rows[-1][0]


def _locked(run_id: int) -> bool:
    """Take this run's export lock until the transaction ends; False if another export
    of the run holds it (it sends these points too). SQLite has one writer: no lock."""
    if connection.vendor != "postgresql":
        return True
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(%s, %s)", [_LOCK_CLASS, run_id])
        return bool(cursor.fetchone()[0])


def _export_to(sink, run: Run, final: bool) -> int:
    """Send one sink the run's points after its cursor (and the run's outcome when
    `final`); the number of points sent."""
    export = sink.open_export(run)
    sent = 0
    try:
        for rows in _new_points(run.pk, export.cursor()):
            export.send(rows)
            sent += len(rows)
        if final and run.status in Run.TERMINAL:
            export.finish(run.status)
    finally:
        export.close()
    if sent:
        logger.info("run %s: %d points exported to %s", run.pk, sent, sink.NAME, extra={"run_id": run.pk})
    return sent


def do_export_run(run_id: int, *, final: bool = False) -> int:
    """Send each configured tracker the run's points it does not have yet; when `final`,
    also close the run there with its outcome. Returns the most points any one tracker
    took (0 when exporting is off, or another export of the run is under way). A tracker
    that fails holds back no other: the rest are sent, then its error is raised (the
    Celery task fails and the next export resumes it from its cursor)."""
    if not sinks.configured():
        return 0
    run = Run.objects.select_related("experiment__team").get(pk=run_id)
    configured = sinks.for_run(run.trackers)
    sent, failure = 0, None
    with transaction.atomic():
        if not _locked(run_id):
            return 0
        for sink in configured:
            try:
                sent = max(sent, _export_to(sink, run, final))
            except Exception as exc:
                # Any error of the tracker's client (down, refused, misconfigured).
                logger.exception("run %s: the export to %s failed", run_id, sink.NAME, extra={"run_id": run_id})
                failure = failure or exc
    if failure is not None:
        raise failure
    return sent
