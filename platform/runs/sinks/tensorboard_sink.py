"""The TensorBoard sink (settings.ROLLWAY_TENSORBOARD_DIR; the `tensorboard` extra).

Every Rollway run is one TensorBoard run, the directory `<ROLLWAY_TENSORBOARD_DIR>/run-<id>`
(`tensorboard --logdir $ROLLWAY_TENSORBOARD_DIR` lists them all): its points as scalars
under their series names at their steps and measurement times; its config once, as the
text `rollway/config` (JSON) and as hyperparameters (the HParams tab, one per config
field); the run's name, team, experiment (as the other trackers name it,
base.experiment_path), preset and page as the text `rollway/run`; its
outcome as the text `rollway/outcome` (SummaryWriter files a text under `<tag>/text_summary`).

Written with torch's SummaryWriter (torch is the platform's own dependency; tensorboard
provides the event format), kept open per run in the process between exports: a new
writer starts a new event file, and a file per export would leave thousands in a long
run's directory. The cursor is the file `rollway-cursor.json` in the run's directory,
replaced only after the writer has flushed the points it counts: a crash in between
sends those points again (TensorBoard then shows them twice), never loses them.
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from pathlib import Path
from typing import Any

from django.conf import settings

from runs.models import Run
from runs.sinks.base import Point, experiment_path, run_url, scalar_leaves

KEY = "tensorboard"  # what a run names it in `trackers`
NAME = "TensorBoard"
SETTING = "ROLLWAY_TENSORBOARD_DIR"
CURSOR_FILE = "rollway-cursor.json"
# Writers kept open in one process (one event file each); the least recently used goes
# first. A run's end closes its own.
MAX_OPEN_WRITERS = 32
# The metric the HParams tab shows beside each run's hyperparameters.
HPARAMS_METRIC = "reward/mean"

_writers: OrderedDict[int, Any] = OrderedDict()


def enabled() -> bool:
    return bool(settings.ROLLWAY_TENSORBOARD_DIR)


def run_dir(run_id: int) -> Path:
    return Path(settings.ROLLWAY_TENSORBOARD_DIR) / f"run-{int(run_id)}"


def _writer(run_id: int, directory: Path):
    from torch.utils.tensorboard import SummaryWriter  # optional: the `tensorboard` extra

    writer = _writers.pop(run_id, None)
    if writer is None or writer.log_dir != str(directory):
        if writer is not None:
            writer.close()
        # Flushed by each export itself; the queue only batches within one.
        writer = SummaryWriter(log_dir=str(directory), max_queue=1000, flush_secs=3600)
    _writers[run_id] = writer
    while len(_writers) > MAX_OPEN_WRITERS:
        _writers.popitem(last=False)[1].close()
    return writer


def _drop_writer(run_id: int) -> None:
    writer = _writers.pop(run_id, None)
    if writer is not None:
        writer.close()


class TensorBoardExport:
    def __init__(self, run: Run) -> None:
        self.run = run
        self.dir = run_dir(run.pk)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.writer = _writer(run.pk, self.dir)
        saved = self._read_cursor()
        if saved is None:
            self._describe()
            self._write_cursor(0)
            saved = 0
        self._cursor = saved

    def _read_cursor(self) -> int | None:
        try:
            return int(json.loads((self.dir / CURSOR_FILE).read_text())["exported_point_id"])
        except FileNotFoundError:
            return None

    def _write_cursor(self, point_id: int) -> None:
        self.writer.flush()  # the points first, then the cursor that counts them
        tmp = self.dir / f".{CURSOR_FILE}.tmp"
        tmp.write_text(json.dumps({"exported_point_id": point_id}))
        os.replace(tmp, self.dir / CURSOR_FILE)
        self._cursor = point_id

    def _describe(self) -> None:
        """The run's identity and config, once, when its directory is new."""
        from torch.utils.tensorboard.summary import hparams

        run = self.run
        self.writer.add_text(
            "rollway/run",
            f"[{run.name}]({run_url(run)}) · run {run.pk} · team {run.experiment.team.name} · "
            f"experiment {experiment_path(run)} · preset {run.preset}",
        )
        # Markdown: four spaces make the JSON a code block.
        config = json.dumps(run.config, indent=2, sort_keys=True)
        self.writer.add_text("rollway/config", "\n".join("    " + line for line in config.splitlines()))
        for summary in hparams(scalar_leaves(run.config), {HPARAMS_METRIC: None}):
            self.writer.file_writer.add_summary(summary)

    def cursor(self) -> int:
        return self._cursor

    def send(self, points: list[Point]) -> None:
        for _, series, step, value, t in points:
            self.writer.add_scalar(series, value, global_step=step, walltime=t)
        self._write_cursor(points[-1][0])

    def finish(self, status: str) -> None:
        self.writer.add_text("rollway/outcome", status)
        self.writer.flush()
        _drop_writer(self.run.pk)

    def close(self) -> None:
        pass  # the writer stays open for the run's next export (finish closes it)


def open_export(run: Run) -> TensorBoardExport:
    return TensorBoardExport(run)
