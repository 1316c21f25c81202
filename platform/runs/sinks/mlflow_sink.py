"""The MLflow sink (settings.ROLLWAY_MLFLOW_TRACKING_URI; the `mlflow` extra).

Every Rollway run is one MLflow run, in the MLflow experiment
"rollway/<team id>-<team slug>/<experiment>" (base.experiment_path: a team's id is its
own, where its name may be another team's too), named after the run, tagged
`rollway.run_id`, `rollway.preset`, `rollway.team`, `rollway.team_id`,
`rollway.experiment` and `rollway.url`, with the run's flattened config as params
("trainer.lr": "1e-06"), its points as metrics and its cursor as the tag
`rollway.exported_point_id`, written in the same log_batch as the points.
"""

from __future__ import annotations

from django.conf import settings

from runs.models import Run
from runs.sinks.base import Point, experiment_path, flatten, run_url

KEY = "mlflow"  # what a run names it in `trackers`
NAME = "MLflow"
SETTING = "ROLLWAY_MLFLOW_TRACKING_URI"
CURSOR_TAG = "rollway.exported_point_id"
RUN_TAG = "rollway.run_id"
# A run's outcome as MLflow's RunStatus names it.
MLFLOW_STATUS = {Run.Status.SUCCEEDED: "FINISHED", Run.Status.FAILED: "FAILED", Run.Status.CANCELLED: "KILLED"}


def enabled() -> bool:
    return bool(settings.ROLLWAY_MLFLOW_TRACKING_URI)


def experiment_name(run: Run) -> str:
    """The MLflow experiment of `run`, one per Rollway experiment (whatever the names)."""
    return f"rollway/{experiment_path(run)}"


def _experiment_id(client, run: Run) -> str:
    name = experiment_name(run)
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
        "rollway.team_id": str(run.experiment.team_id),
        "rollway.experiment": run.experiment.name,
        "rollway.url": run_url(run),
        CURSOR_TAG: "0",
    }
    created = client.create_run(experiment_id, run_name=run.name, tags=tags)
    mlflow_id = created.info.run_id
    params = [Param(key, value) for key, value in flatten(run.config).items()]
    for start in range(0, len(params), 100):  # log_batch's limit on params
        client.log_batch(mlflow_id, params=params[start : start + 100])
    return mlflow_id


class MlflowExport:
    def __init__(self, run: Run) -> None:
        from mlflow.tracking import MlflowClient  # optional: the `mlflow` extra

        self.client = MlflowClient(tracking_uri=settings.ROLLWAY_MLFLOW_TRACKING_URI)
        self.mlflow_id = mlflow_run_id(self.client, run)

    def cursor(self) -> int:
        return int(self.client.get_run(self.mlflow_id).data.tags.get(CURSOR_TAG, "0"))

    def send(self, points: list[Point]) -> None:
        from mlflow.entities import Metric, RunTag

        metrics = [Metric(series, value, int(t * 1000), step) for _, series, step, value, t in points]
        self.client.log_batch(self.mlflow_id, metrics=metrics, tags=[RunTag(CURSOR_TAG, str(points[-1][0]))])

    def finish(self, status: str) -> None:
        if status in MLFLOW_STATUS:
            self.client.set_terminated(self.mlflow_id, status=MLFLOW_STATUS[Run.Status(status)])

    def close(self) -> None:
        pass


def open_export(run: Run) -> MlflowExport:
    return MlflowExport(run)
