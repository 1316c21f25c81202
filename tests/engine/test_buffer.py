"""RolloutBuffer: capacity, backpressure, version rejection, whole groups."""

from __future__ import annotations

import queue
import threading
import time

import pytest
from pydantic import ValidationError

from workers.config.run_config import BufferConfig, RunConfig
from workers.core.records import Group, Rollout
from workers.run.buffer import FIRST_BATCH_HOLD_ENV, AdmissionGate, BufferPlan, RolloutBuffer, first_batch_hold, plan


def group(gid: str, version: int = 0, size: int = 4) -> Group:
    rollouts = [
        Rollout(
            prompt_ids=[1],
            completion_ids=[3, 2],
            behaviour_logprobs=[-1.0, -1.0],
            token_versions=[version, version],
            finish_reason="stop",
            group_id=gid,
        )
        for _ in range(size)
    ]
    return Group(group_id=gid, prompt="a=", answer="a", rollouts=rollouts)


def test_it_hands_out_whole_groups_in_order():
    buf = RolloutBuffer(capacity_groups=4, max_staleness=1)
    for i in range(3):
        assert buf.put(group(str(i))) == pytest.approx(0.0, abs=0.05)
    assert buf.depth == 3
    got = buf.get(2, current_version=0)
    assert [g.group_id for g in got] == ["0", "1"]
    assert all(len(g.rollouts) == 4 for g in got)
    assert buf.depth == 1


def test_offer_takes_what_fits_in_order_without_blocking():
    buf = RolloutBuffer(capacity_groups=3, max_staleness=1)
    buf.put(group("a"))
    assert buf.offer([group("b"), group("c"), group("d")]) == 2
    assert buf.group_ids() == ["a", "b", "c"] and buf.total_put == 3
    assert buf.offer([group("e")]) == 0
    buf.get(2, current_version=0)
    assert buf.offer([group("d"), group("e"), group("f")]) == 2
    assert buf.group_ids() == ["c", "d", "e"]
    assert RolloutBuffer(capacity_groups=None, max_staleness=1).offer([group(str(i)) for i in range(50)]) == 50


def wait_until_blocked(count) -> None:
    """Until `count()` (the buffer's blocked producers or consumers) is 1: the thread under
    test is waiting inside the buffer, whenever the host got it there."""
    deadline = time.monotonic() + 10
    while count() != 1:
        assert time.monotonic() < deadline, "the thread never blocked in the buffer"
        time.sleep(0.005)


def test_put_blocks_while_full_and_reports_seconds_blocked():
    buf = RolloutBuffer(capacity_groups=2, max_staleness=1)
    buf.put(group("a"))
    buf.put(group("b"))
    result = {}
    producer = threading.Thread(target=lambda: result.setdefault("blocked", buf.put(group("c"))))
    producer.start()
    wait_until_blocked(lambda: buf.blocked_puts)  # then room is freed 0.3 s later
    time.sleep(0.3)
    assert producer.is_alive() and buf.depth == 2  # backpressure: still waiting
    assert [g.group_id for g in buf.get(1, current_version=0)] == ["a"]
    producer.join(timeout=10)
    assert not producer.is_alive() and buf.blocked_puts == 0
    assert result["blocked"] >= 0.3
    assert buf.backpressure_s >= 0.3
    assert [g.group_id for g in buf.get(2, current_version=0)] == ["b", "c"]


def test_put_and_get_time_out():
    buf = RolloutBuffer(capacity_groups=1, max_staleness=0)
    with pytest.raises(queue.Empty):
        buf.get(1, current_version=0, timeout=0.05)
    buf.put(group("a"))
    with pytest.raises(queue.Full):
        buf.put(group("b"), timeout=0.05)
    assert buf.depth == 1


def test_it_drops_groups_older_than_max_staleness_and_counts_them():
    buf = RolloutBuffer(capacity_groups=8, max_staleness=1)
    buf.put(group("v0", version=0))
    buf.put(group("v1", version=1))
    buf.put(group("v2", version=2))
    got = buf.get(1, current_version=2)  # oldest allowed: 2 - 1 = 1
    assert [g.group_id for g in got] == ["v1"]
    assert buf.dropped_stale == 1
    assert buf.depth == 1


def test_a_group_with_one_stale_token_is_dropped_whole():
    buf = RolloutBuffer(capacity_groups=4, max_staleness=0)
    mixed = group("mixed", version=3)
    mixed.rollouts[2].token_versions = [2, 3]  # in-flight update: one older token
    buf.put(mixed)
    buf.put(group("fresh", version=3))
    assert [g.group_id for g in buf.get(1, current_version=3)] == ["fresh"]
    assert buf.dropped_stale == 1


def test_get_waits_for_fresh_groups_after_dropping_stale_ones():
    buf = RolloutBuffer(capacity_groups=4, max_staleness=0)
    buf.put(group("old", version=0))
    threading.Timer(0.2, lambda: buf.put(group("new", version=1))).start()
    got = buf.get(1, current_version=1, timeout=2)
    assert [g.group_id for g in got] == ["new"] and buf.dropped_stale == 1


def test_a_held_get_takes_its_batch_only_once_the_buffer_holds_the_hold():
    buf = RolloutBuffer(capacity_groups=4, max_staleness=1)
    buf.put(group("a"))
    buf.put(group("b"))
    with pytest.raises(queue.Empty):  # a batch of 1 is there, the hold of 3 is not
        buf.get(1, current_version=0, timeout=0.05, hold_until=3)
    assert buf.depth == 2  # nothing taken
    buf.put(group("c"))
    assert [g.group_id for g in buf.get(1, current_version=0, timeout=0.05, hold_until=3)] == ["a"]
    # Stale groups do not count towards the hold: they are rejected first.
    buf.put(group("d", version=3))
    with pytest.raises(queue.Empty):
        buf.get(1, current_version=3, timeout=0.05, hold_until=2)
    assert buf.dropped_stale == 2 and buf.group_ids() == ["d"]
    with pytest.raises(ValueError, match="hold_until must be at most capacity"):
        buf.get(1, current_version=3, hold_until=5)


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, 0), ("", 0), ("0", 0), ("8", 8), ("16", 16)],
)
def test_the_first_batch_hold_reads_its_switch(value, expected):
    async_plan = plan(BufferConfig(mode="bounded", capacity=2, max_staleness=1), "async", 8)
    assert first_batch_hold(async_plan, 8, value) == expected


@pytest.mark.parametrize(
    ("mode", "buffer", "value", "needle"),
    [
        ("async", {"mode": "bounded", "capacity": 2, "max_staleness": 1}, "17", "at most 16 groups"),
        # Synchronous: nothing generated ahead, so the gate stops at one batch.
        ("sync", {"mode": "bounded", "capacity": 2, "max_staleness": 1}, "9", "at most 8 groups"),
        ("async", {"mode": "bounded", "capacity": 2, "max_staleness": 1}, "two", "must be a number of groups"),
    ],
)
def test_a_first_batch_hold_the_buffer_cannot_reach_is_refused_naming_the_switch(mode, buffer, value, needle):
    with pytest.raises(ValueError, match=needle) as caught:
        first_batch_hold(plan(BufferConfig(**buffer), mode, 8), 8, value)
    assert FIRST_BATCH_HOLD_ENV in str(caught.value)


def test_concurrent_producers_never_split_or_lose_groups():
    buf = RolloutBuffer(capacity_groups=3, max_staleness=10)
    n_producers, per_producer = 3, 20

    def produce(p: int) -> None:
        for i in range(per_producer):
            buf.put(group(f"{p}-{i}", size=5))

    threads = [threading.Thread(target=produce, args=(p,)) for p in range(n_producers)]
    for t in threads:
        t.start()
    seen = []
    for _ in range(n_producers * per_producer // 2):
        for g in buf.get(2, current_version=0, timeout=5):
            assert len(g.rollouts) == 5 and {r.group_id for r in g.rollouts} == {g.group_id}
            seen.append(g.group_id)
        assert buf.depth <= buf.capacity
    for t in threads:
        t.join(timeout=5)
    assert sorted(seen) == sorted(f"{p}-{i}" for p in range(n_producers) for i in range(per_producer))
    assert buf.total_put == buf.total_got == 60


def test_bad_arguments_are_errors_that_name_the_fix():
    with pytest.raises(ValueError, match="capacity_groups must be ≥ 1"):
        RolloutBuffer(0, 1)
    with pytest.raises(ValueError, match="1..capacity"):
        RolloutBuffer(2, 1).get(3, current_version=0)
    with pytest.raises(ValueError, match="on_stale must be 'drop' or 'requeue'"):
        RolloutBuffer(2, 1, on_stale="keep")
    with pytest.raises(ValueError, match="batch_groups must be ≥ 1"):
        AdmissionGate(0, 1)


# -- modes ------------------------------------------------------------------------------


def test_the_default_is_a_bounded_buffer_of_two_batches_dropping_stale_groups():
    cfg = RunConfig().buffer
    assert (cfg.mode, cfg.capacity, cfg.max_staleness, cfg.on_stale) == ("bounded", 2, 1, "drop")
    # A stored config that names no mode validates, to the same buffer.
    stored = BufferConfig.model_validate({"capacity": 3, "max_staleness": 2})
    assert plan(stored, "async", 4) == BufferPlan(12, 2, 2, "drop")


@pytest.mark.parametrize(
    ("mode", "capacity_groups", "ahead"),
    [("none", 4, 0), ("double", 4, 1), ("bounded", 12, 2), ("unbounded", None, 2)],
)
def test_each_mode_has_its_capacity_and_head(mode, capacity_groups, ahead):
    cfg = BufferConfig(mode=mode, capacity=3, max_staleness=2)
    p = plan(cfg, "async", 4)
    assert (p.capacity_groups, p.ahead_batches) == (capacity_groups, ahead)
    assert plan(cfg, "sync", 4).ahead_batches == 0  # a sync run never runs ahead


def test_max_head_offpolicyness_sets_the_gate_and_is_checked_against_mode_none():
    cfg = BufferConfig(mode="unbounded", max_staleness=1, max_head_offpolicyness=3)
    assert plan(cfg, "async", 2).ahead_batches == 3
    with pytest.raises(ValidationError, match="buffer.max_head_offpolicyness .*buffer.mode is 'none'"):
        BufferConfig(mode="none", max_head_offpolicyness=1)
    with pytest.raises(ValidationError, match="mode"):
        BufferConfig(mode="ring")


def test_unbounded_put_never_blocks():
    buf = RolloutBuffer(None, max_staleness=1)
    for i in range(500):
        assert buf.put(group(str(i)), timeout=0) == pytest.approx(0.0, abs=0.05)
    assert buf.depth == 500 and buf.capacity is None
    assert [g.group_id for g in buf.get(300, current_version=0)][:2] == ["0", "1"]


def test_requeue_hands_stale_prompts_back_once_and_counts_them():
    buf = RolloutBuffer(4, max_staleness=0, on_stale="requeue")
    buf.put(group("old", version=0))
    buf.put(group("new", version=1))
    assert [g.group_id for g in buf.get(1, current_version=1)] == ["new"]
    assert (buf.requeued, buf.dropped_stale, buf.rejected) == (1, 0, 1)
    assert [g.prompt for g in buf.take_requeued(5)] == ["a="]
    assert buf.take_requeued(5) == []


def test_get_counts_consumer_starved_time():
    buf = RolloutBuffer(2, max_staleness=1)
    with pytest.raises(queue.Empty):
        buf.get(1, current_version=0, timeout=0.2)
    assert buf.starved_s >= 0.2 and buf.blocked_gets == 0
    consumer = threading.Thread(target=lambda: buf.get(1, current_version=0, timeout=10))
    consumer.start()
    wait_until_blocked(lambda: buf.blocked_gets)  # then the group comes 0.2 s later
    time.sleep(0.2)
    buf.put(group("late"))
    consumer.join(timeout=10)
    assert not consumer.is_alive() and buf.depth == 0
    assert buf.starved_s >= 0.4


def test_the_gate_is_areal_capacity_rule():
    gate = AdmissionGate(batch_groups=4, ahead=1)
    assert gate.may_admit(version=0, admitted=0, rejected=0, want=10) == 8  # (0+1+1)·4
    assert gate.may_admit(version=0, admitted=8, rejected=0, want=1) == 0  # full: wait
    assert gate.may_admit(version=0, admitted=8, rejected=3, want=5) == 3  # rejected free places
    assert gate.may_admit(version=1, admitted=8, rejected=0, want=5) == 4  # new weights
    assert AdmissionGate(4, 0).may_admit(0, 4, 0, 4) == 0  # sync: one batch per version
