"""Comparing runs side by side: only the config fields whose values differ between the
runs (a config has ~100 fields; the handful that differ are what explains the results),
then each run's outcome from its metrics."""

from __future__ import annotations

import json
from typing import Any

from rollway_cli.client import Api
from workers.core.merge import dotted

REWARD, STEPS = "reward/mean", "policy/version"
# Enough points that the min-max downsampling the API applies keeps the series' maximum
# (it keeps each group's highest point) and its last point.
MAX_POINTS = 10


def _text(value: Any) -> str:
    # As JSON text: 1 and true (or 1 and "1") are different settings.
    return json.dumps(value, sort_keys=True)


def differing(configs: list[dict]) -> dict[str, list[Any]]:
    """{dotted field: [value in each run]} for the fields not equal in every run (a field
    one config lacks counts as differing, shown as None)."""
    flat = [dotted(c or {}) for c in configs]
    names = sorted({name for f in flat for name in f})
    return {
        name: [f.get(name) for f in flat]
        for name in names
        if any(name not in f for f in flat) or len({_text(f[name]) for f in flat}) > 1
    }


def outcome(api: Api, run: dict) -> dict[str, Any]:
    """Status, steps trained, final and best reward/mean of a run, from the API."""
    series = api.get(f"/api/runs/{run['id']}/metrics", series=f"{REWARD},{STEPS}", max_points=MAX_POINTS)["series"]
    reward, steps = series.get(REWARD), series.get(STEPS)
    return {
        "id": run["id"],
        "name": run["name"],
        "status": run["status"],
        "steps": int(steps["values"][-1]) if steps and steps["values"] else None,
        "final_reward": reward["values"][-1] if reward and reward["values"] else None,
        "best_reward": max(reward["values"]) if reward and reward["values"] else None,
    }


def compare(api: Api, run_ids: list[int]) -> dict[str, Any]:
    """{"runs": [outcome of each], "differences": {field: [value per run]}}."""
    details = [api.get(f"/api/runs/{run_id}") for run_id in run_ids]
    return {
        "runs": [outcome(api, d) for d in details],
        "differences": differing([d.get("config") or {} for d in details]),
    }
