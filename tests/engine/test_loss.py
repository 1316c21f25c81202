"""The GRPO loss against values worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from workers.train.loss import group_advantages, mismatch_kl, policy_loss, truncated_is_weight


def test_advantages_are_normalised_within_each_group():
    adv = group_advantages(torch.tensor([[1.0, 0.0], [0.5, 0.5], [1.0, 2.0]]))
    # group 1: mean 0.5, sample std sqrt(0.5) → ±0.7071; group 2: all equal → 0
    assert adv[0].tolist() == pytest.approx([0.70710, -0.70710], abs=1e-4)
    assert adv[1].tolist() == [0.0, 0.0]
    assert adv[2].tolist() == pytest.approx([-0.70710, 0.70710], abs=1e-4)
    four = group_advantages(torch.tensor([[0.0, 0.0, 0.0, 1.0]]))
    # mean 0.25, sample std 0.5 → (-0.5, -0.5, -0.5, 1.5)
    assert four[0].tolist() == pytest.approx([-0.5, -0.5, -0.5, 1.5], abs=1e-5)


def test_advantages_need_groups_of_two():
    with pytest.raises(ValueError, match="group_size ≥ 2"):
        group_advantages(torch.tensor([[1.0]]))


def test_truncated_is_weight_caps_pi_old_over_mu():
    w, truncated = truncated_is_weight(
        torch.log(torch.tensor([0.4, 0.4, 0.4])), torch.log(torch.tensor([0.4, 0.1, 0.8])), cap=2.0
    )
    assert w.tolist() == pytest.approx([1.0, 2.0, 0.5])
    assert truncated.tolist() == [False, True, False]


def hand_example():
    # Four token slots; the last is padding (mask 0) with absurd values that must not count.
    logp = torch.log(torch.tensor([0.5, 0.6, 0.36, 0.9])).requires_grad_(True)
    old = torch.log(torch.tensor([0.4, 0.4, 0.4, 0.01]))  # ratios 1.25, 1.5, 0.9
    mu = torch.log(torch.tensor([0.4, 0.1, 0.8, 0.9]))  # pi_old/mu = 1, 4 (→ cap 2), 0.5
    adv = torch.tensor([1.0, 1.0, -1.0, 100.0])
    mask = torch.tensor([1.0, 1.0, 1.0, 0.0])
    return logp, old, mu, adv, mask


def test_policy_loss_matches_the_hand_computation():
    logp, old, mu, adv, mask = hand_example()
    loss, stats = policy_loss(logp, old, mu, adv, mask, clip_eps=0.2, tis_cap=2.0)
    # token 1: min(1.25·1, 1.2·1) = 1.2, weight 1   → -1.2
    # token 2: min(1.5·1, 1.2·1)  = 1.2, weight 2   → -2.4
    # token 3: min(0.9·-1, 0.9·-1) = -0.9, weight 0.5 → +0.45
    assert loss.item() == pytest.approx((-1.2 - 2.4 + 0.45) / 3, abs=1e-5)
    assert stats["is/ratio_mean"] == pytest.approx((1 + 2 + 0.5) / 3, abs=1e-5)
    assert stats["is/clipped_frac"] == pytest.approx(1 / 3)
    assert stats["ppo/clipped_frac"] == pytest.approx(2 / 3)
    # k3 = r - 1 - log r for r = 1, 4, 0.5
    k3 = [0.0, 3 - math.log(4), -0.5 + math.log(2)]
    assert stats["mismatch/kl"] == pytest.approx(sum(k3) / 3, abs=1e-5)


def test_clipped_tokens_get_no_gradient_and_the_rest_get_weight_times_ratio():
    logp, old, mu, adv, mask = hand_example()
    loss, _ = policy_loss(logp, old, mu, adv, mask, clip_eps=0.2, tis_cap=2.0)
    loss.backward()
    # d/dlogp of -w·ratio·A/3 = -w·A·ratio/3; tokens 1-2 are clipped (flat), 4 is masked
    assert logp.grad.tolist() == pytest.approx([0.0, 0.0, 0.5 * 0.9 / 3, 0.0], abs=1e-6)


def test_on_policy_loss_is_minus_the_mean_advantage():
    logp = torch.log(torch.tensor([[0.3, 0.2], [0.5, 0.5]]))
    adv = torch.tensor([[1.0, 1.0], [-0.5, -0.5]])
    loss, stats = policy_loss(logp, logp, logp, adv, torch.ones(2, 2), 0.2, 2.0)
    assert loss.item() == pytest.approx(-0.25)
    assert stats["is/ratio_mean"] == pytest.approx(1.0)
    assert stats["mismatch/kl"] == pytest.approx(0.0, abs=1e-7)


def test_mismatch_kl_is_zero_when_policies_agree_and_positive_otherwise():
    lp = torch.log(torch.tensor([0.2, 0.7]))
    assert mismatch_kl(lp, lp, torch.ones(2)).item() == pytest.approx(0.0, abs=1e-7)
    assert mismatch_kl(lp, lp + 0.3, torch.ones(2)).item() > 0


def test_every_correction_method_the_config_offers_has_a_loss():
    from typing import get_args

    from workers.config.run_config import CorrectionMethod
    from workers.train.loss import LOSSES, METHODS

    assert list(LOSSES) == list(METHODS) == list(get_args(CorrectionMethod))
