"""How one training step's batch is laid out: minibatches of whole groups, each dealt
across the trainer's ranks, each rank's share run in micro-batches.

The step's groups are shuffled (the trainer's seeded RNG) and minibatch k takes every
`trainer.minibatches`-th of them from the k-th: each minibatch is one optimizer update.
A minibatch's groups are dealt to the ranks whole (a group's advantages are computed
within it), the group with the most trained tokens first, each to the rank with the
fewest so far. A rank runs its rows in micro-batches of at most
`trainer.micro_batch_rows` rows, and every rank runs the same number of them: a forward
and a backward are collectives for a sharded model (and the last backward of a
minibatch is one for every pool backend), so a rank with fewer rows runs empty ones.

The loss of a minibatch aggregates over all its trained tokens, on every rank: a token
mean by default, `trained_tokens` counting them, each micro-batch's own token mean
weighted by its share of them (workers/train/trainer.py); a sequence mean (or Dr. GRPO's
constant normaliser) the same way over `trained_rows`, the sequences with a trained
token. With one rank this is the single trainer's step.

Advantages are computed once, over the whole batch, before the plan (a batch-wide std
needs every group): each rank gets its groups' with them, and with process credit
(rewards.credit "process") each rollout's per-token advantages too.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from workers.core.records import Group


@dataclass
class RankStep:
    """One rank's part of a step."""

    groups: list[Group]  # this rank's groups, in the batch's order
    advantages: list[list[float]]  # per group of `groups`: each rollout's advantage
    minibatches: list[list[int]]  # per minibatch: indices into `groups`, in the shuffled order
    trained_tokens: list[int]  # per minibatch: trained tokens on all ranks
    trained_rows: list[int]  # per minibatch: sequences with a trained token, on all ranks
    micro_batches: list[int]  # per minibatch: forward+backward passes each rank runs
    old_micro_batches: int  # pi_old forwards each rank runs (for minibatches after the first)
    # Process credit: per group of `groups`, per rollout, one advantage per completion
    # token (these are what the loss takes then); None: `advantages`, one per rollout.
    token_advantages: list[list[list[float]]] | None = None


def trained_tokens(group: Group) -> int:
    return sum(sum(r.trained) for r in group.rollouts)


def trained_rows(group: Group) -> int:
    return sum(any(r.trained) for r in group.rollouts)


def _passes(rows: list[int], micro_batch_rows: int | None) -> int:
    """Passes every rank runs so the one with the most rows needs no more (≥ 1)."""
    if micro_batch_rows is None:
        return 1
    return max(1, max(math.ceil(n / micro_batch_rows) for n in rows))


def plan_step(
    groups: list[Group],
    advantages: list[list[float]],
    rng: random.Random,
    minibatches: int,
    num_ranks: int,
    micro_batch_rows: int | None,
    token_advantages: list[list[list[float]]] | None = None,
) -> list[RankStep]:
    """Each rank's part of a step on `groups` (module docstring), `advantages` one list
    per group; `rng` shuffles the minibatches' membership (one shuffle per step, as the
    single trainer always has)."""
    if not groups:
        raise ValueError("a step needs at least one group")
    if [len(a) for a in advantages] != [len(g.rollouts) for g in groups]:
        raise ValueError("advantages need one list per group, one value per rollout")
    if token_advantages is not None and [[len(a) for a in g] for g in token_advantages] != [
        [len(r.completion_ids) for r in g.rollouts] for g in groups
    ]:
        raise ValueError("token_advantages need one list per group, per rollout one value per completion token")
    order = list(range(len(groups)))
    rng.shuffle(order)
    n_mb = min(minibatches, len(groups))
    tokens = [trained_tokens(g) for g in groups]
    # per minibatch, per rank: batch indices of its groups, in the shuffled order
    dealt: list[list[list[int]]] = []
    for k in range(n_mb):
        members = order[k::n_mb]
        load = [0] * num_ranks
        owner: dict[int, int] = {}
        for gi in sorted(members, key=lambda g: -tokens[g]):  # stable: ties keep the shuffled order
            r = min(range(num_ranks), key=lambda r: (load[r], r))
            owner[gi] = r
            load[r] += tokens[gi]
        dealt.append([[gi for gi in members if owner[gi] == r] for r in range(num_ranks)])
    rows = [[sum(len(groups[gi].rollouts) for gi in dealt[k][r]) for r in range(num_ranks)] for k in range(n_mb)]
    micro = [_passes(rows[k], micro_batch_rows) for k in range(n_mb)]
    old = _passes([sum(rows[k][r] for k in range(1, n_mb)) for r in range(num_ranks)], micro_batch_rows)
    old = old if n_mb > 1 else 0
    totals = [sum(tokens[gi] for gi in order[k::n_mb]) for k in range(n_mb)]
    seqs = [sum(trained_rows(groups[gi]) for gi in order[k::n_mb]) for k in range(n_mb)]
    steps = []
    for r in range(num_ranks):
        mine = sorted(gi for k in range(n_mb) for gi in dealt[k][r])
        local = {gi: i for i, gi in enumerate(mine)}
        steps.append(
            RankStep(
                groups=[groups[gi] for gi in mine],
                advantages=[list(advantages[gi]) for gi in mine],
                minibatches=[[local[gi] for gi in dealt[k][r]] for k in range(n_mb)],
                trained_tokens=totals,
                trained_rows=seqs,
                micro_batches=micro,
                old_micro_batches=old,
                token_advantages=[token_advantages[gi] for gi in mine] if token_advantages is not None else None,
            )
        )
    return steps
