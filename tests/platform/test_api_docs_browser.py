"""The API's Swagger page in Debian's Chromium (driven by Playwright): signed in, /api/docs
draws every tagged group and operation from /api/openapi.json under the site's own
Content-Security-Policy, with not one violation, and "Try it out" calls the API with
the session."""

from __future__ import annotations

import pytest

from teams.models import Membership, Team
from tests.browser import PASSWORD, launch, log_in, skip_without_chromium
from tests.platform.test_security_browser import violations, watch

pytestmark = [pytest.mark.slow, pytest.mark.browser, pytest.mark.django_db(transaction=True)]

TAGS = ("runs", "metrics", "presets", "configs", "comparisons", "experiments", "teams", "tokens", "exports")


def test_the_docs_page_lists_the_operations_under_the_policy(live_server):
    skip_without_chromium()
    from django.contrib.auth import get_user_model
    from playwright.sync_api import expect, sync_playwright

    user = get_user_model().objects.create_user("dora", password=PASSWORD)
    Membership.objects.create(team=Team.objects.create(name="Docs"), user=user, role=Membership.Role.ADMIN)
    # Playwright's sync API runs an event loop in this thread: no ORM calls inside.
    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            page = log_in(browser, live_server.url, "dora")
            console = watch(page)
            page.goto(f"{live_server.url}/api/docs")
            expect(page.locator(".swagger-ui .info .title")).to_contain_text("Rollway API")
            for tag in TAGS:
                expect(page.locator(f'.opblock-tag[data-tag="{tag}"]')).to_be_visible()
            operations = page.locator(".opblock")
            expect(operations.first).to_be_visible()
            assert operations.count() >= 20
            paths = set(page.locator(".opblock-summary-path").all_inner_texts())
            assert {"/api/runs", "/api/runs/{run_id}/metrics", "/api/tokens"} <= {
                p.replace("\u200b", "") for p in paths
            }

            presets = page.locator("#operations-presets-api_views_list_presets")
            presets.locator(".opblock-summary").click()
            presets.locator("button.try-out__btn").click()
            presets.locator("button.execute").click()
            status = presets.locator(".live-responses-table tbody .response-col_status").first
            expect(status).to_have_text("200", timeout=30_000)
            assert violations(page, console) == []
        finally:
            browser.close()
