"""The GRPO policy loss and its off-policy (staleness) corrections.

Three policies meet here, named as in this engine:
- mu (`behaviour_logp`): the behaviour policy that sampled the tokens, i.e. the inference
  logprobs carried in each Rollout (possibly several versions stale, and computed by a
  different kernel: vLLM vs torch);
- pi_old (`old_logp`): the trainer's policy at the start of the step, recomputed by the
  trainer on the batch and detached. AReaL calls it pi_prox (the proximal policy), verl
  the "old" log-prob of its decoupled mode;
- pi_theta (`logp`): the policy being optimised (the only term with a gradient).

Every method reports the same statistics: `is/ratio_mean` (mean IS weight applied per
token), `is/clipped_frac` (fraction of tokens whose weight was truncated or dropped) and
`mismatch/kl` (KL(mu || pi_old), the gap between behaviour and trainer logprobs). All
losses are token means over `mask`, the trained tokens: the completion's, less the
environment's tokens of a multi-turn episode (workers/core/records.py), which get exactly
zero gradient and count in no denominator; a dropped token counts in the denominator
with weight 0 (as in AReaL). Pure functions on tensors, so each term can be
checked by hand (tests/engine/test_loss.py, tests/engine/test_is_variants.py).

The algorithm's other knobs live here too, so one module holds the whole objective: how
advantages are scaled (`scaled_advantages`), how per-token losses are aggregated
(`Aggregation`: a token mean by default; GRPO's sequence mean; Dr. GRPO's constant
normaliser), the asymmetric clip (`clip_eps_high`) and the KL penalty to a frozen
reference policy (`reference_kl`, added per token before aggregation, as TRL and verl
do). The statistics stay token means whatever the aggregation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import get_args

import torch

from workers.config.run_config import (
    AdvantageScaling,
    CorrectionConfig,
    CorrectionMethod,
    KLEstimator,
    LossAggregation,
    TrainerConfig,
)

# correction.method's choices, in the config's order (each has its loss in LOSSES).
METHODS: tuple[str, ...] = get_args(CorrectionMethod)
# The other knobs' choices, named once in the config.
AGGREGATIONS: tuple[str, ...] = get_args(LossAggregation)
ADVANTAGE_SCALINGS: tuple[str, ...] = get_args(AdvantageScaling)
KL_ESTIMATORS: tuple[str, ...] = get_args(KLEstimator)


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


def scaled_advantages(
    rewards: Sequence[Sequence[float]], scaling: str = "group_std", eps: float = 1e-6
) -> list[list[float]]:
    """Each group's advantages: reward − the group's mean, divided by (`scaling`) the
    group's std + eps (group_std, GRPO: `group_advantages`), the std of every reward of
    the batch + eps (batch_std, TRL scale_rewards="batch"), or nothing (none, Dr. GRPO).
    Groups may differ in size; stds are sample stds (unbiased)."""
    if scaling not in ADVANTAGE_SCALINGS:
        raise ValueError(f"trainer.advantage_scaling {scaling!r} is not one of {', '.join(ADVANTAGE_SCALINGS)}")
    if any(len(g) < 2 for g in rewards):
        raise ValueError("every group needs ≥ 2 rewards for its advantages")
    if scaling == "group_std":
        return [group_advantages(torch.tensor([list(g)], dtype=torch.float32))[0].tolist() for g in rewards]
    tensors = [torch.tensor(list(g), dtype=torch.float32) for g in rewards]
    centred = [t - t.mean() for t in tensors]
    if scaling == "none":
        return [c.tolist() for c in centred]
    std = torch.cat(tensors).std()
    return [(c / (std + eps)).tolist() for c in centred]


def process_advantages(
    steps: Sequence[Sequence[tuple[Sequence[int], Sequence[float]]]], scaling: str = "group_std", eps: float = 1e-6
) -> list[list[list[float]]]:
    """Process supervision's per-token advantages (DeepSeekMath §4.1.3, PRM-GRPO).

    `steps`: per group, per completion, its (step ends, step scores): the completion-token
    count at the end of each step and the step's score. Every step score is normalised
    over the group's step scores, r̃ = (r − mean) / (std + eps), and a token of step j
    gets Σ_{k ≥ j} r̃_k: a step is credited with its own score and every later one's, as
    an outcome reward credits every token with the end's. Returns, per group, per
    completion, one advantage per completion token (the last step's end).

    `scaling` as `scaled_advantages` says, over step scores: group_std (the paper's),
    batch_std (the std of every step score of the batch), none (centred only). The mean
    is always the group's; stds are sample stds (unbiased), as for outcome advantages."""
    if scaling not in ADVANTAGE_SCALINGS:
        raise ValueError(f"trainer.advantage_scaling {scaling!r} is not one of {', '.join(ADVANTAGE_SCALINGS)}")
    for group in steps:
        for ends, scores in group:
            if not ends or len(ends) != len(scores):
                raise ValueError("every completion needs ≥ 1 step, each with one score")
        if sum(len(scores) for _, scores in group) < 2:
            raise ValueError("every group needs ≥ 2 step scores for its advantages")
    flat = [torch.tensor([s for _, scores in g for s in scores], dtype=torch.float64) for g in steps]
    batch_std = torch.cat(flat).std() if scaling == "batch_std" else None
    out = []
    for group, group_scores in zip(steps, flat, strict=True):
        centred = group_scores - group_scores.mean()
        if scaling == "group_std":
            centred = centred / (group_scores.std() + eps)
        elif batch_std is not None:
            centred = centred / (batch_std + eps)
        normalised = iter(centred.tolist())
        rows = []
        for ends, _ in group:
            r = [next(normalised) for _ in ends]
            # Suffix sums: what each step's tokens get.
            to_go = [sum(r[j:]) for j in range(len(r))]
            row: list[float] = []
            start = 0
            for end, value in zip(ends, to_go, strict=True):
                row += [value] * (end - start)
                start = end
            rows.append(row)
        out.append(rows)
    return out


@dataclass(frozen=True)
class Aggregation:
    """How a (micro-)batch's per-token losses make one loss (`trainer.loss_aggregation`):
    token_mean, the mean over every trained token; sequence_mean, each sequence's token
    mean, then their mean; constant, each sequence's token sum over `constant`, then
    their mean (Dr. GRPO). A sequence with no trained token counts in no mean.

    `units` is what a pool's micro-batches are weighted by to sum to the minibatch's
    loss (workers/train/trainer.py): trained tokens for token_mean, trained sequences else."""

    mode: str = "token_mean"
    constant: float = 1.0

    @classmethod
    def of(cls, trainer: TrainerConfig, max_new_tokens: int | None = None) -> Aggregation:
        """`trainer.loss_aggregation`; its constant is `trainer.loss_constant` or, unset,
        the completion budget `max_new_tokens` (Dr. GRPO's)."""
        constant = trainer.loss_constant or max_new_tokens
        if trainer.loss_aggregation == "constant" and constant is None:
            raise ValueError("trainer.loss_aggregation 'constant' needs trainer.loss_constant or max_new_tokens")
        return cls(trainer.loss_aggregation, float(constant or 1))

    def __post_init__(self) -> None:
        if self.mode not in AGGREGATIONS:
            raise ValueError(f"trainer.loss_aggregation {self.mode!r} is not one of {', '.join(AGGREGATIONS)}")

    def __call__(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """`x` aggregated over `mask` (both rows × tokens)."""
        if self.mode == "token_mean":
            return _masked_mean(x, mask)
        mask = mask.to(x.dtype)
        per_row = (x * mask).sum(dim=-1)
        tokens = mask.sum(dim=-1)
        per_row = per_row / (tokens.clamp(min=1) if self.mode == "sequence_mean" else self.constant)
        return per_row.sum() / (tokens > 0).sum().clamp(min=1)

    def units(self, mask: torch.Tensor) -> int:
        """Trained tokens (token_mean) or trained sequences (the others) under `mask`."""
        if self.mode == "token_mean":
            return int(mask.sum())
        return int((mask.sum(dim=-1) > 0).sum())


TOKEN_MEAN = Aggregation()


def reference_kl(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """Per-token estimate of KL(pi_theta || pi_ref) on tokens sampled from the policy,
    d = log pi_ref − log pi_theta (Schulman's estimators, as TRL and verl name them):
    k1 = −d (unbiased, can be negative); k2 = d²/2; k3 = exp(d) − d − 1 (unbiased, never
    negative: TRL's per_token_kl, verl's low_var_kl). Differentiable in `logp`."""
    d = ref_logp.detach() - logp
    if estimator == "k1":
        return -d
    if estimator == "k2":
        return 0.5 * d * d
    if estimator == "k3":
        return torch.exp(d) - d - 1
    raise ValueError(f"trainer.kl_estimator {estimator!r} is not one of {', '.join(KL_ESTIMATORS)}")


def truncated_is_weight(
    old_logp: torch.Tensor, behaviour_logp: torch.Tensor, cap: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token weight min(pi_old/mu, cap) (no gradient) and the mask of truncated tokens."""
    raw = torch.exp(old_logp.detach() - behaviour_logp.detach())
    return raw.clamp(max=cap), raw > cap


def sequence_is_weight(
    old_logp: torch.Tensor, behaviour_logp: torch.Tensor, mask: torch.Tensor, cap: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """One weight per row, min(exp(Σ_t log pi_old − log mu), cap), broadcast to its tokens
    (verl's sequence-level TIS). Tensors are (rows, tokens); returns (weight, truncated)."""
    log_w = ((old_logp.detach() - behaviour_logp.detach()) * mask).sum(dim=-1, keepdim=True)
    raw = torch.exp(log_w).expand_as(old_logp)
    return raw.clamp(max=cap), raw > cap


def masked_is_weight(
    old_logp: torch.Tensor, behaviour_logp: torch.Tensor, low: float, high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token weight pi_old/mu where it lies in [low, high], else 0 (the token is
    dropped: verl's masked IS, IcePop). Returns (weight, dropped)."""
    raw = torch.exp(old_logp.detach() - behaviour_logp.detach())
    dropped = (raw < low) | (raw > high)
    return torch.where(dropped, torch.zeros_like(raw), raw), dropped


def mismatch_kl(old_logp: torch.Tensor, behaviour_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """KL(mu || pi_old) on tokens sampled from mu, k3 estimator: E[r - 1 - log r], r = pi_old/mu.

    Unbiased and never negative; zero when trainer and inference agree exactly.
    """
    log_r = (old_logp - behaviour_logp).detach()
    k3 = torch.exp(log_r) - 1 - log_r
    return _masked_mean(k3, mask).clamp(min=0.0)  # rounding can dip below 0


def weighted_ppo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    behaviour_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float,
    weight: torch.Tensor,
    corrected: torch.Tensor,
    clip_eps_high: float | None = None,
    aggregation: Aggregation = TOKEN_MEAN,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Aggregate of -weight · min(ratio·A, clip(ratio, 1 − eps, 1 + eps_high)·A), ratio =
    pi_theta/pi_old, eps_high = `clip_eps_high` (None: `clip_eps`).

    `weight` is the detached IS weight per token and `corrected` marks the tokens whose
    weight was truncated or dropped (reported as is/clipped_frac). All tensors share one
    shape; `advantages` is already broadcast to tokens.
    """
    mask = mask.to(logp.dtype)
    high = clip_eps if clip_eps_high is None else clip_eps_high
    ratio = torch.exp(logp - old_logp.detach())
    unclipped = ratio * advantages
    clipped = ratio.clamp(1 - clip_eps, 1 + high) * advantages
    surrogate = torch.minimum(unclipped, clipped)
    loss = aggregation(-weight.detach() * surrogate, mask)
    stats = {
        "is/ratio_mean": _masked_mean(weight, mask).item(),
        "is/clipped_frac": _masked_mean(corrected.to(mask.dtype), mask).item(),
        "ppo/clipped_frac": _masked_mean((clipped < unclipped).to(mask.dtype), mask).item(),
        # The two sides of it (they add up to it): a ratio below 1 − eps on a negative
        # advantage, above 1 + eps_high on a positive one (TRL's clip_ratio/low_mean, high_mean).
        "ppo/clipped_low_frac": _masked_mean(((ratio < 1 - clip_eps) & (advantages < 0)).to(mask.dtype), mask).item(),
        "ppo/clipped_high_frac": _masked_mean(((ratio > 1 + high) & (advantages > 0)).to(mask.dtype), mask).item(),
        "mismatch/kl": mismatch_kl(old_logp, behaviour_logp, mask).item(),
    }
    return loss, stats


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    behaviour_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float,
    tis_cap: float,
    clip_eps_high: float | None = None,
    aggregation: Aggregation = TOKEN_MEAN,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The default ("token_tis"): PPO-clip on pi_theta/pi_old times the token-level
    truncated IS weight min(pi_old/mu, tis_cap) (verl's token TIS in decoupled mode;
    AReaL's decoupled PPO with the weight clamped instead of masked)."""
    weight, truncated = truncated_is_weight(old_logp, behaviour_logp, tis_cap)
    return weighted_ppo_loss(
        logp, old_logp, behaviour_logp, advantages, mask, clip_eps, weight, truncated, clip_eps_high, aggregation
    )


def pipelinerl_reinforce_loss(
    logp: torch.Tensor,
    behaviour_logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    eps_hi: float,
    aggregation: Aggregation = TOKEN_MEAN,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PipelineRL's `reinforce`: the aggregate (a token mean by default) of
    -log pi_theta · A · sg(clamp(pi_theta/mu, 0, 1+eps_hi)).

    The weight compares the *current* policy with the behaviour policy (no pi_old, no PPO
    clip); it is detached, so the gradient is -A·w·∇log pi_theta. `old_logp` is used only
    for the mismatch KL, which every method reports the same way.
    """
    mask = mask.to(logp.dtype)
    raw = torch.exp(logp.detach() - behaviour_logp.detach())
    weight = raw.clamp(0.0, 1.0 + eps_hi)
    loss = aggregation(-logp * advantages * weight, mask)
    stats = {
        "is/ratio_mean": _masked_mean(weight, mask).item(),
        "is/clipped_frac": _masked_mean((raw > 1.0 + eps_hi).to(mask.dtype), mask).item(),
        "mismatch/kl": mismatch_kl(old_logp, behaviour_logp, mask).item(),
    }
    return loss, stats


@dataclass(frozen=True)
class LossInputs:
    """What every correction method's loss reads: the three policies' logprobs (module
    docstring), the advantages broadcast to tokens, the trained-token mask, and the
    settings: the `trainer` section (clip_eps, clip_eps_high, tis_cap), the `correction`
    section, and how per-token losses are aggregated."""

    logp: torch.Tensor
    old_logp: torch.Tensor
    behaviour_logp: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    trainer: TrainerConfig
    correction: CorrectionConfig
    aggregation: Aggregation

    def ppo(self, weight: torch.Tensor, corrected: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        """PPO-clip on pi_theta/pi_old times `weight` (weighted_ppo_loss)."""
        return weighted_ppo_loss(
            self.logp,
            self.old_logp,
            self.behaviour_logp,
            self.advantages,
            self.mask,
            self.trainer.clip_eps,
            weight,
            corrected,
            self.trainer.clip_eps_high,
            self.aggregation,
        )


def _token_tis(x: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO-clip × min(pi_old/mu, tis_cap) per token (the default)."""
    return policy_loss(
        x.logp,
        x.old_logp,
        x.behaviour_logp,
        x.advantages,
        x.mask,
        x.trainer.clip_eps,
        x.trainer.tis_cap,
        x.trainer.clip_eps_high,
        x.aggregation,
    )


def _sequence_tis(x: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO-clip × min(Π_t pi_old/mu, tis_cap), one weight per sequence."""
    return x.ppo(*sequence_is_weight(x.old_logp, x.behaviour_logp, x.mask, x.trainer.tis_cap))


def _masked_is(x: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO-clip × pi_old/mu, tokens with pi_old/mu outside [mask_low, mask_high] dropped."""
    return x.ppo(*masked_is_weight(x.old_logp, x.behaviour_logp, x.correction.mask_low, x.correction.mask_high))


def _decoupled_ppo(x: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
    """AReaL: PPO-clip on pi_theta/pi_prox × pi_prox/mu, tokens with weight > tis_cap
    dropped (AReaL's behav_imp_weight_cap); pi_prox = pi_old here."""
    return x.ppo(*masked_is_weight(x.old_logp, x.behaviour_logp, 0.0, x.trainer.tis_cap))


def _pipelinerl_reinforce(x: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
    """-log pi_theta · A · sg(clamp(pi_theta/mu, 0, 1+reinforce_eps_hi))."""
    return pipelinerl_reinforce_loss(
        x.logp, x.behaviour_logp, x.old_logp, x.advantages, x.mask, x.correction.reinforce_eps_hi, x.aggregation
    )


def _no_correction(x: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO-clip on pi_theta/pi_old, no correction for pi_old ≠ mu."""
    return x.ppo(torch.ones_like(x.logp), torch.zeros_like(x.mask, dtype=torch.bool))


# correction.method → its loss.
LOSSES: dict[str, Callable[[LossInputs], tuple[torch.Tensor, dict[str, float]]]] = {
    "token_tis": _token_tis,
    "sequence_tis": _sequence_tis,
    "masked_is": _masked_is,
    "pipelinerl_reinforce": _pipelinerl_reinforce,
    "decoupled_ppo": _decoupled_ppo,
    "none": _no_correction,
}


def correction_loss(
    trainer: TrainerConfig,
    correction: CorrectionConfig,
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    behaviour_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    aggregation: Aggregation | None = None,
    ref_logp: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The policy loss for `correction.method` (LOSSES: each method's function says what
    it computes) and its statistics, with the `trainer` section's clip range, IS cap and
    KL penalty, aggregated as `aggregation` says (the trainer builds it once,
    `Aggregation.of`; None: built here from `trainer`). With `ref_logp` (the frozen
    reference policy's logprobs) and `trainer.kl_coef` > 0, plus kl_coef times the
    aggregated per-token `reference_kl` (`trainer.kl_estimator`), reported as loss/kl_ref
    (its token mean)."""
    aggregation = aggregation if aggregation is not None else Aggregation.of(trainer)
    loss = LOSSES.get(correction.method)
    if loss is None:
        raise ValueError(f"correction.method {correction.method!r} is not one of {', '.join(METHODS)}")
    # Outside the mask mu is a placeholder (a tool token was never sampled; padding has
    # none): pi_old stands in, so no value there can reach a weight, the KL or, through
    # 0 * inf, the loss and its gradient.
    behaviour_logp = torch.where(mask.bool(), behaviour_logp, old_logp.detach())
    inputs = LossInputs(logp, old_logp, behaviour_logp, advantages, mask, trainer, correction, aggregation)
    total, stats = loss(inputs)
    if ref_logp is not None and trainer.kl_coef:
        kl = reference_kl(logp, ref_logp, trainer.kl_estimator)
        # Outside the mask the reference's logprob may be anything (padding): 0 there.
        kl = torch.where(mask.bool(), kl, torch.zeros_like(kl))
        total = total + trainer.kl_coef * aggregation(kl, mask)
        stats["loss/kl_ref"] = _masked_mean(kl.detach(), mask.to(kl.dtype)).item()
    return total, stats


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1)
