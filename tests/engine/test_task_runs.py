"""Real short runs (Ray, the torch backend, the tiny model, real training) on a task
other than reverse, its prompts read from one of the shipped data files. A countdown run
from the shipped file trains and evaluates in test_eval_runs.py."""

from __future__ import annotations

import os

import ray

from tests.engine.helpers import tiny_config, warm_started
from workers.core.run_actors import NAMESPACE, actor_name
from workers.rollout.shipped_data import DATA_DIR
from workers.run.driver import RunDriver
from workers.run.paths import Confinement


def test_a_dataset_outside_the_data_roots_fails_the_run_naming_the_field(cluster, cache_dir, tmp_path):
    config = tiny_config(
        task={"name": "countdown", "dataset": {"path": os.path.join(DATA_DIR, "countdown.jsonl")}},
        inference={"max_new_tokens": 13},
    )
    confinement = Confinement(data_roots=(str(tmp_path),), scratch_root=str(tmp_path / "scratch"))
    driver = RunDriver.options(name=actor_name(4102), namespace=NAMESPACE).remote(
        4102, config, None, "", cache_dir, exit_when_done=False, confinement=confinement
    )
    try:
        summary = ray.get(driver.run.remote(), timeout=120)
    finally:
        ray.kill(driver)
    assert summary["state"] == "failed"
    assert "task.dataset.path" in summary["error"] + summary["error_detail"]


def test_a_calculator_run_calls_the_tool_and_trains_on_episodes_each_on_one_version(cluster, cache_dir, tmp_path):
    """The multi-turn task through the whole engine (driver, inference worker, buffer,
    trainer): episodes with tool calls are generated, scheduled by episode (with one
    group of overcommit), scored and trained on."""
    config = tiny_config(
        task={"name": "calculator", "options": {"max_operand": 9, "max_terms": 2}},
        inference={"max_new_tokens": 24},
        warm_start={"steps": 150, "noisy_steps": 0, "batch_size": 32},
        sync={"update_mode": "drain"},
        buffer={"unit": "episode", "overcommit": 1},
        stop={"max_steps": 3},
    )
    warm_started(config, cache_dir)
    driver = RunDriver.options(name=actor_name(4103), namespace=NAMESPACE).remote(
        4103, config, None, "", cache_dir, exit_when_done=False, confinement=Confinement(scratch_root=str(tmp_path))
    )
    try:
        summary = ray.get(driver.run.remote(), timeout=300)
    finally:
        ray.kill(driver)
    assert summary["state"] == "succeeded", summary["error"]
    series = summary["series"]
    rewards = [value for _, value in series["reward/mean"]]
    assert len(rewards) == len(series["loss"]) == 3 and all(0.0 <= v <= 1.0 for v in rewards)
    # Warm-started on episodes that call the calculator, the policy answers some right:
    # a reward above zero needs a call, its result appended, and the answer after it.
    assert max(rewards) > 0.0, rewards
    assert "episode/p90_s" in series
    assert not any(name.startswith("agent/") for name in series)  # one agent: no per-agent series
    assert not any(name.startswith("eval/") for name in series)  # its config leaves eval off, the default
    assert max(v for _, v in series["staleness/max"]) <= 1.0
    # Under drain no weights load while an episode is in flight: no episode mixes versions.
    assert [v for _, v in series["rollout/mixed_version_frac"]] == [0.0] * 3
