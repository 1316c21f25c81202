"""Any Hugging Face causal LM from a local directory: the tiny BPE checkpoints that
workers.model.tiny_hf writes go through AutoModelForCausalLM / AutoTokenizer, their chat
template and EOS, on the torch backend (transformers' forward for Qwen2, the hand-written
loop for Llama) and on vLLM; directories a run cannot use are refused naming model.path."""

from __future__ import annotations

import importlib
import json
import os
import random
import shutil

import pytest
import ray
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, BertConfig, BertForMaskedLM

from tests.engine.helpers import HF_WARM_START, warm_started
from tests.fake_hub import FakeHub
from workers.config.run_config import RunConfig
from workers.core.hub import HubUnavailable
from workers.core.run_actors import NAMESPACE, actor_name
from workers.inference.backends import make_backend
from workers.inference.torch_backend import TorchBackend
from workers.model.loading import checkpoint_state_dict, model_dir_problem
from workers.model.tiny_hf import IM_END, make_tiny_checkpoint
from workers.model.tokenizer import CharTokenizer, HFTokenizer, load_tokenizer
from workers.rl_tasks import make_task
from workers.rollout.generation import generate_groups
from workers.run.driver import RunDriver
from workers.run.paths import Confinement, PathNotAllowed
from workers.sync.base import state_checksum
from workers.train import warmstart
from workers.train.trainer import Trainer, pack, spread, token_logprobs

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def models_root(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def qwen_dir(models_root) -> str:
    return make_tiny_checkpoint(os.path.join(models_root, "tiny-qwen2"), "qwen2")


@pytest.fixture(scope="module")
def llama_dir(models_root) -> str:
    return make_tiny_checkpoint(os.path.join(models_root, "tiny-llama"), "llama")


def path_config(model_dir: str, **overrides) -> RunConfig:
    base = {
        "model": {"source": "path", "path": model_dir},
        "warm_start": HF_WARM_START,
        "trainer": {"batch_groups": 4, "group_size": 4},
        "stop": {"max_steps": 3},
    }
    base.update(overrides)
    return RunConfig.model_validate(base)


def box_for(models_root: str, tmp_path) -> Confinement:
    return Confinement(
        model_roots=(models_root,),
        scratch_root=str(tmp_path / "scratch"),
        export_root=str(tmp_path / "exports"),
    )


# --- the checkpoint and its tokenizer ---------------------------------------------------


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_the_tiny_checkpoint_is_a_real_hugging_face_directory(tmp_path, arch):
    path = make_tiny_checkpoint(str(tmp_path / arch), arch)
    model = AutoModelForCausalLM.from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)
    assert type(model).__name__ == {"qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM"}[arch]
    assert model.config.vocab_size == len(tok)
    assert tok.eos_token == IM_END and tok.pad_token_id is not None and tok.bos_token_id is not None
    assert len(tok.encode("assistant")) == 1  # BPE merged what the text repeats most
    assert model_dir_problem(path) is None
    # Both go to the hand-written loop (Qwen2 with its biased q/k/v and tied embeddings).
    assert isinstance(make_backend(RunConfig(), path), TorchBackend)


def test_prompts_go_through_the_chat_template_and_completions_stop_at_eos(qwen_dir):
    tok = load_tokenizer(qwen_dir)
    assert isinstance(tok, HFTokenizer)
    hf = AutoTokenizer.from_pretrained(qwen_dir)
    ids = tok.prompt_ids("abc=")
    assert ids == hf.apply_chat_template(
        [{"role": "user", "content": "abc="}], add_generation_prompt=True, return_dict=False
    )
    assert hf.decode(ids).endswith("<|im_start|>assistant\n")
    assert tok.stop_ids == [hf.convert_tokens_to_ids(IM_END)]
    answer = tok.encode("cba")
    assert tok.decode([*answer, tok.eos_id, *tok.encode("zz")]) == "cba"
    # The char model keeps its exact ids.
    assert CharTokenizer().prompt_ids("ab=") == [1, 3, 4, 39]


# --- refusals: each names model.path and says what is wrong ----------------------------


def test_a_directory_that_is_not_a_model_is_refused(tmp_path, qwen_dir):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "no config.json" in model_dir_problem(str(empty))
    no_weights = tmp_path / "no-weights"
    shutil.copytree(qwen_dir, no_weights, ignore=shutil.ignore_patterns("*.safetensors"))
    problem = model_dir_problem(str(no_weights))
    assert problem.startswith("has no weights") and "model.path" in problem
    box = Confinement(model_roots=(str(tmp_path),), scratch_root=str(tmp_path / "scratch"))
    errors = box.errors(path_config(str(no_weights)))
    assert list(errors) == ["model.path"] and str(no_weights) in errors["model.path"]
    with pytest.raises(PathNotAllowed, match=r"^model\.path: .* has no weights"):
        box.check(path_config(str(no_weights)))


def test_a_tokenizer_larger_than_the_models_vocabulary_is_refused(tmp_path, qwen_dir):
    bad = tmp_path / "grown-tokenizer"
    shutil.copytree(qwen_dir, bad)
    tok = AutoTokenizer.from_pretrained(bad)
    tok.add_tokens(["<extra-1>", "<extra-2>"])  # the embedding was not resized
    tok.save_pretrained(bad)
    vocab = json.loads((bad / "config.json").read_text())["vocab_size"]
    problem = model_dir_problem(str(bad))
    assert f"tokenizer of {vocab + 2} tokens" in problem and f"embedding has {vocab} rows" in problem
    box = Confinement(model_roots=(str(tmp_path),), scratch_root=str(tmp_path / "scratch"))
    assert "tokenizer" in box.errors(path_config(str(bad)))["model.path"]


def test_a_model_that_is_not_a_causal_lm_is_refused(tmp_path, qwen_dir):
    bert = tmp_path / "bert"
    config = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    BertForMaskedLM(config).save_pretrained(bert)
    AutoTokenizer.from_pretrained(qwen_dir).save_pretrained(bert)
    problem = model_dir_problem(str(bert))
    assert "BertForMaskedLM" in problem and "not a causal language model" in problem
    box = Confinement(model_roots=(str(tmp_path),), scratch_root=str(tmp_path / "scratch"))
    assert "not a causal language model" in box.errors(path_config(str(bert)))["model.path"]


def test_a_hub_model_is_refused_while_the_hub_cannot_be_reached(tmp_path, monkeypatch):
    from huggingface_hub import constants

    cfg = RunConfig.model_validate({"model": {"source": "hub", "hub_id": "rollway-tests/no-such-model"}})
    box = Confinement(scratch_root=str(tmp_path))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    message = box.errors(cfg)["model.hub_id"]
    assert "offline" in message and "model.source='path'" in message
    hub = FakeHub(monkeypatch, tmp_path)  # online: a Hub that has no such model
    assert box.errors(cfg) == {
        "model.hub_id": "there is no model 'rollway-tests/no-such-model' on the Hugging Face Hub (or it is private)"
    }
    hub.fail = FakeHub.http_error(500)  # a Hub that fails is not the config's fault: no refusal, HubUnavailable
    with pytest.raises(HubUnavailable) as info:
        box.errors(cfg)
    assert info.value.field == "model.hub_id" and "answered 500; try again later" in info.value.message


def test_hub_needs_an_id():
    with pytest.raises(ValueError, match="model.hub_id is required"):
        RunConfig.model_validate({"model": {"source": "hub"}})
    with pytest.raises(ValueError, match="hub_id"):
        RunConfig.model_validate({"model": {"source": "hub", "hub_id": "../etc/passwd"}})


# --- generation on the checkpoint's own tokenizer ----------------------------------------


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_rollouts_use_the_bpe_ids_and_stop_at_eos(request, tmp_path, arch):
    model_dir = request.getfixturevalue(f"{arch}_dir" if arch == "llama" else "qwen_dir")
    cfg = path_config(model_dir)
    policy = warmstart.policy_dir(cfg, str(tmp_path / "cache"))
    tok = load_tokenizer(policy)
    task = make_task(cfg.task)
    prompts = task.sample(8, random.Random(3))
    groups = generate_groups(make_backend(cfg, policy), task, tok, prompts, cfg, version=0, seed=0)
    rollouts = [r for g in groups for r in g.rollouts]
    for (prompt, _), g in zip(prompts, groups, strict=True):
        assert all(r.prompt_ids == tok.prompt_ids(prompt) for r in g.rollouts)
    stopped = [r for r in rollouts if r.finish_reason == "stop"]
    assert len(stopped) >= len(rollouts) // 2, [r.completion_ids for r in rollouts]
    for r in stopped:  # EOS ends the completion and appears nowhere before it
        assert r.completion_ids[-1] == tok.eos_id and tok.eos_id not in r.completion_ids[:-1]
    # The warm start taught it to answer in the task's letters: decoded with the BPE
    # tokenizer, most completions are text of the alphabet (random ids would not be).
    texts = [tok.decode(r.completion_ids) for r in stopped]
    assert sum(bool(t) and set(t) <= set(cfg.task.alphabet) for t in texts) >= len(texts) // 2, texts
    # The sampler's logprobs are the trainer's: same ids, same model.
    trainer = Trainer(cfg, policy)
    batch = pack([r.prompt_ids for r in rollouts], [r.completion_ids for r in rollouts], trainer.pad_id)
    with torch.no_grad():
        trained = token_logprobs(trainer.model, batch, cfg.inference.temperature)
    sampled = spread([r.behaviour_logprobs for r in rollouts], batch)
    assert float(((trained - sampled) * batch.mask).abs().max()) < 1e-4


def test_weights_reload_into_the_transformers_backend_and_the_hand_written_loop(qwen_dir):
    from workers.inference.transformers_backend import TransformersBackend
    from workers.sync.verify import backend_checksum

    backend = TransformersBackend(qwen_dir)
    model = AutoModelForCausalLM.from_pretrained(qwen_dir)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.5)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    state.pop("lm_head.weight")  # tied to the embedding: a checkpoint may leave it out
    backend.load_weights(state)
    assert state_checksum(backend.model.state_dict()) == state_checksum(model.state_dict())
    with pytest.raises(KeyError, match="missing"):
        backend.load_weights({k: v for k, v in state.items() if "layers.0." not in k})
    loop = make_backend(RunConfig(), qwen_dir)  # Qwen2 in float32 on the CPU: the hand-written loop
    assert isinstance(loop, TorchBackend)
    loop.load_weights(state)
    assert backend_checksum(loop) == state_checksum(checkpoint_state_dict(model))


# --- whole runs through the driver --------------------------------------------------------


def run_driver(run_id: int, cfg: RunConfig, cache_dir: str, box: Confinement) -> dict:
    warm_started(cfg, cache_dir)
    driver = RunDriver.options(name=actor_name(run_id), namespace=NAMESPACE).remote(
        run_id, cfg.model_dump(mode="json"), None, "", cache_dir, exit_when_done=False, confinement=box
    )
    try:
        return ray.get(driver.run.remote(), timeout=600)
    finally:
        ray.kill(driver)


def test_a_run_post_trains_a_local_qwen2_checkpoint_and_exports_it(cluster, cache_dir, models_root, qwen_dir, tmp_path):
    box = box_for(models_root, tmp_path)
    out = run_driver(801, path_config(qwen_dir), cache_dir, box)
    assert out["state"] == "succeeded", out["error"]
    rewards = dict(out["series"]["reward/mean"])
    assert sorted(rewards) == [1, 2, 3]
    # A char tokenizer's ids on this model would decode to nothing of the task: reward 0.
    assert max(rewards.values()) > 0, rewards
    exported = out["export_dir"]
    assert exported == box.export_dir(801)
    model = AutoModelForCausalLM.from_pretrained(exported)
    assert state_checksum(checkpoint_state_dict(model)) == out["policy_sha256"]
    assert (
        AutoTokenizer.from_pretrained(exported).chat_template == AutoTokenizer.from_pretrained(qwen_dir).chat_template
    )


def test_an_async_moe_run_keeps_routing_and_sampling_masks_end_to_end(cluster, cache_dir, models_root, tmp_path):
    """The records travel through the run's actors (inference worker, buffer, trainer):
    routing agreement is reported every step and the mask keeps the top-k bias out."""
    moe = make_tiny_checkpoint(os.path.join(models_root, "tiny-qwen2-moe"), "qwen2_moe", hidden_size=64)
    cfg = path_config(
        moe,
        mode="async",
        inference={"top_k": 8},
        correction={"keep_routing": True, "keep_sampling_mask": True},
    )
    out = run_driver(804, cfg, cache_dir, box_for(models_root, tmp_path))
    assert out["state"] == "succeeded", out["error"]
    s = {k: dict(v) for k, v in out["series"].items()}
    assert sorted(s["routing/agreement"]) == [1, 2, 3]
    assert all(0.0 <= v <= 1.0 for v in s["routing/agreement"].values())
    # Without the mask this cut gives a mismatch KL above 1 (bench/keep_records.py).
    assert all(v < 0.1 for v in s["mismatch/kl"].values()), s["mismatch/kl"]


def test_a_run_on_a_directory_that_is_not_a_model_fails_naming_model_path(cluster, cache_dir, tmp_path):
    models = tmp_path / "models"
    (models / "half").mkdir(parents=True)
    (models / "half" / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    out = run_driver(802, path_config(str(models / "half")), cache_dir, box_for(str(models), tmp_path))
    assert out["state"] == "failed"
    assert out["error"].startswith("model.path:") and "has no weights" in out["error"]
    assert not os.path.exists(box_for(str(models), tmp_path).export_dir(802))


@pytest.mark.slow
@pytest.mark.vllm
def test_a_run_post_trains_a_local_qwen2_checkpoint_on_vllm(cluster, cache_dir, models_root, qwen_dir, tmp_path):
    try:
        importlib.import_module("vllm")
    except Exception as exc:  # ImportError, or a broken install
        pytest.skip(f"vllm is not importable ({exc})")
    box = box_for(models_root, tmp_path)
    out = run_driver(803, path_config(qwen_dir, inference={"backend": "vllm"}), cache_dir, box)
    assert out["state"] == "succeeded", out["error"]
    s = {k: dict(v) for k, v in out["series"].items()}
    assert sorted(s["reward/mean"]) == [1, 2, 3] and max(s["reward/mean"].values()) > 0
    # Weights reached the engine (tied lm_head left to vLLM) and its logprobs match the trainer's.
    assert s["sync/latency_ms"] and all(0.5 < v < 2.0 for v in s["is/ratio_mean"].values())
    model = AutoModelForCausalLM.from_pretrained(out["export_dir"])
    assert state_checksum(checkpoint_state_dict(model)) == out["policy_sha256"]
