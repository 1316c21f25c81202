"""The Weights & Biases sink (settings.ROLLWAY_WANDB_PROJECT; the `wandb` extra), tested
in W&B's own offline mode (WANDB_MODE=offline: the records a `wandb sync` uploads later,
written under ROLLWAY_HOME/wandb; tests/platform/test_tracker_sinks.py reads them back).

Every Rollway run is one W&B run of the project, id `rollway-<id>`, named after the run,
grouped by "<team id>-<team slug>/<experiment>" (base.experiment_path: two teams may
share a name, never an id), tagged with its preset, its config as the W&B config
and its page's URL as its notes. Each export resumes the W&B run (resume="allow") and
finishes it again; the run's end finishes it with exit code 0 (succeeded) or 1. Points
are logged against their own step as the metric `rollway/step` (W&B's own step must only
grow, and a series may arrive behind another); the cursor is the summary key
`rollway.exported_point_id`, set after each batch, and kept in a file beside W&B's
(`rollway-<id>.cursor`): offline, a resumed W&B run starts with an empty summary, and
the file alone keeps an export from sending the run's points again. W&B's API key, host
and mode come from its own environment (WANDB_API_KEY, WANDB_BASE_URL, WANDB_MODE) in the
worker processes.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

from runs.models import Run
from runs.sinks.base import Point, experiment_path, run_url, scalar_leaves

KEY = "wandb"  # what a run names it in `trackers`
NAME = "W&B"
SETTING = "ROLLWAY_WANDB_PROJECT"
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
        self.cursor_file = directory / f"{wandb_id(run)}.cursor"
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
        kept = int(self.cursor_file.read_text()) if self.cursor_file.exists() else 0
        return max(int(self.wb.summary.get(CURSOR_KEY, 0)), kept)

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
        self.cursor_file.write_text(str(points[-1][0]))

    def finish(self, status: str) -> None:
        self.wb.finish(exit_code=0 if status == Run.Status.SUCCEEDED else 1)
        self.finished = True

    def close(self) -> None:
        if not self.finished:
            self.wb.finish()


def open_export(run: Run) -> WandbExport:
    return WandbExport(run)
