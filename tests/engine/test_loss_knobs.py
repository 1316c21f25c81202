"""The algorithm knobs users bring from TRL and verl, as pure functions on small tensors,
each against values worked out by hand in the test (workers/train/loss.py): loss aggregation,
asymmetric clipping, the KL penalty to a reference policy and advantage scaling. Each
test also checks the default gives another value, so a knob that were ignored fails.
"""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from workers.config.run_config import CorrectionConfig, RunConfig, TrainerConfig
from workers.train.loss import METHODS, Aggregation, correction_loss, reference_kl, scaled_advantages

NONE = CorrectionConfig(method="none")
TRAINER = TrainerConfig()  # clip_eps 0.2, tis_cap 2.0, no KL penalty, token_mean


def aggregated(mode: str, constant: int) -> TrainerConfig:
    """The trainer section aggregating as `mode`; `constant` divides each sequence's sum
    under 'constant' (the config takes loss_constant with that mode only)."""
    return TrainerConfig(loss_aggregation=mode, loss_constant=constant if mode == "constant" else None)


# Two sequences of 3 and 1 trained tokens (a third with none), values 1, 2, 3 and 4.
X = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0], [9.0, 9.0, 9.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])


def test_token_mean_is_the_mean_over_every_trained_token():
    assert Aggregation("token_mean")(X, MASK).item() == pytest.approx((1 + 2 + 3 + 4) / 4)  # 2.5
    assert Aggregation("token_mean").units(MASK) == 4


def test_sequence_mean_is_the_mean_of_each_sequences_token_mean():
    # (1+2+3)/3 = 2 and 4/1 = 4; the row with no trained token counts in no mean.
    assert Aggregation("sequence_mean")(X, MASK).item() == pytest.approx((2 + 4) / 2)
    assert Aggregation("sequence_mean").units(MASK) == 2


def test_the_constant_normaliser_divides_each_sequences_sum_by_the_constant():
    # Dr. GRPO: (6/4 + 4/4) / 2 sequences.
    assert Aggregation("constant", 4.0)(X, MASK).item() == pytest.approx((6 / 4 + 4 / 4) / 2)
    assert Aggregation("constant", 4.0).units(MASK) == 2


def test_an_unknown_aggregation_is_refused_by_name():
    with pytest.raises(ValueError, match="trainer.loss_aggregation 'seq' is not one of token_mean"):
        Aggregation("seq")


def test_the_policy_loss_is_aggregated_as_asked():
    # On-policy, no correction: the per-token loss is -A; A = 1 on the 3-token sequence,
    # -1 on the 1-token one.
    logp = torch.zeros(2, 3)
    adv = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])
    mask = MASK[:2]
    loss = {
        mode: correction_loss(aggregated(mode, 2), NONE, logp, logp, logp, adv, mask)[0]
        for mode in ("token_mean", "sequence_mean", "constant")
    }
    assert loss["token_mean"].item() == pytest.approx(-(3 - 1) / 4)
    assert loss["sequence_mean"].item() == pytest.approx(-(1 - 1) / 2)
    assert loss["constant"].item() == pytest.approx(-(3 / 2 - 1 / 2) / 2)


@pytest.mark.parametrize("method", METHODS)
def test_every_correction_method_aggregates_as_asked(method):
    # On-policy (pi_theta = pi_old = mu = 0.5), A = 1 on a 3-token sequence and 3 on a
    # 1-token one: each token's loss is k·A, k = -1 for the PPO-clip methods and
    # -log 0.5 for pipelinerl_reinforce (-log pi · A · 1).
    k = -math.log(0.5) if method == "pipelinerl_reinforce" else -1.0
    logp = torch.full((2, 3), math.log(0.5))
    adv = torch.tensor([[1.0, 1.0, 1.0], [3.0, 3.0, 3.0]])
    cfg = CorrectionConfig(method=method)
    want = {"token_mean": k * (3 + 3) / 4, "sequence_mean": k * (1 + 3) / 2, "constant": k * (3 / 4 + 3 / 4) / 2}
    for mode, value in want.items():
        loss, _ = correction_loss(aggregated(mode, 4), cfg, logp, logp, logp, adv, MASK[:2])
        assert loss.item() == pytest.approx(value), mode


@pytest.mark.parametrize("method", [m for m in METHODS if m != "pipelinerl_reinforce"])
def test_every_ppo_method_clips_higher_when_asked(method):
    # ratio 1.5 against pi_old = mu (IS weight 1): the surrogate is capped at 1 + eps_high.
    old = torch.zeros(1, 1)
    logp, adv, mask = torch.log(torch.tensor([[1.5]])), torch.ones(1, 1), torch.ones(1, 1)
    cfg = CorrectionConfig(method=method)
    assert correction_loss(TrainerConfig(clip_eps_high=0.28), cfg, logp, old, old, adv, mask)[
        0
    ].item() == pytest.approx(-1.28)
    assert correction_loss(TRAINER, cfg, logp, old, old, adv, mask)[0].item() == pytest.approx(-1.2)


def test_clip_higher_widens_the_upper_clip_only():
    # ratio 1.5 with A = +1: clipped at 1 + eps_high; ratio 0.5 with A = -1: at 1 - eps.
    old = torch.zeros(1, 2)
    logp = torch.log(torch.tensor([[1.5, 0.5]]))
    adv = torch.tensor([[1.0, -1.0]])
    mask = torch.ones(1, 2)
    high, high_stats = correction_loss(TrainerConfig(clip_eps_high=0.28), NONE, logp, old, old, adv, mask)
    symmetric, _ = correction_loss(TRAINER, NONE, logp, old, old, adv, mask)
    assert high.item() == pytest.approx((-1.28 + 0.8) / 2)
    assert symmetric.item() == pytest.approx((-1.2 + 0.8) / 2)
    assert high_stats["ppo/clipped_frac"] == 1.0


@pytest.mark.parametrize(
    "estimator, per_token",
    [
        # d = log pi_ref - log pi = log 0.5 and log 2
        ("k1", [math.log(2), -math.log(2)]),
        ("k2", [0.5 * math.log(2) ** 2, 0.5 * math.log(2) ** 2]),
        ("k3", [0.5 + math.log(2) - 1, 2 - math.log(2) - 1]),
    ],
)
def test_the_kl_estimators_match_their_formulas(estimator, per_token):
    logp = torch.log(torch.tensor([[0.5, 0.2]]))
    ref = torch.log(torch.tensor([[0.25, 0.4]]))
    assert reference_kl(logp, ref, estimator)[0].tolist() == pytest.approx(per_token, abs=1e-6)


def test_the_kl_penalty_adds_coef_times_the_aggregated_k3_and_its_gradient():
    logp = torch.log(torch.tensor([[0.5, 0.2]])).requires_grad_()
    ref = torch.log(torch.tensor([[0.25, 0.4]]))
    zero_adv, mask = torch.zeros(1, 2), torch.ones(1, 2)
    loss, stats = correction_loss(
        TrainerConfig(kl_coef=0.1), NONE, logp, logp.detach(), logp.detach(), zero_adv, mask, ref_logp=ref
    )
    # k3 per token: 0.5 + ln 2 - 1 and 2 - ln 2 - 1, mean exactly 0.25.
    assert stats["loss/kl_ref"] == pytest.approx(0.25)
    assert loss.item() == pytest.approx(0.1 * 0.25)
    loss.backward()
    # d k3 / d log pi = 1 - pi_ref/pi = 0.5 and -1, over 2 tokens, times 0.1.
    assert logp.grad[0].tolist() == pytest.approx([0.1 * 0.5 / 2, 0.1 * -1 / 2])
    # Off: no penalty, no statistic (the policy term alone is 0 here).
    off, off_stats = correction_loss(TRAINER, NONE, logp, logp.detach(), logp.detach(), zero_adv, mask, ref_logp=ref)
    assert off.item() == 0.0 and "loss/kl_ref" not in off_stats


REWARDS = [[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 1.0, 3.0]]


def test_group_std_scales_by_each_groups_std():
    # group 1: mean 0.5, sample std sqrt(1/3); group 2: mean 1, std sqrt(2)
    g1, g2 = scaled_advantages(REWARDS, "group_std")
    s1, s2 = math.sqrt(1 / 3), math.sqrt((1 + 1 + 0 + 4) / 3)
    assert g1 == pytest.approx([0.5 / s1, -0.5 / s1, -0.5 / s1, 0.5 / s1], rel=1e-5)
    assert g2 == pytest.approx([-1 / s2, -1 / s2, 0.0, 2 / s2], rel=1e-5)


def test_batch_std_centres_per_group_and_scales_by_the_batchs_std():
    # all eight rewards: mean 0.75, squared deviations sum to 7.5, sample std sqrt(7.5 / 7)
    std = math.sqrt(7.5 / 7)
    g1, g2 = scaled_advantages(REWARDS, "batch_std")
    assert g1 == pytest.approx([0.5 / std, -0.5 / std, -0.5 / std, 0.5 / std], rel=1e-5)
    assert g2 == pytest.approx([-1 / std, -1 / std, 0.0, 2 / std], rel=1e-5)
    assert g1 != pytest.approx(scaled_advantages(REWARDS, "group_std")[0], rel=1e-2)


def test_no_scaling_only_centres():
    assert scaled_advantages(REWARDS, "none") == [[0.5, -0.5, -0.5, 0.5], [-1.0, -1.0, 0.0, 2.0]]


def test_a_uniform_group_gets_zero_advantage_under_every_scaling():
    for scaling in ("group_std", "batch_std", "none"):
        assert scaled_advantages([[2.0, 2.0], [0.0, 1.0]], scaling)[0] == [0.0, 0.0]


# --- the config refuses knobs that cannot work, naming the field and the fix ----------


def test_clip_eps_high_below_clip_eps_is_refused():
    with pytest.raises(ValidationError, match=r"trainer.clip_eps_high \(0.1\) must be ≥ trainer.clip_eps \(0.2\)"):
        TrainerConfig(clip_eps_high=0.1)


def test_a_loss_constant_without_the_constant_aggregation_is_refused():
    with pytest.raises(ValidationError, match="trainer.loss_constant .* set loss_aggregation to 'constant'"):
        TrainerConfig(loss_constant=64)
    assert TrainerConfig(loss_aggregation="constant", loss_constant=64).loss_constant == 64


def test_clip_higher_with_a_loss_that_has_no_clip_is_refused():
    with pytest.raises(ValidationError, match="correction.method 'pipelinerl_reinforce' has none"):
        RunConfig(trainer={"clip_eps_high": 0.28}, correction={"method": "pipelinerl_reinforce"})


def test_the_defaults_are_the_engines_behaviour_before_the_knobs():
    tc = TrainerConfig()
    assert (tc.kl_coef, tc.loss_aggregation, tc.advantage_scaling, tc.clip_eps_high) == (
        0.0,
        "token_mean",
        "group_std",
        None,
    )
    assert not tc.mask_truncated and not tc.dynamic_sampling
