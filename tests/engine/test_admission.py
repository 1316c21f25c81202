"""Admission (workers/run/admission.py): operator limits, what the engine can run and cluster
capacity (CPUs, GPUs, memory), each refusal naming the field and the limit; the estimate
grows with what drives memory."""

from __future__ import annotations

import pytest

from workers.config.run_config import RunConfig
from workers.model.loading import build_tiny
from workers.model.tokenizer import CharTokenizer
from workers.run.admission import (
    Capacity,
    Limits,
    admission_errors,
    capacity_errors,
    colocated_gpu,
    demand,
    gpu_demand,
    gpu_memory_errors,
    gpu_memory_of,
    model_shape,
)

ROOMY = Capacity(cpus=64, memory_bytes=512 * 2**30)


def cfg(**sections) -> RunConfig:
    return RunConfig.model_validate(sections)


def test_the_parameter_count_matches_the_model_that_is_built():
    c = RunConfig()
    model = build_tiny(c.model, CharTokenizer(), seed=0)
    assert model_shape(c)["params"] == sum(p.numel() for p in model.parameters())


def test_the_default_run_fits_this_kind_of_machine():
    assert admission_errors(RunConfig(), Limits(), Capacity(cpus=2, memory_bytes=8 * 2**30)) == {}


def test_cpus_are_what_the_actors_ask_for():
    assert demand(cfg(inference={"num_workers": 3})).cpus == 0.25 + 3 * 0.25
    assert demand(cfg(inference={"num_workers": 3, "cpus_per_worker": 1}, trainer={"cpus_per_rank": 2})).cpus == 5
    errors = admission_errors(cfg(inference={"num_workers": 8}), Limits(), Capacity(cpus=2, memory_bytes=2**40))
    assert "2.25 CPUs" in errors["inference.num_workers"]


FOUR_GPUS = Capacity(cpus=64, memory_bytes=512 * 2**30, gpus=4)


def on_gpus(workers: int, ranks: int = 1, mode: str = "disaggregated") -> RunConfig:
    return cfg(
        inference={"num_workers": workers},
        trainer={"num_ranks": ranks, "backend": "ddp" if ranks > 1 else "single"},
        placement={"devices": "gpu", "mode": mode},
    )


def test_gpus_are_counted_per_pool_when_disaggregated():
    assert demand(on_gpus(2, 2)).gpus == 4
    assert capacity_errors(on_gpus(2, 2), FOUR_GPUS) == {}
    errors = capacity_errors(on_gpus(3, 2), FOUR_GPUS)
    assert list(errors) == ["inference.num_workers"]
    assert "asks for 5 GPUs" in errors["inference.num_workers"]
    assert "the cluster has 4" in errors["inference.num_workers"]
    assert list(capacity_errors(on_gpus(1, 4), FOUR_GPUS)) == ["trainer.num_ranks"]


def test_a_launch_asking_more_gpus_than_the_cluster_has_is_refused():
    assert admission_errors(on_gpus(3), Limits(), FOUR_GPUS) == {}
    errors = admission_errors(on_gpus(4), Limits(), FOUR_GPUS)
    assert set(errors) == {"inference.num_workers"}
    assert "5 GPUs" in errors["inference.num_workers"]
    # No GPU in the cluster at all: any GPU placement is refused, a CPU one is not.
    assert "inference.num_workers" in admission_errors(on_gpus(1), Limits(), ROOMY)
    assert admission_errors(cfg(inference={"num_workers": 4}), Limits(), ROOMY) == {}


def test_colocated_pools_share_their_gpus():
    assert demand(on_gpus(2, 2, "colocated")).gpus == 2
    assert demand(on_gpus(4, 1, "colocated")).gpus == 4
    assert capacity_errors(on_gpus(4, 1, "colocated"), FOUR_GPUS) == {}
    assert "inference.num_workers" in capacity_errors(on_gpus(5, 1, "colocated"), FOUR_GPUS)


def with_reward_pool(base: RunConfig, workers: int, **rewards) -> RunConfig:
    return RunConfig.model_validate({**base.model_dump(), "rewards": {"workers": workers, **rewards}})


def test_the_reward_pools_cpus_gpus_and_processes_are_counted():
    plain = on_gpus(1)
    pooled = with_reward_pool(plain, 2, gpus_per_worker=1, cpus_per_worker=2)
    assert (demand(plain).gpus, demand(pooled).gpus) == (2, 4)
    assert demand(pooled).cpus == demand(plain).cpus + 2 * 2
    assert demand(pooled).memory_bytes > demand(plain).memory_bytes
    assert "reward worker" in demand(pooled).per_role and "reward worker" not in demand(plain).per_role
    # Colocated pools share their GPUs; the reward workers' GPUs come on top.
    assert demand(with_reward_pool(on_gpus(2, 2, "colocated"), 2, gpus_per_worker=0.5)).gpus == 2 + 1


def test_a_reward_pool_asking_more_gpus_than_the_cluster_has_is_refused_naming_it():
    assert admission_errors(with_reward_pool(on_gpus(1), 2, gpus_per_worker=1), Limits(), FOUR_GPUS) == {}
    errors = admission_errors(with_reward_pool(on_gpus(1), 3, gpus_per_worker=1), Limits(), FOUR_GPUS)
    assert list(errors) == ["rewards.workers"]
    assert errors["rewards.workers"] == (
        "the run asks for 5 GPUs (inference.num_workers 1 × inference.tensor_parallel_size 1 + trainer.num_ranks 1 "
        "+ rewards.workers 3 × rewards.gpus_per_worker 1); the cluster has 4: ask for fewer, or set "
        "placement.devices to 'cpu'"
    )
    # The pool that asks for the most is named: here the inference workers.
    errors = capacity_errors(with_reward_pool(on_gpus(3), 1, gpus_per_worker=0.5), FOUR_GPUS)
    assert list(errors) == ["inference.num_workers"] and "4.5 GPUs" in errors["inference.num_workers"]


def test_a_reward_pool_asking_more_cpus_than_the_cluster_has_is_refused_naming_it():
    small = Capacity(cpus=2, memory_bytes=2**40)
    assert admission_errors(cfg(rewards={"workers": 4}), Limits(), small) == {}
    errors = admission_errors(cfg(rewards={"workers": 4, "cpus_per_worker": 1}), Limits(), small)
    assert list(errors) == ["rewards.workers"]
    assert errors["rewards.workers"].startswith("1 inference workers and 4 reward workers ask for 4.5 CPUs")
    assert "+ rewards.cpus_per_worker 1 × 4 for the reward pool" in errors["rewards.workers"]


def test_tensor_parallel_inference_needs_vllm_and_is_refused_naming_the_field_otherwise():
    assert admission_errors(on_gpus(2, 2), Limits(), FOUR_GPUS) == {}  # a trainer pool runs
    errors = admission_errors(cfg(inference={"tensor_parallel_size": 2}), Limits(), ROOMY)
    assert list(errors) == ["inference.tensor_parallel_size"]
    assert "read only by vLLM (inference.backend 'vllm')" in errors["inference.tensor_parallel_size"]
    assert admission_errors(cfg(inference={"tensor_parallel_size": 2, "backend": "vllm"}), Limits(), ROOMY) == {}


def test_memory_grows_with_the_model_the_batch_and_vllm():
    base = demand(RunConfig()).memory_bytes
    assert demand(cfg(model={"hidden_size": 512, "num_heads": 4})).memory_bytes > base
    assert demand(cfg(trainer={"batch_groups": 64})).memory_bytes > base
    assert demand(cfg(inference={"backend": "vllm"})).memory_bytes > base
    lora = cfg(model={"hidden_size": 1024, "num_heads": 8}, lora={"enabled": True})
    full = cfg(model={"hidden_size": 1024, "num_heads": 8})
    assert demand(lora).per_role["trainer"] < demand(full).per_role["trainer"]


def test_limits_are_checked_before_the_cluster():
    errors = admission_errors(cfg(stop={"max_steps": 10**30}), Limits(), Capacity(cpus=0, memory_bytes=0))
    assert list(errors) == ["stop.max_steps"]


def test_each_limit_names_its_field_and_setting():
    limits = Limits(max_steps=10, max_minutes=5, max_workers=2, max_model_params=1000)
    errors = admission_errors(
        cfg(stop={"max_steps": 11, "max_minutes": 6}, inference={"num_workers": 3}), limits, ROOMY
    )
    assert {"stop.max_steps", "stop.max_minutes", "inference.num_workers", "model.hidden_size"} == set(errors)
    for setting in ("ROLLWAY_MAX_STEPS", "ROLLWAY_MAX_MINUTES", "ROLLWAY_MAX_WORKERS", "ROLLWAY_MAX_MODEL_PARAMS"):
        assert any(setting in m for m in errors.values())


def test_a_checkpoint_is_sized_from_its_headers(tmp_path):
    from workers.model.loading import save_model

    c = RunConfig()
    model = build_tiny(c.model, CharTokenizer(), seed=0)
    save_model(model, CharTokenizer(), str(tmp_path))
    shape = model_shape(cfg(model={"source": "path", "path": str(tmp_path)}))
    assert shape["params"] == sum(p.numel() for p in model.parameters())
    assert shape["hidden"] == c.model.hidden_size


# --- GPU memory per pool ----------------------------------------------------------------

# Qwen2.5-7B's shape (its published config): 7.62 G parameters, 28 layers, 4 KV heads of 128.
QWEN_7B = {
    "params": 7_615_616_512,
    "hidden": 3584,
    "layers": 28,
    "intermediate": 18944,
    "vocab": 152064,
    "kv_width": 512,
}
H100 = 80 * 2**30


def on_h100s(**sections) -> RunConfig:
    base = {"placement": {"devices": "gpu"}, "model": {"max_position_embeddings": 1024}}
    base["inference"] = {"dtype": "bfloat16", "max_new_tokens": 512, **sections.pop("inference", {})}
    return RunConfig.model_validate({**base, **sections})


def test_a_gpus_memory_comes_from_the_type_ray_names_the_smallest_known():
    assert gpu_memory_of({"GPU": 8, "accelerator_type:H100": 8}) == 80 * 2**30
    assert gpu_memory_of({"GPU": 12, "accelerator_type:H100": 8, "accelerator_type:L4": 4}) == 24 * 2**30
    assert gpu_memory_of({"GPU": 2, "accelerator_type:A100": 2}) == 40 * 2**30  # 40 or 80: the smaller
    assert gpu_memory_of({"GPU": 1, "accelerator_type:MADE-UP": 1}) == 0 and gpu_memory_of({"CPU": 2}) == 0


def test_the_estimate_is_near_what_a_7b_lora_step_held_on_an_h100():
    """bench/gpu_scale.py on an H100 80GB: Qwen2.5-7B shape, LoRA r=32, bf16 mixed, 8×8
    rollouts of 128+512 tokens in micro-batches of 8 rows, checkpointed: peak 36.9 GiB."""
    c = on_h100s(
        trainer={
            "batch_groups": 8,
            "group_size": 8,
            "micro_batch_rows": 8,
            "gradient_checkpointing": True,
            "dtype": "bfloat16",
        },
        lora={"enabled": True, "rank": 32},
        task={"min_len": 3, "max_len": 126},
    )
    estimate = gpu_demand(c, QWEN_7B).trainer / 2**30
    assert 0.85 * 36.9 < estimate < 1.15 * 36.9, estimate


def test_a_7b_full_fine_tune_needs_a_sharded_trainer_pool_on_80_gib_gpus():
    whole = on_h100s(trainer={"micro_batch_rows": 8, "gradient_checkpointing": True, "dtype": "bfloat16"})
    errors = gpu_memory_errors(whole, H100, QWEN_7B)
    assert list(errors) == ["trainer.backend"]
    assert "gradients and AdamW state 85.1 GiB" in errors["trainer.backend"]
    assert "trainer.backend 'fsdp2'" in errors["trainer.backend"]
    sharded = whole.model_copy(
        update={"trainer": whole.trainer.model_copy(update={"backend": "fsdp2", "num_ranks": 8})}
    )
    assert gpu_memory_errors(sharded, H100, QWEN_7B) == {}
    assert gpu_demand(sharded, QWEN_7B).trainer < gpu_demand(whole, QWEN_7B).trainer / 4


def test_vllm_must_hold_the_weights_in_its_share_of_the_gpu():
    fp32 = on_h100s(inference={"backend": "vllm", "dtype": "float32", "gpu_memory_utilization": 0.3})
    errors = gpu_memory_errors(fp32, H100, QWEN_7B)
    assert "inference.tensor_parallel_size" in errors
    assert "inference.gpu_memory_utilization 0.3 of 80.0 GiB" in errors["inference.tensor_parallel_size"]
    roomier = fp32.model_copy(update={"inference": fp32.inference.model_copy(update={"gpu_memory_utilization": 0.6})})
    assert "inference.tensor_parallel_size" not in gpu_memory_errors(roomier, H100, QWEN_7B)


def test_colocated_the_trainer_gets_what_vllm_leaves_of_the_gpu():
    settings = {
        "trainer": {"micro_batch_rows": 8, "gradient_checkpointing": True, "dtype": "bfloat16"},
        "lora": {"enabled": True, "rank": 32},
    }
    apart = on_h100s(inference={"backend": "vllm", "gpu_memory_utilization": 0.6}, **settings)
    assert gpu_memory_errors(apart, H100, QWEN_7B) == {}
    together = apart.model_copy(update={"placement": apart.placement.model_copy(update={"mode": "colocated"})})
    errors = gpu_memory_errors(together, H100, QWEN_7B)
    # Both resident they need 82.2 GiB; taking turns, 77.4: the refusal names the switch.
    assert list(errors) == ["inference.sleep_level"]
    assert "need 82.2 GiB of one GPU at once" in errors["inference.sleep_level"]
    assert "Taking turns (vLLM asleep while the trainer steps) needs 77.4 GiB" in errors["inference.sleep_level"]
    whole = together.model_copy(update={"lora": together.lora.model_copy(update={"enabled": False})})
    assert "beside its colocated inference worker" in gpu_memory_errors(whole, H100, QWEN_7B)["trainer.backend"]


def test_a_cuda_ipc_sender_into_the_torch_backend_keeps_a_version_on_the_trainers_gpu():
    """The project's own sender keeps the newest version until its next send (an H200 run
    found it standing where vLLM's KV cache had to wake); vLLM's ipc engine frees it."""
    colocated = {"devices": "gpu", "mode": "colocated"}
    torch_ipc = on_h100s(placement=colocated, sync={"protocol": "cuda_ipc"}, inference={"backend": "torch"})
    assert gpu_demand(torch_ipc, QWEN_7B).trainer_parts["sync buffer"] == QWEN_7B["params"] * 2  # bf16
    into_vllm = on_h100s(placement=colocated, sync={"protocol": "cuda_ipc"}, inference={"backend": "vllm"})
    by_store = on_h100s(placement=colocated, inference={"backend": "torch"})
    assert gpu_demand(into_vllm, QWEN_7B).trainer_parts["sync buffer"] == 0
    assert gpu_demand(by_store, QWEN_7B).trainer_parts["sync buffer"] == 0
    kept = gpu_demand(torch_ipc, QWEN_7B).trainer - gpu_demand(by_store, QWEN_7B).trainer
    assert kept == QWEN_7B["params"] * 2


def colocated_7b_lora(level: int, utilization: float = 0.6) -> RunConfig:
    return on_h100s(
        mode="sync",
        placement={"devices": "gpu", "mode": "colocated"},
        inference={"backend": "vllm", "gpu_memory_utilization": utilization, "sleep_level": level},
        trainer={"micro_batch_rows": 8, "gradient_checkpointing": True, "dtype": "bfloat16"},
        lora={"enabled": True, "rank": 32},
    )


@pytest.mark.parametrize("level", [1, 2])
def test_a_colocated_gpu_that_fits_only_taking_turns_is_admitted_when_vllm_sleeps(level):
    assert gpu_memory_errors(colocated_7b_lora(0), H100, QWEN_7B).keys() == {"inference.sleep_level"}
    assert gpu_memory_errors(colocated_7b_lora(level), H100, QWEN_7B) == {}


def test_while_vllm_generates_its_share_and_the_trainers_weights_must_fit_together():
    errors = gpu_memory_errors(colocated_7b_lora(1, utilization=0.7), H100, QWEN_7B)
    assert list(errors) == ["inference.gpu_memory_utilization"]
    assert "need 85.4 GiB; the GPU has 80.0 GiB" in errors["inference.gpu_memory_utilization"]


# What one NVIDIA H200 (143,771 MiB) held in colocated turns, measured by
# bench/gpu_sleep.py: vLLM's sleep-mode allocator holding a worker's bf16 weights and
# KV cache at gpu_memory_utilization 0.5 in one process, the trainer (bf16 mixed, 8×8
# rollouts of 128+512 tokens, micro-batches of 8 rows, checkpointed; LoRA r=32 at 7B) in
# another, random-weight Qwen2.5 shapes. GiB in use on the GPU, every process's: while
# vLLM generates (both awake) and at the trainer's step (vLLM asleep, level 1).
H200 = 143_771 * 2**20
H200_TURNS = [
    # (shape, LoRA, generating GiB, training GiB)
    ({"params": 494_032_768, "hidden": 896, "layers": 24, "intermediate": 4864, "vocab": 151_936, "kv_width": 128},
     False, 73.3, 13.3),
    ({"params": 1_543_714_304, "hidden": 1536, "layers": 28, "intermediate": 8960, "vocab": 151_936,
      "kv_width": 256}, False, 77.2, 30.6),
    ({**QWEN_7B, "params": 7_614_699_008, "vocab": 151_936}, True, 100.2, 37.9),
]  # fmt: skip


@pytest.mark.parametrize(("shape", "lora", "generating", "training"), H200_TURNS, ids=["0.5b", "1.5b", "7b"])
def test_the_colocated_plan_is_near_what_an_h200_held_in_each_phase(shape, lora, generating, training):
    c = on_h100s(
        mode="sync",
        placement={"devices": "gpu", "mode": "colocated"},
        inference={"backend": "vllm", "gpu_memory_utilization": 0.5, "sleep_level": 1},
        trainer={"batch_groups": 8, "group_size": 8, "micro_batch_rows": 8, "gradient_checkpointing": True,
                 "dtype": "bfloat16"},
        lora={"enabled": lora, "rank": 32},
        task={"min_len": 3, "max_len": 126},
    )  # fmt: skip
    plan = colocated_gpu(c, H200, shape)
    assert abs(plan.generating / 2**30 - generating) < 0.03 * generating, plan
    assert abs(plan.training / 2**30 - training) < 0.10 * training, plan
    assert plan.peak == max(plan.generating, plan.training)
    # Nobody asleep: vLLM's share and the trainer's whole step at once, more than either phase.
    assert colocated_gpu(c, H200, shape, level=0).peak > plan.peak


def test_a_trainer_step_too_big_for_the_whole_gpu_is_refused_even_when_vllm_sleeps():
    c = colocated_7b_lora(1)
    whole = c.model_copy(update={"lora": c.lora.model_copy(update={"enabled": False})})
    errors = gpu_memory_errors(whole, H100, QWEN_7B)
    assert "beside its sleeping inference worker" in errors["trainer.backend"]


@pytest.mark.parametrize(
    ("sections", "says"),
    [
        ({"inference": {"backend": "vllm", "sleep_level": 1}}, "vLLM on CPU has no sleep mode"),
        (
            {"placement": {"devices": "gpu"}, "inference": {"backend": "vllm", "sleep_level": 1}},
            "placement.mode 'disaggregated' shares none",
        ),
        (
            {"mode": "sync", "placement": {"devices": "gpu", "mode": "colocated"}, "inference": {"sleep_level": 2}},
            "inference.backend 'torch' does not have",
        ),
        (
            {"placement": {"devices": "gpu", "mode": "colocated"}, "inference": {"backend": "vllm", "sleep_level": 1}},
            "mode 'async' runs them side by side: set mode to 'sync'",
        ),
        (
            {
                "mode": "sync",
                "placement": {"devices": "gpu", "mode": "colocated"},
                "inference": {"backend": "vllm", "sleep_level": 2},
                "lora": {"enabled": True},
                "sync": {"protocol": "lora"},
            },
            "the base weights would never come back",
        ),
    ],
)
def test_a_sleep_level_where_it_cannot_work_is_refused_at_launch_naming_the_field(sections, says):
    errors = admission_errors(cfg(**sections), Limits(), None)
    assert says in errors["inference.sleep_level"]


def test_a_sleep_level_colocated_on_vllm_in_sync_mode_is_accepted():
    ok = {"mode": "sync", "placement": {"devices": "gpu", "mode": "colocated"}, "inference": {"backend": "vllm"}}
    for level in (0, 1, 2):
        sections = {**ok, "inference": {"backend": "vllm", "sleep_level": level}}
        assert "inference.sleep_level" not in admission_errors(cfg(**sections), Limits(), None)


def test_gpu_memory_is_checked_only_on_gpus_of_known_memory():
    big = on_h100s()
    assert gpu_memory_errors(big, 0, QWEN_7B) == {}
    assert (
        gpu_memory_errors(
            big.model_copy(update={"placement": big.placement.model_copy(update={"devices": "cpu"})}), H100, QWEN_7B
        )
        == {}
    )


# --- vLLM's context: the run's sequences, not the model's whole window -------------------


def qwen25_half_b_dir(tmp_path) -> str:
    """Qwen2.5-0.5B's config (32,768 positions, tied) beside a small tokenizer, no weights:
    what admission reads of a checkpoint."""
    from transformers import Qwen2Config

    from workers.config.run_config import TaskConfig
    from workers.model.tiny_hf import train_tokenizer

    path = tmp_path / "qwen2.5-0.5b"
    Qwen2Config(
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        tie_word_embeddings=True,
        eos_token_id=3,
    ).save_pretrained(path)
    train_tokenizer(TaskConfig()).save_pretrained(path)
    return str(path)


def test_a_vllm_worker_is_sized_for_the_runs_prompts_not_the_models_whole_context(tmp_path):
    from workers.inference.base import vllm_cpu_kv_cache_bytes
    from workers.model.loading import model_config, model_dims
    from workers.run.admission import run_context

    path = qwen25_half_b_dir(tmp_path)
    run = cfg(model={"source": "path", "path": path}, inference={"backend": "vllm"})
    dims = model_dims(model_config(path))
    context = run_context(run)
    # BOS + the chat template + a reversal prompt of ≤ 5 letters, + 8 new tokens.
    assert 8 < context <= 40
    assert vllm_cpu_kv_cache_bytes(dims, context) < 2 * 2**30
    assert vllm_cpu_kv_cache_bytes(dims, dims.positions) > 200 * 2**30  # what the whole window reserved
    assert demand(run).per_role["inference worker"] < 8 * 2**30


def test_prompts_and_completions_past_the_models_positions_are_refused_at_launch(tmp_path):
    from workers.model.tiny_hf import make_tiny_checkpoint

    path = make_tiny_checkpoint(str(tmp_path / "tiny"), "llama", max_position_embeddings=32)
    errors = admission_errors(
        cfg(model={"source": "path", "path": path}, inference={"max_new_tokens": 40}), Limits(), None
    )
    assert "inference.max_new_tokens" in errors
    assert "the model takes 32 positions" in errors["inference.max_new_tokens"]


def test_a_kl_penalty_costs_a_float32_copy_of_the_weights_unless_lora_gives_the_base():
    shape = model_shape(RunConfig())
    plain = gpu_demand(cfg(), shape)
    with_kl = gpu_demand(cfg(trainer={"kl_coef": 0.05}), shape)
    assert with_kl.trainer_parts["KL reference"] == 4 * shape["params"]
    assert with_kl.trainer - plain.trainer == 4 * shape["params"]
    lora = gpu_demand(cfg(trainer={"kl_coef": 0.05}, lora={"enabled": True}), shape)
    assert lora.trainer_parts["KL reference"] == 0


@pytest.mark.parametrize("arch", ["qwen2_moe", "mixtral"])
def test_a_mixture_of_experts_on_vllm_cpu_is_refused_at_launch_naming_the_backend(tmp_path, arch):
    from workers.model.tiny_hf import make_tiny_checkpoint

    moe = make_tiny_checkpoint(str(tmp_path / arch), arch, hidden_size=64)
    dense = make_tiny_checkpoint(str(tmp_path / "llama"), "llama", hidden_size=64)

    def errors(path, **inference):
        return admission_errors(cfg(model={"source": "path", "path": path}, inference=inference), Limits(), None)

    refused = errors(moe, backend="vllm")
    assert list(refused) == ["inference.backend"]
    assert "mixture of experts" in refused["inference.backend"] and "'torch'" in refused["inference.backend"]
    assert errors(moe, backend="torch") == {}
    assert errors(dense, backend="vllm") == {}
    on_gpus = cfg(model={"source": "path", "path": moe}, inference={"backend": "vllm"}, placement={"devices": "gpu"})
    assert "inference.backend" not in admission_errors(on_gpus, Limits(), None)


def test_keep_routing_is_refused_at_launch_where_there_is_no_router_or_vllm_cannot_return_them(tmp_path):
    from workers.model.tiny_hf import make_tiny_checkpoint

    moe = make_tiny_checkpoint(str(tmp_path / "moe"), "qwen2_moe", hidden_size=64)
    dense = make_tiny_checkpoint(str(tmp_path / "dense"), "qwen2", hidden_size=64)

    def errors(model, **inference):
        run = cfg(model=model, inference=inference, correction={"keep_routing": True})
        return admission_errors(run, Limits(), None)

    assert errors({"source": "path", "path": moe}, backend="torch") == {}
    for model in ({"source": "path", "path": dense}, {"source": "tiny"}):
        refused = errors(model, backend="torch")
        assert list(refused) == ["correction.keep_routing"]
        assert "no mixture-of-experts router" in refused["correction.keep_routing"]
    on_vllm = cfg(
        model={"source": "path", "path": moe},
        inference={"backend": "vllm"},
        placement={"devices": "gpu"},
        correction={"keep_routing": True},
    )
    assert "correction.keep_routing" not in admission_errors(on_vllm, Limits(), None)
    on_vllm_cpu = on_vllm.model_copy(update={"placement": on_vllm.placement.model_copy(update={"devices": "cpu"})})
    refused = admission_errors(on_vllm_cpu, Limits(), None)
    assert "V2 model runner" in refused["correction.keep_routing"] and "Triton" in refused["correction.keep_routing"]


def test_the_memory_estimates_count_a_tasks_own_prompts_not_the_reverse_tasks_lengths():
    """A sequence is the run's longest prompt as its tokenizer renders it plus the
    completion: gsm8k's prompts are its own, whatever task.max_len says (read only by
    the reverse and copy tasks), and longer than task.max_len's default."""
    from workers.run.admission import sequence_tokens

    def cfg(**task) -> RunConfig:
        return RunConfig.model_validate(
            {"task": task, "inference": {"max_new_tokens": 32}, "model": {"max_position_embeddings": 512}}
        )

    gsm8k, longer = cfg(name="gsm8k"), cfg(name="gsm8k", min_len=3, max_len=40)
    assert sequence_tokens(gsm8k) == sequence_tokens(longer) > RunConfig().task.max_len + 2 + 32
    assert demand(gsm8k).memory_bytes == demand(longer).memory_bytes
    assert gpu_demand(gsm8k).trainer == gpu_demand(longer).trainer
    # The reverse task's own lengths do move it.
    assert sequence_tokens(cfg(min_len=3, max_len=40)) > sequence_tokens(cfg())
