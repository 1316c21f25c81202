"""RolloutBuffer: capacity, backpressure, version rejection, whole groups."""

from __future__ import annotations

import queue
import threading
import time

import pytest

from workers.buffer import RolloutBuffer
from workers.rollout import Group, Rollout


def group(gid: str, version: int = 0, size: int = 4) -> Group:
    rollouts = [
        Rollout(prompt_ids=[1], completion_ids=[3, 2], behaviour_logprobs=[-1.0, -1.0],
                token_versions=[version, version], finish_reason="stop", group_id=gid)
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


def test_put_blocks_while_full_and_reports_seconds_blocked():
    buf = RolloutBuffer(capacity_groups=2, max_staleness=1)
    buf.put(group("a"))
    buf.put(group("b"))
    result = {}
    producer = threading.Thread(target=lambda: result.setdefault("blocked", buf.put(group("c"))))
    producer.start()
    time.sleep(0.3)
    assert producer.is_alive() and buf.depth == 2  # backpressure: still waiting
    assert [g.group_id for g in buf.get(1, current_version=0)] == ["a"]
    producer.join(timeout=2)
    assert not producer.is_alive()
    assert result["blocked"] >= 0.25
    assert buf.backpressure_s >= 0.25
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
