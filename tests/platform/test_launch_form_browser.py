"""The launch form in Debian's Chromium (driven by Playwright) against Django's live
server: the config controls and the overrides JSON stay in step, a changed control is
marked, a preset switch keeps the overrides, a refused value's error shows beside its
control, and the launched run has exactly the overrides and the priority chosen; a model
directory, a data file and a task are chosen with controls, and paths outside the
allowed roots are refused beside them."""

from __future__ import annotations

import json
import os
import re
import shutil

import pytest

from runs.models import Experiment, Run
from teams.models import Membership, Team
from tests.browser import PASSWORD, launch, log_in, skip_without_chromium
from workers.config.presets import PRESETS, build
from workers.rollout.shipped_data import DATA_DIR

pytestmark = [pytest.mark.slow, pytest.mark.browser, pytest.mark.django_db(transaction=True)]

CAPACITY = '.control[data-path="buffer.capacity"]'
MAX_STEPS = '.control[data-path="stop.max_steps"]'
TASK_NAME = '.control[data-path="task.name"]'


def test_controls_and_json_stay_in_step_and_the_run_gets_what_the_form_shows(live_server):
    skip_without_chromium()
    from django.contrib.auth import get_user_model
    from playwright.sync_api import expect, sync_playwright

    user = get_user_model().objects.create_user("lena", password=PASSWORD)
    team = Team.objects.create(name="Forms")
    Membership.objects.create(team=team, user=user, role=Membership.Role.ADMIN)
    experiment = Experiment.objects.create(team=team, name="capacities")
    sync_cfg, async_cfg = PRESETS["sync"]["config"], PRESETS["async"]["config"]
    # Playwright's sync API runs an event loop in this thread: no ORM calls inside.
    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            page = log_in(browser, live_server.url, "lena")
            page.goto(f"{live_server.url}/runs/new/")

            def overrides() -> dict:
                return json.loads(page.input_value("#id_overrides"))

            page.select_option("#id_experiment", str(experiment.pk))
            page.select_option("#id_preset", "sync")
            expect(page.locator("#config-controls")).to_be_visible()
            # Each control shows the chosen preset's value, nothing marked.
            expect(page.locator("#cfg-mode")).to_have_value("sync")
            expect(page.locator("#cfg-buffer-capacity")).to_have_value(str(sync_cfg.buffer.capacity))
            expect(page.locator(".control.changed")).to_have_count(0)
            expect(page.locator("[data-role=reset]:visible")).to_have_count(0)

            # A control edited: the JSON holds exactly that override; the control is marked.
            page.fill("#cfg-buffer-capacity", "5")
            assert overrides() == {"buffer": {"capacity": 5}}
            expect(page.locator(CAPACITY)).to_have_class(re.compile(r"\bchanged\b"))
            expect(page.locator(f"{CAPACITY} [data-role=changed]")).to_be_visible()
            expect(page.locator(f"{CAPACITY} [data-role=preset]")).to_have_text(f"preset: {sync_cfg.buffer.capacity}")
            expect(page.locator(".control.changed")).to_have_count(1)

            # The JSON edited: the controls follow.
            page.fill("#id_overrides", '{"buffer": {"capacity": 3}, "stop": {"max_steps": 20}}')
            expect(page.locator("#cfg-buffer-capacity")).to_have_value("3")
            expect(page.locator("#cfg-stop-max_steps")).to_have_value("20")
            expect(page.locator(".control.changed")).to_have_count(2)

            # JSON that does not parse pauses the controls until it does.
            page.fill("#id_overrides", '{"buffer": ')
            expect(page.locator("#controls-paused")).to_be_visible()
            expect(page.locator("#cfg-buffer-capacity")).to_be_disabled()
            page.fill("#id_overrides", '{"buffer": {"capacity": 3}, "stop": {"max_steps": 20}}')
            expect(page.locator("#cfg-buffer-capacity")).to_be_enabled()

            # Another preset: the controls re-base on it, the overrides stay.
            page.select_option("#id_preset", "async")
            expect(page.locator("#cfg-mode")).to_have_value(async_cfg.mode)
            expect(page.locator("#cfg-buffer-capacity")).to_have_value("3")
            assert overrides() == {"buffer": {"capacity": 3}, "stop": {"max_steps": 20}}

            # Reset to preset drops the override and shows the preset's value again.
            page.click(f"{MAX_STEPS} [data-role=reset]")
            expect(page.locator("#cfg-stop-max_steps")).to_have_value(str(async_cfg.stop.max_steps))
            expect(page.locator(MAX_STEPS)).not_to_have_class(re.compile(r"\bchanged\b"))
            expect(page.locator(f"{MAX_STEPS} [data-role=reset]")).to_be_hidden()
            assert overrides() == {"buffer": {"capacity": 3}}

            # A value the config refuses: the server's error shows beside that control.
            page.fill("#cfg-buffer-capacity", "0")
            page.click("#launch-form button[value=launch]")
            error = page.locator(f'{CAPACITY} .field-error[data-field="buffer.capacity"]')
            expect(error).to_be_visible()
            expect(error).to_contain_text("greater than or equal to 1")
            expect(page.locator("#config-errors")).to_have_count(0)  # nothing left without a control
            expect(page.locator("#cfg-buffer-capacity")).to_have_value("0")
            expect(page.locator(CAPACITY)).to_have_class(re.compile(r"\bchanged\b"))

            # Fixed, with a priority: the run is launched with exactly these overrides.
            page.select_option("#id_experiment", str(experiment.pk))
            page.fill("#cfg-buffer-capacity", "4")
            page.fill("#id_priority", "2")
            assert overrides() == {"buffer": {"capacity": 4}}
            page.click("#launch-form button[value=launch]")
            page.wait_for_url(re.compile(r"/runs/\d+/$"))
            run_id = int(re.search(r"/runs/(\d+)/$", page.url).group(1))
        finally:
            browser.close()

    run = Run.objects.get(pk=run_id)
    assert (run.experiment_id, run.preset, run.overrides, run.priority) == (
        experiment.pk,
        "async",
        {"buffer": {"capacity": 4}},
        2,
    )
    assert run.config == build("async", {"buffer": {"capacity": 4}}).model_dump(mode="json")
    assert run.config["buffer"]["capacity"] == 4


def test_a_model_directory_a_dataset_file_and_a_task_are_chosen_with_controls(live_server, settings, tmp_path):
    skip_without_chromium()
    from django.contrib.auth import get_user_model
    from playwright.sync_api import expect, sync_playwright

    from workers.model.tiny_hf import make_tiny_checkpoint

    models, data, outside = tmp_path / "models", tmp_path / "data", tmp_path / "outside"
    for d in (data, outside):
        d.mkdir()
        shutil.copy(os.path.join(DATA_DIR, "countdown.jsonl"), d / "countdown.jsonl")
    checkpoint = make_tiny_checkpoint(str(models / "tiny-qwen2"), "qwen2")
    settings.ROLLWAY_MODEL_ROOTS = [str(models)]
    settings.ROLLWAY_DATA_ROOTS = [str(data)]
    settings.ROLLWAY_SCRATCH_DIR = str(tmp_path / "scratch")
    user = get_user_model().objects.create_user("mira", password=PASSWORD)
    team = Team.objects.create(name="Checkpoints")
    Membership.objects.create(team=team, user=user, role=Membership.Role.ADMIN)
    experiment = Experiment.objects.create(team=team, name="countdown")
    dataset = str(data / "countdown.jsonl")
    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            page = log_in(browser, live_server.url, "mira")
            page.goto(f"{live_server.url}/runs/new/")

            def overrides() -> dict:
                return json.loads(page.input_value("#id_overrides"))

            page.select_option("#id_experiment", str(experiment.pk))
            page.select_option("#id_preset", "sync")
            expect(page.locator("#cfg-task-name")).to_have_value("reverse")
            expect(page.locator("#cfg-task-name-other")).to_be_hidden()
            # The dataset's fields are empty (every preset leaves it unset), defaults shown.
            expect(page.locator("#cfg-task-dataset-path")).to_have_value("")
            expect(page.locator("#cfg-task-dataset-prompt_column")).to_have_attribute("placeholder", "default: prompt")

            # A task name that is not built in: "other", then typed.
            page.select_option("#cfg-task-name", "")
            expect(page.locator("#cfg-task-name-other")).to_be_visible()
            assert overrides() == {}  # nothing typed yet: nothing overridden
            page.fill("#cfg-task-name-other", "my_pkg.tasks:MyTask")
            assert overrides() == {"task": {"name": "my_pkg.tasks:MyTask"}}
            page.click(f"{TASK_NAME} [data-role=reset]")
            expect(page.locator("#cfg-task-name")).to_have_value("reverse")
            expect(page.locator("#cfg-task-name-other")).to_be_hidden()
            assert overrides() == {}

            # A built-in, a model directory and a data file, each from its control.
            page.select_option("#cfg-task-name", "countdown")
            page.select_option("#cfg-model-source", "path")
            page.fill("#cfg-model-path", str(outside))
            page.fill("#cfg-task-dataset-path", str(outside / "countdown.jsonl"))
            page.fill("#cfg-task-dataset-prompt_column", "question")
            page.fill("#cfg-task-dataset-prompt_column", "")  # emptied: back to the default
            page.fill("#cfg-task-dataset-eval_fraction", "0.2")
            page.fill("#cfg-inference-max_new_tokens", "13")
            assert overrides() == {
                "model": {"source": "path", "path": str(outside)},
                "task": {
                    "name": "countdown",
                    "dataset": {"path": str(outside / "countdown.jsonl"), "eval_fraction": 0.2},
                },
                "inference": {"max_new_tokens": 13},
            }

            # Paths outside the allowed roots: each refusal beside its control.
            page.click("#launch-form button[value=launch]")
            for path, setting in [("model.path", "ROLLWAY_MODEL_ROOTS"), ("task.dataset.path", "ROLLWAY_DATA_ROOTS")]:
                error = page.locator(f'.control[data-path="{path}"] .field-error[data-field="{path}"]')
                expect(error).to_be_visible()
                expect(error).to_contain_text("outside the allowed roots")
                expect(error).to_contain_text(setting)
            expect(page.locator("#config-errors")).to_have_count(0)
            expect(page.locator("#cfg-task-name")).to_have_value("countdown")  # the form kept what was chosen

            # Fixed: the run gets exactly what the controls show.
            page.select_option("#id_experiment", str(experiment.pk))
            page.fill("#cfg-model-path", checkpoint)
            page.fill("#cfg-task-dataset-path", dataset)
            page.click("#launch-form button[value=launch]")
            page.wait_for_url(re.compile(r"/runs/\d+/$"))
            run_id = int(re.search(r"/runs/(\d+)/$", page.url).group(1))
        finally:
            browser.close()

    run = Run.objects.get(pk=run_id)
    assert run.overrides == {
        "model": {"source": "path", "path": checkpoint},
        "task": {"name": "countdown", "dataset": {"path": dataset, "eval_fraction": 0.2}},
        "inference": {"max_new_tokens": 13},
    }
    assert run.config["task"]["dataset"] == {
        "path": dataset,
        "prompt_column": "prompt",
        "answer_column": "answer",
        "eval_fraction": 0.2,
        "eval_path": None,
        "subset": None,
        "split": "train",
        "eval_split": None,
        "split_seed": 0,
    }
