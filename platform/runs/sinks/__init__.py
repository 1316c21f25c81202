"""The experiment trackers a run's config and series are exported to (runs/tracking.py
runs the export): each a sink module with KEY (its name in a run's `trackers`), NAME,
SETTING (what turns it on for the site), enabled() (that setting is set) and
open_export(run) → base.Export.

The site's operator turns a tracker on for the site; a run takes every tracker the site
has unless its launch chose some (`Run.trackers`: a list of keys, empty for none)."""

from __future__ import annotations

from types import ModuleType

from runs.sinks import mlflow_sink, tensorboard_sink, wandb_sink

SINKS: tuple[ModuleType, ...] = (mlflow_sink, tensorboard_sink, wandb_sink)


def configured() -> list[ModuleType]:
    """The sinks this site exports to (their settings are set)."""
    return [sink for sink in SINKS if sink.enabled()]


def by_key() -> dict[str, ModuleType]:
    """Every sink by its key, whether this site has it or not."""
    return {sink.KEY: sink for sink in SINKS}


def for_run(trackers: list[str] | None) -> list[ModuleType]:
    """The sinks a run with these `trackers` (Run.trackers) is exported to: every one the
    site has when None, else those of them it names."""
    return [sink for sink in configured() if trackers is None or sink.KEY in trackers]
