"""When a run stops: max_steps, max_minutes, target_reward over the last steps."""

from __future__ import annotations

from workers.config import StopConfig
from workers.driver import SERIES_TAIL, TARGET_WINDOW, series_store, stop_reason


def reason(stop: StopConfig, done=False, elapsed=0.0, rewards=()):
    return stop_reason(stop, trainer_done=done, elapsed_s=elapsed, rewards=list(rewards))


def test_the_trainer_reaching_max_steps_stops_the_run():
    assert reason(StopConfig(max_steps=3), done=True) == "max_steps"


def test_max_minutes_counts_seconds_of_the_loops():
    stop = StopConfig(max_minutes=0.5)
    assert reason(stop, elapsed=29.9) is None
    assert reason(stop, elapsed=30.0) == "max_minutes"


def test_target_reward_needs_a_full_window_of_recent_steps():
    stop = StopConfig(target_reward=0.8)
    assert reason(stop, rewards=[1.0] * (TARGET_WINDOW - 1)) is None  # too few steps to judge
    assert reason(stop, rewards=[0.0] * 10 + [0.8] * TARGET_WINDOW) == "target_reward"
    assert reason(stop, rewards=[0.0] * 10 + [0.8] * (TARGET_WINDOW - 1) + [0.7]) is None


def test_without_a_target_reward_only_steps_and_time_stop_the_run():
    assert reason(StopConfig(), rewards=[1.0] * 50) is None


def test_the_driver_keeps_only_the_latest_points_of_each_series():
    # A long fast run emits millions of points; the driver must not hold them all.
    series = series_store(tail=5)
    for step in range(1, 1001):
        series["reward/mean"].append((step, step / 1000))
        series["loss"].append((step, 1.0))
    assert [s for s, _ in series["reward/mean"]] == [996, 997, 998, 999, 1000]
    assert len(series["loss"]) == 5
    # The default keeps enough for the target_reward window.
    assert series_store()["reward/mean"].maxlen == SERIES_TAIL >= TARGET_WINDOW
