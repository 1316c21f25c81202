"""The trainer pool: a step split across ranks equals the single trainer's step.

The plan (workers/train/step_plan.py) is checked on its own; the equivalence runs the real
Trainer in two Ray processes joined by the real pool (gloo on this CPU host), for ddp and
fsdp2, full fine-tuning and LoRA, against one Trainer in this process on the same batch.
"""

from __future__ import annotations

import copy
import dataclasses
import random

import pytest
import ray
import torch

from tests.engine.helpers import PoolRank, build_pool, fixed_groups, small_config
from workers.core.records import Group, Rollout
from workers.train.step_plan import plan_step, trained_tokens
from workers.train.trainer import Trainer

CPU = torch.device("cpu")


def _group(i: int, rows: int, tokens: int) -> Group:
    rollout = Rollout([1, 2], [5] * tokens, [-1.0] * tokens, [0] * tokens, "stop")
    return Group(f"g{i}", f"p{i}", "a", [copy.deepcopy(rollout) for _ in range(rows)])


def no_advantages(groups: list[Group]) -> list[list[float]]:
    return [[0.0] * len(g.rollouts) for g in groups]


def test_one_rank_gets_the_whole_batch_in_the_single_trainers_order():
    groups = [_group(i, 2, 3 + i) for i in range(6)]
    (step,) = plan_step(
        groups, no_advantages(groups), random.Random(7), minibatches=2, num_ranks=1, micro_batch_rows=None
    )
    order = list(range(6))
    random.Random(7).shuffle(order)
    assert step.groups == groups
    assert step.minibatches == [order[0::2], order[1::2]]
    assert step.micro_batches == [1, 1] and step.old_micro_batches == 1
    assert step.trained_tokens == [sum(trained_tokens(groups[i]) for i in order[k::2]) for k in range(2)]


def test_ranks_get_whole_groups_balanced_by_tokens_and_run_as_many_passes_as_each_other():
    sizes = [9, 1, 1, 1, 8, 2]  # tokens per completion
    groups = [_group(i, 2, n) for i, n in enumerate(sizes)]
    steps = plan_step(groups, no_advantages(groups), random.Random(0), minibatches=1, num_ranks=2, micro_batch_rows=1)
    owned = [[g.group_id for g in s.groups] for s in steps]
    assert sorted(owned[0] + owned[1]) == sorted(g.group_id for g in groups)  # each group once, whole
    loads = [sum(trained_tokens(g) for g in s.groups) for s in steps]
    assert abs(loads[0] - loads[1]) <= 2 * 2  # the LPT deal: within one smallest group
    rows = [sum(len(g.rollouts) for g in s.groups) for s in steps]
    assert steps[0].micro_batches == steps[1].micro_batches == [max(rows)]
    assert steps[0].trained_tokens == steps[1].trained_tokens == [sum(trained_tokens(g) for g in groups)]


def test_a_rank_with_no_group_in_a_minibatch_still_runs_its_passes():
    groups = [_group(i, 2, 4) for i in range(3)]
    steps = plan_step(
        groups, no_advantages(groups), random.Random(1), minibatches=2, num_ranks=2, micro_batch_rows=None
    )
    # minibatch 1 has a single group: one rank holds none of it and runs an empty pass
    assert sorted(len(s.minibatches[1]) for s in steps) == [0, 1]
    assert all(s.micro_batches == [1, 1] and s.old_micro_batches == 1 for s in steps)


@ray.remote(num_cpus=0)
class Rank(PoolRank):
    """A pool rank (tests/engine/helpers.py) whose training state a test takes and restores."""

    def training_state(self):
        from workers.run.checkpoints import training_state

        return training_state(self.trainer)

    def restore(self, state) -> None:
        from workers.run.checkpoints import restore_training_state

        restore_training_state(self.trainer, state)


@pytest.fixture(scope="module")
def ranks(cluster):
    actors = [Rank.remote(0), Rank.remote(1)]
    yield actors
    for a in actors:
        ray.kill(a)


@pytest.mark.parametrize("backend", ["ddp", "fsdp2"])
@pytest.mark.parametrize("lora", [False, True])
@pytest.mark.parametrize("n_groups", [4, 3])  # 3: one rank holds no group of the second minibatch
def test_a_two_rank_step_equals_the_single_trainers_step(ranks, tiny_model_dir, backend, lora, n_groups):
    trainer = {"minibatches": 2, "micro_batch_rows": 3, "entropy_coef": 0.01}
    _check_pool_equals_single(ranks, tiny_model_dir, backend, lora, n_groups, trainer)


# The algorithm knobs away from their defaults: a pool rank must aggregate with the
# minibatch's sequence count over all ranks, scale advantages by the whole batch's std,
# and (fsdp2 + LoRA) run the reference's forward as a collective in its empty passes.
KNOBS = {
    "loss_aggregation": "sequence_mean",
    "advantage_scaling": "batch_std",
    "kl_coef": 0.1,
    "clip_eps": 0.001,  # small, so the second minibatch's ratios reach the clip
    "clip_eps_high": 0.002,
    "mask_truncated": True,
    "lr": 0.01,
}


@pytest.mark.parametrize("backend", ["ddp", "fsdp2"])
@pytest.mark.parametrize("lora", [False, True])
def test_a_two_rank_step_equals_the_single_trainers_step_with_the_algorithm_knobs(ranks, tiny_model_dir, backend, lora):
    trainer = {"minibatches": 2, "micro_batch_rows": 3, **KNOBS}
    got = _check_pool_equals_single(
        ranks, tiny_model_dir, backend, lora, 3, trainer, extra=("loss/kl_ref", "ppo/clipped_frac")
    )
    assert got["loss/kl_ref"] > 0 and got["ppo/clipped_frac"] > 0, "the knobs must be at work in this step"


# Process credit: the pipelined reward stage's config (the trainer reads only `credit`).
PROCESS = {"workers": 1, "mode": "pipelined", "credit": "process"}


def with_steps(groups: list[Group], seed: int = 0) -> list[Group]:
    """`groups` with each completion cut into up to three steps, each with its own score,
    as the pipelined reward stage leaves them."""
    rng = random.Random(seed)
    out = []
    for g in groups:
        rollouts = []
        for r in g.rollouts:
            n = len(r.completion_ids)
            ends = sorted({*rng.sample(range(1, n), min(2, n - 1)), n}) if n > 1 else [n]
            rollouts.append(dataclasses.replace(r, step_ends=ends, step_scores=[rng.random() for _ in ends]))
        out.append(dataclasses.replace(g, rollouts=rollouts))
    return out


@pytest.mark.parametrize("backend", ["ddp", "fsdp2"])
def test_a_two_rank_step_equals_the_single_trainers_step_with_process_credit(ranks, tiny_model_dir, backend):
    trainer = {"minibatches": 2, "micro_batch_rows": 3}
    _check_pool_equals_single(ranks, tiny_model_dir, backend, False, 3, trainer, rewards=PROCESS, prepare=with_steps)


def _check_pool_equals_single(
    ranks, tiny_model_dir, backend, lora, n_groups, trainer, extra=(), rewards=None, prepare=None
) -> dict:
    """One step of a 2-rank pool against one step of a single trainer on the same batch:
    the same figures and the same weights after. Returns the pool's metrics."""
    more = {"rewards": rewards} if rewards else {}
    single_cfg = small_config(trainer=trainer, lora={"enabled": lora, "rank": 2}, **more)
    pool_cfg = small_config(
        trainer={**trainer, "backend": backend, "num_ranks": 2}, lora=single_cfg.lora.model_dump(), **more
    )
    groups = fixed_groups(tiny_model_dir, single_cfg)[:n_groups]
    if prepare is not None:
        groups = prepare(groups)

    single = Trainer(single_cfg, tiny_model_dir, device=CPU)
    start = single.state_dict()
    want = single.train_step(copy.deepcopy(groups))
    want_weights = single.state_dict()

    build_pool(ranks, pool_cfg, tiny_model_dir)
    got = ray.get(ranks[0].step.remote(copy.deepcopy(groups), ranks[1:]))
    got_weights, _ = ray.get([r.weights.remote() for r in ranks])  # a gather every rank joins

    for key in (
        "loss",
        "trainer/grad_norm",
        "is/ratio_mean",
        "is/clipped_frac",
        "mismatch/kl",
        "policy/entropy",
        *extra,
    ):
        assert got[key] == pytest.approx(want[key], rel=1e-4, abs=1e-6), key
    assert got["policy/version"] == want["policy/version"] == 1.0
    changed = [k for k in want_weights if not torch.equal(want_weights[k], start[k])]
    assert changed, "the step changed no weight: the comparison would prove nothing"
    assert sorted(got_weights) == sorted(want_weights)
    for k in want_weights:
        torch.testing.assert_close(got_weights[k], want_weights[k], rtol=1e-4, atol=1e-6, msg=k)
    worst = max((got_weights[k] - want_weights[k]).abs().max().item() for k in want_weights)
    print(
        f"\n{backend} lora={lora} groups={n_groups}: loss {got['loss']:.6g} vs {want['loss']:.6g}, grad norm "
        f"{got['trainer/grad_norm']:.6g} vs {want['trainer/grad_norm']:.6g}, max |weight diff| {worst:.2e}"
    )
    # each rank's part is reported: both computed, both communicated
    for r in range(2):
        assert got[f"trainer/rank_compute_s/{r}"] > 0
        assert got[f"trainer/rank_comm_s/{r}"] > 0 and got[f"trainer/rank_comm_bytes/{r}"] > 0
    return got


@pytest.mark.parametrize("backend", ["ddp", "fsdp2"])
def test_a_pools_training_state_is_the_single_trainers_format_both_ways(ranks, tiny_model_dir, backend):
    """A pool's checkpointed state (gathered on rank 0) resumes a single trainer, and a
    single trainer's resumes a pool (broadcast from rank 0): the next step is the same."""
    trainer = {"minibatches": 2, "micro_batch_rows": 3}
    single_cfg = small_config(trainer=trainer)
    pool_cfg = small_config(trainer={**trainer, "backend": backend, "num_ranks": 2})
    first, second = fixed_groups(tiny_model_dir, single_cfg, seed=1), fixed_groups(tiny_model_dir, single_cfg, seed=2)

    build_pool(ranks, pool_cfg, tiny_model_dir)
    ray.get(ranks[0].step.remote(copy.deepcopy(first), ranks[1:]))
    state, empty = ray.get([r.training_state.remote() for r in ranks])  # a gather every rank joins
    assert empty == ({}, {}) and state[1]["state"], "rank 0 alone holds the state, with AdamW's moments"

    single = Trainer(single_cfg, tiny_model_dir, device=CPU)
    from workers.run.checkpoints import restore_training_state

    # A copy: torch's optimizer keeps the loaded step counters and increments them in place.
    restore_training_state(single, copy.deepcopy(state))
    single.train_step(copy.deepcopy(second))
    after_single = single.state_dict()

    # And back: a fresh pool takes the state the single trainer started its step from.
    build_pool(ranks, pool_cfg, tiny_model_dir)
    ray.get([ranks[0].restore.remote(state), ranks[1].restore.remote(None)])
    ray.get(ranks[0].step.remote(copy.deepcopy(second), ranks[1:]))
    after_pool, _ = ray.get([r.weights.remote() for r in ranks])
    for k in after_single:
        torch.testing.assert_close(after_pool[k], after_single[k], rtol=1e-4, atol=1e-6, msg=k)
