"""Buffer modes through the real driver (in-process Ray, torch backend): a buffer that
drops uniform groups fails a run whose groups never differ, saying why.

The other buffer modes reach the BufferActor in runs that other modules start anyway: a
double buffer in the slime preset's run (test_presets.py: a capacity of one batch,
nothing trained more than one version old), an unbounded stream whose head runs ahead
of max_staleness 0 in test_replay.py's requeue run (no capacity, stale groups requeued,
never dropped, none trained)."""

from __future__ import annotations

import pytest

from tests.engine.helpers import run_inline

pytestmark = pytest.mark.slow


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
