"""Each off-policy correction (correction.method) against values worked out by hand.

The example: 2 sequences × 3 completion tokens, plus a padding slot (mask 0) with absurd
values that must not count anywhere (also not in the sequence weight).

                  row 1 (A = +1)          row 2 (A = -1)          padding
    pi_theta      0.5   0.6   0.36        0.3   0.225  0.1        0.9
    pi_old        0.4   0.4   0.4         0.3   0.25   0.1        0.01
    mu            0.4   0.1   0.5         0.2   0.25   0.5        0.9
    r=θ/old       1.25  1.5   0.9         1.0   0.9    1.0
    pi_old/mu     1     4     0.8         1.5   1.0    0.2
    pi_theta/mu   1.25  6     0.72        1.5   0.9    0.2

PPO-clip surrogate min(r·A, clip(r, 0.8, 1.2)·A):
    row 1: 1.2 (clipped), 1.2 (clipped), 0.9      row 2: -1.0, -0.9, -1.0
"""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from tests.engine.helpers import fixed_groups, small_config
from workers.config.run_config import CorrectionConfig, RunConfig, TrainerConfig
from workers.train.loss import correction_loss, policy_loss

# The trainer section's defaults: clip_eps 0.2, tis_cap 2.0.
TRAINER = TrainerConfig()
SURROGATE = [[1.2, 1.2, 0.9], [-1.0, -0.9, -1.0]]
PI_OLD_OVER_MU = [1.0, 4.0, 0.8, 1.5, 1.0, 0.2]
K3 = sum(r - 1 - math.log(r) for r in PI_OLD_OVER_MU) / 6  # mismatch KL(mu || pi_old)


def example():
    logp = torch.log(torch.tensor([[0.5, 0.6, 0.36, 0.9], [0.3, 0.225, 0.1, 0.9]])).requires_grad_(True)
    old = torch.log(torch.tensor([[0.4, 0.4, 0.4, 0.01], [0.3, 0.25, 0.1, 0.01]]))
    mu = torch.log(torch.tensor([[0.4, 0.1, 0.5, 0.9], [0.2, 0.25, 0.5, 0.9]]))
    adv = torch.tensor([[1.0], [-1.0]]).expand(2, 4)
    mask = torch.tensor([[True, True, True, False], [True, True, True, False]])
    return logp, old, mu, adv, mask


def run(method, tis_cap=2.0, **fields):
    logp, old, mu, adv, mask = example()
    loss, stats = correction_loss(
        TrainerConfig(tis_cap=tis_cap), CorrectionConfig(method=method, **fields), logp, old, mu, adv, mask
    )
    loss.backward()
    return loss.item(), stats, logp.grad[:, :3].flatten().tolist(), logp.grad[:, 3].tolist()


def weighted(weights):
    """-mean(w · surrogate) over the six tokens."""
    flat = [s for row in SURROGATE for s in row]
    return -sum(w * s for w, s in zip(weights, flat, strict=True)) / 6


def test_token_tis_truncates_each_token_at_the_cap():
    loss, stats, grad, pad_grad = run("token_tis")
    # w = min(pi_old/mu, 2) = 1, 2 (truncated), 0.8 | 1.5, 1, 0.2
    assert loss == pytest.approx(weighted([1, 2, 0.8, 1.5, 1, 0.2]), abs=1e-6)  # = -0.286667
    assert loss == pytest.approx(-(1.2 + 2.4 + 0.72 - 1.5 - 0.9 - 0.2) / 6, abs=1e-6)
    assert stats["is/ratio_mean"] == pytest.approx(6.5 / 6, abs=1e-6)
    assert stats["is/clipped_frac"] == pytest.approx(1 / 6)
    assert stats["ppo/clipped_frac"] == pytest.approx(2 / 6)
    # Row 1 (A > 0) is clipped above 1.2 twice; row 2 (A < 0) never falls below 0.8.
    assert (stats["ppo/clipped_high_frac"], stats["ppo/clipped_low_frac"]) == (pytest.approx(2 / 6), 0.0)
    assert stats["mismatch/kl"] == pytest.approx(K3, abs=1e-6)
    # gradient -w·A·r/6 where PPO does not clip: row 1 tokens 1-2 are clipped (flat);
    # A > 0 pushes log pi up (negative gradient), A < 0 pushes it down.
    assert grad == pytest.approx([0, 0, -0.8 * 0.9 / 6, 1.5 / 6, 0.9 / 6, 0.2 / 6], abs=1e-6)
    assert pad_grad == [0.0, 0.0]


def test_the_default_is_token_tis_and_equals_the_old_policy_loss():
    assert RunConfig().correction.method == "token_tis"
    torch.manual_seed(0)
    logp = torch.randn(3, 5) - 1.0
    old = logp + 0.1 * torch.randn(3, 5)
    mu = old + 0.5 * torch.randn(3, 5)
    adv = torch.randn(3, 1).expand(3, 5)
    mask = torch.rand(3, 5) > 0.2
    new, new_stats = correction_loss(TRAINER, CorrectionConfig(), logp, old, mu, adv, mask)
    ref, ref_stats = policy_loss(logp, old, mu, adv, mask, 0.2, 2.0)
    assert new.item() == ref.item()
    assert new_stats == ref_stats


def test_sequence_tis_gives_each_sequence_one_truncated_weight():
    loss, stats, grad, _ = run("sequence_tis")
    # row 1: 1·4·0.8 = 3.2 → 2 (truncated); row 2: 1.5·1·0.2 = 0.3. The padding slot
    # (0.01/0.9) is not in the product.
    assert loss == pytest.approx(weighted([2, 2, 2, 0.3, 0.3, 0.3]), abs=1e-6)  # = -0.955
    assert loss == pytest.approx(-(2 * 3.3 + 0.3 * -2.9) / 6, abs=1e-6)
    assert stats["is/ratio_mean"] == pytest.approx((3 * 2 + 3 * 0.3) / 6, abs=1e-6)
    assert stats["is/clipped_frac"] == pytest.approx(3 / 6)  # row 1's three tokens
    assert stats["mismatch/kl"] == pytest.approx(K3, abs=1e-6)
    assert grad == pytest.approx([0, 0, -2 * 0.9 / 6, 0.3 / 6, 0.3 * 0.9 / 6, 0.3 / 6], abs=1e-6)


def test_masked_is_drops_exactly_the_tokens_outside_low_high():
    loss, stats, grad, _ = run("masked_is", mask_low=0.5, mask_high=2.0)
    # pi_old/mu = 4 (row 1, token 2) and 0.2 (row 2, token 3) are outside [0.5, 2]: weight 0;
    # the others keep their weight pi_old/mu.
    assert loss == pytest.approx(weighted([1, 0, 0.8, 1.5, 1, 0]), abs=1e-6)  # = +0.08
    assert loss == pytest.approx(-(1.2 + 0.72 - 1.5 - 0.9) / 6, abs=1e-6)
    assert stats["is/ratio_mean"] == pytest.approx(4.3 / 6, abs=1e-6)
    assert stats["is/clipped_frac"] == pytest.approx(2 / 6)
    assert grad == pytest.approx([0, 0, -0.8 * 0.9 / 6, 1.5 / 6, 0.9 / 6, 0], abs=1e-6)
    # Widen the range to [0.1, 5]: nothing is dropped and the weights are the raw ratios.
    loss, stats, _, _ = run("masked_is", mask_low=0.1, mask_high=5.0)
    assert loss == pytest.approx(weighted(PI_OLD_OVER_MU), abs=1e-6)
    assert stats["is/clipped_frac"] == 0.0


def test_decoupled_ppo_drops_tokens_whose_behaviour_weight_exceeds_the_cap():
    loss, stats, grad, _ = run("decoupled_ppo")
    # AReaL: r = pi_theta/pi_prox (pi_prox = pi_old), w = pi_prox/mu, w > cap → 0.
    # w = 1, 4 → 0, 0.8 | 1.5, 1, 0.2 (below the cap nothing is dropped)
    assert loss == pytest.approx(weighted([1, 0, 0.8, 1.5, 1, 0.2]), abs=1e-6)  # = +0.113333
    assert loss == pytest.approx(-(1.2 + 0.72 - 1.5 - 0.9 - 0.2) / 6, abs=1e-6)
    assert stats["is/ratio_mean"] == pytest.approx(4.5 / 6, abs=1e-6)
    assert stats["is/clipped_frac"] == pytest.approx(1 / 6)
    assert stats["ppo/clipped_frac"] == pytest.approx(2 / 6)
    assert grad == pytest.approx([0, 0, -0.8 * 0.9 / 6, 1.5 / 6, 0.9 / 6, 0.2 / 6], abs=1e-6)


def test_pipelinerl_reinforce_clamps_pi_theta_over_mu_and_detaches_it():
    loss, stats, grad, _ = run("pipelinerl_reinforce", reinforce_eps_hi=0.02)
    # w = sg(clamp(pi_theta/mu, 0, 1.02)) = 1.02, 1.02, 0.72 | 1.02, 0.9, 0.2
    w = [[1.02, 1.02, 0.72], [1.02, 0.9, 0.2]]
    lp = [[0.5, 0.6, 0.36], [0.3, 0.225, 0.1]]
    a = [1.0, -1.0]
    expected = -sum(math.log(lp[i][t]) * a[i] * w[i][t] for i in range(2) for t in range(3)) / 6
    assert loss == pytest.approx(expected, abs=1e-5)
    assert stats["is/ratio_mean"] == pytest.approx(4.88 / 6, abs=1e-6)
    assert stats["is/clipped_frac"] == pytest.approx(3 / 6)  # 1.25, 6 and 1.5 exceed 1.02
    assert stats["mismatch/kl"] == pytest.approx(K3, abs=1e-6)
    # w is detached: the gradient is -A·w/6 per token, not through the ratio.
    assert grad == pytest.approx([-1.02 / 6, -1.02 / 6, -0.72 / 6, 1.02 / 6, 0.9 / 6, 0.2 / 6], abs=1e-6)


def test_none_is_plain_ppo_clip():
    loss, stats, grad, _ = run("none")
    assert loss == pytest.approx(weighted([1] * 6), abs=1e-6)  # = -(3.3 - 2.9)/6
    assert stats["is/ratio_mean"] == 1.0
    assert stats["is/clipped_frac"] == 0.0
    assert stats["mismatch/kl"] == pytest.approx(K3, abs=1e-6)  # still reported
    assert grad == pytest.approx([0, 0, -0.9 / 6, 1 / 6, 0.9 / 6, 1 / 6], abs=1e-6)


@pytest.mark.parametrize("method", ["token_tis", "sequence_tis", "masked_is", "decoupled_ppo", "none"])
def test_on_policy_every_ppo_method_is_minus_the_mean_advantage(method):
    logp = torch.log(torch.tensor([[0.3, 0.2], [0.5, 0.5]]))
    adv = torch.tensor([[1.0, 1.0], [-0.5, -0.5]])
    loss, stats = correction_loss(
        TRAINER, CorrectionConfig(method=method), logp, logp, logp, adv, torch.ones(2, 2, dtype=torch.bool)
    )
    assert loss.item() == pytest.approx(-0.25)
    assert stats["is/ratio_mean"] == pytest.approx(1.0)
    assert stats["is/clipped_frac"] == 0.0
    assert stats["mismatch/kl"] == pytest.approx(0.0, abs=1e-7)


def test_config_errors_name_the_field():
    with pytest.raises(ValidationError, match="correction.method"):
        RunConfig.model_validate({"correction": {"method": "vtrace"}})
    with pytest.raises(ValidationError, match="correction.mask_low"):
        RunConfig.model_validate({"correction": {"mask_low": 1.5}})
    with pytest.raises(ValidationError, match="correction.mask_high"):
        RunConfig.model_validate({"correction": {"mask_high": 0.9}})
    with pytest.raises(ValidationError, match="correction.reinforce_eps_hi"):
        RunConfig.model_validate({"correction": {"reinforce_eps_hi": -0.1}})
    with pytest.raises(ValidationError, match="correction.tis_cap"):
        RunConfig.model_validate({"correction": {"tis_cap": 2.0}})  # it lives in trainer


def test_the_trainer_applies_the_configured_method(tiny_model_dir):
    """Behaviour logprobs shifted by +0.5 on every token: pi_old/mu = e^-0.5 ≈ 0.607 on the
    first step, so each method leaves its own fingerprint in the trainer's metrics."""
    from workers.train.trainer import Trainer

    def first_step(**correction):
        cfg = small_config(correction=correction)
        groups = fixed_groups(tiny_model_dir, cfg)
        for g in groups:
            for r in g.rollouts:
                r.behaviour_logprobs = [lp + 0.5 for lp in r.behaviour_logprobs]
        return Trainer(cfg, tiny_model_dir).train_step(groups)

    w = math.exp(-0.5)
    assert first_step()["is/ratio_mean"] == pytest.approx(w, abs=1e-3)  # token_tis
    assert first_step(method="none")["is/ratio_mean"] == 1.0
    dropped = first_step(method="masked_is", mask_low=0.7)  # 0.607 < 0.7: every token dropped
    assert dropped["is/clipped_frac"] == 1.0 and dropped["loss"] == 0.0
    reinforce = first_step(method="pipelinerl_reinforce")  # pi_theta = pi_old on the first update
    assert reinforce["is/ratio_mean"] == pytest.approx(w, abs=1e-3) and "ppo/clipped_frac" not in reinforce
    assert (
        first_step(method="sequence_tis")["is/ratio_mean"] < w
    )  # Π of 0.607 over each completion (most have several tokens)


@pytest.mark.slow
@pytest.mark.parametrize(
    "method", ["token_tis", "sequence_tis", "masked_is", "pipelinerl_reinforce", "decoupled_ppo", "none"]
)
def test_every_method_still_learns_the_default_task_one_step_off(method):
    """bench/learn_inprocess.py --lag 1 in miniature: torch backend, default preset, each batch
    trained one version after it was generated (so pi_old ≠ mu and the correction acts).
    Measured (2 cores): every method reaches avg5 ≥ 0.8 in 14-17 steps from 0.155."""
    import os
    import random
    import tempfile

    from workers.config.presets import build
    from workers.inference.torch_backend import TorchBackend
    from workers.model.tokenizer import CharTokenizer
    from workers.rl_tasks import make_task
    from workers.rollout.generation import generate_groups
    from workers.train.trainer import Trainer
    from workers.train.warmstart import policy_dir

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cfg = build("async", {"correction": {"method": method}})
        # The bench's cache: the default warm start is built once per machine.
        model_dir = policy_dir(cfg, os.path.join(tempfile.gettempdir(), "rollway-bench-cache"))
        tokenizer, task = CharTokenizer.load(model_dir), make_task(cfg.task)
        backend, trainer, rng = TorchBackend(model_dir), Trainer(cfg, model_dir), random.Random(cfg.seed)
        pending, rewards, metrics = [], [], []
        for _step in range(40):
            while len(pending) < 2:  # one batch in hand → train on the older one (lag 1)
                prompts = task.sample(cfg.trainer.batch_groups, rng)
                pending.append(
                    generate_groups(
                        backend, task, tokenizer, prompts, cfg, trainer.version, seed=len(rewards) * 7 + len(pending)
                    )
                )
            m = trainer.train_step(pending.pop(0))
            backend.load_weights(trainer.state_dict())
            rewards.append(m["reward/mean"])
            metrics.append(m)
            if len(rewards) >= 5 and sum(rewards[-5:]) / 5 >= 0.7:
                break
        backend.close()
    finally:
        torch.set_num_threads(threads)
    assert rewards[0] < 0.4
    assert sum(rewards[-5:]) / 5 >= 0.7, f"{method}: rewards {[round(r, 2) for r in rewards]}"
    assert max(m["staleness/mean"] for m in metrics) == 1.0  # the correction had work to do
    assert all(math.isfinite(m[k]) for m in metrics for k in ("is/ratio_mean", "is/clipped_frac", "mismatch/kl"))


def test_the_ppo_clip_fraction_splits_into_its_low_and_high_sides():
    """Each token's side by hand: ratio pi_theta/pi_old against [1 − 0.2, 1 + 0.28]."""
    ratio = torch.tensor([[0.5, 0.9, 1.5, 1.25], [0.5, 0.7, 1.5, 1.0]])
    adv = torch.tensor([[-1.0], [1.0]]).expand(2, 4)
    old = torch.zeros(2, 4)
    mask = torch.tensor([[True, True, True, True], [True, True, True, False]])
    _, stats = policy_loss(ratio.log(), old, old, adv, mask, clip_eps=0.2, tis_cap=2.0, clip_eps_high=0.28)
    # Row 1, A < 0: 0.5 is clipped low; 1.5 is above but a negative advantage is not bound there.
    # Row 2, A > 0: 1.5 is clipped high (above 1.28); 0.5 and 0.7 are below but not bound.
    assert stats["ppo/clipped_low_frac"] == pytest.approx(1 / 7)
    assert stats["ppo/clipped_high_frac"] == pytest.approx(1 / 7)
    assert stats["ppo/clipped_frac"] == pytest.approx(stats["ppo/clipped_low_frac"] + stats["ppo/clipped_high_frac"])
