"""Requeue proof: with buffer.on_stale='requeue' the prompts of rejected groups are
generated again and trained, not only sent back.

`RolloutBuffer.regenerated` counts the trained groups whose prompt came back through
`take_requeued`, and nothing else. A real run whose groups go stale (its first batch held
by a test hook, max_staleness 0) requeues them, generates them again and trains them
while nothing stale is trained: tests/engine/test_replay.py's requeue run, which also
shows the unbounded buffer reaching the BufferActor as a stream (no capacity, the time the
trainer waited for fresh groups reported).
"""

from __future__ import annotations

from workers.core.records import Group, Rollout
from workers.run.buffer import RolloutBuffer


def group(gid: str, prompt: str, version: int) -> Group:
    rollouts = [
        Rollout(
            prompt_ids=[1],
            completion_ids=[3, 2],
            behaviour_logprobs=[-1.0, -1.0],
            token_versions=[version, version],
            finish_reason="stop",
            group_id=gid,
        )
        for _ in range(2)
    ]
    return Group(group_id=gid, prompt=prompt, answer=prompt[::-1], rollouts=rollouts)


def regenerate(buf: RolloutBuffer, version: int, suffix: str = "'") -> list[str]:
    """What a producer does: take the requeued prompts and put fresh groups of them."""
    prompts = [g.prompt for g in buf.take_requeued(10)]
    for p in prompts:
        buf.put(group(p + suffix, p, version))
    return prompts


# -- RolloutBuffer.regenerated (fast) ---------------------------------------------------


def test_a_requeued_prompt_counts_once_it_is_generated_again_and_trained():
    buf = RolloutBuffer(capacity_groups=None, max_staleness=0, on_stale="requeue")
    buf.put(group("a", "abc", 0))
    buf.put(group("b", "bcd", 0))
    buf.put(group("c", "cde", 1))
    assert [g.group_id for g in buf.get(1, current_version=1)] == ["c"]  # a, b stale
    assert buf.requeued == 2 and buf.regenerated == 0
    assert regenerate(buf, 1) == ["abc", "bcd"]
    assert buf.regenerated == 0  # generated again, not yet trained
    got = buf.get(2, current_version=1)
    assert [(g.group_id, g.prompt) for g in got] == [("abc'", "abc"), ("bcd'", "bcd")]
    assert buf.regenerated == 2
    assert buf.take_requeued(10) == []


def test_fresh_groups_and_dropped_groups_never_count():
    buf = RolloutBuffer(capacity_groups=None, max_staleness=0, on_stale="requeue")
    buf.put(group("a", "abc", 0))
    buf.get(1, current_version=0)
    assert buf.regenerated == 0  # trained fresh: nothing was requeued
    drop = RolloutBuffer(capacity_groups=None, max_staleness=0, on_stale="drop")
    drop.put(group("a", "abc", 0))
    drop.put(group("b", "abc", 1))
    drop.get(1, current_version=1)
    assert (drop.dropped_stale, drop.take_requeued(10), drop.regenerated) == (1, [], 0)


def test_a_regeneration_that_goes_stale_again_counts_once_when_finally_trained():
    buf = RolloutBuffer(capacity_groups=None, max_staleness=0, on_stale="requeue")
    buf.put(group("a", "abc", 0))
    buf.put(group("x", "xyz", 1))
    buf.get(1, current_version=1)
    regenerate(buf, 1)  # "abc" generated again at version 1 ...
    buf.put(group("y", "yzx", 2))
    buf.get(1, current_version=2)  # ... but stale again at version 2: requeued twice
    assert buf.requeued == 2 and buf.regenerated == 0
    regenerate(buf, 2, suffix="''")
    assert [g.group_id for g in buf.get(1, current_version=2)] == ["abc''"]
    assert buf.regenerated == 1
    buf.put(group("z", "abc", 2))  # a fresh sample of the same prompt later: not a regeneration
    buf.get(1, current_version=2)
    assert buf.regenerated == 1
