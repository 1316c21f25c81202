"""Each distinct prompt run once (workers/train/shared_prefix.py) computes what the padded
forward computes: the same logprobs, entropies, loss and gradients on every
architecture of the matrix, through a LoRA adapter, and in a whole trainer step; and the
trainer uses it only where a row's forward depends on its own tokens alone."""

from __future__ import annotations

import copy
import random

import pytest
import torch

from tests.engine.helpers import fixed_groups, small_config
from workers.model.loading import load_model
from workers.model.lora import apply_lora
from workers.model.tiny_hf import ARCHS
from workers.train.shared_prefix import completion_view
from workers.train.trainer import Trainer, pack, token_logprobs

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# Float32 rounding of the same sums in another order (measured: ≤ 3e-6 on logprobs, and
# relative gradient gaps ≤ 2e-6); a wrong position, mask or cache row is off by ≥ 1e-2.
ATOL = 1e-5
GRAD_RTOL = 1e-4


def grpo_batch(vocab: int, seed: int = 0):
    """Three prompts of different lengths (one past Gemma-2's 64-token sliding window,
    so the window crosses the prompt padding), three completions each, of different
    lengths down to empty."""
    rng = random.Random(seed)
    prompts, completions = [], []
    for length in (70, 23, 2):
        prompt = [rng.randrange(5, vocab) for _ in range(length)]
        for n in (30, 11, 0) if length == 23 else (30, 17, 1):
            prompts.append(prompt)
            completions.append([rng.randrange(5, vocab) for _ in range(n)])
    return pack(prompts, completions, 0)


def both_paths(model: torch.nn.Module, batch, temperature: float = 0.9):
    """Per path (padded, shared): logprobs, entropies, a loss of both and its gradients."""
    weights = torch.randn(batch.mask.shape, generator=torch.Generator().manual_seed(0))
    out = {}
    for share in (False, True):
        model.zero_grad(set_to_none=True)
        logp, entropy = token_logprobs(model, batch, temperature, with_entropy=True, share_prompts=share)
        loss = ((logp * weights + 0.1 * entropy) * batch.mask).sum() / batch.mask.sum()
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        out[share] = (logp.detach(), entropy.detach(), loss.detach(), grads)
    return out[False], out[True]


def assert_same(padded, shared, mask):
    assert torch.allclose(padded[0][mask], shared[0][mask], atol=ATOL, rtol=0)
    assert torch.allclose(padded[1][mask], shared[1][mask], atol=ATOL, rtol=0)
    assert torch.allclose(padded[2], shared[2], atol=ATOL, rtol=0)
    assert padded[3].keys() == shared[3].keys() and padded[3]
    for name, grad in padded[3].items():
        gap = (grad - shared[3][name]).norm() / grad.norm().clamp(min=1e-12)
        assert gap < GRAD_RTOL, (name, float(gap))


@pytest.mark.parametrize("arch", ARCHS)
def test_shared_prompts_give_the_padded_forwards_logprobs_and_gradients(checkpoints, arch):
    model = load_model(checkpoints(arch), dropout=False).train()
    batch = grpo_batch(model.config.get_text_config().vocab_size)
    # The batch is shared: 3 prefixes for 9 rows.
    assert completion_view(model, batch.input_ids, batch.attention_mask, batch.prompt_lengths) is not None
    padded, shared = both_paths(model, batch)
    assert_same(padded, shared, batch.mask)
    # Only completion slots are scored: the rest is 0, not a prompt token's logprob.
    assert not shared[0][~batch.mask].any()


def test_shared_prompts_give_the_same_gradients_through_a_lora_adapter(checkpoints):
    model = load_model(checkpoints("qwen2"), dropout=False).train()
    model = apply_lora(model, small_config(lora={"enabled": True, "rank": 4}).lora, init_lora_weights=False)
    batch = grpo_batch(model.config.get_text_config().vocab_size, seed=1)
    padded, shared = both_paths(model, batch)
    assert all("lora" in name for name in padded[3])
    assert_same(padded, shared, batch.mask)


def test_a_batch_of_distinct_prompts_takes_the_padded_forward(checkpoints):
    model = load_model(checkpoints("llama"), dropout=False)
    batch = pack([[5, 6, 7], [8, 9, 10, 11]], [[12, 13], [14]], 0)
    assert completion_view(model, batch.input_ids, batch.attention_mask, batch.prompt_lengths) is None
    with torch.no_grad():
        assert torch.equal(token_logprobs(model, batch, 1.0, share_prompts=True), token_logprobs(model, batch, 1.0))


@pytest.mark.parametrize("knobs", [{}, {"minibatches": 2, "kl_coef": 0.1, "entropy_coef": 0.01}])
def test_a_step_with_shared_prompts_is_the_padded_step(tiny_model_dir, knobs):
    """Same groups, same seed: the step's metrics and the weights it leaves agree."""
    cfg = small_config(trainer={"lr": 1e-2, **knobs})
    groups = fixed_groups(tiny_model_dir, cfg)
    results = {}
    for share in (False, True):
        trainer = Trainer(cfg, tiny_model_dir)
        assert trainer.share_prompts
        trainer.share_prompts = share
        # AdamW's first update moves a weight by about lr whatever its gradient's size
        # once that is well above eps (1e-8), so a gradient within rounding of zero could
        # move it by +lr in one step and -lr in the other (it did, once in a suite). At
        # eps 1e-3 the update is smooth in the gradient: rounding moves it by rounding.
        for group in trainer.optimizer.param_groups:
            group["eps"] = 1e-3
        metrics = trainer.train_step(copy.deepcopy(groups))
        results[share] = (metrics, trainer.state_dict())
    (m_pad, w_pad), (m_shared, w_shared) = results[False], results[True]
    for key in ("loss", "policy/entropy", "is/ratio_mean", "mismatch/kl", "trainer/grad_norm"):
        assert m_shared[key] == pytest.approx(m_pad[key], abs=ATOL), key
    if knobs:
        assert m_shared["loss/kl_ref"] == pytest.approx(m_pad["loss/kl_ref"], abs=ATOL)
    for name, weight in w_pad.items():
        assert torch.allclose(weight, w_shared[name], atol=1e-6), name


@pytest.mark.parametrize(
    ("section", "knob"),
    [
        ("trainer", {"disable_dropout": False}),  # the G rows would share one dropout mask
        ("trainer", {"gradient_checkpointing": True}),  # it turns the KV cache off
        ("lora", {"enabled": True, "dropout": 0.05}),  # LoRA's own dropout: one mask again
    ],
)
def test_prompts_are_not_shared_where_a_rows_forward_is_not_its_own(tiny_model_dir, section, knob):
    assert not Trainer(small_config(**{section: knob}), tiny_model_dir).share_prompts


def test_lora_without_dropout_shares_prompts(tiny_model_dir):
    assert Trainer(small_config(lora={"enabled": True, "dropout": 0.0}), tiny_model_dir).share_prompts
