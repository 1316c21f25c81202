"""Process credit (rewards.credit "process"): each reasoning step's score, normalised
within its group, credits the tokens of that step and of the steps before it
(workers/train/loss.py `process_advantages`), carried on the rollouts (workers/core/records.py) and
taken per token by the trainer's loss (workers/train/trainer.py)."""

from __future__ import annotations

import copy
import json
import random

import pytest
import torch
from pydantic import ValidationError

from tests.engine.helpers import fixed_groups, small_config
from workers.core.records import Group, Rollout
from workers.train.loss import process_advantages, scaled_advantages
from workers.train.trainer import Trainer

PROCESS = {"workers": 1, "mode": "pipelined", "credit": "process"}


def test_a_tokens_advantage_is_the_sum_of_the_normalised_scores_of_its_step_and_the_later_ones():
    # A: 2 steps over 3 tokens (ends 2, 3), scores 3, 3; B: 3 steps over 4 tokens (ends
    # 1, 3, 4), scores 1, 2, 1. The group's five scores have mean 2 and sample std 1, so
    # r̃ is A: 1, 1 and B: −1, 0, −1; suffix sums A: 2, 1 and B: −2, −1, −1.
    group = [([2, 3], [3.0, 3.0]), ([1, 3, 4], [1.0, 2.0, 1.0])]
    (got,) = process_advantages([group], eps=0.0)
    assert got == [[2.0, 2.0, 1.0], [-2.0, -1.0, -1.0, -1.0]]
    # eps is added to the std, as for outcome advantages.
    (with_eps,) = process_advantages([group])
    assert with_eps[0] == pytest.approx([2 / (1 + 1e-6), 2 / (1 + 1e-6), 1 / (1 + 1e-6)], abs=1e-12)


def test_without_scaling_the_step_scores_are_only_centred_on_the_group():
    # Mean 2; r̃ A: −2, 2 and B: 0; std 2√2 would have divided them.
    (got,) = process_advantages([[([1, 2], [0.0, 4.0]), ([3], [2.0])]], "none")
    assert got == [[0.0, 2.0], [0.0, 0.0, 0.0]]


def test_one_step_per_completion_scored_by_its_reward_is_grpos_outcome_advantage():
    rewards = [[0.2, 0.9, 0.4], [1.0, 0.0]]
    lengths = [[3, 1, 2], [2, 4]]
    steps = [[([n], [r]) for n, r in zip(ns, rs, strict=True)] for ns, rs in zip(lengths, rewards, strict=True)]
    got = process_advantages(steps)
    outcome = scaled_advantages(rewards)
    for g_got, g_out, g_len in zip(got, outcome, lengths, strict=True):
        for row, a, n in zip(g_got, g_out, g_len, strict=True):
            assert row == pytest.approx([a] * n, abs=1e-6)


def test_process_credit_is_refused_outside_pipelined_mode_naming_the_field_and_the_fix():
    with pytest.raises(ValidationError, match="rewards.credit 'process'.*set rewards.mode to 'pipelined'"):
        small_config(rewards={"workers": 1, "mode": "after", "credit": "process"})
    assert small_config(rewards=PROCESS).rewards.credit == "process"


def _rollout(n: int, ends: list[int], scores: list[float]) -> Rollout:
    return Rollout(
        prompt_ids=[1],
        completion_ids=list(range(2, 2 + n)),
        behaviour_logprobs=[-0.5] * n,
        token_versions=[0] * n,
        finish_reason="stop",
        reward=scores[-1] if scores else 0.0,
        step_ends=ends,
        step_scores=scores,
    )


def test_the_steps_survive_a_checkpoints_json_and_an_outcome_groups_json_has_none():
    group = Group("0-0", "p", "a", [_rollout(3, [2, 3], [0.25, 1.0]), _rollout(2, [2], [0.5])])
    back = Group.from_json(json.loads(json.dumps(group.to_json())))
    assert back == group
    assert [r.step_ends for r in back.rollouts] == [[2, 3], [2]]
    assert [r.step_scores for r in back.rollouts] == [[0.25, 1.0], [0.5]]
    outcome = Group("0-1", "p", "a", [_rollout(3, [], [])])
    data = outcome.to_json()
    assert "step_ends" not in data["rollouts"][0] and "step_scores" not in data["rollouts"][0]
    assert Group.from_json(data) == outcome


@pytest.mark.parametrize(
    ("ends", "scores"),
    [([2, 3], [1.0]), ([2, 2, 3], [1.0, 1.0, 1.0]), ([1, 2], [1.0, 1.0])],
)
def test_a_rollout_refuses_steps_that_do_not_cover_its_completion(ends, scores):
    with pytest.raises(ValueError, match="step_"):
        _rollout(3, ends, scores)


def _with_steps(groups, seed: int = 0):
    """Each rollout split into two steps at its middle (one step if it has 1 token),
    with seeded random scores, the last one its reward."""
    rng = random.Random(seed)
    for g in groups:
        for r in g.rollouts:
            n = len(r.completion_ids)
            r.step_ends = [n // 2, n] if n > 1 else [n]
            r.step_scores = [rng.random() for _ in r.step_ends]
            r.reward = r.step_scores[-1]
    return groups


def test_a_trainer_step_with_process_credit_takes_per_token_advantages(tiny_model_dir):
    # correction.method "none", one minibatch: on-policy, the per-token loss is −A, so the
    # step's loss is minus the token mean of the advantages.
    cfg = small_config(correction={"method": "none"}, rewards=PROCESS)
    groups = _with_steps(fixed_groups(tiny_model_dir, cfg))
    advantages = process_advantages([[(r.step_ends, r.step_scores) for r in g.rollouts] for g in groups])
    tokens = [a for g in advantages for row in g for a in row]
    want = -sum(tokens) / len(tokens)
    (step,) = Trainer(cfg, tiny_model_dir).plan(copy.deepcopy(groups))
    assert step.token_advantages == advantages
    got = Trainer(cfg, tiny_model_dir).train_step(copy.deepcopy(groups))["loss"]
    assert got == pytest.approx(want, abs=1e-5)
    # The same batch under outcome credit: the rewards' advantages, another loss.
    outcome_cfg = small_config(correction={"method": "none"}, rewards={"workers": 1, "mode": "pipelined"})
    outcome = Trainer(outcome_cfg, tiny_model_dir).train_step(copy.deepcopy(groups))["loss"]
    assert abs(outcome - got) > 1e-3
    (outcome_step,) = Trainer(outcome_cfg, tiny_model_dir).plan(copy.deepcopy(groups))
    assert outcome_step.token_advantages is None


def test_process_credits_a_rollout_without_steps_with_its_reward_as_one_step(tiny_model_dir):
    cfg = small_config(correction={"method": "none"}, rewards=PROCESS)
    groups = fixed_groups(tiny_model_dir, cfg)  # no steps: as if generated under outcome credit
    (step,) = Trainer(cfg, tiny_model_dir).plan(copy.deepcopy(groups))
    assert step.token_advantages is not None
    outcome = scaled_advantages([[r.reward for r in g.rollouts] for g in groups])
    for g, rows, adv in zip(groups, step.token_advantages, outcome, strict=True):
        for r, row, a in zip(g.rollouts, rows, adv, strict=True):
            assert torch.allclose(torch.tensor(row), torch.full((len(r.completion_ids),), a), atol=1e-5)


def test_a_group_with_equal_rewards_but_steps_scored_apart_is_not_uniform():
    steps_apart = Group("0-0", "p", "a", [_rollout(2, [1, 2], [0.0, 1.0]), _rollout(2, [1, 2], [1.0, 1.0])])
    assert [r.reward for r in steps_apart.rollouts] == [1.0, 1.0]
    assert not steps_apart.uniform  # process credit has something to teach here
    same = Group("0-1", "p", "a", [_rollout(2, [1, 2], [1.0, 1.0]), _rollout(3, [3], [1.0])])
    assert same.uniform
    outcome = Group("0-2", "p", "a", [_rollout(2, [], []), _rollout(3, [], [])])
    assert outcome.uniform  # rewards 0 and 0, no steps: as before
