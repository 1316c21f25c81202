"""Property tests of the rollout buffer and the admission gate over random schedules.

A schedule interleaves, on one thread (every blocking call with timeout 0, so the
schedule decides who runs): admissions by producers holding (possibly old) weights,
produce calls that put the admitted groups (tokens from the admission version up to the
producer's current one: an in-flight update), consume calls (the trainer takes B groups
at its version and steps), weight syncs to producers and requeue pick-ups. After every
action the invariants are checked, for every buffer mode and both on_stale actions:

- no sample lost or trained twice: every admitted prompt is in exactly one place
  (in flight, in the buffer, trained, dropped, waiting for regeneration);
- no group split: every trained group is whole;
- every trained group's oldest token is within max_staleness of the trainer version;
- the buffer never holds more than its capacity;
- the capacity rule: admitted − rejected ≤ (v + ahead + 1) · B after every admission.
"""

from __future__ import annotations

import queue

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workers.config.run_config import BufferConfig
from workers.core.records import Group, Rollout
from workers.run.buffer import AdmissionGate, RolloutBuffer, plan

GROUP_SIZE = 3
MODES = ("none", "double", "bounded", "unbounded")


def make_group(prompt: str, versions: list[int]) -> Group:
    # One rollout per version in the span: tokens of several policy versions (in-flight).
    rollouts = [
        Rollout(
            prompt_ids=[1],
            completion_ids=[3],
            behaviour_logprobs=[-1.0],
            token_versions=[versions[i % len(versions)]],
            finish_reason="stop",
            group_id=prompt,
        )
        for i in range(GROUP_SIZE)
    ]
    return Group(group_id=prompt, prompt=prompt, answer="a", rollouts=rollouts)


class Simulation:
    """One trainer, several producers, one buffer and gate, and the ledger of every prompt."""

    def __init__(self, cfg: BufferConfig, batch_groups: int, producers: int) -> None:
        self.b = batch_groups
        self.plan = plan(cfg, "async", batch_groups)
        self.buf = RolloutBuffer(self.plan.capacity_groups, self.plan.max_staleness, self.plan.on_stale)
        self.gate = AdmissionGate(batch_groups, self.plan.ahead_batches)
        self.version = 0
        self.held = [0] * producers  # weights version each producer holds
        self.in_flight: list[list[tuple[str, int]]] = [[] for _ in range(producers)]
        self.admitted = 0
        self.trained: list[str] = []
        self.regenerating: list[str] = []  # requeued prompts taken back, not yet re-admitted
        self.prompts: set[str] = set()
        self.next_id = 0

    # -- actions ---------------------------------------------------------------
    def admit(self, p: int, want: int) -> None:
        n = self.gate.may_admit(self.held[p], self.admitted, self.buf.rejected, want)
        assert 0 <= n <= want
        self.admitted += n
        # Capacity rule: an admission never leaves more live groups (admitted − rejected)
        # than (v + ahead + 1) · B for the admitting producer's v. (A producer with older
        # weights may find it already over, from a newer producer's admissions: it gets 0.)
        live = self.admitted - (self.buf.dropped_stale + self.buf.requeued)
        if n:
            assert live <= (self.held[p] + self.plan.ahead_batches + 1) * self.b
        for _ in range(n):
            if self.regenerating:  # a requeued prompt is generated again first
                prompt = self.regenerating.pop(0)
            else:
                prompt = f"p{self.next_id}"
                self.next_id += 1
                self.prompts.add(prompt)
            self.in_flight[p].append((prompt, self.held[p]))

    def produce(self, p: int, k: int) -> None:
        for _ in range(min(k, len(self.in_flight[p]))):
            prompt, started = self.in_flight[p][0]
            group = make_group(prompt, list(range(started, self.held[p] + 1)))
            try:
                self.buf.put(group, timeout=0)
            except queue.Full:
                return  # backpressure: the producer keeps it and retries later
            self.in_flight[p].pop(0)

    def consume(self) -> None:
        try:
            groups = self.buf.get(self.b, self.version, timeout=0)
        except queue.Empty:
            return
        assert len(groups) == self.b
        for g in groups:
            assert len(g.rollouts) == GROUP_SIZE  # whole
            assert {r.group_id for r in g.rollouts} == {g.group_id}  # not mixed
            assert self.version - g.min_version <= self.plan.max_staleness
            self.trained.append(g.group_id)
        self.version += 1

    def sync(self, p: int) -> None:
        self.held[p] = self.version

    def take_requeued(self, k: int) -> None:
        self.regenerating += [g.group_id for g in self.buf.take_requeued(k)]

    # -- invariants -------------------------------------------------------------
    def check(self) -> None:
        # The capacity rule, globally: never more live than the newest weights allow.
        live = self.admitted - (self.buf.dropped_stale + self.buf.requeued)
        assert live <= (max(self.held) + self.plan.ahead_batches + 1) * self.b
        cap = self.buf.capacity
        assert cap is None or self.buf.depth <= cap
        in_buffer = self.buf.group_ids()
        in_flight = [p for fl in self.in_flight for p, _ in fl]
        pending = [g.group_id for g in self.buf._requeue]
        places = self.trained + in_buffer + in_flight + self.regenerating + pending
        assert len(places) == len(set(places)), "a prompt is in two places (or trained twice)"
        # Everything not somewhere visible was dropped, and exactly that many were counted.
        assert set(places) <= self.prompts
        assert len(self.prompts) - len(places) == self.buf.dropped_stale
        if self.plan.on_stale == "requeue":
            assert self.buf.dropped_stale == 0
        else:
            assert self.buf.requeued == 0 and not pending
        assert self.buf.total_got == len(self.trained)


action = st.one_of(
    st.tuples(st.just("admit"), st.integers(0, 2), st.integers(1, 4)),
    st.tuples(st.just("produce"), st.integers(0, 2), st.integers(1, 4)),
    st.tuples(st.just("consume"), st.just(0), st.just(0)),
    st.tuples(st.just("sync"), st.integers(0, 2), st.just(0)),
    st.tuples(st.just("take_requeued"), st.just(0), st.integers(1, 3)),
)


def run_schedule(sim: Simulation, schedule: list) -> None:
    for name, p, k in schedule:
        if name in ("admit", "produce"):
            getattr(sim, name)(p, k)
        elif name == "take_requeued":
            sim.take_requeued(k)
        elif name == "sync":
            sim.sync(p)
        else:
            sim.consume()
        sim.check()


SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SCHEDULES = st.lists(action, min_size=30, max_size=120)


@SETTINGS
@given(
    mode=st.sampled_from(MODES),
    on_stale=st.sampled_from(("drop", "requeue")),
    capacity=st.integers(1, 3),
    max_staleness=st.integers(0, 3),
    eta=st.one_of(st.none(), st.integers(0, 4)),
    batch_groups=st.integers(1, 3),
    schedule=SCHEDULES,
)
def test_random_schedules_keep_every_invariant(mode, on_stale, capacity, max_staleness, eta, batch_groups, schedule):
    if mode == "none":
        eta = None
    cfg = BufferConfig(
        mode=mode, on_stale=on_stale, capacity=capacity, max_staleness=max_staleness, max_head_offpolicyness=eta
    )
    run_schedule(Simulation(cfg, batch_groups, producers=3), schedule)


@pytest.mark.parametrize("on_stale", ["drop", "requeue"])
@SETTINGS
@given(
    mode=st.sampled_from(("double", "bounded", "unbounded")),
    max_staleness=st.integers(0, 1),
    extra_head=st.integers(1, 3),
    schedule=SCHEDULES,
)
def test_gating_past_max_staleness_rejects_but_never_trains_stale(on_stale, mode, max_staleness, extra_head, schedule):
    """η > max_staleness admits groups that go stale: they are rejected (dropped or
    requeued, counted), and the invariants still hold."""
    cfg = BufferConfig(
        mode=mode,
        on_stale=on_stale,
        capacity=3,
        max_staleness=max_staleness,
        max_head_offpolicyness=max_staleness + extra_head,
    )
    run_schedule(Simulation(cfg, batch_groups=1, producers=3), schedule)


@settings(max_examples=40, deadline=None)
@given(
    batch_groups=st.integers(1, 5),
    ahead=st.integers(0, 4),
    version=st.integers(0, 20),
    admitted=st.integers(0, 200),
    rejected=st.integers(0, 200),
    want=st.integers(0, 20),
)
def test_the_gate_never_admits_past_the_capacity_rule(batch_groups, ahead, version, admitted, rejected, want):
    rejected = min(rejected, admitted)
    gate = AdmissionGate(batch_groups, ahead)
    n = gate.may_admit(version, admitted, rejected, want)
    limit = (version + ahead + 1) * batch_groups
    assert 0 <= n <= want
    live = admitted - rejected
    if live + n > limit:  # only if already over (an older producer's admissions)
        assert n == 0
    # It admits as many as the rule allows, not fewer.
    assert n == max(0, min(want, limit - live))


@pytest.mark.parametrize("mode", MODES)
def test_a_synchronous_schedule_trains_every_prompt_once_with_staleness_zero(mode):
    """The sync loop (admit B, produce, consume, sync) works in every mode, loses nothing."""
    sim = Simulation(BufferConfig(mode=mode, max_staleness=0), batch_groups=2, producers=1)
    for _ in range(5):
        sim.admit(0, 2)
        sim.produce(0, 2)
        sim.consume()
        sim.sync(0)
        sim.check()
    assert sim.version == 5 and sorted(sim.trained) == sorted(sim.prompts)
