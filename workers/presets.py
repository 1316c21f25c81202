"""Named presets: instances of `RunConfig` that reproduce a pipeline layout.

`build(name, overrides)` deep-merges JSON overrides onto a preset and validates the
result, so the launch form, the API and tests all go through one path.
"""

from __future__ import annotations

import json
from typing import Any

from workers.config import RunConfig

PRESETS: dict[str, dict[str, str | RunConfig]] = {
    "async": {
        "description": (
            "One-step-off async GRPO: inference and trainer run side by side through a "
            "bounded buffer (capacity 2 batches), version rejection at max_staleness=1, "
            "truncated IS against the behaviour logprobs; weights pushed by full reload."
        ),
        "config": RunConfig(mode="async"),
    },
    "sync": {
        "description": (
            "Synchronous baseline (TRL GRPOTrainer-style): generate a batch, train on it, "
            "sync weights, repeat. Same code path as async."
        ),
        "config": RunConfig(mode="sync", buffer={"capacity": 1, "max_staleness": 0}),
    },
}


class UnknownPreset(ValueError):
    pass


def deep_merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def dotted_overrides(items: list[str]) -> dict[str, Any]:
    """`["a.b=value", ...]` (command-line `--set`; value parsed as JSON when it can be)
    → nested overrides for `build`."""
    out: dict[str, Any] = {}
    for item in items:
        key, _, raw = item.partition("=")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        node = out
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def build(name: str, overrides: dict[str, Any] | None = None) -> RunConfig:
    """Preset `name` with `overrides` merged in; raises pydantic.ValidationError on a bad
    field and UnknownPreset on a bad name."""
    if name not in PRESETS:
        raise UnknownPreset(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    base = PRESETS[name]["config"].model_dump()
    return RunConfig.model_validate(deep_merge(base, overrides or {}))
