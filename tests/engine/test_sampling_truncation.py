"""Top-k / top-p / min-p sampling on the torch backends (workers/inference/sampling.py):
the right tokens are cut, top_k=1 is greedy, and the behaviour logprob of each sampled
token is the log of its probability in the truncated, renormalised distribution. The
reference (`reference_kept`, tests/engine/helpers.py) is plain Python in float64, from
the definitions vLLM uses (min_p, then top_k, then top_p on what is left). vLLM's own
sampling is checked the same way in test_vllm_backend.py."""

from __future__ import annotations

import math

import pytest
import torch

from tests.engine.helpers import reference_kept
from workers.inference.sampling import Truncation
from workers.inference.torch_backend import TorchBackend
from workers.inference.transformers_backend import TransformersBackend
from workers.model.loading import load_model

LOGITS = [2.0, 1.0, 0.5, 0.0, -1.0]  # probabilities ≈ 0.563, 0.207, 0.126, 0.076, 0.028


@pytest.mark.parametrize(
    "cut, kept",
    [
        (Truncation(top_k=2), {0, 1}),
        (Truncation(top_p=0.8), {0, 1, 2}),  # 0.563 + 0.207 < 0.8 ≤ + 0.126
        (Truncation(min_p=0.3), {0, 1}),  # 0.3 × 0.563 = 0.169: 0.126 is out
        (Truncation(min_p=0.1, top_k=3, top_p=0.7), {0, 1}),  # min_p keeps 4, top_k 3, nucleus of those 2
        (Truncation(), {0, 1, 2, 3, 4}),
    ],
)
def test_the_cuts_keep_the_right_tokens_and_renormalise(cut, kept):
    ref = reference_kept(LOGITS, cut.top_k, cut.top_p, cut.min_p)
    assert set(ref) == kept  # the hand-worked sets, and the reference agrees
    logp = torch.log_softmax(cut(torch.tensor([LOGITS], dtype=torch.float64)), dim=-1)[0]
    assert {i for i in range(5) if logp[i] > -math.inf} == kept
    for i, want in ref.items():
        assert logp[i].item() == pytest.approx(want, abs=1e-9)


def test_no_cut_leaves_the_logits_untouched():
    logits = torch.tensor([LOGITS])
    assert Truncation()(logits) is logits


BACKENDS = {
    "torch": lambda model_dir, cut: TorchBackend(model_dir, cut),
    "transformers": lambda model_dir, cut: TransformersBackend(model_dir, truncation=cut),
}
PROMPTS = [[1, 5, 6, 7], [1, 9, 4], [1, 3, 3, 8, 6]]


def _logits_along(hf, prompt: list[int], tokens: list[int]) -> list[list[float]]:
    """The model's logits (float64) before each of `tokens`, teacher-forced."""
    with torch.no_grad():
        out = hf(torch.tensor([prompt + tokens])).logits[0].double()
    return [out[len(prompt) - 1 + k].tolist() for k in range(len(tokens))]


@pytest.fixture(scope="module")
def hf(tiny_model_dir):
    return load_model(tiny_model_dir)


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_top_k_1_is_greedy_with_logprob_zero(tiny_model_dir, hf, backend):
    b = BACKENDS[backend](tiny_model_dir, Truncation(top_k=1))
    runs = [b.generate(PROMPTS, n=3, max_new_tokens=6, temperature=1.0, seed=s) for s in (0, 1)]
    assert runs[0] == runs[1]  # no randomness left
    for prompt, group in zip(PROMPTS, runs[0], strict=True):
        for c in group:
            assert c.token_ids == group[0].token_ids
            assert c.logprobs == [0.0] * len(c.token_ids)
            for logits, token in zip(_logits_along(hf, prompt, c.token_ids), c.token_ids, strict=True):
                assert token == max(range(len(logits)), key=logits.__getitem__)


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("cut", [Truncation(top_p=0.7), Truncation(min_p=0.2), Truncation(top_k=4, top_p=0.9)])
def test_behaviour_logprobs_are_of_the_truncated_distribution(tiny_model_dir, hf, backend, cut):
    temperature = 0.8
    b = BACKENDS[backend](tiny_model_dir, cut)
    groups = b.generate(PROMPTS, n=8, max_new_tokens=6, temperature=temperature, seed=3)
    worst, cut_off = 0.0, 0.0
    for prompt, group in zip(PROMPTS, groups, strict=True):
        for c in group:
            for logits, token, lp in zip(_logits_along(hf, prompt, c.token_ids), c.token_ids, c.logprobs, strict=True):
                tempered = [x / temperature for x in logits]
                kept = reference_kept(tempered, cut.top_k, cut.top_p, cut.min_p)
                assert token in kept, "a token the cut removes was sampled"
                worst = max(worst, abs(lp - kept[token]))
                full = reference_kept(tempered, None, 1.0, 0.0)[token]
                cut_off = max(cut_off, lp - full)
    assert worst < 1e-4
    # The cut matters on these samples: the untruncated logprobs would be off.
    assert cut_off > 1e-2


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("cut", [Truncation(top_p=0.7), Truncation(top_k=3), Truncation(min_p=0.2, top_p=0.95)])
def test_each_tokens_kept_set_is_recorded_when_asked(tiny_model_dir, hf, backend, cut):
    """Keep Sampling Mask's record: the set each token was drawn from, as the reference
    computes it from the teacher-forced logits; renormalising over it gives mu back."""
    from workers.core.records import Group, Rollout
    from workers.core.sampling_mask import SamplingMask

    temperature = 0.8
    b = BACKENDS[backend](tiny_model_dir, cut)
    b.keep_sampling_mask = True
    groups = b.generate(PROMPTS, n=4, max_new_tokens=6, temperature=temperature, seed=5)
    for prompt, group in zip(PROMPTS, groups, strict=True):
        for c in group:
            mask = SamplingMask.of(c.kept)
            assert mask is not None and mask.tokens == len(c.token_ids)
            dense = mask.dense()
            for k, (logits, lp) in enumerate(zip(_logits_along(hf, prompt, c.token_ids), c.logprobs, strict=True)):
                tempered = torch.tensor(logits) / temperature
                ref = reference_kept(tempered.tolist(), cut.top_k, cut.top_p, cut.min_p)
                assert set(mask.kept(k).tolist()) == set(ref)
                assert set(dense[k].nonzero().flatten().tolist()) == set(ref)
                renormalised = tempered[dense[k]].logsumexp(0)
                assert tempered[c.token_ids[k]] - renormalised == pytest.approx(lp, abs=1e-4)
            # Through a checkpoint's JSON and back.
            g = Group(
                "g",
                "p",
                "a",
                [Rollout(prompt, c.token_ids, c.logprobs, [0] * len(c.token_ids), "stop", sampling_mask=mask)],
            )
            assert Group.from_json(g.to_json()).rollouts[0].sampling_mask == mask
    # Not asked: nothing recorded.
    b.keep_sampling_mask = False
    unasked = [c for g in b.generate(PROMPTS, n=2, max_new_tokens=4, temperature=1.0, seed=1) for c in g]
    assert all(k is None for c in unasked for k in c.kept) and all(SamplingMask.of(c.kept) is None for c in unasked)


def test_a_mask_keeping_most_of_the_vocabulary_is_stored_as_what_it_dropped():
    import numpy as np

    from workers.core.sampling_mask import Kept, SamplingMask

    vocab = 1000
    kept = [Kept(np.arange(990), vocab), None, Kept(np.array([3, 7]), vocab), Kept(np.arange(vocab), vocab)]
    mask = SamplingMask.of(kept)
    assert mask is not None and mask.tokens == 4
    # 10 dropped ids + 2 kept ids (int32), 5 offsets (int32), 4 flags.
    assert len(mask.ids) == 4 * 12 and mask.bytes_per_token == (48 + 20 + 4) / 4
    dense = mask.dense()
    assert dense[0].sum() == 990 and not dense[0, 995]
    assert dense[1].all() and dense[3].all()  # no set; every token kept
    assert dense[2].nonzero().flatten().tolist() == [3, 7]
    assert mask.kept(1) is None and mask.kept(2).tolist() == [3, 7] and len(mask.kept(0)) == 990
    assert SamplingMask.of([None, None]) is None


def test_a_draw_follows_the_distribution_and_never_takes_a_token_a_filter_removed():
    from workers.inference.torch_backend import draw

    probs = torch.tensor([0.5, 0.0, 0.3, 0.2, 0.0])  # the last token cut, as top-k/top-p cut
    logp = probs.log().expand(20_000, -1)
    gen = torch.Generator().manual_seed(0)
    tokens = draw(logp, gen).squeeze(1)
    counts = torch.bincount(tokens, minlength=5) / len(tokens)
    assert counts[1] == counts[4] == 0
    # Within 5 standard errors of each probability (at most 0.0177 at p = 0.5).
    assert torch.allclose(counts, probs, atol=5 * math.sqrt(0.25 / len(tokens)))
    again = draw(logp, torch.Generator().manual_seed(0)).squeeze(1)
    assert torch.equal(tokens, again)  # seeded: the same draws
