"""The run list and a run's phase in Chromium against daphne: the list filters by status
from its form, and the page of a running run shows its phase and a progress bar. The
runs, their points and phase are written to the database directly (no engine needed)."""

from __future__ import annotations

import re
import time

import pytest

from tests.browser import PASSWORD, launch, log_in, skip_without_chromium

pytestmark = [pytest.mark.slow, pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def two_runs(db):
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from runs.actions import do_ensure_demo
    from runs.models import MetricPoint, Run
    from workers.config.presets import build

    user = get_user_model().objects.create_user("lea", password=PASSWORD)
    _, experiment = do_ensure_demo(user, team_name="List")
    config = build("async", {"stop": {"max_steps": 40}}).model_dump(mode="json")
    running = Run.objects.create(
        experiment=experiment,
        name="still going",
        preset="async",
        config=config,
        launched_by=user,
        status=Run.Status.RUNNING,
        started_at=timezone.now(),
        phase="stepping",
        phase_detail="",
        ingest_token="t1",
    )
    done = Run.objects.create(
        experiment=experiment,
        name="all done",
        preset="async",
        config=config,
        launched_by=user,
        status=Run.Status.SUCCEEDED,
        ingest_token="t2",
    )
    t0 = time.time() - 10
    steps = range(1, 11)
    MetricPoint.objects.upsert(running.pk, [("policy/version", k, k, t0 + k) for k in steps])
    MetricPoint.objects.upsert(running.pk, [("reward/mean", k, k / 10, t0 + k) for k in steps])
    return user, running, done


def test_the_list_filters_by_status_and_a_running_run_shows_its_phase_and_progress(stack, two_runs):
    skip_without_chromium()
    from playwright.sync_api import expect, sync_playwright

    user, running, done = two_runs
    # Playwright's sync API runs an event loop in this thread: no ORM calls inside.
    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            page = log_in(browser, stack.url, user.username)

            page.goto(f"{stack.url}/")
            expect(page.locator(f'tr[data-run-id="{done.pk}"]')).to_be_visible()
            page.select_option("#filter-status", "running")
            page.click("#filter-apply")
            expect(page).to_have_url(re.compile(r"status=running"))
            expect(page.locator(f'tr[data-run-id="{running.pk}"]')).to_be_visible()
            expect(page.locator(f'tr[data-run-id="{done.pk}"]')).to_have_count(0)
            row = page.locator(f'tr[data-run-id="{running.pk}"]')
            expect(row.locator("[data-role=phase]")).to_have_text("stepping")
            expect(row.locator("svg.spark")).to_have_count(1)

            row.locator("a").first.click()
            page.wait_for_url(re.compile(rf"/runs/{running.pk}/$"))
            expect(page.locator("#phase-name")).to_have_text("stepping")
            expect(page.locator("#run-progress")).to_be_visible()
            # 10 of 40 steps: a quarter of the bar, and a time left from the step rate.
            expect(page.locator("#run-progress")).to_have_attribute("aria-valuenow", "25")
            expect(page.locator("#progress-text")).to_contain_text("step 10 of 40")
            expect(page.locator("#progress-text")).to_contain_text("left")
        finally:
            browser.close()
