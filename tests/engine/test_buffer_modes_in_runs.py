"""Buffer modes through the real driver (in-process Ray, torch backend): the config
reaches the BufferActor, and a requeue run regenerates stale prompts."""

from __future__ import annotations

import pytest

from tests.engine.helpers import run_inline

pytestmark = pytest.mark.slow


def test_unbounded_stream_with_a_long_head_requeues_stale_groups(cluster, cache_dir):
    out = run_inline(
        131,
        cache_dir,
        buffer={"mode": "unbounded", "max_staleness": 0, "max_head_offpolicyness": 2, "on_stale": "requeue"},
        stop={"max_steps": 5},
    )
    assert out["state"] == "succeeded", out["error"]
    s = {k: dict(v) for k, v in out["series"].items()}
    assert set(s["staleness/max"].values()) == {0.0}  # nothing older than max_staleness trained
    assert "buffer/capacity" not in s  # a stream has no capacity
    assert max(s["buffer/requeued"].values()) > 0  # η 2 > max_staleness 0: some went stale
    assert set(s["buffer/dropped_stale"].values()) == {0.0}  # requeued, not dropped
    assert "buffer/starved_s" in s


def test_double_buffer_runs_one_batch_ahead(cluster, cache_dir):
    out = run_inline(132, cache_dir, buffer={"mode": "double", "max_staleness": 1}, stop={"max_steps": 5})
    assert out["state"] == "succeeded", out["error"]
    s = {k: dict(v) for k, v in out["series"].items()}
    assert set(s["buffer/capacity"].values()) == {4.0}  # one batch of B=4 groups
    assert max(s["staleness/max"].values()) <= 1.0
