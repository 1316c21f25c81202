"""A run's config and series, exported to an MLflow tracking server while it runs.

Why the platform and not the engine: every series already reaches the platform (the
driver's reporter posts it to the ingest), so exporting from here needs nothing of the
engine, no tracker credentials on the Ray cluster, and no tracker client in its image;
a tracker that is down slows no training step; and the export can be checked against
what the platform stored. The cost is a lag of about one reporter batch.

With settings.ROLLWAY_MLFLOW_TRACKING_URI set, every run gets one MLflow run, in the
MLflow experiment "<team>/<experiment>", named after the run, tagged `rollway.run_id`,
`rollway.preset`, `rollway.team`, `rollway.experiment` and `rollway.url`, with the run's
flattened config as params ("trainer.lr": "1e-06"). Its points go over as metrics
(series name, step, value, measurement time): the ingest asks for an export at most
every EXPORT_EVERY_S per run (the Celery task `export_run_metrics`), and the run's end
asks for a last one that also closes the MLflow run with the run's outcome.

Each export sends the points stored since the last one, in order of their row id, and
records the last id it sent as the MLflow run's tag `rollway.exported_point_id`, in the
same batch as the points: an export that fails half way resumes where it stopped. A
point the reporter sends again (an upsert of the same row) keeps its id and is not sent
twice; a point that replaces another at the same step is not sent again either.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator, Mapping
from typing import Any

from django.conf import settings
from django.db import connection, transaction

from runs import dispatch
from runs.models import MetricPoint, Run

logger = logging.getLogger(__name__)

# How often the ingest asks for an export of one run: more often → more Celery tasks and
# tracker requests per run; less often → MLflow's charts lag further behind.
EXPORT_EVERY_S = 5.0
# MLflow's log_batch takes at most 1000 entities; one of them is the cursor tag.
BATCH = 999
# MLflow's limit on a param's value (MAX_PARAM_VAL_LENGTH).
MAX_PARAM_CHARS = 6000
CURSOR_TAG = "rollway.exported_point_id"
RUN_TAG = "rollway.run_id"
# A run's outcome as MLflow's RunStatus names it.
MLFLOW_STATUS = {Run.Status.SUCCEEDED: "FINISHED", Run.Status.FAILED: "FAILED", Run.Status.CANCELLED: "KILLED"}
# pg_try_advisory_xact_lock's first key: this module's exports, one lock per run.
_LOCK_CLASS = 0x524C_4D46  # "RLMF"

_last_asked: dict[int, float] = {}


def enabled() -> bool:
    return bool(settings.ROLLWAY_MLFLOW_TRACKING_URI)


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """{"trainer.lr": "1e-06", …}: MLflow params are flat strings. Lists are JSON."""
    out: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{name}."))
        else:
            text = value if isinstance(value, str) else json.dumps(value)
            out[name] = text[:MAX_PARAM_CHARS]
    return out


def ask_export(run_id: int, *, final: bool = False) -> None:
    """Have the Celery worker export the run's new points (and close its MLflow run when
    `final`), at most every EXPORT_EVERY_S per run unless final. Call once the points
    or the run's end are committed."""
    if not enabled():
        return
    now = time.monotonic()
    if not final and now - _last_asked.get(run_id, -EXPORT_EVERY_S) < EXPORT_EVERY_S:
        return
    _last_asked[run_id] = now
    if final:
        _last_asked.pop(run_id, None)
    dispatch.send_or_log(dispatch.FINISH_RUN_METRICS if final else dispatch.EXPORT_RUN_METRICS, run_id)


def _client():
    from mlflow.tracking import MlflowClient  # optional: the `mlflow` extra

    return MlflowClient(tracking_uri=settings.ROLLWAY_MLFLOW_TRACKING_URI)


def _experiment_id(client, run: Run) -> str:
    name = f"{run.experiment.team.name}/{run.experiment.name}"
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    try:
        return client.create_experiment(name)
    except Exception:
        # Another export created it meanwhile (MLflow's RESOURCE_ALREADY_EXISTS).
        found = client.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id


def mlflow_run_id(client, run: Run) -> str:
    """The run's MLflow run id, creating the MLflow run (tags and params) the first time."""
    from mlflow.entities import Param

    experiment_id = _experiment_id(client, run)
    found = client.search_runs([experiment_id], filter_string=f"tags.`{RUN_TAG}` = '{run.pk}'", max_results=1)
    if found:
        return found[0].info.run_id
    tags = {
        RUN_TAG: str(run.pk),
        "rollway.preset": run.preset,
        "rollway.team": run.experiment.team.name,
        "rollway.experiment": run.experiment.name,
        "rollway.url": f"{settings.ROLLWAY_PUBLIC_URL}{run.get_absolute_url()}",
        CURSOR_TAG: "0",
    }
    created = client.create_run(experiment_id, run_name=run.name, tags=tags)
    mlflow_id = created.info.run_id
    params = [Param(key, value) for key, value in flatten(run.config).items()]
    for start in range(0, len(params), 100):  # log_batch's limit on params
        client.log_batch(mlflow_id, params=params[start : start + 100])
    return mlflow_id


def _new_points(run_id: int, after_id: int) -> Iterator[list[tuple[int, str, int, float, float]]]:
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


def do_export_run(run_id: int, *, final: bool = False) -> int:
    """Send the run's points not yet in its MLflow run; when `final`, also close the
    MLflow run with the run's outcome. Returns how many points were sent (0 when
    exporting is off, or another export of the run is under way)."""
    from mlflow.entities import Metric, RunTag

    if not enabled():
        return 0
    run = Run.objects.select_related("experiment__team").get(pk=run_id)
    sent = 0
    with transaction.atomic():
        if not _locked(run_id):
            return 0
        client = _client()
        mlflow_id = mlflow_run_id(client, run)
        cursor = int(client.get_run(mlflow_id).data.tags.get(CURSOR_TAG, "0"))
        for rows in _new_points(run_id, cursor):
            metrics = [Metric(series, value, int(t * 1000), step) for _, series, step, value, t in rows]
            client.log_batch(mlflow_id, metrics=metrics, tags=[RunTag(CURSOR_TAG, str(rows[-1][0]))])
            sent += len(rows)
        if final and run.status in MLFLOW_STATUS:
            client.set_terminated(mlflow_id, status=MLFLOW_STATUS[Run.Status(run.status)])
    if sent:
        logger.info("run %s: %d points exported to MLflow run %s", run_id, sent, mlflow_id, extra={"run_id": run_id})
    return sent
