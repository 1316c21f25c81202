"""The compare page in Debian's Chromium (driven by Playwright) against Django's live
server: 2 configurations × 2 seeds with stored points; the charts draw (each as it comes
into view), the config table's diff-only toggle and pinned baseline work, the summary
CSV the page links to carries the numbers the stored points give, and while the runs
run the charts grow without a reload."""

from __future__ import annotations

import csv
import io
from statistics import fmean

import pytest

from runs.models import Experiment, MetricPoint, Run
from teams.models import Membership, Team
from tests.browser import PASSWORD, launch, log_in, skip_without_chromium
from workers.config.presets import build

pytestmark = [pytest.mark.slow, pytest.mark.browser, pytest.mark.django_db(transaction=True)]

T0 = 1_700_000_000.0
BUDGET = 30.0


def seed_runs(user) -> tuple[list[Run], dict[str, float]]:
    """Four finished runs and, per configuration label, the mean over its seeds of the
    reward at BUDGET seconds, computed here from the points themselves."""
    team = Team.objects.create(name="Compare")
    Membership.objects.create(team=team, user=user, role=Membership.Role.ADMIN)
    experiment = Experiment.objects.create(team=team, name="lr sweep")
    runs, want = [], {}
    for lr in (1e-5, 3e-5):
        rewards = []
        for seed in (1, 2):
            config = build("async").model_dump(mode="json")
            config["seed"] = seed
            config["trainer"]["lr"] = lr
            run = Run.objects.create(
                experiment=experiment,
                name=f"lr {lr} seed {seed}",
                preset="async",
                overrides={"trainer": {"lr": lr}, "seed": seed},
                config=config,
                status=Run.Status.SUCCEEDED,
            )
            slope = lr * 1e4 / 10
            points = [("reward/mean", s, slope * s + 0.01 * seed, T0 + 2.0 * s) for s in range(50)]
            points += [("staleness/mean", s, 0.5 * seed + (s % 3), T0 + 2.0 * s) for s in range(50)]
            # the behaviour-trainer mismatch grows with the step size: c1's is the lower
            points += [("mismatch/kl", s, 100 * lr + 1e-4 * seed, T0 + 2.0 * s) for s in range(50)]
            points += [("is/ratio_mean", s, 1 - 1000 * lr, T0 + 2.0 * s) for s in range(50)]
            MetricPoint.objects.upsert(run.pk, points)
            within = [v for name, _step, v, t in points if name == "reward/mean" and t - T0 <= BUDGET]
            rewards.append(within[-1])
            runs.append(run)
        want[f"async (trainer.lr={lr})"] = fmean(rewards)
    return runs, want


def test_the_compare_page_draws_toggles_pins_and_exports(live_server):
    skip_without_chromium()
    from django.contrib.auth import get_user_model
    from playwright.sync_api import expect, sync_playwright

    user = get_user_model().objects.create_user("cora", password=PASSWORD)
    runs, want = seed_runs(user)
    ids = ",".join(str(r.pk) for r in runs)
    # Playwright's sync API runs an event loop in this thread: no ORM calls inside.
    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            page = log_in(browser, live_server.url, "cora")

            page.goto(f"{live_server.url}/compare/?runs={ids}&budget={BUDGET:g}")
            reward = page.locator('[data-metric="reward/mean"]')
            expect(reward).to_have_attribute("data-traces", "6")  # 2 configurations × (band low, high, mean)
            assert int(reward.get_attribute("data-points")) == 2 * 3 * 50
            assert page.locator("#charts .chart").count() >= 30  # every metric of the vocabulary
            assert page.locator('[data-metric="reward/mean"] .main-svg').count() > 0
            # a chart far below the fold has not asked for its series yet; scrolled to, it does
            last = page.locator("#charts .chart").last
            expect(last).to_have_attribute("data-state", "waiting")
            last.scroll_into_view_if_needed()
            expect(last).to_have_attribute("data-state", "drawn")

            rows = page.locator("#config-table tr[data-key]")
            total = rows.count()
            page.check("#diff-only")
            visible = page.locator("#config-table tr[data-key]:not([hidden])")
            expect(visible).to_have_count(1)
            assert visible.first.get_attribute("data-key") == "trainer.lr"
            assert total > 10
            assert "diff=1" in page.url

            page.select_option("#baseline", "c2")
            first_column = page.locator("#config-table tr:first-child th[data-configuration]").first
            expect(first_column).to_have_attribute("data-configuration", "c2")
            lr_cells = page.locator('#config-table tr[data-key="trainer.lr"] td')
            expect(lr_cells.nth(1)).to_contain_text("-2")  # 1e-5 shown as its difference from 3e-5
            assert "baseline=c2" in page.url

            # the summary table draws the mismatch per configuration, ★ on the lower KL and the
            # IS ratio nearer 1 (1e-5: KL 1e-3 + 1.5e-4 over seeds, ratio 0.99; 3e-5: 3.15e-3, 0.97)
            kl = page.locator('#summary-table tr[data-configuration="c1"] td[data-column="mismatch_kl"]')
            expect(kl).to_have_text("0.001150 ± 5.000e-5 ★")
            assert float(kl.get_attribute("data-mean")) == pytest.approx(1.15e-3)
            other = page.locator('#summary-table tr[data-configuration="c2"] td[data-column="mismatch_kl"]')
            expect(other).to_have_text("0.003150 ± 5.000e-5")
            ratio = page.locator('#summary-table tr[data-configuration="c1"] td[data-column="is_ratio_mean"]')
            expect(ratio).to_have_text("0.9900 ± 0 ★")
            expect(page.locator('#summary-table th[data-column="is_ratio_mean"]')).to_have_text("IS ratio mean → 1")
            no_routing = page.locator('#summary-table tr[data-configuration="c1"] td[data-column="routing_agreement"]')
            expect(no_routing).to_have_text("—")

            href = page.get_attribute("#export-summary-csv", "href")
            exported = page.request.get(live_server.url + href).text()
            page.reload()  # the URL alone restores the view
            expect(page.locator("#diff-only")).to_be_checked()
            expect(page.locator("#baseline")).to_have_value("c2")
        finally:
            browser.close()

    got = {
        row["label"]: float(row["mean"])
        for row in csv.DictReader(io.StringIO(exported))
        if row["column"] == "reward_at_budget"
    }
    assert got == pytest.approx(want)


def test_the_compare_page_grows_while_runs_run_without_reloading(live_server):
    skip_without_chromium()
    import threading

    from django.contrib.auth import get_user_model
    from playwright.sync_api import expect, sync_playwright

    user = get_user_model().objects.create_user("cyd", password=PASSWORD)
    runs, _ = seed_runs(user)
    Run.objects.filter(pk__in=[r.pk for r in runs]).update(status=Run.Status.RUNNING)
    ids = ",".join(str(r.pk) for r in runs)

    def more_points():  # the engine reporting 10 more steps per run, from another thread
        from django.db import connection

        for run in runs:
            MetricPoint.objects.upsert(run.pk, [("reward/mean", s, 0.5, T0 + 2.0 * s) for s in range(50, 60)])
        connection.close()

    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            page = log_in(browser, live_server.url, "cyd")
            page.goto(f"{live_server.url}/compare/?runs={ids}")
            reward = page.locator('[data-metric="reward/mean"]')
            expect(reward).to_have_attribute("data-points", str(2 * 3 * 50))
            expect(page.locator("#live-state")).to_have_attribute("data-state", "live")
            page.evaluate("() => { window.__sameDocument = true; }")
            writer = threading.Thread(target=more_points)
            writer.start()
            writer.join()
            # the next poll redraws the loaded charts with the new steps: 60 per band line
            expect(reward).to_have_attribute("data-points", str(2 * 3 * 60), timeout=20_000)
            assert page.evaluate("() => window.__sameDocument === true"), "the page reloaded"
        finally:
            browser.close()
