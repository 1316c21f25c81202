"""Weight-update modes as a switch of a real run: the driver, a Ray buffer, an inference
worker and the trainer on in-process Ray (torch backend), reporting to an ingest stub.

Generation is made the bottleneck (no warm start, so the policy seldom says EOS;
56-token completions; small batches, whose training is cheap while a decode step costs
about the same at any small batch size) and the worker may run well ahead (unbounded stream, η = 3), so it
is generating whenever new weights arrive: the abort modes abort and count, in-flight
mixes versions inside sequences, and every trained token stays within max_staleness.
"""

from __future__ import annotations

import pytest

from tests.engine.helpers import run_to_the_end

pytestmark = pytest.mark.slow

AHEAD = {"mode": "unbounded", "max_staleness": 3, "max_head_offpolicyness": 3}


@pytest.mark.parametrize("mode", ["abort_retry", "abort_resume", "in_flight", "drain"])
def test_update_mode_in_a_run(cluster, stub, cache_dir, mode):
    run_id = 7100 + ["abort_retry", "abort_resume", "in_flight", "drain"].index(mode)
    series = run_to_the_end(
        run_id,
        stub,
        cache_dir,
        buffer=AHEAD,
        sync={"update_mode": mode},
        stop={"max_steps": 10},
        warm_start={"steps": 0, "noisy_steps": 0},
        inference={"max_new_tokens": 56},
        trainer={"batch_groups": 2, "group_size": 4},
    )

    def last(name: str) -> float:  # the value at the last step: a cumulative series' total
        return series[name][max(series[name])]

    assert len(series["loss"]) == 10
    assert max(series["staleness/max"].values()) <= 3
    aborted, resumed, retried = (last(f"rollout/partial_{k}") for k in ("aborted", "resumed", "retried"))
    mixed = max(series["rollout/mixed_version_frac"].values())
    if mode == "abort_retry":
        assert aborted > 0 and retried == aborted and resumed == 0 and mixed == 0
    elif mode == "abort_resume":
        # Resumed sequences mix versions, but whether one is among the 10 trained batches
        # depends on timing; tests/engine/test_update_modes.py checks the kept tokens.
        assert aborted > 0 and resumed == aborted and retried == 0
    elif mode == "in_flight":
        assert aborted == resumed == retried == 0 and mixed > 0
    else:
        assert aborted == resumed == retried == 0 and mixed == 0
