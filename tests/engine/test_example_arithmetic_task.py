"""examples/arithmetic: its dataset is what its script writes, its launch file makes a
valid config with the dataset beside it, and its reward functions score as TRL would."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest

from examples.arithmetic import make_data
from examples.arithmetic.task import ArithmeticTask, correct_answer, sign_first
from rollway_cli.launchfile import launch_body
from workers.config.run_config import RunConfig
from workers.rl_tasks import make_task
from workers.rollout.task_data import load_splits

EXAMPLE = Path(make_data.PATH).parent


@pytest.fixture
def allowed(monkeypatch):
    monkeypatch.setenv("ROLLWAY_TASK_MODULES", "examples.arithmetic.task")


def test_the_committed_dataset_is_what_the_script_writes(tmp_path):
    written = make_data.write(str(tmp_path / "a.jsonl"))
    assert Path(written).read_text() == Path(make_data.PATH).read_text(), (
        "examples/arithmetic/arithmetic.jsonl is stale: run python -m examples.arithmetic.make_data"
    )


def test_the_launch_file_is_a_valid_run_with_its_dataset_beside_it(allowed):
    body = launch_body(EXAMPLE / "run.yaml", [])
    dataset = body["overrides"]["task"]["dataset"]
    assert dataset["path"] == make_data.PATH and os.path.isabs(dataset["path"])
    cfg = RunConfig.model_validate(body["overrides"])
    splits = load_splits(cfg)
    assert (len(splits.train), len(splits.eval)) == (270, 30)
    prompt, answer = splits.train[0]
    assert set(json.loads(answer)) == {"answer", "op"}  # every column but the prompt reaches the functions
    task = make_task(cfg.task)
    value = json.loads(answer)["answer"]
    scores = task.score(prompt, answer, [value, "x"], [[1], [2]])
    applies = json.loads(answer)["op"] == "-"
    assert scores.totals[0] == 1.0 + (0.5 if applies else 0.0)


def test_the_reward_functions_answer_as_documented():
    assert correct_answer(["3-5="] * 2, ["-2", "2"], ["-2", "-2"]) == [1.0, 0.0]
    assert sign_first(["3-5=", "3+5="], ["2", "8"], ["-2", "8"], ["-", "+"]) == [0.0, None]
    task = ArithmeticTask()
    for prompt, answer in task.sample(20, random.Random(0)):
        assert task.reward(task.demonstration(prompt, answer), answer) == 1.0
