"""Nested overrides: merged over a base config dict (the one merge the presets, saved
configurations and the command line all use), and written on a command line as
`--set a.b=value` (the one grammar the `rollway` CLI and the bench scripts share). Kept
apart from workers.config.presets so the CLI imports it without loading the config models.

A `--set` value is read as JSON when it is JSON, else taken as the text itself:
`8` → 8, `3e-3` → 0.003, `true` → True, `null` → None, `[1, 2]` → a list, `"8"` → the
string "8", and a bare word such as `no`, `masked_is` or `Qwen/Qwen3-0.6B` → that string.
The config's own types then decide: a boolean field takes `no`, `off` or `false` as
false, and a text field keeps `no` as "no" (YAML would have made it False). A value that
starts like JSON (`[`, `{`, `"`) but is not valid JSON is an error, not a string.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any


class OverrideError(ValueError):
    """A `--set` item or an override key that cannot be read; the message says how to
    write it."""


def deep_merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """`base` with `overrides` on top: dicts merge key by key, anything else replaces."""
    out = dict(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def nest(flat: dict[str, Any], where: str = "overrides") -> dict[str, Any]:
    """Overrides with dotted keys (at any depth) as nested dicts: {"a.b": 1} → {"a": {"b": 1}}.
    `where` names the source in an error."""
    out: dict[str, Any] = {}
    for key, value in flat.items():
        if not isinstance(key, str) or not key or any(not part for part in key.split(".")):
            raise OverrideError(f"{where}: {key!r} is not a config field name such as buffer.capacity")
        if isinstance(value, dict):
            value = nest(value, where)
        *parents, leaf = key.split(".")
        node: dict[str, Any] = {leaf: value}
        for part in reversed(parents):
            node = {part: node}
        out = deep_merge(out, node)
    return out


def dotted(config: Any, prefix: str = "") -> dict[str, Any]:
    """`nest`'s inverse: {"trainer.lr": 1e-06, …}, every leaf of a nested config under its
    dotted name, as it is (lists stay values; an empty dict has no leaf). The one
    flattening the trackers' params, the compare page and `rollway compare` use."""
    if not isinstance(config, dict):
        return {prefix: config} if prefix else {}
    out: dict[str, Any] = {}
    for key, value in config.items():
        out.update(dotted(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def set_value(raw: str) -> Any:
    """A `--set` value: JSON when it is JSON, else the text (see the module's note)."""
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        if raw.lstrip()[:1] in ("[", "{", '"'):
            raise OverrideError(f"{raw!r} starts like JSON but is not valid JSON ({exc.msg})") from None
        return raw


def parse_set(item: str) -> dict[str, Any]:
    """`a.b=value` → {"a": {"b": value}}."""
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise OverrideError(f"--set {item!r}: write it as field.path=value, e.g. --set buffer.capacity=8")
    try:
        value = set_value(raw)
    except OverrideError as exc:
        raise OverrideError(f"--set {key}: {exc}") from None
    return nest({key: value}, where="--set")


def parse_sets(items: Iterable[str]) -> dict[str, Any]:
    """Several `--set` items merged in order (a later one wins) into nested overrides."""
    out: dict[str, Any] = {}
    for item in items:
        out = deep_merge(out, parse_set(item))
    return out
