"""The GRPO policy loss with PPO clipping and truncated importance sampling.

Three policies meet here:
- mu: the behaviour policy that sampled the tokens (inference logprobs, possibly stale
  and computed by a different kernel: vLLM vs torch);
- pi_old: the trainer's policy at the start of the step (detached);
- pi_theta: the policy being optimised.

PPO clips pi_theta/pi_old as usual; the off-policy gap pi_old/mu is corrected by a
truncated IS weight min(pi_old/mu, tis_cap), as in the decoupled PPO objective of AReaL
and the truncated IS of verl/PipelineRL. Everything here is a pure function on tensors
so each term can be checked by hand.
"""

from __future__ import annotations

import torch


def group_advantages(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """GRPO advantages (r - mean) / (std + eps) within each group.

    `rewards` is (num_groups, group_size); std is the sample std (unbiased, as in
    DeepSeekMath and TRL). A group whose rewards are all equal gets zero advantage.
    """
    if rewards.dim() != 2 or rewards.shape[1] < 2:
        raise ValueError(f"rewards must be (num_groups, group_size ≥ 2); got {tuple(rewards.shape)}")
    mean = rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, keepdim=True)
    return (rewards - mean) / (std + eps)


def truncated_is_weight(
    old_logp: torch.Tensor, behaviour_logp: torch.Tensor, cap: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token weight min(pi_old/mu, cap) (no gradient) and the mask of truncated tokens."""
    raw = torch.exp(old_logp.detach() - behaviour_logp.detach())
    return raw.clamp(max=cap), raw > cap


def mismatch_kl(old_logp: torch.Tensor, behaviour_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """KL(mu || pi_old) on tokens sampled from mu, k3 estimator: E[r - 1 - log r], r = pi_old/mu.

    Unbiased and never negative; zero when trainer and inference agree exactly.
    """
    log_r = (old_logp - behaviour_logp).detach()
    k3 = torch.exp(log_r) - 1 - log_r
    return _masked_mean(k3, mask).clamp(min=0.0)  # rounding can dip below 0


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    behaviour_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float,
    tis_cap: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Token-mean of -min(ratio·A, clip(ratio, 1±eps)·A) · min(pi_old/mu, tis_cap).

    All tensors share one shape (e.g. (rows, tokens)); `advantages` is already broadcast
    to tokens and `mask` marks the completion tokens that count. Returns the loss (with
    gradient through `logp` only) and its statistics.
    """
    mask = mask.to(logp.dtype)
    ratio = torch.exp(logp - old_logp.detach())
    unclipped = ratio * advantages
    clipped = ratio.clamp(1 - clip_eps, 1 + clip_eps) * advantages
    surrogate = torch.minimum(unclipped, clipped)
    is_weight, truncated = truncated_is_weight(old_logp, behaviour_logp, tis_cap)
    loss = _masked_mean(-is_weight * surrogate, mask)
    stats = {
        "is/ratio_mean": _masked_mean(is_weight, mask).item(),
        "is/clipped_frac": _masked_mean(truncated.to(mask.dtype), mask).item(),
        "ppo/clipped_frac": _masked_mean((clipped < unclipped).to(mask.dtype), mask).item(),
        "mismatch/kl": mismatch_kl(old_logp, behaviour_logp, mask).item(),
    }
    return loss, stats


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1)
