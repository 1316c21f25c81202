"""The experiment trackers a run's config and series are exported to (runs/tracking.py
runs the export): each a sink module with NAME, enabled() (its setting is set) and
open_export(run) → base.Export."""

from __future__ import annotations

from types import ModuleType

from runs.sinks import mlflow_sink, tensorboard_sink, wandb_sink

SINKS: tuple[ModuleType, ...] = (mlflow_sink, tensorboard_sink, wandb_sink)


def configured() -> list[ModuleType]:
    """The sinks this site exports to (their settings are set)."""
    return [sink for sink in SINKS if sink.enabled()]
