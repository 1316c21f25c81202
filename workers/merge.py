"""Nested overrides merged over a base config dict: the one merge the presets, saved
configurations and the command line all use (kept apart from workers.presets so the
`rollway` CLI can import it without loading the config models)."""

from __future__ import annotations

from typing import Any


def deep_merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """`base` with `overrides` on top: dicts merge key by key, anything else replaces."""
    out = dict(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out
