"""The Weights & Biases sink (settings.ROLLWAY_WANDB_PROJECT; the `wandb` extra). Never
run here: wandb is not installed on the project's machine, so only its calls are tested,
against a stand-in module (tests/platform/test_tracking.py).

Every Rollway run is one W&B run of the project, id `rollway-<id>`, named after the run,
grouped by "<team id>-<team slug>/<experiment>" (base.experiment_path: two teams may
share a name, never an id), tagged with its preset, its config as the W&B config
and its page's URL as its notes. Each export resumes the W&B run (resume="allow") and
finishes it again; the run's end finishes it with exit code 0 (succeeded) or 1. Points
are logged against their own step as the metric `rollway/step` (W&B's own step must only
grow, and a series may arrive behind another); the cursor is the summary key
`rollway.exported_point_id`, set after each batch. W&B's API key and host come from its
own environment (WANDB_API_KEY, WANDB_BASE_URL) in the worker processes.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

from runs.models import Run
from runs.sinks.base import Point, experiment_path, run_url, scalar_leaves

NAME = "W&B"
CURSOR_KEY = "rollway.exported_point_id"
STEP_METRIC = "rollway/step"


def enabled() -> bool:
    return bool(settings.ROLLWAY_WANDB_PROJECT)


def wandb_id(run: Run) -> str:
    return f"rollway-{run.pk}"


class WandbExport:
    def __init__(self, run: Run) -> None:
        import wandb  # optional: the `wandb` extra

        directory = settings.ROLLWAY_HOME / "wandb"
        directory.mkdir(parents=True, exist_ok=True)
        self.wb: Any = wandb.init(
            project=settings.ROLLWAY_WANDB_PROJECT,
            entity=settings.ROLLWAY_WANDB_ENTITY or None,
            id=wandb_id(run),
            resume="allow",
            name=run.name,
            group=experiment_path(run),
            tags=[run.preset],
            notes=run_url(run),
            config=scalar_leaves(run.config),
            dir=str(directory),
        )
        self.wb.define_metric(STEP_METRIC)
        self.wb.define_metric("*", step_metric=STEP_METRIC)
        self.finished = False

    def cursor(self) -> int:
        return int(self.wb.summary.get(CURSOR_KEY, 0))

    def send(self, points: list[Point]) -> None:
        row: dict[str, float] = {}
        step = None
        for _, series, point_step, value, _t in points:
            if row and point_step != step:
                self.wb.log({**row, STEP_METRIC: step})
                row = {}
            step = point_step
            row[series] = value
        self.wb.log({**row, STEP_METRIC: step})
        self.wb.summary[CURSOR_KEY] = points[-1][0]

    def finish(self, status: str) -> None:
        self.wb.finish(exit_code=0 if status == Run.Status.SUCCEEDED else 1)
        self.finished = True

    def close(self) -> None:
        if not self.finished:
            self.wb.finish()


def open_export(run: Run) -> WandbExport:
    return WandbExport(run)
