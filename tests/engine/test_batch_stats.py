"""The trained batch's reward spread and completion lengths (workers/train/batch_stats.py),
against hand-made groups and against torch's own std (TRL's reward_std is a Bessel-
corrected std of the batch's rewards)."""

from __future__ import annotations

import pytest
import torch

from workers.core.metric_names import NAMES
from workers.core.records import Group, Rollout
from workers.train.batch_stats import batch_metrics


def rollout(reward: float, length: int, finish: str = "stop") -> Rollout:
    return Rollout(
        prompt_ids=[1, 2],
        completion_ids=list(range(length)),
        behaviour_logprobs=[-1.0] * length,
        token_versions=[0] * length,
        finish_reason=finish,
        reward=reward,
    )


def group(name: str, *rollouts: Rollout) -> Group:
    return Group(group_id=name, prompt="p", answer="a", rollouts=list(rollouts))


BATCH = [
    group("solved", rollout(1.0, 3), rollout(1.0, 5)),  # no spread
    group("mixed", rollout(0.0, 8, "length"), rollout(1.0, 2)),
    group("failed", rollout(0.0, 8, "length"), rollout(0.0, 4)),  # no spread
]


def test_reward_std_is_the_bessel_corrected_std_of_the_batch_rewards():
    rewards = torch.tensor([r.reward for g in BATCH for r in g.rollouts])
    assert batch_metrics(BATCH)["reward/std"] == pytest.approx(rewards.std().item())


def test_zero_std_frac_counts_the_groups_without_reward_spread():
    assert batch_metrics(BATCH)["reward/zero_std_frac"] == pytest.approx(2 / 3)
    nearly = [group("g", rollout(0.5, 1), rollout(0.5 + 1e-12, 1))]
    assert batch_metrics(nearly)["reward/zero_std_frac"] == 1.0
    spread = [group("g", rollout(0.5, 1), rollout(0.51, 1))]
    assert batch_metrics(spread)["reward/zero_std_frac"] == 0.0


def test_completion_lengths_and_the_share_cut_by_the_budget():
    m = batch_metrics(BATCH)
    assert m["completion/length_mean"] == pytest.approx(30 / 6)
    assert (m["completion/length_min"], m["completion/length_max"]) == (2.0, 8.0)
    assert m["completion/clipped_frac"] == pytest.approx(2 / 6)


def test_a_single_completion_has_no_spread_and_an_empty_batch_no_figures():
    m = batch_metrics([group("g", rollout(0.7, 4))])
    assert m["reward/std"] == 0.0 and m["reward/zero_std_frac"] == 1.0
    assert batch_metrics([]) == {}


def test_every_figure_is_in_the_vocabulary():
    assert set(batch_metrics(BATCH)) <= NAMES
