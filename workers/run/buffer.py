"""The rollout buffer between inference and the trainer, and its admission gate.

Four buffer modes, the four the peers converged on (`BufferConfig.mode`):

- ``none``: synchronous (TRL's sync GRPOTrainer, ART): one batch of room, nothing
  generated ahead of the trainer (ahead 0): generate → train → sync alternate.
- ``double``: double buffer (verifiers, SLIME): one batch of room, one batch ahead, so
  batch k+1 is generated while the trainer trains on batch k.
- ``bounded``: bounded queue of `capacity` batches (SkyRL, verl, NeMo-RL).
- ``unbounded``: a stream (PipelineRL, Atropos): no capacity limit; only the admission
  gate and version rejection keep inference from running away.

`RolloutBuffer` stores whole groups (GRPO advantages are per group, so a group is
stored, handed out, dropped or requeued whole). A producer blocks in `put` while the
buffer is full (backpressure, counted in `backpressure_s`); a consumer blocks in `get`
until enough fresh groups are there (starvation, counted in `starved_s`). Version
rejection happens at `get`: a group whose oldest token is older than
`current_version - max_staleness` is never trained; with ``on_stale="drop"`` it is
discarded (`dropped_stale`), with ``on_stale="requeue"`` its prompt goes back to the
producers to be generated again with newer weights (`requeued`, `take_requeued`) —
dropping alone biases training against slow, hard prompts. `regenerated` counts the
groups `get` hands to the trainer whose prompt had been handed out by `take_requeued`:
the proof that requeued prompts are not only sent back but trained.

Dynamic sampling (`trainer.dynamic_sampling`, DAPO's): a group whose rewards are all
equal has zero advantage everywhere and teaches nothing, so `put` drops it
(`dropped_uniform`) before it takes a place; it counts as rejected, so the admission
gate lets a producer start a fresh group in its place, and the trainer still gets its B
groups per step. When `max_uniform_run` groups in a row were dropped with no batch taken
between, `get` raises `NoSignalError`: the task gives the policy nothing to learn from, and
the run fails saying so instead of generating forever (verl's max_num_gen_batches).

`AdmissionGate` is AReaL's capacity rule as pure arithmetic, so it can be tested alone.

Whether an async run ever trains on stale data depends, left alone, on how fast the
producers are next to the trainer. `get`'s `hold_until` forces it: the trainer's first
get with `FIRST_BATCH_HOLD_ENV` set waits until the buffer holds that many fresh groups,
all generated at the first version, so the batches after the first train one version
late or more whatever the host's load (tests of staleness and its correction set it).
"""

from __future__ import annotations

import math
import queue
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, get_args

from workers.config.run_config import OnStale
from workers.core.records import Group

if TYPE_CHECKING:
    from workers.config.run_config import BufferConfig, TrainerConfig


# The ids of this many groups received last are kept (`received_ids`): a checkpoint reads
# the inference workers' in-flight rows, then the buffer, and a group put between the two
# reads is told apart by its id (workers/run/ledger.py). Only the groups of the calls in
# flight at that moment can be put then, far fewer than this.
RECEIVED_IDS = 4096

# Tests set this to a number of groups N: the trainer's first get waits until the buffer
# holds N fresh groups (module docstring). `first_batch_hold` checks N can be reached.
FIRST_BATCH_HOLD_ENV = "ROLLWAY_TEST_FIRST_BATCH_HOLDS_FOR_GROUPS"


class NoSignalError(RuntimeError):
    """Dynamic sampling dropped too many uniform groups in a row (module docstring)."""


@dataclass(frozen=True)
class AdmissionGate:
    """AReaL's capacity rule: a producer holding policy version v may start a new group
    only while admitted − rejected < (v + ahead + 1) · B, where B is the batch size in
    groups, `ahead` the batches it may run ahead of the trainer (AReaL's η,
    `max_head_offpolicyness`; 0 = synchronous) and rejected the groups dropped or
    requeued as stale (they free their place)."""

    batch_groups: int
    ahead: int
    # Groups admitted beyond the rule (buffer.overcommit): with episodes of heavy-tailed
    # length the trainer takes the first to end, and the late ones train a step later.
    overcommit: int = 0

    def __post_init__(self) -> None:
        if self.batch_groups < 1:
            raise ValueError(f"AdmissionGate batch_groups must be ≥ 1 (got {self.batch_groups})")
        if self.ahead < 0:
            raise ValueError(f"AdmissionGate ahead must be ≥ 0 (got {self.ahead})")
        if self.overcommit < 0:
            raise ValueError(f"AdmissionGate overcommit must be ≥ 0 (got {self.overcommit})")

    def limit(self, version: int) -> int:
        """Most groups admitted and not rejected a producer at `version` may leave live."""
        return (version + self.ahead + 1) * self.batch_groups + self.overcommit

    def may_admit(self, version: int, admitted: int, rejected: int, want: int) -> int:
        """How many of `want` new groups (0..want) a producer holding `version` may start."""
        return max(0, min(want, self.limit(version) - (admitted - rejected)))


def first_batch_hold(plan: BufferPlan, batch_groups: int, value: str | None) -> int:
    """The groups the trainer's first get waits for under FIRST_BATCH_HOLD_ENV (`value`,
    the variable's text; None or empty: 0, no hold). ValueError naming the variable where
    the buffer could never hold that many before a first step: more than its capacity, or
    than the admission gate lets producers start at the first version."""
    if not value:
        return 0
    try:
        n = int(value)
    except ValueError:
        raise ValueError(f"{FIRST_BATCH_HOLD_ENV} must be a number of groups (got {value!r})") from None
    reachable = AdmissionGate(batch_groups, plan.ahead_batches, plan.overcommit_groups).limit(0)
    if plan.capacity_groups is not None:
        reachable = min(reachable, plan.capacity_groups)
    if not 0 <= n <= reachable:
        raise ValueError(
            f"{FIRST_BATCH_HOLD_ENV}={n}: the buffer can hold at most {reachable} groups before the first "
            "step (its capacity and the admission gate's limit at version 0); set at most that"
        )
    return n


def groups_per_call(batch_groups: int, num_workers: int) -> int:
    """The groups an inference worker asks the gate for in one generate call: the batch
    split evenly between the workers, so a synchronous step keeps every one of them busy
    (and a worker waits for its call's longest completion before it asks again)."""
    return math.ceil(batch_groups / num_workers)


@dataclass(frozen=True)
class BufferPlan:
    """What a run's buffer is, derived from its config: capacity (None = unbounded) in
    groups, how many batches producers may run ahead, and the staleness policy."""

    capacity_groups: int | None
    ahead_batches: int
    max_staleness: int
    on_stale: OnStale
    drop_uniform: bool = False
    max_uniform_run: int | None = None  # with drop_uniform: groups dropped in a row before NoSignalError
    overcommit_groups: int = 0  # admitted beyond the gate's rule (buffer.overcommit)


def plan(cfg: BufferConfig, run_mode: str, batch_groups: int, trainer: TrainerConfig | None = None) -> BufferPlan:
    """The buffer a run gets from `cfg` (its `buffer` section), its `mode` ("sync" forces
    ahead 0) and `trainer.batch_groups`; `trainer` (the section) says whether it drops
    uniform groups (`dynamic_sampling`)."""
    if cfg.mode == "none":
        capacity, ahead = 1, 0
    elif cfg.mode == "double":
        capacity, ahead = 1, 1
    elif cfg.mode == "bounded":
        capacity = cfg.capacity
        # By default never admit more than get() could accept (max_staleness) or than
        # there is room for (capacity): admission paces generation instead of dropping.
        ahead = min(cfg.capacity, cfg.max_staleness)
    else:  # unbounded
        capacity, ahead = None, cfg.max_staleness
    if cfg.max_head_offpolicyness is not None:
        ahead = cfg.max_head_offpolicyness
    if run_mode == "sync":
        ahead = 0
    dynamic = trainer is not None and trainer.dynamic_sampling
    return BufferPlan(
        capacity_groups=None if capacity is None else capacity * batch_groups,
        ahead_batches=ahead,
        max_staleness=cfg.max_staleness,
        on_stale=cfg.on_stale,
        drop_uniform=dynamic,
        max_uniform_run=trainer.dynamic_sampling_max_batches * batch_groups if trainer and dynamic else None,
        overcommit_groups=cfg.overcommit,
    )


class RolloutBuffer:
    """FIFO of whole groups with backpressure and staleness-based rejection.

    `capacity_groups=None` makes it unbounded (a stream): `put` never blocks.
    """

    def __init__(
        self,
        capacity_groups: int | None,
        max_staleness: int,
        on_stale: OnStale = "drop",
        drop_uniform: bool = False,
        max_uniform_run: int | None = None,
    ) -> None:
        if capacity_groups is not None and capacity_groups < 1:
            raise ValueError(f"RolloutBuffer capacity_groups must be ≥ 1 or None for unbounded (got {capacity_groups})")
        if max_staleness < 0:
            raise ValueError(f"RolloutBuffer max_staleness must be ≥ 0 (got {max_staleness})")
        if on_stale not in get_args(OnStale):
            choices = " or ".join(repr(c) for c in get_args(OnStale))
            raise ValueError(f"RolloutBuffer on_stale must be {choices} (got {on_stale!r})")
        if max_uniform_run is not None and max_uniform_run < 1:
            raise ValueError(f"RolloutBuffer max_uniform_run must be ≥ 1 or None (got {max_uniform_run})")
        self._capacity = capacity_groups
        self.max_staleness = max_staleness
        self.on_stale = on_stale
        self.drop_uniform = drop_uniform
        self.max_uniform_run = max_uniform_run
        self._dropped_uniform = 0
        self._uniform_run = 0  # uniform groups dropped since a batch was last taken
        self._groups: deque[Group] = deque()
        self._requeue: deque[Group] = deque()
        self._cond = threading.Condition()
        self._dropped_stale = 0
        self._requeued = 0
        # (prompt, answer) → times handed out by take_requeued and not yet trained: a
        # multiset, since a prompt can be requeued again before its regeneration trains.
        self._regenerating: Counter[tuple[str, str]] = Counter()
        self._regenerated = 0
        self._late = 0
        self.total_put = 0
        self.total_got = 0
        self._received_ids: deque[str] = deque(maxlen=RECEIVED_IDS)
        self.backpressure_s = 0.0  # cumulative seconds producers spent blocked (buffer full)
        self.starved_s = 0.0  # cumulative seconds consumers spent waiting for fresh groups
        self._blocked_puts = 0  # producers waiting in `put` for room now
        self._blocked_gets = 0  # consumers waiting in `get` for groups now

    @property
    def depth(self) -> int:
        with self._cond:
            return len(self._groups)

    @property
    def blocked_puts(self) -> int:
        """Producers waiting in `put` for room now: what a test waits on to free room only
        once a producer is blocked, rather than hoping a thread got there in time."""
        with self._cond:
            return self._blocked_puts

    @property
    def blocked_gets(self) -> int:
        """Consumers waiting in `get` for groups now (as `blocked_puts`, for a test)."""
        with self._cond:
            return self._blocked_gets

    @property
    def capacity(self) -> int | None:
        """Capacity in groups; None when unbounded."""
        return self._capacity

    @property
    def dropped_stale(self) -> int:
        with self._cond:
            return self._dropped_stale

    @property
    def requeued(self) -> int:
        """Stale groups whose prompts were handed back for regeneration (cumulative)."""
        with self._cond:
            return self._requeued

    @property
    def regenerated(self) -> int:
        """Groups handed to the trainer whose prompt had come back through
        `take_requeued` (cumulative): requeued prompts that were generated again and
        trained. Matched by (prompt, answer), so a fresh sample of the same prompt while
        a regeneration is pending counts in its place (rare, and the count is the same)."""
        with self._cond:
            return self._regenerated

    @property
    def late(self) -> int:
        """Groups handed to the trainer at least one version after the oldest of their
        tokens (cumulative): trained a step or more after the batch they were made for."""
        with self._cond:
            return self._late

    @property
    def dropped_uniform(self) -> int:
        """Groups dropped because their rewards were all equal (dynamic sampling, cumulative)."""
        with self._cond:
            return self._dropped_uniform

    @property
    def rejected(self) -> int:
        """Groups that left without being trained (dropped stale or uniform, requeued):
        the admission gate gives their places back."""
        with self._cond:
            return self._dropped_stale + self._requeued + self._dropped_uniform

    def stats(self) -> dict[str, float]:
        """The buffer's figures as metric values (workers/core/metric_names.py names)."""
        stats = {
            "buffer/depth": float(self.depth),
            "buffer/dropped_stale": float(self.dropped_stale),
            "buffer/requeued": float(self.requeued),
            "buffer/regenerated": float(self.regenerated),
            "buffer/late_groups": float(self.late),
            "buffer/starved_s": self.starved_s,
        }
        if self.capacity is not None:  # an unbounded stream has none to chart
            stats["buffer/capacity"] = float(self.capacity)
        if self.drop_uniform:
            stats["buffer/dropped_uniform"] = float(self.dropped_uniform)
        return stats

    @property
    def received(self) -> int:
        """Groups put into the buffer and accounted for: handed out by `get`, waiting, or
        rejected. A buffer restored from a checkpoint counts the checkpoint's."""
        with self._cond:
            return self.total_got + len(self._groups) + self._dropped_stale + self._requeued + self._dropped_uniform

    def state_dict(self) -> dict:
        """The groups waiting, the stale groups awaiting regeneration, the ids of the
        groups received last (`RECEIVED_IDS`) and the counters behind the buffer's
        metrics, as JSON data (a checkpoint's buffer.json)."""
        with self._cond:
            return {
                "groups": [g.to_json() for g in self._groups],
                "requeue": [g.to_json() for g in self._requeue],
                "regenerating": [[p, a, n] for (p, a), n in self._regenerating.items()],
                "dropped_stale": self._dropped_stale,
                "requeued": self._requeued,
                "regenerated": self._regenerated,
                "dropped_uniform": self._dropped_uniform,
                "uniform_run": self._uniform_run,
                "late": self._late,
                "total_put": self.total_put,
                "total_got": self.total_got,
                "received_ids": list(self._received_ids),
                "backpressure_s": self.backpressure_s,
                "starved_s": self.starved_s,
            }

    def load_state_dict(self, state: dict) -> None:
        """Take a `state_dict`'s groups and counters in place of this buffer's."""
        with self._cond:
            self._groups = deque(Group.from_json(g) for g in state["groups"])
            self._requeue = deque(Group.from_json(g) for g in state["requeue"])
            self._regenerating = Counter({(p, a): int(n) for p, a, n in state["regenerating"]})
            self._dropped_stale = int(state["dropped_stale"])
            self._requeued = int(state["requeued"])
            self._regenerated = int(state["regenerated"])
            # Checkpoints written before dynamic sampling existed hold neither.
            self._dropped_uniform = int(state.get("dropped_uniform", 0))
            self._uniform_run = int(state.get("uniform_run", 0))
            self._late = int(state.get("late", 0))  # nor one written before late groups were counted
            self.total_put = int(state["total_put"])
            self.total_got = int(state["total_got"])
            self._received_ids = deque(state.get("received_ids", []), maxlen=RECEIVED_IDS)
            self.backpressure_s = float(state["backpressure_s"])
            self.starved_s = float(state["starved_s"])
            self._cond.notify_all()

    def group_ids(self) -> list[str]:
        """Ids of the groups waiting, oldest first (a snapshot, for checks and tests)."""
        with self._cond:
            return [g.group_id for g in self._groups]

    def _has_room(self) -> bool:
        return self._capacity is None or len(self._groups) < self._capacity

    def put(self, group: Group, timeout: float | None = None) -> float:
        """Append `group`, blocking while the buffer is full; returns seconds blocked.
        With `drop_uniform`, a group whose rewards are all equal is dropped instead
        (never blocks).

        Raises queue.Full if still full after `timeout` seconds.
        """
        start = time.monotonic()
        with self._cond:
            if self.drop_uniform and group.uniform:
                self._dropped_uniform += 1
                self._uniform_run += 1
                self.total_put += 1
                self._received_ids.append(group.group_id)
                self._cond.notify_all()
                return 0.0
            self._blocked_puts += 1
            try:
                room = self._cond.wait_for(self._has_room, timeout)
            finally:
                self._blocked_puts -= 1
            if not room:
                self.backpressure_s += time.monotonic() - start
                raise queue.Full(f"rollout buffer full ({self._capacity} groups) for {timeout}s")
            blocked = time.monotonic() - start
            self.backpressure_s += blocked
            self._groups.append(group)
            self.total_put += 1
            self._received_ids.append(group.group_id)
            self._cond.notify_all()
            return blocked

    def offer(self, groups: list[Group]) -> int:
        """Put `groups` in order while there is room, without blocking; returns how many
        were taken (uniform ones dropped under `drop_uniform` count as taken). One lock
        for the lot: a producer with many groups, or the simulator, pays it once."""
        with self._cond:
            taken = 0
            for group in groups:
                if self.drop_uniform and group.uniform:
                    self._dropped_uniform += 1
                    self._uniform_run += 1
                elif self._has_room():
                    self._groups.append(group)
                else:
                    break
                self._received_ids.append(group.group_id)
                taken += 1
            self.total_put += taken
            if taken:
                self._cond.notify_all()
            return taken

    def get(
        self,
        n_groups: int,
        current_version: int,
        timeout: float | None = None,
        hold_until: int = 0,
        ids: list[str] | None = None,
    ) -> list[Group]:
        """Take the `n_groups` oldest fresh groups, waiting until that many are present
        (and `hold_until` fresh groups in all: the module docstring's hook). `ids`: take
        exactly these groups, in this order, waiting until all are present (a replayed
        batch, workers/run/schedule.py); ValueError if one was rejected meanwhile.

        Stale groups (min_version < current_version - max_staleness) are rejected first
        (dropped or requeued, by `on_stale`). Raises queue.Empty if `n_groups` fresh
        groups are not available within `timeout` seconds (nothing fresh is taken then).
        """
        if n_groups < 1 or (self._capacity is not None and n_groups > self._capacity):
            raise ValueError(f"get n_groups must be in 1..capacity ({self._capacity}); got {n_groups}")
        if self._capacity is not None and hold_until > self._capacity:
            raise ValueError(f"get hold_until must be at most capacity ({self._capacity}); got {hold_until}")
        oldest_ok = current_version - self.max_staleness
        wanted = max(n_groups, hold_until)

        def ready() -> bool:
            self._reject_stale(oldest_ok)
            if ids is not None:
                return self._all_present(ids)
            if len(self._groups) >= wanted:
                return True
            if self.max_uniform_run is not None and self._uniform_run >= self.max_uniform_run:
                raise NoSignalError(
                    f"dynamic sampling dropped {self._uniform_run} groups in a row whose rewards were all equal, "
                    "with no batch trained between (trainer.dynamic_sampling_max_batches × trainer.batch_groups): "
                    "this task gives the policy no signal. Make it easier (or its reward give partial credit), "
                    "raise trainer.group_size, raise trainer.dynamic_sampling_max_batches, or turn "
                    "trainer.dynamic_sampling off"
                )
            return False

        start = time.monotonic()
        with self._cond:
            self._blocked_gets += 1
            try:
                ok = self._cond.wait_for(ready, timeout)
            finally:
                self._blocked_gets -= 1
            self.starved_s += time.monotonic() - start
            if not ok:
                raise queue.Empty(f"fewer than {n_groups} fresh groups after {timeout}s")
            out = self._take(ids) if ids is not None else [self._groups.popleft() for _ in range(n_groups)]
            self.total_got += n_groups
            self._late += sum(g.min_version < current_version for g in out)
            self._uniform_run = 0
            if self._regenerating:
                for g in out:
                    self._regenerated += self._settle_regeneration(g)
            self._cond.notify_all()
            return out

    def _all_present(self, ids: list[str]) -> bool:
        """Whether every group of `ids` is in the buffer; ValueError naming one that was
        received and is gone (rejected: only the get that wants it takes it)."""
        present = {g.group_id for g in self._groups}
        gone = [i for i in ids if i not in present and i in self._received_ids]
        if gone:
            raise ValueError(f"group {gone[0]} was rejected (stale or uniform) before its batch took it")
        return all(i in present for i in ids)

    def _take(self, ids: list[str]) -> list[Group]:
        """The groups of `ids` out of the buffer, in that order; the others keep theirs."""
        self._groups, out = taken_by_id(self._groups, ids)
        return out

    def take_requeued(self, max_groups: int) -> list[Group]:
        """Up to `max_groups` stale groups (oldest first) whose prompts a producer should
        generate again; each is handed out once."""
        with self._cond:
            out = [self._requeue.popleft() for _ in range(min(max_groups, len(self._requeue)))]
            self._regenerating.update((g.prompt, g.answer) for g in out)
            return out

    def take_requeued_ids(self, ids: list[str], timeout: float | None = None) -> list[Group]:
        """The groups `ids`, in that order, as take_requeued hands groups out: a replayed
        call's requeued prompts (workers/run/schedule.py). Each is taken from the stale
        groups awaiting regeneration, or, still in the buffer, requeued now: the record
        says it was requeued, and no replayed batch takes it, so only when it leaves
        changes, not what is trained. Waits until every one has been put; raises
        queue.Empty if one has not within `timeout` seconds."""

        def ready() -> bool:
            queued = {g.group_id for g in self._requeue}
            waiting = {g.group_id: g for g in self._groups if g.group_id not in queued}
            if not all(i in queued or i in waiting for i in ids):
                return False
            early = [i for i in ids if i not in queued]
            if early:
                self._groups, stale = taken_by_id(self._groups, early)
                for g in stale:
                    self._send_back(g)
                self._requeued += len(stale)
            return True

        with self._cond:
            if not self._cond.wait_for(ready, timeout):
                raise queue.Empty(f"requeued groups {ids} not all put within {timeout}s")
            self._requeue, out = taken_by_id(self._requeue, ids)
            self._regenerating.update((g.prompt, g.answer) for g in out)
            self._cond.notify_all()
            return out

    def _send_back(self, group: Group) -> None:
        """Put stale `group` among those awaiting regeneration (caller holds the lock and
        counts it). A regeneration that went stale again is no longer pending: it is
        pending again once take_requeued hands it out again."""
        self._settle_regeneration(group)
        self._requeue.append(group)

    def _settle_regeneration(self, group: Group) -> int:
        """1 if `group` is a pending regeneration (and no longer pending), else 0.
        Caller holds the lock."""
        key = (group.prompt, group.answer)
        if not self._regenerating[key]:
            return 0
        self._regenerating[key] -= 1
        if not self._regenerating[key]:
            del self._regenerating[key]
        return 1

    def _reject_stale(self, oldest_ok: int) -> None:
        # Caller holds the lock.
        kept: deque[Group] = deque()
        rejected = 0
        for g in self._groups:
            if g.min_version >= oldest_ok:
                kept.append(g)
                continue
            rejected += 1
            if self.on_stale == "requeue":
                self._send_back(g)
        if rejected:
            if self.on_stale == "requeue":
                self._requeued += rejected
            else:
                self._dropped_stale += rejected
            self._groups = kept
            self._cond.notify_all()


def taken_by_id(groups: deque[Group], ids: list[str]) -> tuple[deque[Group], list[Group]]:
    """(`groups` less those of `ids`, in their order; those of `ids`, in the order of `ids`)."""
    wanted = set(ids)
    by_id = {g.group_id: g for g in groups if g.group_id in wanted}
    return deque(g for g in groups if g.group_id not in wanted), [by_id[i] for i in ids]


def with_prefetched(state: dict, prefetched: list[Group]) -> dict:
    """`state` (a RolloutBuffer's `state_dict`) with `prefetched`, groups the trainer took
    for its next step and has not trained, back at the buffer's head."""
    return {
        **state,
        "groups": [g.to_json() for g in prefetched] + state["groups"],
        "total_got": state["total_got"] - len(prefetched),
    }
