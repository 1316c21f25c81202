"""Requeue proof: with buffer.on_stale='requeue' the prompts of rejected groups are
generated again and trained, not only sent back.

Fast: `RolloutBuffer.regenerated` counts the trained groups whose prompt came back
through `take_requeued`, and nothing else. Slow: a real run (RunDriver, in-process Ray,
torch backend) that makes groups go stale (a stream whose head runs 3 batches ahead,
max_staleness 0) requeues them, and its live BufferActor's buffer counts regenerations
trained while nothing stale is trained. The same run shows the unbounded buffer reaching
the BufferActor as a stream: no capacity, and the time the trainer waited for fresh
groups reported.
"""

from __future__ import annotations

import time

import pytest
import ray

from workers.core.records import Group, Rollout
from workers.core.run_actors import NAMESPACE, actor_name
from workers.run.buffer import RolloutBuffer
from workers.run.driver import RunDriver


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


# -- a real run (slow) ------------------------------------------------------------------

RUN_ID = 451
# Inference may run 3 batches ahead while get() accepts only current-version groups:
# whatever the trainer's next version overtakes is rejected and requeued.
CONFIG = {
    "mode": "async",
    "model": {"hidden_size": 16, "num_layers": 1, "num_heads": 2, "intermediate_size": 32},
    "warm_start": {"steps": 2, "noisy_steps": 1, "batch_size": 8},
    "trainer": {"batch_groups": 4, "group_size": 4},
    "inference": {"backend": "torch"},
    "buffer": {"mode": "unbounded", "max_head_offpolicyness": 3, "max_staleness": 0, "on_stale": "requeue"},
    "stop": {"max_steps": 40, "max_minutes": 3},
}


def _buffer_counts(run_id: int) -> tuple[int, int] | None:
    """(requeued, regenerated) read from the live run's RolloutBuffer, None once gone."""
    try:
        actor = ray.get_actor(f"{actor_name(run_id)}-buffer", namespace=NAMESPACE)
        return ray.get(actor.__ray_call__.remote(lambda a: (a.buffer.requeued, a.buffer.regenerated)), timeout=10)
    except (ValueError, ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
        return None


@pytest.fixture(scope="module")
def requeue_run(cluster, cache_dir):
    """Run until the live buffer has trained a few regenerated groups (or 120 s), then
    stop the run; returns (the driver's summary, the last (requeued, regenerated) read)."""
    driver = RunDriver.options(name=actor_name(RUN_ID), namespace=NAMESPACE).remote(
        RUN_ID, CONFIG, None, "", cache_dir, exit_when_done=False
    )
    try:
        done = driver.run.remote()
        counts, deadline = None, time.monotonic() + 120
        while time.monotonic() < deadline and not ray.wait([done], timeout=0.2)[0]:
            counts = _buffer_counts(RUN_ID) or counts
            if counts and counts[1] >= 3:
                break
        driver.stop.remote()
        return ray.get(done, timeout=60), counts
    finally:
        ray.kill(driver)


@pytest.mark.slow
def test_stale_groups_are_requeued_regenerated_and_trained(requeue_run):
    out, counts = requeue_run
    assert out["state"] in ("succeeded", "cancelled"), out["error"]
    s = {k: dict(v) for k, v in out["series"].items()}
    assert max(s["buffer/requeued"].values()) > 0  # η 3 > max_staleness 0: groups went stale
    assert set(s["buffer/dropped_stale"].values()) == {0.0}  # requeued, never dropped
    assert set(s["staleness/max"].values()) == {0.0}  # nothing stale trained
    assert counts is not None, "never read the live buffer"
    requeued, regenerated = counts
    assert regenerated >= 1, f"requeued {requeued} groups but trained no regeneration"
    assert regenerated <= requeued


@pytest.mark.slow
def test_an_unbounded_stream_reports_no_capacity_and_its_starved_time(requeue_run):
    out, _ = requeue_run
    s = {k: dict(v) for k, v in out["series"].items()}
    assert "buffer/capacity" not in s  # a stream has no capacity
    assert "buffer/starved_s" in s


@pytest.mark.slow
def test_the_run_reports_regenerated_groups(requeue_run):
    out, _ = requeue_run
    s = {k: dict(v) for k, v in out["series"].items()}
    assert max(s["buffer/regenerated"].values()) > 0
    assert max(s["buffer/regenerated"].values()) <= max(s["buffer/requeued"].values())
