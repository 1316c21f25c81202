"""The Teams page in Debian's Chromium (driven by Playwright) against Django's live
server: a site admin creates a team from its form, adds a colleague by email as a
viewer, makes them a member, is refused demoting themselves (the team's last admin)
with the message drawn on the page, and removes the colleague."""

from __future__ import annotations

import pytest

from teams.models import AuditEvent, Team
from tests.browser import PASSWORD, launch, log_in, skip_without_chromium

pytestmark = [pytest.mark.slow, pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_site_admin_creates_a_team_and_manages_its_members_on_the_page(live_server):
    skip_without_chromium()
    from django.contrib.auth import get_user_model
    from playwright.sync_api import expect, sync_playwright

    make = get_user_model().objects.create_user
    make("sam", password=PASSWORD, is_staff=True)
    make("nina", password=PASSWORD, email="nina@example.org")
    # Playwright's sync API runs an event loop in this thread: no ORM calls inside.
    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            page = log_in(browser, live_server.url, "sam")
            page.goto(f"{live_server.url}/teams/")
            expect(page.locator("main, body").first).to_contain_text("You are in no team yet")

            form = page.locator("form.new-team")
            form.locator('input[name="name"]').fill("Robotics Lab")
            form.locator("button[type=submit]").click()
            section = page.locator('section.team[data-team="robotics-lab"]')
            expect(section.locator("h2")).to_contain_text("Robotics Lab (you: admin)")
            expect(page.locator(".messages")).to_contain_text("Created team Robotics Lab (robotics-lab)")

            add = section.locator("form.add-member")
            add.locator('input[name="username"]').fill("nina@example.org")
            add.locator('select[name="role"]').select_option("viewer")
            add.locator("button[type=submit]").click()
            row = page.locator('section.team[data-team="robotics-lab"] tr[data-username="nina"]')
            expect(row.locator("select")).to_have_value("viewer")

            row.locator("select").select_option("member")
            row.locator("text=Set").click()
            expect(page.locator(".messages")).to_contain_text("Set nina as member in Robotics Lab.")
            expect(row.locator("select")).to_have_value("member")

            mine = page.locator('section.team[data-team="robotics-lab"] tr[data-username="sam"]')
            mine.locator("select").select_option("viewer")
            mine.locator("text=Set").click()
            expect(page.locator(".messages")).to_contain_text("sam is team robotics-lab's last admin")
            expect(mine.locator("select")).to_have_value("admin")

            row.locator("text=Remove").click()
            expect(page.locator(".messages")).to_contain_text("Removed nina from Robotics Lab.")
            expect(row).to_have_count(0)
            audit = [page.locator("table.audit tbody tr").nth(i).locator("td").nth(2).inner_text() for i in range(4)]
        finally:
            browser.close()

    assert audit == ["removed member", "changed role", "added member", "created team"]
    team = Team.objects.get(slug="robotics-lab")
    assert list(team.memberships.values_list("user__username", "role")) == [("sam", "admin")]
    assert AuditEvent.objects.filter(team=team).count() == 4
