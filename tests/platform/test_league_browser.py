"""The league table in Debian's Chromium (driven by Playwright) against Django's live
server: a comparison of every built-in preset, one finished run each and its simulated
runs at every scale; every preset's row is drawn, each cell a link, the best cell of a
column marked, and a click on a column's name sorts the rows by it."""

from __future__ import annotations

import pytest

from compare import league
from compare.models import Comparison, ComparisonRun
from runs.models import Experiment, MetricPoint, Run
from teams.models import Membership, Team
from tests.browser import PASSWORD, launch, log_in, skip_without_chromium
from workers.config.presets import PRESETS, build

pytestmark = [pytest.mark.slow, pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def seed_league(user) -> Comparison:
    """Every preset, one run each: preset k measured at k + 1 samples/s."""
    team = Team.objects.create(name="League")
    Membership.objects.create(team=team, user=user, role=Membership.Role.ADMIN)
    experiment = Experiment.objects.create(team=team, name="styles")
    comparison = Comparison.objects.create(
        team=team, experiment=experiment, name="every style", configurations=list(PRESETS), seeds=[0]
    )
    for k, name in enumerate(PRESETS):
        run = Run.objects.create(
            experiment=experiment,
            name=name,
            preset=name,
            config=build(name).model_dump(mode="json"),
            status=Run.Status.SUCCEEDED,
        )
        points = [("samples/per_s", s, k + 1.0, 1000.0 + s) for s in (1, 2)]
        points += [("staleness/mean", s, 0.5, 1000.0 + s) for s in (1, 2)]
        MetricPoint.objects.upsert(run.pk, points)
        ComparisonRun.objects.create(comparison=comparison, run=run, configuration=name)
    made, errors = league.simulate_all(user, comparison)
    assert not errors and len(made) == len(PRESETS) * len(league.SCALES)
    return comparison


def test_the_league_draws_every_preset_and_sorts_by_a_column(live_server):
    skip_without_chromium()
    from django.contrib.auth import get_user_model
    from playwright.sync_api import expect, sync_playwright

    user = get_user_model().objects.create_user("lena", password=PASSWORD)
    comparison = seed_league(user)
    runs = {r.preset: r.pk for r in comparison.runs.all()}
    # Playwright's sync API runs an event loop in this thread: no ORM calls inside.
    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            page = log_in(browser, live_server.url, "lena")
            page.goto(f"{live_server.url}/comparisons/{comparison.pk}/")
            page.click("#league-link")
            page.wait_for_url(f"**/comparisons/{comparison.pk}/league/")
            table = page.locator("#league-table")
            expect(table).to_be_visible()
            rows = page.locator("#league-table tbody tr")
            assert rows.count() == len(PRESETS)
            table_box = table.bounding_box()
            tops = []
            for k, name in enumerate(PRESETS):
                row = page.locator(f'#league-table tr[data-configuration="{name}"]')
                expect(row).to_be_visible()
                box = row.bounding_box()
                assert box["height"] > 10 and table_box["y"] <= box["y"] < table_box["y"] + table_box["height"]
                tops.append(box["y"])
                cell = row.locator('td[data-key="samples_per_s"] a')
                assert cell.inner_text() == f"{k + 1:.3g}"
                assert cell.get_attribute("href") == f"/compare/?runs={runs[name]}"
                for scale in league.SCALES:  # every simulated cell drawn with its number and link
                    simulated = row.locator(f'td[data-key="{scale.key}:samples_per_s"] a')
                    assert simulated.inner_text() != "—"
                    assert simulated.get_attribute("href").startswith("/runs/")
            assert tops == sorted(tops) and len(set(tops)) == len(tops)  # one row under another
            # The best samples/s (the last preset's) is marked, and shows it.
            best = page.locator(
                f'#league-table tr[data-configuration="{list(PRESETS)[-1]}"] td[data-key="samples_per_s"]'
            )
            assert "best" in best.get_attribute("class")
            assert best.evaluate("e => getComputedStyle(e).backgroundColor") == "rgb(236, 253, 245)"
            # A row that approximates its library says how, on the page.
            expect(page.locator('tr[data-configuration="prime-rl"] td.approximates')).to_contain_text(
                "Approximates: PRIME-RL masks a token"
            )

            # Sorting by samples/s: the highest first; a second click, the lowest first.
            header = page.locator("#league-table button.sort", has_text="samples/s").first
            header.click()
            first = rows.first
            expect(first).to_have_attribute("data-configuration", list(PRESETS)[-1])
            assert page.locator("#league-table th[aria-sort='descending']").count() == 1
            first_box = first.bounding_box()
            assert first_box["y"] == min(rows.nth(i).bounding_box()["y"] for i in range(rows.count()))
            header.click()
            expect(rows.first).to_have_attribute("data-configuration", list(PRESETS)[0])
        finally:
            browser.close()
