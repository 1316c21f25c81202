"""A launch request from a YAML file and `--set` options: the body of POST /api/runs.

The file's top level mixes the launch's own fields (preset, team, experiment, name,
priority, saved_config, overrides) with config overrides written where they sit in the
config (`buffer: {capacity: 8}`, or dotted: `buffer.capacity: 8`); both kinds of
override are merged, file first, then each `--set a.b=value` in order. The site takes
nested overrides only, so dotted keys are nested here. A `--set` value follows the
grammar the bench scripts share (workers/core/merge.py): JSON when it is JSON (8 a number,
true a boolean, null null, "8" a string), else the text itself (`no` is the string "no",
which a boolean field reads as false).

A dataset path in the file that starts with "./" or "../" (`task.dataset.path`,
`eval_path`) is read relative to the file, so a launch file can sit beside its data; it
is sent as an absolute path, which the site must be able to read.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from rollway_cli.errors import BAD_REQUEST, CliError
from workers.core import merge
from workers.core.merge import deep_merge

LAUNCH_FIELDS = ("team", "experiment", "name", "preset", "priority", "trackers", "saved_config", "overrides")
# What a simulation adds to a launch (POST /api/simulations): not config overrides.
SIMULATE_FIELDS = ("cluster", "workload", "steps")


def nest(flat: dict[str, Any], where: str = "overrides") -> dict:
    try:
        return merge.nest(flat, where)
    except merge.OverrideError as exc:
        raise CliError(str(exc), BAD_REQUEST) from None


def parse_set(item: str) -> dict:
    """`a.b=value` → {"a": {"b": value}} in workers.core.merge's `--set` grammar."""
    try:
        return merge.parse_set(item)
    except merge.OverrideError as exc:
        raise CliError(str(exc), BAD_REQUEST) from None


def read_file(path: Path) -> dict:
    try:
        text = path.read_text()
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror or exc}", BAD_REQUEST) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise CliError(f"{path} is not valid YAML: {exc}", BAD_REQUEST) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise CliError(f"{path}: the top level must be a mapping (preset: …, overrides: …)", BAD_REQUEST)
    return data


# Config fields holding a dataset path a launch file may give relative to itself.
DATASET_PATHS = ("path", "eval_path")


def beside_file(overrides: dict, path: Path) -> None:
    """Make the file's "./" and "../" dataset paths absolute, from the file's folder."""
    dataset = overrides.get("task", {}).get("dataset") if isinstance(overrides.get("task"), dict) else None
    if not isinstance(dataset, dict):
        return
    folder = os.path.dirname(os.path.abspath(path))
    for key in DATASET_PATHS:
        value = dataset.get(key)
        if isinstance(value, str) and value.startswith(("./", "../")):
            dataset[key] = os.path.normpath(os.path.join(folder, value))


def launch_body(path: Path | None, sets: list[str], *, simulation: bool = False, **given: Any) -> dict:
    """The POST /api/runs body: the file's fields, then the command's options (`given`:
    team, experiment, name, preset, priority, trackers; None when not given), then `sets`. With
    `simulation`, the file's cluster, workload and steps are fields of the body too
    (POST /api/simulations)."""
    data = read_file(path) if path is not None else {}
    fields = {k: data.pop(k) for k in LAUNCH_FIELDS + (SIMULATE_FIELDS if simulation else ()) if k in data}
    overrides = fields.pop("overrides", None) or {}
    if not isinstance(overrides, dict):
        raise CliError(f"{path}: overrides must be a mapping of config fields", BAD_REQUEST)
    overrides = deep_merge(nest(data, where=str(path)), nest(overrides, where=str(path)))
    if path is not None:
        beside_file(overrides, path)
    for item in sets:
        overrides = deep_merge(overrides, parse_set(item))
    fields.update({k: v for k, v in given.items() if v is not None})
    body = {k: v for k, v in fields.items() if v is not None}
    if overrides:
        body["overrides"] = overrides
    return body
