"""A new user's whole path, through the real stack (daphne, a separate Celery worker,
Ray, real torch training, Chromium): write a small real checkpoint under a model root,
point the launch form's controls at it and at the shipped countdown file, launch, watch
the run succeed with a reward at every step, download the exported model and generate
with it through transformers, then replay the run from its page's button and see the
replay's page say it trained the same, step by step. (That GRPO raises the reward is
tests/engine/test_learning.py's to show; this is the path a user's checkpoint and data
take.)"""

from __future__ import annotations

import io
import json
import os
import re
import statistics
import zipfile

import pytest

from tests.browser import PASSWORD, launch, log_in, skip_without_chromium
from tests.integration.stack import REPO, wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(2400),  # two runs, each under RUN_DEADLINE_S, and the stack's start
]

COUNTDOWN_FILE = str(REPO / "data" / "countdown.jsonl")  # data/ is a default data root
# A reward at every step is what is checked, not its rise (test_learning's): a few steps.
STEPS = 4
# What the launch form's controls set: the sync preset, 8 prompts × 8 completions a step,
# the longest countdown solution's 13 tokens (the checkpoint's tokenizer has no merges
# among digits and operators: one token a character).
CONTROLS = {
    "#cfg-trainer-batch_groups": "8",
    "#cfg-trainer-group_size": "8",
    "#cfg-inference-max_new_tokens": "13",
    "#cfg-stop-max_steps": str(STEPS),
}
# One torch thread for each of the run's actors: a replay then repeats the run's rounding
# (at two, MKL may split a matmul differently from one launch to the next).
PLACEMENT = {"cpu_threads": 1}
# The warm start has no controls: typed into the overrides JSON. Clean demonstrations
# teach countdown's format (digits and operators, then EOS), which the exported model is
# checked for; noisy ones (digits and operators replaced at random) leave a policy whose
# rewards spread, so GRPO's groups have something to rank. 150 + 50 steps teach the format
# as well as 300 + 100 did (five prompts answered in digits and operators, then EOS) in
# half the time: 19 s on one thread, alone.
WARM_START = {"steps": 150, "noisy_steps": 50, "batch_size": 32, "label_noise": 0.6}
# How long the run and then its replay may take: the warm start alone took 39 s for 400
# steps here when the machine was idle, and more than 400 s inside a whole suite that kept
# both cores busy (a load average of 7 to 10). A deadline that stops a hung run, not a
# measure of speed.
RUN_DEADLINE_S = 900


@pytest.fixture
def new_user(db):
    from django.contrib.auth import get_user_model

    from runs.actions import do_ensure_demo

    user = get_user_model().objects.create_user("nina", password=PASSWORD)
    _, experiment = do_ensure_demo(user, team_name="Post-training")
    return user, experiment


@pytest.fixture
def checkpoint(stack):
    """A tiny Qwen2 with its BPE tokenizer, under the site's model root (the stack's
    ROLLWAY_HOME/models, ROLLWAY_MODEL_ROOTS' default)."""
    from transformers import AutoTokenizer

    from workers.model.tiny_hf import make_tiny_checkpoint

    directory = make_tiny_checkpoint(str(stack.home / "models" / "tiny-qwen2"), "qwen2")
    # Its BPE is trained on the reverse task's text, but byte-level: every countdown
    # character has a token of its own, so a prompt or solution round-trips.
    tok = AutoTokenizer.from_pretrained(directory)
    for text in ("14 5 8:27=", "(3+4)*2-10/5"):
        assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    return directory


def test_a_new_user_post_trains_a_checkpoint_on_a_dataset_file_and_gets_it_back(
    stack, new_user, checkpoint, tmp_path, show_logs_on_failure
):
    skip_without_chromium()
    from playwright.sync_api import expect, sync_playwright

    from runs.models import MetricPoint, Run

    user, experiment = new_user
    stack.ensure_worker()
    # Playwright's sync API runs an event loop in this thread: no ORM calls inside.
    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            page = log_in(browser, stack.url, user.username)
            page.goto(f"{stack.url}/runs/new/")
            page.select_option("#id_experiment", str(experiment.pk))
            page.select_option("#id_preset", "sync")
            expect(page.locator("#config-controls")).to_be_visible()
            page.select_option("#cfg-model-source", "path")
            page.fill("#cfg-model-path", checkpoint)
            page.select_option("#cfg-task-name", "countdown")
            page.fill("#cfg-task-dataset-path", COUNTDOWN_FILE)
            for selector, value in CONTROLS.items():
                page.fill(selector, value)
            overrides = json.loads(page.input_value("#id_overrides"))
            assert overrides["model"] == {"source": "path", "path": checkpoint}
            assert overrides["task"] == {"name": "countdown", "dataset": {"path": COUNTDOWN_FILE}}
            page.fill("#id_overrides", json.dumps({**overrides, "warm_start": WARM_START, "placement": PLACEMENT}))
            page.click("#launch-form button[value=launch]")
            page.wait_for_url(re.compile(r"/runs/\d+/$"))
            run_id = int(re.search(r"/runs/(\d+)/$", page.url).group(1))

            def finished() -> str:
                text = page.locator("[data-role=status]").inner_text()
                return text if text in ("succeeded", "failed", "cancelled") else ""

            state = wait_for(finished, RUN_DEADLINE_S, "the run to finish", interval_s=1.0)
            assert state == "succeeded", stack.log_tail()

            # The finished run's page draws where every row it drew went (its driver sent
            # the ledger before its final status).
            page.reload()
            ledger = page.locator("#ledger")
            expect(ledger).to_be_visible()
            expect(page.locator("#ledger-verdict")).to_have_text("Every row drawn is accounted for.")
            box = ledger.bounding_box()
            assert box is not None and box["width"] > 0 and box["height"] > 0
            trained = ledger.locator("tr", has_text="trained").locator("td").nth(1).inner_text()

            # The model comes back as the page's Download model link serves it.
            response = page.request.get(f"{stack.url}/api/runs/{run_id}/export")
            assert response.status == 200, response.text()
            archive = response.body()

            # Replayed from the page's button: the child follows the schedule the run
            # recorded, and its page says it trained the same as the original, step by step.
            page.click("#replay-button")
            page.wait_for_url(re.compile(r"/runs/\d+/$"))
            replay_id = int(re.search(r"/runs/(\d+)/$", page.url).group(1))
            assert replay_id != run_id
            state = wait_for(finished, RUN_DEADLINE_S, "the replay to finish", interval_s=1.0)
            assert state == "succeeded", stack.log_tail()
            page.reload()
            verdict = page.locator("#replay-verdict")
            expect(verdict).to_have_text(f"Equal to run #{run_id} at every step of every trained series: bit for bit.")
            table = page.locator("#replay-comparison")
            expect(table.locator("tr", has_text="loss").locator("td").nth(1)).to_have_text(str(STEPS))
            box = table.bounding_box()
            assert box is not None and box["width"] > 0 and box["height"] > 0
        finally:
            browser.close()

    run = Run.objects.get(pk=run_id)
    assert run.status == Run.Status.SUCCEEDED, run.error
    assert run.config["model"]["path"] == checkpoint
    assert run.config["task"]["dataset"]["path"] == COUNTDOWN_FILE

    rewards = [
        value
        for _, value in MetricPoint.objects.filter(run_id=run_id, series="reward/mean")
        .order_by("step")
        .values_list("step", "value")
    ]
    assert len(rewards) == STEPS, rewards
    assert int(trained) == STEPS * run.config["trainer"]["batch_groups"]
    print(f"reward: first step {rewards[0]:.4f}, last {rewards[-1]:.4f}, mean {statistics.mean(rewards):.4f}")

    with zipfile.ZipFile(io.BytesIO(archive)) as zf:
        zf.extractall(tmp_path)
    exported = str(tmp_path / f"run-{run_id}-model")
    assert os.path.exists(os.path.join(exported, "model.safetensors"))

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(exported)
    tok = AutoTokenizer.from_pretrained(exported)
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "14 5 8:27="}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        out = model.generate(**prompt, max_new_tokens=13, do_sample=False, pad_token_id=tok.pad_token_id)
    completion = tok.decode(out[0, prompt["input_ids"].shape[1] :], skip_special_tokens=True)
    print(f"the exported model answers 14 5 8:27= with {completion!r}")
    # Trained on countdown's format: digits and operators, stopped by EOS.
    assert completion and set(completion) <= set("0123456789+-*/() "), completion
    assert tok.eos_token_id in out[0, prompt["input_ids"].shape[1] :].tolist(), "no EOS within 13 tokens"
