"""Buffer modes through the real driver (in-process Ray, torch backend): the config
reaches the BufferActor, and a requeue run regenerates stale prompts.

A double buffer's run is the slime preset's (test_presets.py: a capacity of one batch,
nothing trained more than one version old)."""

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


def test_a_run_whose_groups_never_differ_fails_saying_so(cluster, cache_dir):
    """With trainer.dynamic_sampling the run's buffer drops uniform groups: an untrained
    policy never gets an exact answer, so every group's rewards are all 0, every group is
    dropped, and the run fails saying why instead of generating forever."""
    out = run_inline(
        134,
        cache_dir,
        warm_start={"steps": 0, "noisy_steps": 0},
        task={"reward": "exact"},
        trainer={"batch_groups": 4, "group_size": 4, "dynamic_sampling": True, "dynamic_sampling_max_batches": 2},
    )
    assert out["state"] == "failed"
    assert "trainer.dynamic_sampling" in out["error"] and "no signal" in out["error"]
