"""The whole site from a user's chair: real Chromium (Debian's build, driven by
Playwright) against daphne, with a separate Celery worker and a Ray head behind it.

Log in, launch a run from the form, watch a chart gain points without reloading the
page, cancel, see "cancelled".
"""

from __future__ import annotations

import json
import re

import pytest

from tests.browser import PASSWORD, launch, log_in, skip_without_chromium, wait_for_value
from tests.integration.helpers import waiting_on_tools

pytestmark = [pytest.mark.slow, pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# A tiny run that goes on until it is cancelled (or for 5 minutes), a step every few
# seconds while the browser starts and watches.
RUN = waiting_on_tools(max_steps=10_000, max_minutes=5)
TOTAL_POINTS_JS = """() => [...document.querySelectorAll('.chart')]
    .reduce((n, el) => n + Number(el.dataset.points || 0), 0)"""


@pytest.fixture
def browser_user(db):
    from django.contrib.auth import get_user_model

    from runs.actions import do_ensure_demo

    user = get_user_model().objects.create_user("bea", password=PASSWORD)
    _, experiment = do_ensure_demo(user, team_name="Browser")
    return user, experiment


def test_a_user_launches_a_run_watches_it_live_and_cancels_it(stack, browser_user, show_logs_on_failure):
    skip_without_chromium()
    from playwright.sync_api import expect, sync_playwright

    user, experiment = browser_user
    stack.ensure_worker()
    # Playwright's sync API runs an event loop in this thread: no ORM calls inside.
    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            page = log_in(browser, stack.url, user.username)

            page.goto(f"{stack.url}/runs/new/")
            page.select_option("#id_experiment", str(experiment.pk))
            page.select_option("#id_preset", "async")
            page.fill("#id_overrides", json.dumps(RUN))
            page.click("#launch-form button[type=submit]")
            page.wait_for_url(re.compile(r"/runs/\d+/$"))
            run_id = int(re.search(r"/runs/(\d+)/$", page.url).group(1))

            page.evaluate("() => { window.__sameDocument = true; }")
            first = wait_for_value(page, TOTAL_POINTS_JS, lambda n: n > 0, timeout_s=300)
            later = wait_for_value(page, TOTAL_POINTS_JS, lambda n: n > first, timeout_s=120)
            assert later > first
            assert page.evaluate("() => window.__sameDocument === true"), "the page reloaded"
            expect(page.locator("[data-role=status]")).to_have_text("running")

            page.click("#cancel-button")
            expect(page.locator("[data-role=status]")).to_have_text("cancelled", timeout=60_000)
        finally:
            browser.close()

    from runs.models import Run

    assert Run.objects.get(pk=run_id).status == Run.Status.CANCELLED
