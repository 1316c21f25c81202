"""A launch request from a YAML file and `--set` options: the body of POST /api/runs.

The file's top level mixes the launch's own fields (preset, team, experiment, name,
priority, saved_config, overrides) with config overrides written where they sit in the
config (`buffer: {capacity: 8}`, or dotted: `buffer.capacity: 8`); both kinds of
override are merged, file first, then each `--set a.b=value` in order. The site takes
nested overrides only, so dotted keys are nested here. A `--set` value follows the
grammar the bench scripts share (workers/merge.py): JSON when it is JSON (8 a number,
true a boolean, null null, "8" a string), else the text itself (`no` is the string "no",
which a boolean field reads as false).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from rollway_cli.errors import BAD_REQUEST, CliError
from workers import merge
from workers.merge import deep_merge

LAUNCH_FIELDS = ("team", "experiment", "name", "preset", "priority", "saved_config", "overrides")


def nest(flat: dict[str, Any], where: str = "overrides") -> dict:
    try:
        return merge.nest(flat, where)
    except merge.OverrideError as exc:
        raise CliError(str(exc), BAD_REQUEST) from None


def parse_set(item: str) -> dict:
    """`a.b=value` → {"a": {"b": value}} in workers.merge's `--set` grammar."""
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


def launch_body(path: Path | None, sets: list[str], **given: Any) -> dict:
    """The POST /api/runs body: the file's fields, then the command's options (`given`:
    team, experiment, name, preset, priority; None when not given), then `sets`."""
    data = read_file(path) if path is not None else {}
    fields = {k: data.pop(k) for k in LAUNCH_FIELDS if k in data}
    overrides = fields.pop("overrides", None) or {}
    if not isinstance(overrides, dict):
        raise CliError(f"{path}: overrides must be a mapping of config fields", BAD_REQUEST)
    overrides = deep_merge(nest(data, where=str(path)), nest(overrides, where=str(path)))
    for item in sets:
        overrides = deep_merge(overrides, parse_set(item))
    fields.update({k: v for k, v in given.items() if v is not None})
    body = {k: v for k, v in fields.items() if v is not None}
    if overrides:
        body["overrides"] = overrides
    return body
