"""A launch request from a YAML file and `--set` options: the body of POST /api/runs.

The file's top level mixes the launch's own fields (preset, team, experiment, name,
priority, saved_config, overrides) with config overrides written where they sit in the
config (`buffer: {capacity: 8}`, or dotted: `buffer.capacity: 8`); both kinds of
override are merged, file first, then each `--set a.b=value` in order. The site takes
nested overrides only, so dotted keys are nested here. A `--set` value is a YAML scalar
(or flow collection): 8 is a number, true a boolean, null null, "8" a string.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from rollway_cli.errors import BAD_REQUEST, CliError
from workers.merge import deep_merge

LAUNCH_FIELDS = ("team", "experiment", "name", "preset", "priority", "saved_config", "overrides")


def nest(flat: dict[str, Any], where: str = "overrides") -> dict:
    """Overrides with dotted keys (at any depth) as nested dicts: {"a.b": 1} → {"a": {"b": 1}}."""
    out: dict = {}
    for key, value in flat.items():
        if not isinstance(key, str) or not key or any(not part for part in key.split(".")):
            raise CliError(f"{where}: {key!r} is not a config field name such as buffer.capacity", BAD_REQUEST)
        if isinstance(value, dict):
            value = nest(value, where)
        *parents, leaf = key.split(".")
        node: dict = {}
        tip = node
        for part in parents:
            tip[part] = {}
            tip = tip[part]
        tip[leaf] = value
        out = deep_merge(out, node)
    return out


def parse_set(item: str) -> dict:
    """`a.b=value` → {"a": {"b": value}}, the value read as YAML."""
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise CliError(f"--set {item!r}: write it as field.path=value, e.g. --set buffer.capacity=8", BAD_REQUEST)
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise CliError(f"--set {key}: {raw!r} is not a YAML value ({exc.problem or exc})", BAD_REQUEST) from None
    return nest({key: value}, where="--set")


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
