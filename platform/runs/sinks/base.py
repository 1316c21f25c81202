"""What every tracker sink is to the export loop (runs/tracking.py): an `Export`, one
sink's connection to one run for the length of one export.

The loop asks it for its cursor (the last point id the tracker holds), hands it the
points stored after that in row order, BATCH at a time, and at the run's end its
outcome. A sink records the cursor with each batch it takes, in the tracker itself where
it can, so the next export resumes there whichever process runs it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Protocol

from django.conf import settings

from runs.models import Run
from workers.core.merge import dotted

# (row id, series, step, value, measurement time in seconds since the epoch)
Point = tuple[int, str, int, float, float]
# Points handed to a sink at once: MLflow's log_batch takes at most 1000 entities, one of
# them its cursor tag; the other sinks take the same batches.
BATCH = 999
# MLflow's limit on a param's value (MAX_PARAM_VAL_LENGTH); the others keep it too.
MAX_PARAM_CHARS = 6000


class Export(Protocol):
    def cursor(self) -> int:
        """The id of the last point the tracker holds (0: none)."""
        ...

    def send(self, points: list[Point]) -> None:
        """Log `points` (in row order) and record the last one's id as the cursor."""
        ...

    def finish(self, status: str) -> None:
        """Close the tracker's run with the Rollway run's terminal status."""
        ...

    def close(self) -> None:
        """End this export (the tracker's run stays open unless `finish` closed it)."""
        ...


def flatten(config: Mapping[str, Any]) -> dict[str, str]:
    """{"trainer.lr": "1e-06", …}: trackers' params are flat strings. Lists are JSON."""
    return {
        name: (value if isinstance(value, str) else json.dumps(value))[:MAX_PARAM_CHARS]
        for name, value in dotted(config).items()
    }


def scalar_leaves(config: Mapping[str, Any]) -> dict[str, bool | int | float | str]:
    """The config's leaves as the hyperparameter views take them: numbers, booleans and
    text as they are, anything else (None, lists) as its JSON."""
    return {
        name: value if isinstance(value, bool | int | float | str) else json.dumps(value)[:MAX_PARAM_CHARS]
        for name, value in dotted(config).items()
    }


def run_url(run: Run) -> str:
    return f"{settings.ROLLWAY_PUBLIC_URL}{run.get_absolute_url()}"


def experiment_path(run: Run) -> str:
    """ "<team id>-<team slug>/<experiment>": how the trackers name the run's experiment.
    By the team's id, which no other team has (two teams may share a name; a shared
    name would pour one team's runs into the other's tracker experiment), and its slug
    for people to read."""
    team = run.experiment.team
    return f"{team.pk}-{team.slug}/{run.experiment.name}"
