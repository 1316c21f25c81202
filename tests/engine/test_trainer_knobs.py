"""The algorithm knobs reach the trainer's step (workers/train/trainer.py): each step's figures
against an independent float64 computation from the same rollouts and models.

With correction.method "none" and one minibatch, the first minibatch is on-policy
(pi_theta = pi_old, ratio 1, weight 1): the per-token loss is -A, so the step's loss is
the aggregate of -A, computable from the rollouts alone.
"""

from __future__ import annotations

import copy
import json
import os

import pytest
import torch

from tests.engine.helpers import fixed_groups, small_config
from workers.model.loading import load_model
from workers.train.loss import reference_kl, scaled_advantages
from workers.train.trainer import Trainer, pack, token_logprobs


def _expected_loss(groups, aggregation: str, constant: float, scaling: str = "group_std") -> float:
    """The aggregate of -A over the trained tokens, in float64."""
    advantages = scaled_advantages([[r.reward for r in g.rollouts] for g in groups], scaling)
    terms = [
        (a, len(r.completion_ids))
        for g, adv in zip(groups, advantages, strict=True)
        for r, a in zip(g.rollouts, adv, strict=True)
    ]
    if aggregation == "token_mean":
        return -sum(a * n for a, n in terms) / sum(n for _, n in terms)
    if aggregation == "sequence_mean":
        return -sum(a for a, _ in terms) / len(terms)
    return -sum(a * n / constant for a, n in terms) / len(terms)


@pytest.mark.parametrize("aggregation", ["token_mean", "sequence_mean", "constant"])
def test_the_steps_loss_is_aggregated_as_configured(tiny_model_dir, aggregation):
    cfg = small_config(
        correction={"method": "none"},
        # Micro-batches of 3 rows: each one's aggregate is weighted to the minibatch's.
        trainer={"loss_aggregation": aggregation, "micro_batch_rows": 3},
        inference={"max_new_tokens": 12},
    )
    groups = fixed_groups(tiny_model_dir, cfg)
    assert len({len(r.completion_ids) for g in groups for r in g.rollouts}) > 1, "lengths must differ"
    got = Trainer(cfg, tiny_model_dir).train_step(copy.deepcopy(groups))["loss"]
    want = _expected_loss(groups, aggregation, constant=12.0)
    assert got == pytest.approx(want, abs=1e-5)
    # The three differ on these rollouts: a knob that were ignored would fail above.
    others = {
        a: _expected_loss(groups, a, 12.0) for a in ("token_mean", "sequence_mean", "constant") if a != aggregation
    }
    assert all(abs(v - want) > 1e-3 for v in others.values())


def test_the_constant_normaliser_is_loss_constant_when_set(tiny_model_dir):
    cfg = small_config(correction={"method": "none"}, trainer={"loss_aggregation": "constant", "loss_constant": 32})
    groups = fixed_groups(tiny_model_dir, cfg)
    got = Trainer(cfg, tiny_model_dir).train_step(copy.deepcopy(groups))["loss"]
    assert got == pytest.approx(_expected_loss(groups, "constant", constant=32.0), abs=1e-6)


@pytest.mark.parametrize("scaling", ["batch_std", "none"])
def test_the_plan_carries_the_batchs_advantages_as_scaled(tiny_model_dir, scaling):
    cfg = small_config(correction={"method": "none"}, trainer={"advantage_scaling": scaling})
    groups = fixed_groups(tiny_model_dir, cfg)
    rewards = [[r.reward for r in g.rollouts] for g in groups]
    (step,) = Trainer(cfg, tiny_model_dir).plan(groups)
    assert step.advantages == scaled_advantages(rewards, scaling)
    assert step.advantages != scaled_advantages(rewards, "group_std")
    got = Trainer(cfg, tiny_model_dir).train_step(copy.deepcopy(groups))["loss"]
    assert got == pytest.approx(_expected_loss(groups, "token_mean", 1.0, scaling), abs=1e-5)


def _k3_token_mean(policy, ref, groups, pad_id: int) -> float:
    rollouts = [r for g in groups for r in g.rollouts]
    batch = pack([r.prompt_ids for r in rollouts], [r.completion_ids for r in rollouts], pad_id)
    with torch.no_grad():
        logp = token_logprobs(policy, batch, 1.0).double()
        ref_logp = token_logprobs(ref, batch, 1.0).double()
    kl = reference_kl(logp, ref_logp, "k3")
    return float((kl * batch.mask).sum() / batch.mask.sum())


@pytest.mark.parametrize("lora", [False, True])
def test_the_kl_penalty_is_to_the_initial_policy_and_enters_the_loss(tiny_model_dir, lora):
    coef = 0.5
    cfg = small_config(
        correction={"method": "none"},
        trainer={"kl_coef": coef, "lr": 0.05},
        lora={"enabled": lora, "rank": 2},
    )
    first, second = fixed_groups(tiny_model_dir, cfg, seed=1), fixed_groups(tiny_model_dir, cfg, seed=2)
    trainer = Trainer(cfg, tiny_model_dir)
    assert (trainer.ref_model is None) == lora  # LoRA: the base is the reference, no copy
    step1 = trainer.train_step(copy.deepcopy(first))
    assert step1["loss/kl_ref"] == pytest.approx(0.0, abs=1e-6)  # the policy is still the reference
    # The reference is the initial weights, loaded afresh; the policy the trained one.
    want_kl = _k3_token_mean(trainer.model, load_model(tiny_model_dir), second, trainer.pad_id)
    assert want_kl > 1e-4, "the first step should have moved the policy"
    step2 = trainer.train_step(copy.deepcopy(second))
    assert step2["loss/kl_ref"] == pytest.approx(want_kl, rel=1e-3)
    assert step2["loss"] - coef * step2["loss/kl_ref"] == pytest.approx(
        _expected_loss(second, "token_mean", 1.0), abs=1e-5
    )


def test_without_kl_coef_there_is_no_reference_and_no_penalty(tiny_model_dir):
    cfg = small_config()
    trainer = Trainer(cfg, tiny_model_dir)
    assert trainer.ref_model is None
    assert "loss/kl_ref" not in trainer.train_step(fixed_groups(tiny_model_dir, cfg))


def test_clip_eps_high_reaches_the_loss(tiny_model_dir, monkeypatch):
    import workers.train.trainer as trainer_module

    seen = []
    real = trainer_module.correction_loss

    def spy(trainer, *args, **knobs):
        seen.append((trainer, knobs))
        return real(trainer, *args, **knobs)

    monkeypatch.setattr(trainer_module, "correction_loss", spy)
    cfg = small_config(trainer={"clip_eps_high": 0.28, "loss_aggregation": "sequence_mean"})
    Trainer(cfg, tiny_model_dir).train_step(fixed_groups(tiny_model_dir, cfg))
    assert seen and all(t.clip_eps_high == 0.28 and k["aggregation"].mode == "sequence_mean" for t, k in seen)


def _truncated(groups, every: int):
    """`groups` with every `every`-th completion marked cut off at the budget."""
    out = copy.deepcopy(groups)
    for i, r in enumerate(r for g in out for r in g.rollouts):
        if i % every == 0:
            r.finish_reason = "length"
        else:
            r.finish_reason = "stop"
    return out


def test_mask_truncated_takes_cut_off_completions_out_of_every_denominator(tiny_model_dir):
    cfg = small_config(correction={"method": "none"}, trainer={"mask_truncated": True})
    groups = _truncated(fixed_groups(tiny_model_dir, cfg), every=2)
    (step,) = Trainer(cfg, tiny_model_dir).plan(groups)
    kept = [r for g in groups for r in g.rollouts if r.finish_reason == "stop"]
    assert step.trained_tokens == [sum(len(r.completion_ids) for r in kept)]
    assert step.trained_rows == [len(kept)]
    # The advantages still come from every reward of the group.
    assert step.advantages == scaled_advantages([[r.reward for r in g.rollouts] for g in groups], "group_std")
    # The loss: -A over the kept tokens only.
    advantages = [a for adv in step.advantages for a in adv]
    rollouts = [r for g in groups for r in g.rollouts]
    kept_terms = [
        (a, len(r.completion_ids)) for r, a in zip(rollouts, advantages, strict=True) if r.finish_reason == "stop"
    ]
    want = -sum(a * n for a, n in kept_terms) / sum(n for _, n in kept_terms)
    assert Trainer(cfg, tiny_model_dir).train_step(groups)["loss"] == pytest.approx(want, abs=1e-5)


@pytest.mark.parametrize("mask_truncated", [True, False])
def test_a_batch_of_truncated_completions_trains_nothing_when_masked(tiny_model_dir, mask_truncated):
    cfg = small_config(trainer={"mask_truncated": mask_truncated})
    groups = _truncated(fixed_groups(tiny_model_dir, cfg), every=1)
    trainer = Trainer(cfg, tiny_model_dir)
    before = trainer.state_dict()
    metrics = trainer.train_step(groups)
    after = trainer.state_dict()
    unchanged = all(torch.equal(before[k], after[k]) for k in before)
    assert unchanged == mask_truncated
    assert (metrics["loss"] == 0.0) == mask_truncated
    assert metrics["staleness/mean"] == 0.0  # the step's own figures still see every rollout


@pytest.mark.parametrize("arch", ["gpt2", "phi3", "gpt_neox"])
def test_the_trainer_scores_a_dropout_checkpoint_without_dropout_unless_asked(tmp_path, arch):
    """GPT-2 ships dropout on (0.1), and Phi-3 and GPT-NeoX name their rates differently (`resid_pdrop`,
    `attention_dropout`, `hidden_dropout`); with disable_dropout the trainer's model, in
    training mode, gives the same logprobs twice and those of the checkpoint in eval
    mode; without it, two forwards differ."""
    from workers.model.tiny_hf import make_tiny_checkpoint

    source = make_tiny_checkpoint(str(tmp_path / arch), arch)
    with open(os.path.join(source, "config.json")) as f:
        shipped = json.load(f)
    rates = {k: v for k, v in shipped.items() if isinstance(v, float) and ("dropout" in k or k.endswith("pdrop"))}
    for name in rates:  # a rate high enough that no forward escapes it
        shipped[name] = 0.3
    with open(os.path.join(source, "config.json"), "w") as f:
        json.dump(shipped, f)
    assert rates, f"{arch}'s config names no dropout rate"

    batch = pack([[5, 6, 7, 8]], [[9, 10, 11, 12, 13]], 0)
    eval_model = load_model(source)
    with torch.no_grad():
        reference = token_logprobs(eval_model, batch, 1.0)
        for disable in (True, False):
            trainer = Trainer(small_config(trainer={"disable_dropout": disable}), source)
            assert trainer.model.training
            first, second = (token_logprobs(trainer.model, batch, 1.0) for _ in range(2))
            if disable:
                assert torch.equal(first, second)
                assert torch.allclose(first, reference, atol=1e-6)
            else:
                assert not torch.equal(first, second)
