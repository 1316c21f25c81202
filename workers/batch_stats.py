"""What a trained batch looked like: its rewards and completions, in the figures a GRPO
user reads first (TRL logs the same as `reward_std`, `frac_reward_zero_std` and
`completions/*`; the README's metric glossary maps the names).

A pure function of the batch's groups, so the trainer's step adds them in one line and
they are tested without a model.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import stdev

from workers.rollout import Group

# Rewards closer than this count as equal: a group whose rewards all are has no spread,
# so GRPO gives it zero advantage and it teaches nothing (math.isclose's default rel_tol
# with an absolute floor for rewards at 0, as torch.isclose's atol).
ZERO_SPREAD_ATOL = 1e-8


def _no_spread(rewards: Sequence[float]) -> bool:
    return all(math.isclose(r, rewards[0], abs_tol=ZERO_SPREAD_ATOL) for r in rewards[1:])


def batch_metrics(groups: Sequence[Group]) -> dict[str, float]:
    """reward/std (sample std over the batch's completions, Bessel-corrected as TRL's),
    reward/zero_std_frac (share of groups whose completions all got the same reward),
    completion/length_* (completion tokens: mean, min, max) and completion/clipped_frac
    (share that hit the token budget or turn limit rather than EOS)."""
    rollouts = [r for g in groups for r in g.rollouts]
    if not rollouts:
        return {}
    rewards = [r.reward for r in rollouts]
    lengths = [len(r.completion_ids) for r in rollouts]
    return {
        "reward/std": stdev(rewards) if len(rewards) > 1 else 0.0,
        "reward/zero_std_frac": sum(_no_spread([r.reward for r in g.rollouts]) for g in groups if g.rollouts)
        / sum(1 for g in groups if g.rollouts),
        "completion/length_mean": sum(lengths) / len(lengths),
        "completion/length_min": float(min(lengths)),
        "completion/length_max": float(max(lengths)),
        "completion/clipped_frac": sum(r.finish_reason == "length" for r in rollouts) / len(rollouts),
    }
