"""TorchBackend: logprobs equal a direct forward pass, EOS stops, seeded, weights reload."""

from __future__ import annotations

import pytest
import torch

from tests.engine.helpers import small_config
from workers.inference.backends import make_backend
from workers.inference.torch_backend import TorchBackend
from workers.model.loading import build_tiny, load_model
from workers.model.tokenizer import CharTokenizer

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
