"""When a run stops: max_steps, max_minutes, target_reward over the last steps."""

from __future__ import annotations

from workers.config.run_config import StopConfig
from workers.run.driver import SERIES_TAIL, TARGET_WINDOW, RunDriver, stop_reason


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


def test_the_driver_keeps_only_the_latest_points_of_each_series(tmp_path):
    # A long fast run emits millions of points; the driver must not hold them all. The
    # driver's own class (outside Ray), with no site: its reporter keeps every point.
    driver = RunDriver.__ray_actor_class__(1, {}, None, "", str(tmp_path))
    for step in range(SERIES_TAIL + 500):
        driver.metrics.emit("reward/mean", step, step / 1000)
        driver.metrics.emit("loss", step, 1.0)
    kept = driver.summary()["series"]
    assert [s for s, _ in kept["reward/mean"]] == list(range(500, SERIES_TAIL + 500))
    assert len(kept["loss"]) == SERIES_TAIL
    assert len(driver.reporter.points) == 2 * (SERIES_TAIL + 500)  # sent on, all of them
    # The tail keeps enough for the target_reward window.
    assert SERIES_TAIL >= TARGET_WINDOW
