"""Real short runs (Ray, the torch backend, the tiny model, real training) with the eval
pass on: its series arrive at the steps it ran on, within their bounds.

The sync run is also the suite's run of the sync preset (mode sync, a buffer of one batch
and max_staleness 0): generation and training take turns, which it checks too, rather
than paying a whole run of its own for that (each costs seconds of process start-up)."""

from __future__ import annotations

import math
import os

import pytest
import ray

from tests.engine.helpers import tiny_config, warm_started
from workers.core.run_actors import NAMESPACE, actor_name
from workers.rollout.evaluation import PASS_AT_1, PASS_AT_K, REWARD_MEAN, SERIES
from workers.rollout.shipped_data import DATA_DIR
from workers.run.driver import RunDriver
from workers.run.paths import Confinement

pytestmark = pytest.mark.slow


def run_countdown(run_id: int, cache_dir: str, tmp_path, **overrides) -> dict:
    config = tiny_config(
        task={"name": "countdown", "dataset": {"path": os.path.join(DATA_DIR, "countdown.jsonl")}},
        inference={"max_new_tokens": 13},
        warm_start={"steps": 150, "noisy_steps": 0, "batch_size": 32},
        eval={"every_steps": 2, "num_prompts": 30, "k": 8},  # the whole eval split (30 rows)
        **overrides,
    )
    confinement = Confinement(data_roots=(DATA_DIR,), scratch_root=str(tmp_path / "scratch"))
    warm_started(config, cache_dir)
    driver = RunDriver.options(name=actor_name(run_id), namespace=NAMESPACE).remote(
        run_id, config, None, "", cache_dir, exit_when_done=False, confinement=confinement
    )
    try:
        summary = ray.get(driver.run.remote(), timeout=300)
    finally:
        ray.kill(driver)
    assert summary["state"] == "succeeded", summary["error"]
    return summary


def check_bounds(series: dict) -> None:
    for name in SERIES:
        assert all(0.0 <= value <= 1.0 for _, value in series[name]), (name, series[name])
    for (step, p1), (step_k, pk) in zip(series[PASS_AT_1], series[PASS_AT_K], strict=True):
        assert step == step_k and pk >= p1


def test_a_sync_run_alternates_generate_train_sync_and_evaluates_every_two_steps_on_the_held_out_split(
    cluster, cache_dir, tmp_path
):
    """Sync mode: worker 0 loads every version, so the passes run exactly at steps 2 and
    4 (the last, also the end of the run: one pass, not two). Generation and training
    take turns: every batch comes from the weights of the step before."""
    sync_preset = {"capacity": 1, "max_staleness": 0}
    out = run_countdown(4201, cache_dir, tmp_path, mode="sync", buffer=sync_preset, stop={"max_steps": 4})
    series = out["series"]
    # The training reward, from the shipped file's training rows: a point per step.
    rewards = series["reward/mean"]
    assert [step for step, _ in rewards] == [1, 2, 3, 4]
    assert all(0.0 <= value <= 1.0 and math.isfinite(value) for _, value in rewards), rewards
    for name in SERIES:
        assert [step for step, _ in series[name]] == [2, 4], (name, series[name])
    check_bounds(series)
    # After its warm start the policy writes some well-formed expressions (partial credit).
    assert max(value for _, value in series[REWARD_MEAN]) > 0, series[REWARD_MEAN]

    s = {k: dict(v) for k, v in series.items()}
    assert sorted(s["staleness/max"]) == [1, 2, 3, 4]
    assert set(s["staleness/max"].values()) == {0.0}  # every batch from the current weights
    assert set(s["buffer/dropped_stale"].values()) == {0.0}
    # Alternation: every batch is from the weights of the step before (staleness 0
    # above), so the trainer waits for its generation at every step.
    assert sorted(s["trainer/idle_frac"]) == [1, 2, 3, 4]
    assert all(v > 0 for v in s["trainer/idle_frac"].values())
    # Taking turns, each phase computes on the threads of both (a thread each by default).
    threads = {p["actor"]: p["threads"] for p in out["placement"]}
    assert threads["trainer"] == threads["inference worker 0"] == 2, threads


def test_an_async_run_evaluates_once_per_interval_and_at_the_end(cluster, cache_dir, tmp_path):
    """Async mode: a version worker 0 skipped (two arrived at once) moves a pass to the
    next one; the run's final weights are always evaluated."""
    series = run_countdown(4202, cache_dir, tmp_path, stop={"max_steps": 5})["series"]
    steps = [step for step, _ in series[REWARD_MEAN]]
    assert steps == sorted(set(steps)) and steps[-1] == 5, steps  # the end: version 5
    periodic = steps[:-1]
    assert periodic and periodic[0] >= 2, steps  # none before the first multiple
    # Every interval [2, 4), [4, 6) gets a pass, none gets two (the end's aside).
    assert {s // 2 for s in steps} == {1, 2}, steps
    assert len({s // 2 for s in periodic}) == len(periodic), steps
    check_bounds(series)
