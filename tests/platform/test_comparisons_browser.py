"""The new-comparison form in Debian's Chromium (driven by Playwright) against Django's
live server: 2 configurations × 2 seeds launched from the form land on the
comparison's compare page, which shows its 4 runs."""

from __future__ import annotations

import re

import pytest

from compare.models import Comparison
from runs.models import Experiment, Run
from teams.models import Membership, Team
from tests.browser import PASSWORD, launch, log_in, skip_without_chromium

pytestmark = [pytest.mark.slow, pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_comparison_launched_from_the_form_lands_on_its_compare_page_with_4_runs(live_server):
    skip_without_chromium()
    from django.contrib.auth import get_user_model
    from playwright.sync_api import expect, sync_playwright

    user = get_user_model().objects.create_user("cleo", password=PASSWORD)
    team = Team.objects.create(name="Sweeps")
    Membership.objects.create(team=team, user=user, role=Membership.Role.ADMIN)
    experiment = Experiment.objects.create(team=team, name="modes")
    # Playwright's sync API runs an event loop in this thread: no ORM calls inside.
    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            page = log_in(browser, live_server.url, "cleo")

            page.click("nav >> text=Comparisons")
            page.click("#new-comparison")
            page.select_option("#id_target", str(experiment.pk))
            page.fill("#id_name", "async vs sync")
            page.check('#configurations input[value="async"]')
            page.check('#configurations input[value="sync"]')
            page.fill("#id_seeds", "3, 4")
            page.fill("#id_overrides", '{"stop": {"max_steps": 20}}')
            page.click("#launch-comparison")

            expect(page).to_have_url(re.compile(r"/comparisons/\d+/"))
            expect(page.locator("h1")).to_contain_text("Compare 4 runs")
            expect(page.locator('#compare p.muted a[href^="/runs/"]')).to_have_count(4)
            expect(page.locator("#summary-table tr")).not_to_have_count(0)
            comparison_path = re.search(r"/comparisons/\d+/", page.url).group(0)
            shown = page.locator("#compare").get_attribute("data-runs")
        finally:
            browser.close()

    comparison = Comparison.objects.get(name="async vs sync")
    assert comparison.get_absolute_url() == comparison_path
    runs = Run.objects.filter(pk__in=comparison.run_ids())
    assert shown == ",".join(str(pk) for pk in comparison.run_ids())
    assert sorted((r.preset, r.config["seed"], r.config["stop"]["max_steps"]) for r in runs) == [
        ("async", 3, 20),
        ("async", 4, 20),
        ("sync", 3, 20),
        ("sync", 4, 20),
    ]
    assert all(r.status == Run.Status.QUEUED for r in runs)
