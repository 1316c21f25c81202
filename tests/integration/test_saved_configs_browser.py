"""Saved configurations in Chromium against daphne: save the launch form's preset and
overrides as a team configuration, find it in the preset selector's team group, and
launch from it. The test checks the run the launch stores, then cancels it."""

from __future__ import annotations

import json
import re

import pytest

from tests.browser import PASSWORD, launch, log_in, skip_without_chromium
from tests.integration.helpers import status
from tests.integration.stack import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.browser, pytest.mark.django_db(transaction=True)]

OVERRIDES = {"buffer": {"capacity": 3}, "stop": {"max_steps": 7}}


@pytest.fixture
def member(db):
    from django.contrib.auth import get_user_model

    from runs.actions import do_ensure_demo

    user = get_user_model().objects.create_user("cora", password=PASSWORD)
    _, experiment = do_ensure_demo(user, team_name="Configs")
    return user, experiment


def test_a_user_saves_a_configuration_from_the_launch_form_and_launches_from_it(stack, member):
    skip_without_chromium()
    from playwright.sync_api import expect, sync_playwright

    user, experiment = member
    # Playwright's sync API runs an event loop in this thread: no ORM calls inside.
    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            page = log_in(browser, stack.url, user.username)

            page.goto(f"{stack.url}/runs/new/")
            page.select_option("#id_experiment", str(experiment.pk))
            page.select_option("#id_preset", "sync")
            page.fill("#id_overrides", json.dumps(OVERRIDES))
            page.click("#save-config summary")
            page.fill("#id_config_name", "sync, capacity 3")
            page.fill("#id_config_description", "sync with three batches of room")
            page.click("#save-config-button")
            page.wait_for_url(re.compile(r"/runs/new/\?preset=saved:\d+$"))
            saved_id = int(re.search(r"saved:(\d+)$", page.url).group(1))

            group = page.locator('#id_preset optgroup[label="Configs configurations"]')
            expect(group.locator("option")).to_have_text(["sync, capacity 3 v1"])
            expect(page.locator("#id_preset")).to_have_value(f"saved:{saved_id}")
            expect(page.locator(f'p.preset-description[data-preset="saved:{saved_id}"]')).to_have_text(
                "sync with three batches of room"
            )
            expect(page.locator('#id_preset optgroup[label="Built-in presets"] option[value="async"]')).to_have_count(1)

            page.select_option("#id_experiment", str(experiment.pk))
            page.fill("#id_overrides", "{}")
            page.click("#launch-form button[value=launch]")
            page.wait_for_url(re.compile(r"/runs/\d+/$"))
            run_id = int(re.search(r"/runs/(\d+)/$", page.url).group(1))
        finally:
            browser.close()

    from configs.models import SavedConfig
    from runs.models import Run
    from workers.config.presets import build

    saved = SavedConfig.objects.get(pk=saved_id)
    assert (saved.team, saved.base_preset, saved.overrides, saved.version) == (experiment.team, "sync", OVERRIDES, 1)
    run = Run.objects.get(pk=run_id)
    assert run.saved_config == saved
    assert run.config == build("sync", OVERRIDES).model_dump(mode="json")
    # The launch queued it for a Celery worker, which the session may already hold (an
    # earlier test's): cancelled as its user would, through a worker, and waited for, so
    # that it does not train on beside the tests that follow.
    from runs.actions import do_cancel_run

    stack.ensure_worker()
    assert do_cancel_run(user, run)
    wait_for(lambda: status(run) in Run.TERMINAL, 120, f"run {run.pk} to be cancelled")
    assert run.status == Run.Status.CANCELLED, f"run {run.pk} {run.status}: {run.error}"
