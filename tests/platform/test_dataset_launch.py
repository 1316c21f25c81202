"""Launching a run whose task reads a data file: the path stays under ROLLWAY_DATA_ROOTS
and the file must serve the run, or the launch is a 400 naming the field (nothing
stored); an unknown task name is a 400 naming task.name."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from runs.models import Run
from tests.fake_hub import FakeHub
from workers.rollout.shipped_data import DATA_DIR

URL = "/api/runs"


def launch(client, experiment, task: dict):
    body = {
        "experiment": experiment.pk,
        "preset": "async",
        "overrides": {"task": task, "inference": {"max_new_tokens": 13}},
    }
    return client.post(URL, data=json.dumps(body), content_type="application/json")


@pytest.fixture
def data_root(settings, tmp_path):
    root = tmp_path / "data"
    root.mkdir()
    shutil.copy(os.path.join(DATA_DIR, "countdown.jsonl"), root / "countdown.jsonl")
    (tmp_path / "outside").mkdir()
    shutil.copy(os.path.join(DATA_DIR, "countdown.jsonl"), tmp_path / "outside" / "countdown.jsonl")
    settings.ROLLWAY_DATA_ROOTS = [str(root)]
    settings.ROLLWAY_SCRATCH_DIR = str(tmp_path / "scratch")
    return root


def test_the_shipped_data_directory_is_a_default_data_root():
    from django.conf import settings

    if "ROLLWAY_DATA_ROOTS" not in os.environ:
        assert os.path.realpath(DATA_DIR) in [os.path.realpath(r) for r in settings.ROLLWAY_DATA_ROOTS]


def test_a_dataset_under_a_data_root_is_accepted(client_for, owner, experiment, data_root):
    task = {"name": "countdown", "dataset": {"path": str(data_root / "countdown.jsonl")}}
    r = launch(client_for(owner), experiment, task)
    assert r.status_code == 201, r.content
    assert Run.objects.get().config["task"]["dataset"]["path"] == task["dataset"]["path"]


@pytest.mark.parametrize("how", ["absolute", "dotdot"])
def test_a_dataset_outside_the_data_roots_is_refused(client_for, owner, experiment, data_root, how):
    path = (
        data_root.parent / "outside" / "countdown.jsonl"
        if how == "absolute"
        else f"{data_root}/../outside/countdown.jsonl"
    )
    r = launch(client_for(owner), experiment, {"name": "countdown", "dataset": {"path": str(path)}})
    assert r.status_code == 400, r.content
    message = r.json()["errors"]["task.dataset.path"]
    assert "outside the allowed roots" in message and "ROLLWAY_DATA_ROOTS" in message
    assert Run.objects.count() == 0


def test_a_missing_column_is_refused_naming_it(client_for, owner, experiment, data_root):
    task = {"name": "countdown", "dataset": {"path": str(data_root / "countdown.jsonl"), "prompt_column": "question"}}
    r = launch(client_for(owner), experiment, task)
    assert r.status_code == 400, r.content
    assert "no column 'question'" in r.json()["errors"]["task.dataset.prompt_column"]


def test_an_unknown_task_name_is_refused_naming_it(client_for, owner, experiment, data_root, monkeypatch):
    r = launch(client_for(owner), experiment, {"name": "no_such_pkg.tasks:Task"})
    assert r.status_code == 400, r.content
    assert "not among the task modules this site allows" in r.json()["errors"]["task.name"]
    monkeypatch.setenv("ROLLWAY_TASK_MODULES", "no_such_pkg.tasks")
    r = launch(client_for(owner), experiment, {"name": "no_such_pkg.tasks:Task"})
    assert r.status_code == 400, r.content
    errors = r.json()["errors"]
    assert "cannot import module 'no_such_pkg.tasks'" in errors["task.name"], errors


def test_an_unknown_hub_dataset_is_refused_naming_the_path(client_for, owner, experiment, data_root, monkeypatch):
    hub = FakeHub(monkeypatch, data_root)
    r = launch(client_for(owner), experiment, {"name": "countdown", "dataset": {"path": "acme/no-such-set"}})
    assert r.status_code == 400, r.content
    message = r.json()["errors"]["task.dataset.path"]
    assert "there is no dataset 'acme/no-such-set' on the Hugging Face Hub" in message
    assert Run.objects.count() == 0 and hub.downloads == []


def test_a_reward_function_outside_the_allowed_packages_is_refused_naming_the_field(
    client_for, owner, experiment, data_root
):
    task = {"name": "countdown", "reward_funcs": ["no_such_pkg.rewards:accuracy"]}
    r = launch(client_for(owner), experiment, task)
    assert r.status_code == 400, r.content
    assert "not among the reward-function modules this site allows" in r.json()["errors"]["task.reward_funcs"]


def test_reward_weights_of_another_length_are_refused_naming_the_field(client_for, owner, experiment, data_root):
    task = {"name": "countdown", "reward_weights": [1.0]}
    r = launch(client_for(owner), experiment, task)
    assert r.status_code == 400, r.content
    assert "1 weights for 0 task.reward_funcs" in r.json()["errors"]["task.reward_weights"]
