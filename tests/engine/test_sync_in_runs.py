"""The weight-sync protocol and LoRA as config switches of a real run.

Fast: the config refuses combinations that cannot work, naming the fields; the LoRA
trainer trains the adapter only and hands out merged weights under checkpoint names.
Slow: on vLLM, a LoRA run's versioned adapters and a LoRA run's merged policy through
vLLM's broadcast engine (packed) reach the engine. Whole runs cost most of this suite's
time, so other modules' runs carry the rest: a delta sync's bytes per version are
test_driver.py's vocabulary run, a packed collective from a trainer pool to two inference
workers is test_placement.py's disaggregated run, and the full-weight filesystem and
collective runs into vLLM are test_driver_vllm.py's (weights taken mid-generation).
"""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from tests.engine.helpers import policy_bytes, run_inline, small_config
from workers.config.run_config import RunConfig

# -- config (fast) --------------------------------------------------------------------


def test_lora_protocol_without_lora_enabled_names_the_fields():
    with pytest.raises(ValidationError) as err:
        RunConfig.model_validate({"sync": {"protocol": "lora"}})
    text = str(err.value)
    assert "sync.protocol 'lora'" in text and "lora.enabled=true" in text


def test_collective_cannot_move_a_lora_model_except_into_vllm():
    with pytest.raises(ValidationError) as err:
        RunConfig.model_validate({"sync": {"protocol": "collective"}, "lora": {"enabled": True}})
    assert "sync.protocol 'collective'" in str(err.value) and "lora.enabled" in str(err.value)
    # vLLM's broadcast engine takes the merged policy.
    cfg = RunConfig.model_validate(
        {"sync": {"protocol": "collective"}, "lora": {"enabled": True}, "inference": {"backend": "vllm"}}
    )
    assert cfg.lora.enabled


def test_full_reload_stays_valid_and_lora_with_full_weight_protocols_is_allowed():
    assert RunConfig.model_validate({"sync": {"protocol": "full_reload"}}).sync.protocol == "object_store"
    assert RunConfig().sync.protocol == "object_store"
    for protocol in ("lora", "object_store", "filesystem"):
        cfg = RunConfig.model_validate({"sync": {"protocol": protocol}, "lora": {"enabled": True, "rank": 4}})
        assert cfg.lora.rank == 4
    with pytest.raises(ValidationError, match="rank"):
        RunConfig.model_validate({"lora": {"rank": 0}})


def test_lora_trainer_trains_the_adapter_and_exports_merged_checkpoint_weights(tiny_model_dir):
    from workers.model.loading import load_model
    from workers.train.trainer import Trainer

    full = Trainer(small_config(), tiny_model_dir)
    lora = Trainer(small_config(lora={"enabled": True, "rank": 2}), tiny_model_dir)
    trained = [p for group in lora.optimizer.param_groups for p in group["params"]]
    assert trained and all(p.requires_grad for p in trained)
    assert sum(p.numel() for p in trained) < sum(p.numel() for p in full.model.parameters()) / 5
    sd = lora.state_dict()
    base = load_model(tiny_model_dir).state_dict()
    assert sd.keys() == base.keys()  # checkpoint names, no peft prefixes
    # B starts at zero: the merged policy is the base until the first step.
    assert all(torch.equal(sd[k], base[k]) for k in base)


# -- real runs (slow) -------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.vllm
def test_a_lora_run_on_vllm_serves_versioned_adapters(cluster, cache_dir):
    pytest.importorskip("vllm")

    lora = {"enabled": True, "rank": 8, "alpha": 16.0}
    out = run_inline(303, cache_dir, sync={"protocol": "lora"}, lora=lora, inference={"backend": "vllm"})
    assert out["state"] == "succeeded", out["error"]
    s = {k: dict(v) for k, v in out["series"].items()}
    assert sorted(s["reward/mean"]) == [1, 2, 3, 4]
    # Only the adapter moves (the torch backend's LoRA runs: the trl-async-lora preset's in
    # test_presets.py, a sharded pool's in test_trainer_pool_runs.py).
    adapter = policy_bytes(cache_dir, lora)
    assert set(s["sync/bytes"].values()) == {float(adapter)}
    assert adapter < policy_bytes(cache_dir) / 5  # 139 kB against 1.36 MB for the tiny policy at rank 8
    assert s["sync/inference_ms"] and all(v > 0 for v in s["sync/inference_ms"].values())
    # vLLM's logprobs under the adapter match the trainer's merged policy: IS ratio near 1.
    assert all(0.5 < v < 2.0 for v in s["is/ratio_mean"].values())


@pytest.mark.slow
@pytest.mark.vllm
def test_a_lora_collective_run_on_vllm_broadcasts_the_merged_policy_into_the_engine(cluster, cache_dir):
    """vLLM's broadcast engine pair over gloo (`rollway_gloo`), packed: the engine takes
    weights from nothing else (its `load_weights` refuses a state dict), so a run whose
    versions arrive went through it. LoRA: the trainer sends the merged policy. (The
    full-weight collective into vLLM, one tensor at a time, is test_driver_vllm.py's.)"""
    pytest.importorskip("vllm")

    lora = {"enabled": True, "rank": 8, "alpha": 16.0}
    sync = {"protocol": "collective", "packed": True}  # packed: vLLM's chunks, 32 MB (one here)
    out = run_inline(305, cache_dir, sync=sync, inference={"backend": "vllm"}, lora=lora)
    assert out["state"] == "succeeded", out["error"]
    s = {k: dict(v) for k, v in out["series"].items()}
    assert set(s["sync/bytes"].values()) == {float(policy_bytes(cache_dir))}
    assert s["sync/inference_ms"] and all(0.5 < v < 2.0 for v in s["is/ratio_mean"].values())
