"""Tool tokens of multi-turn rollouts are out of the loss (workers/train/loss.py,
workers/train/trainer.py): exactly zero gradient at their logits, no weight in any token-mean
denominator, and their placeholder behaviour logprobs and versions change nothing.
A real trainer step on the tiny Llama; the loss functions on hand-made tensors."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.engine.helpers import small_config
from workers.config.run_config import CorrectionConfig, TrainerConfig
from workers.core.records import Group, Rollout
from workers.model.tokenizer import CharTokenizer
from workers.train.loss import METHODS, correction_loss
from workers.train.trainer import Trainer

TOK = CharTokenizer()
TRAINER = TrainerConfig()  # clip_eps 0.2, tis_cap 2.0


def episode(call: str, result: str, answer: str, reward: float, seed: int) -> Rollout:
    """A rollout "calc:<call>?" + "=<result> " (tool) + "<answer>" EOS with made-up
    behaviour logprobs."""
    pieces = [(TOK.encode(f"calc:{call}?"), 1), (TOK.encode(f"={result} "), 0), (TOK.encode(answer) + [TOK.eos_id], 1)]
    ids = [t for piece, _ in pieces for t in piece]
    mask = [m for piece, m in pieces for _ in piece]
    gen = torch.Generator().manual_seed(seed)
    logprobs = [(-0.2 - 2 * torch.rand((), generator=gen).item()) if m else 0.0 for m in mask]
    versions = [0] * len(mask)
    return Rollout(TOK.prompt_ids("12*7+3="), ids, logprobs, versions, "stop", reward, "g", loss_mask=mask)


def groups() -> list[Group]:
    rollouts = [
        episode("12*7+3", "87", "87", 1.0, 0),
        episode("12*7", "84", "87", 1.0, 1),
        episode("12+7+3", "22", "22", 0.0, 2),
        episode("1/0", "error: division by zero", "5", 0.0, 3),
    ]
    return [Group("g", "12*7+3=", "87", rollouts)]


def trainer(model_dir: str, method: str = "token_tis") -> Trainer:
    cfg = small_config(correction={"method": method}, trainer={"minibatches": 1, "entropy_coef": 0.01})
    return Trainer(cfg, model_dir)


def step_with_logit_grads(t: Trainer, gs: list[Group]) -> tuple[dict[str, float], torch.Tensor]:
    """Train one step; returns the metrics and the gradient of the loss w.r.t. the logits
    that score the completions (the only minibatch's forward; with prompts shared, its
    second pass, whose column j scores completion token j)."""
    captured: list[torch.Tensor] = []

    def keep(module, inputs, output):
        if output.requires_grad:
            output.retain_grad()
            captured.append(output)

    handle = t.model.get_output_embeddings().register_forward_hook(keep)
    try:
        metrics = t.train_step(gs)
    finally:
        handle.remove()
    # Padded: one forward. Shared prompts: the prompts' pass, then the completions'.
    assert len(captured) == (2 if t.share_prompts else 1)
    return metrics, captured[-1].grad


@pytest.mark.parametrize("share_prompts", [False, True], ids=["padded", "shared-prompts"])
def test_tool_tokens_get_exactly_zero_gradient_at_their_logits(tiny_model_dir, one_torch_thread, share_prompts):
    gs = groups()
    t = trainer(tiny_model_dir)
    assert t.share_prompts  # the default path where it is valid
    t.share_prompts = share_prompts
    _, grad = step_with_logit_grads(t, gs)
    tool_slots = model_slots = 0
    for row, r in enumerate(gs[0].rollouts):
        # The logits at this slot predict completion token 0.
        start = 0 if share_prompts else len(r.prompt_ids) - 1
        for j, m in enumerate(r.loss_mask):
            g = grad[row, start + j]
            if m:
                model_slots += 1
                assert g.abs().sum() > 0, (row, j)  # the check can see a gradient where there is one
            else:
                tool_slots += 1
                assert torch.all(g == 0), (row, j)
    assert tool_slots > 10 and model_slots > 10


def _metrics_and_weights(model_dir: str, method: str, gs: list[Group]):
    t = trainer(model_dir, method)
    metrics = t.train_step(gs)
    for timed in ("trainer/step_s", "trainer/tokens_per_s", "trainer/model_tflops"):
        metrics.pop(timed)
    return metrics, t.state_dict()


@pytest.mark.parametrize("method", METHODS)
def test_tool_behaviour_logprobs_and_versions_change_nothing(tiny_model_dir, one_torch_thread, method):
    """Wild placeholders on tool tokens (huge, -inf, NaN; versions far off): the same
    loss, metrics and updated weights, bit for bit. Changing one model token's logprob
    does change them, so the comparison can see a difference."""
    base = groups()
    wild = copy.deepcopy(base)
    for r in wild[0].rollouts:
        for j, m in enumerate(r.loss_mask):
            if not m:
                r.behaviour_logprobs[j] = [50.0, float("-inf"), float("nan")][j % 3]
                r.token_versions[j] = -1000
    expected, weights = _metrics_and_weights(tiny_model_dir, method, base)
    got, wild_weights = _metrics_and_weights(tiny_model_dir, method, wild)
    assert got == expected
    assert all(torch.equal(weights[k], wild_weights[k]) for k in weights)

    model_changed = copy.deepcopy(base)
    model_changed[0].rollouts[0].behaviour_logprobs[0] -= 1.0
    changed, _ = _metrics_and_weights(tiny_model_dir, method, model_changed)
    assert changed["mismatch/kl"] != expected["mismatch/kl"]


def test_staleness_counts_model_tokens_only(tiny_model_dir, one_torch_thread):
    gs = groups()
    for r in gs[0].rollouts:
        r.token_versions = [0 if m else -7 for m in r.loss_mask]
    metrics = trainer(tiny_model_dir).train_step(gs)
    assert metrics["staleness/mean"] == 0.0 and metrics["staleness/max"] == 0.0
    assert metrics["rollout/mixed_version_frac"] == 0.0


def test_an_all_ones_mask_is_bit_identical_to_no_mask(tiny_model_dir, one_torch_thread):
    """The single-turn path: loss_mask None and all ones train the same, bit for bit."""
    gs = groups()
    for r in gs[0].rollouts:
        r.loss_mask = None
    ones = copy.deepcopy(gs)
    for r in ones[0].rollouts:
        r.loss_mask = [1] * len(r.completion_ids)
    a, wa = _metrics_and_weights(tiny_model_dir, "token_tis", gs)
    b, wb = _metrics_and_weights(tiny_model_dir, "token_tis", ones)
    assert a == b and all(torch.equal(wa[k], wb[k]) for k in wa)
    masked, _ = _metrics_and_weights(tiny_model_dir, "token_tis", groups())
    assert masked["loss"] != a["loss"]  # the mask does change what is trained


@pytest.mark.parametrize("method", METHODS)
def test_masked_tokens_are_out_of_every_denominator(method):
    """The loss and its statistics with masked tokens equal those computed on the model
    tokens alone (masked positions removed), for every correction method."""
    gen = torch.Generator().manual_seed(0)
    shape = (3, 10)
    logp = -torch.rand(shape, generator=gen) * 3
    old = logp + 0.1 * torch.randn(shape, generator=gen)
    behaviour = old + 0.3 * torch.randn(shape, generator=gen)
    adv = torch.randn(3, 1, generator=gen).expand(shape)
    mask = torch.rand(shape, generator=gen) > 0.4
    mask[:, 0] = True
    cfg = CorrectionConfig(method=method)

    full, full_stats = correction_loss(TRAINER, cfg, logp, old, behaviour, adv, mask)
    # The model tokens alone, each row compacted and right-padded with masked slots.
    width = int(mask.sum(1).max())

    def compact(x: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
        out = torch.full((3, width), fill)
        for i in range(3):
            kept = x[i][mask[i]]
            out[i, : len(kept)] = kept
        return out

    small_mask = compact(mask.float()).bool()
    alone, alone_stats = correction_loss(
        TRAINER, cfg, compact(logp), compact(old), compact(behaviour), compact(adv), small_mask
    )
    torch.testing.assert_close(full, alone, rtol=1e-6, atol=1e-7)
    for key, value in full_stats.items():
        assert value == pytest.approx(alone_stats[key], rel=1e-6, abs=1e-7), key
