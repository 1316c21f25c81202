"""TorchBackend: logprobs equal a direct forward pass, EOS stops, seeded, weights reload."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from tests.engine.helpers import small_config
from workers.config.run_config import RunConfig
from workers.inference.backends import make_backend
from workers.inference.torch_backend import TorchBackend
from workers.model.loading import DIMS_FILE, build_tiny, dims_of, load_model, model_config, model_dims
from workers.model.tokenizer import CharTokenizer
from workers.train.warmstart import build_policy

PROMPTS = [[1, 3, 4, 5, 16], [1, 9, 16], [1, 3, 3, 3, 3, 4, 16]]  # different lengths


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_equal_a_direct_forward_pass(tiny_model_dir, temperature):
    backend = TorchBackend(tiny_model_dir)
    model = load_model(tiny_model_dir)
    out = backend.generate(PROMPTS, n=3, max_new_tokens=8, temperature=temperature, seed=0)
    assert [len(c) for c in out] == [3, 3, 3]
    checked = 0
    for prompt, completions in zip(PROMPTS, out, strict=True):
        for c in completions:
            assert len(c.token_ids) == len(c.logprobs) >= 1
            seq = torch.tensor([prompt + c.token_ids])
            with torch.no_grad():
                logp = torch.log_softmax(model(seq).logits[0] / temperature, dim=-1)
            ref = [logp[len(prompt) - 1 + j, t].item() for j, t in enumerate(c.token_ids)]
            assert c.logprobs == pytest.approx(ref, abs=1e-4)
            checked += len(ref)
    assert checked > 20


def test_it_stops_at_eos_or_max_new_tokens(tiny_model_dir):
    backend = TorchBackend(tiny_model_dir)
    eos = CharTokenizer().eos_id
    out = backend.generate(PROMPTS, n=8, max_new_tokens=6, temperature=1.0, seed=1)
    reasons = set()
    for completions in out:
        for c in completions:
            reasons.add(c.finish_reason)
            if c.finish_reason == "stop":
                assert c.token_ids[-1] == eos and eos not in c.token_ids[:-1]
            else:
                assert len(c.token_ids) == 6 and eos not in c.token_ids
    assert reasons == {"stop", "length"}  # the fixture's EOS bias makes both happen


def test_the_same_seed_gives_the_same_samples(tiny_model_dir):
    backend = TorchBackend(tiny_model_dir)
    a = backend.generate(PROMPTS, 4, 6, 1.0, seed=7)
    b = backend.generate(PROMPTS, 4, 6, 1.0, seed=7)
    c = backend.generate(PROMPTS, 4, 6, 1.0, seed=8)

    def ids(out):
        return [x.token_ids for cs in out for x in cs]

    assert ids(a) == ids(b)
    assert ids(a) != ids(c)


def test_load_weights_replaces_every_weight(tiny_model_dir, tmp_path):
    other = build_tiny(small_config().model, CharTokenizer(), seed=123)
    backend = TorchBackend(tiny_model_dir)
    before = backend.generate(PROMPTS, 2, 6, 1.0, seed=0)
    backend.load_weights(other.state_dict())
    model = other.eval()
    c = backend.generate(PROMPTS[:1], 1, 6, 1.0, seed=0)[0][0]
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([PROMPTS[0] + c.token_ids])).logits[0], -1)
    ref = [logp[len(PROMPTS[0]) - 1 + j, t].item() for j, t in enumerate(c.token_ids)]
    assert c.logprobs == pytest.approx(ref, abs=1e-4)
    assert before != backend.generate(PROMPTS, 2, 6, 1.0, seed=0)


def test_load_weights_names_a_missing_tensor(tiny_model_dir):
    backend = TorchBackend(tiny_model_dir)
    sd = load_model(tiny_model_dir).state_dict()
    del sd["model.norm.weight"]
    with pytest.raises(KeyError, match="model.norm.weight"):
        backend.load_weights(sd)


def test_prompts_longer_than_the_model_are_refused(tiny_model_dir):
    with pytest.raises(ValueError, match="max_position_embeddings"):
        TorchBackend(tiny_model_dir).generate([[1] * 60], 1, 8, 1.0, seed=0)


def test_make_backend_picks_torch(tiny_model_dir):
    assert isinstance(make_backend(small_config(), tiny_model_dir), TorchBackend)


@pytest.fixture(scope="module")
def biased_model_dirs(tmp_path_factory) -> dict[str, str]:
    """The hand-written forward's other checkpoints: a tiny Qwen2 (biased q, k, v) and a
    tiny Llama with every projection biased (attention_bias, mlp_bias)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from workers.model.tiny_hf import make_tiny_checkpoint

    root = tmp_path_factory.mktemp("biased")
    qwen2 = make_tiny_checkpoint(str(root / "qwen2"), "qwen2")
    llama = str(root / "llama-biased")
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        attention_bias=True,
        mlp_bias=True,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # biases away from 0, so that dropping one would show
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.normal_(0, 0.5)
    model.save_pretrained(llama)
    return {"qwen2": qwen2, "llama-biased": llama}


@pytest.mark.parametrize("kind", ["qwen2", "llama-biased"])
def test_qwen2_and_biased_llama_run_on_the_hand_written_forward_with_exact_logprobs(biased_model_dirs, kind):
    model_dir = biased_model_dirs[kind]
    backend = make_backend(small_config(), model_dir)
    assert isinstance(backend, TorchBackend)
    assert any(layer.qkv_b is not None for layer in backend.layers)
    model = load_model(model_dir)
    out = backend.generate(PROMPTS, n=2, max_new_tokens=6, temperature=1.0, seed=0)
    checked = 0
    for prompt, completions in zip(PROMPTS, out, strict=True):
        for c in completions:
            with torch.no_grad():
                logp = torch.log_softmax(model(torch.tensor([prompt + c.token_ids])).logits[0], dim=-1)
            ref = [logp[len(prompt) - 1 + j, t].item() for j, t in enumerate(c.token_ids)]
            assert c.logprobs == pytest.approx(ref, abs=1e-4)
            checked += len(ref)
    assert checked > 10
    # What the loop computes with reads back as the checkpoint, bias terms included.
    from workers.model.loading import checkpoint_state_dict
    from workers.sync.base import state_checksum
    from workers.sync.verify import backend_checksum

    assert backend_checksum(backend) == state_checksum(checkpoint_state_dict(model))


def test_a_sliding_window_or_a_partial_bias_keeps_a_model_off_the_hand_written_forward(biased_model_dirs):
    from workers.inference.torch_backend import fast_path_problem

    assert fast_path_problem({"model_type": "qwen2", "use_sliding_window": True}) is not None
    assert fast_path_problem({"model_type": "qwen3"}) is not None
    state = load_model(biased_model_dirs["qwen2"]).state_dict()
    del state["model.layers.0.self_attn.k_proj.bias"]
    with pytest.raises(KeyError, match=r"model\.layers\.0\.self_attn\.k_proj\.bias"):
        TorchBackend(biased_model_dirs["qwen2"]).load_weights(state)


def test_each_prompt_is_prefilled_once_for_its_samples_and_they_sample_as_before(tiny_model_dir):
    """The first step runs each prompt once and copies its KV to its samples' rows: the
    tokens and logprobs are those of prefilling every row."""
    from workers.inference.torch_backend import TorchSession, rows_per_sample

    backend = TorchBackend(tiny_model_dir)

    def run(samples: int) -> list[tuple]:
        rows, budgets = rows_per_sample(PROMPTS, [8] * len(PROMPTS), 4)
        session = TorchSession(backend, rows, budgets, 1.0, 7, samples=samples)
        out = []
        while session.unfinished():
            out += [(t.row, t.token, t.logprob) for t in session.step()]
        return out

    shared, every_row = run(4), run(1)
    assert [r[:2] for r in shared] == [r[:2] for r in every_row]
    assert [r[2] for r in shared] == pytest.approx([r[2] for r in every_row], abs=1e-5)
    with pytest.raises(ValueError, match="runs of 5 samples"):
        TorchSession(backend, *rows_per_sample(PROMPTS, [8] * 3, 4), 1.0, 7, samples=5)


# ---- the sizes a built policy keeps ----------------------------------------------------


@pytest.fixture(scope="module")
def built_policy(tmp_path_factory) -> str:
    """A policy as a run's cache holds one: built by the warm start (two steps of it)."""
    out = str(tmp_path_factory.mktemp("built") / "policy")
    cfg = RunConfig.model_validate({"warm_start": {"steps": 2, "noisy_steps": 0, "batch_size": 4}})
    with torch.random.fork_rng():
        build_policy(cfg, out)
    return out


def test_a_built_policy_keeps_its_sizes_as_its_config_class_reads_them(built_policy):
    read = model_dims(model_config(built_policy))
    with open(os.path.join(built_policy, DIMS_FILE)) as f:
        assert json.load(f) == dataclasses.asdict(read)
    assert dims_of(built_policy) == read


@pytest.mark.parametrize("kept", [None, "not json", '{"hidden": 1}'])
def test_without_readable_sizes_beside_it_a_directory_is_read_through_its_config_class(built_policy, tmp_path, kept):
    copy = tmp_path / "policy"
    shutil.copytree(built_policy, copy)
    if kept is None:
        (copy / DIMS_FILE).unlink()
    else:
        (copy / DIMS_FILE).write_text(kept)
    assert dims_of(str(copy)) == model_dims(model_config(str(copy)))


def test_the_torch_backend_starts_on_a_built_policy_without_importing_transformers(built_policy):
    # What a torch-backend inference worker builds at its start: the backend and the
    # tokenizer. transformers' config class would import its modeling machinery (about
    # a second of CPU in every such worker: 1.2 s measured); the sizes kept beside the policy spare it.
    code = (
        "import sys\n"
        "from workers.inference.torch_backend import TorchBackend\n"
        "from workers.model.tokenizer import load_tokenizer\n"
        f"TorchBackend({built_policy!r}); load_tokenizer({built_policy!r})\n"
        "print('transformers' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["False"]
