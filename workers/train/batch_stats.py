"""What a trained batch looked like: its rewards and completions, in the figures a GRPO
user reads first (TRL logs the same as `reward_std`, `frac_reward_zero_std` and
`completions/*`; docs/metrics.md maps the names).

A pure function of the batch's groups, so the trainer's step adds them in one line and
they are tested without a model.
"""

from __future__ import annotations

from collections.abc import Sequence
from statistics import stdev

from workers.core.metric_names import agent_series, reward_func_series
from workers.core.records import Group, Rollout


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
        **reward_func_metrics(rollouts),
        **agent_reward_metrics(rollouts),
        "reward/std": stdev(rewards) if len(rewards) > 1 else 0.0,
        "reward/zero_std_frac": sum(g.uniform for g in groups if g.rollouts) / sum(1 for g in groups if g.rollouts),
        "completion/length_mean": sum(lengths) / len(lengths),
        "completion/length_min": float(min(lengths)),
        "completion/length_max": float(max(lengths)),
        "completion/clipped_frac": sum(r.finish_reason == "length" for r in rollouts) / len(rollouts),
    }


def reward_func_metrics(rollouts: Sequence[Rollout]) -> dict[str, float]:
    """rewards/<func>/mean and /std (TRL's names) for each task.reward_funcs function,
    over the completions it applied to (its None values left out, as TRL's nanmean and
    nanstd); nothing for a function that applied to none."""
    values: dict[str, list[float]] = {}
    for r in rollouts:
        for name, v in r.reward_parts.items():
            values.setdefault(name, [])
            if v is not None:
                values[name].append(v)
    out = {}
    for name, vs in values.items():
        if vs:
            out[reward_func_series(name, "mean")] = sum(vs) / len(vs)
            out[reward_func_series(name, "std")] = stdev(vs) if len(vs) > 1 else 0.0
    return out


def agent_reward_metrics(rollouts: Sequence[Rollout]) -> dict[str, float]:
    """agent/<agent>/reward_mean for each agent of a multi-agent task's episodes (its
    turns' rewards); nothing for a single-agent task."""
    values: dict[str, list[float]] = {}
    for r in rollouts:
        if r.agent:
            values.setdefault(r.agent, []).append(r.reward)
    return {agent_series(a, "reward_mean"): sum(vs) / len(vs) for a, vs in values.items()}
