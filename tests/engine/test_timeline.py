"""Per-step idle fraction, token rate and backpressure from worker time segments."""

from __future__ import annotations

import pytest

from workers.core.timeline import BLOCKED, GENERATE, HANDOFF, Segment, StepWindows, Timeline


def test_idle_fraction_and_tokens_are_split_across_step_windows():
    w = StepWindows(num_workers=1)
    # generating 0..2 (200 tokens), blocked 2..3, generating 3..4 (100 tokens)
    w.report(0, [Segment(GENERATE, 0, 2, 200), Segment(BLOCKED, 2, 3), Segment(GENERATE, 3, 4, 100)], None, 5.0)
    first = w.window(0, 1)
    assert first["inference/idle_frac"] == pytest.approx(0.0)
    assert first["inference/tokens_per_s"] == pytest.approx(100.0)
    second = w.window(1, 5)  # 1 s + 1 s generating out of 4 s
    assert second["inference/idle_frac"] == pytest.approx(0.5)
    assert second["inference/tokens_per_s"] == pytest.approx((100 + 100) / 4)
    assert second["rollout/backpressure_s"] == pytest.approx(1.0)


def test_idle_fraction_averages_over_workers():
    w = StepWindows(num_workers=2)
    w.report(0, [Segment(GENERATE, 0, 4, 40)], None, 4.0)
    w.report(1, [], None, 4.0)
    assert w.window(0, 4)["inference/idle_frac"] == pytest.approx(0.5)


def test_a_window_is_complete_only_when_every_worker_reported_past_it():
    w = StepWindows(num_workers=2)
    w.report(0, [], None, 10.0)
    assert not w.complete(5.0)  # worker 1 has not reported yet
    w.report(1, [], (GENERATE, 4.0), 10.0)
    assert not w.complete(5.0)  # worker 1 is inside a generate call that began before 5
    assert w.complete(3.0)
    w.report(1, [Segment(GENERATE, 4.0, 11.0, 70)], None, 11.0)
    assert w.complete(5.0)


def test_prune_keeps_segments_that_reach_into_later_windows():
    w = StepWindows(num_workers=1)
    w.report(0, [Segment(GENERATE, 0, 1, 10), Segment(GENERATE, 1, 3, 20)], None, 3.0)
    w.prune(2.0)
    assert w.window(2, 3)["inference/tokens_per_s"] == pytest.approx(10.0)
    assert w.window(0, 1)["inference/tokens_per_s"] == 0.0  # forgotten


def test_timeline_records_no_blocked_part_of_a_put_that_did_not_block():
    t = Timeline()
    t.begin(HANDOFF)
    t.end_blocked(0.0)  # the put did not block: its call is handoff only
    assert [s.kind for s in t.drain()[0]] == [HANDOFF]
    t.begin(GENERATE)
    assert t.drain()[1][0] == GENERATE  # open segment visible to the driver
    t.end(tokens=5)
    closed, open_seg, _ = t.drain()
    assert [s.kind for s in closed] == [GENERATE] and closed[0].tokens == 5
    assert open_seg is None


def test_a_put_that_blocked_splits_into_handoff_and_blocked(monkeypatch):
    clock = iter([10.0, 13.0, 14.0])
    monkeypatch.setattr("workers.core.timeline.time.time", lambda: next(clock))
    t = Timeline()
    t.begin(HANDOFF)
    t.end_blocked(2.0)  # a 3 s put call, 2 s of it blocked on a full buffer
    closed, open_seg, _ = t.drain()
    assert [(s.kind, s.t0, s.t1) for s in closed] == [(HANDOFF, 10.0, 11.0), (BLOCKED, 11.0, 13.0)]
    w = StepWindows(num_workers=1)
    w.report(0, closed, open_seg, 14.0)
    window = w.window(10.0, 14.0)
    assert window["rollout/handoff_s"] == pytest.approx(1.0)
    assert window["rollout/backpressure_s"] == pytest.approx(2.0)
    assert window["inference/idle_frac"] == pytest.approx(1.0)  # neither counts as generating


def test_a_cancelled_segment_is_not_recorded():
    t = Timeline()
    t.begin(HANDOFF)
    t.cancel()  # an admission refused: waiting, not handing off
    t.begin(GENERATE)
    t.end(tokens=5)
    assert [s.kind for s in t.drain()[0]] == [GENERATE]
