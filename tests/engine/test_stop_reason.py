"""When a run stops: max_steps, max_minutes, target_reward over the last steps."""

from __future__ import annotations

from workers.config import StopConfig
from workers.driver import TARGET_WINDOW, stop_reason


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
