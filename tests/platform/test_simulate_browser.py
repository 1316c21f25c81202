"""Simulate in Debian's Chromium (driven by Playwright) against Django's live server: the
launch form's Simulate button beside Launch, the run it makes, and its "simulated" mark
as drawn — visible, inside its row, heading or run list, clear of the text beside it — on
the run list, the run page and a compare page that mixes it with a real run."""

from __future__ import annotations

import pytest

from runs.models import Experiment, MetricPoint, Run
from teams.models import Membership, Team
from tests.browser import PASSWORD, launch, log_in, skip_without_chromium
from workers.config.presets import build

pytestmark = [pytest.mark.slow, pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def inside(inner: dict, outer: dict) -> bool:
    return (
        inner["x"] >= outer["x"] - 0.5
        and inner["y"] >= outer["y"] - 0.5
        and inner["x"] + inner["width"] <= outer["x"] + outer["width"] + 0.5
        and inner["y"] + inner["height"] <= outer["y"] + outer["height"] + 0.5
    )


def apart(a: dict, b: dict) -> bool:
    """The boxes do not overlap (side by side, or one wrapped under the other)."""
    return (
        a["x"] + a["width"] <= b["x"] + 0.5
        or b["x"] + b["width"] <= a["x"] + 0.5
        or a["y"] + a["height"] <= b["y"] + 0.5
        or b["y"] + b["height"] <= a["y"] + 0.5
    )


def test_simulate_makes_a_run_marked_simulated_on_every_page_that_shows_it(live_server):
    skip_without_chromium()
    from django.contrib.auth import get_user_model
    from playwright.sync_api import expect, sync_playwright

    user = get_user_model().objects.create_user("sima", password=PASSWORD)
    team = Team.objects.create(name="Sims")
    Membership.objects.create(team=team, user=user, role=Membership.Role.MEMBER)
    experiment = Experiment.objects.create(team=team, name="what if")
    real = Run.objects.create(
        experiment=experiment,
        name="real async",
        preset="async",
        config=build("async", {}).model_dump(mode="json"),
        status=Run.Status.SUCCEEDED,
        launched_by=user,
    )
    MetricPoint.objects.upsert(real.pk, [("samples/per_s", s, 1.0 + s, 1.7e9 + s) for s in range(1, 11)])
    # Playwright's sync API runs an event loop in this thread: no ORM calls inside.
    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            page = log_in(browser, live_server.url, "sima")
            page.set_viewport_size({"width": 1280, "height": 1000})
            page.goto(f"{live_server.url}/runs/new/")
            page.select_option("#id_experiment", str(experiment.pk))
            page.select_option("#id_preset", "async")
            # Simulate sits beside Launch: same row, to its right.
            launch_box = page.locator("#launch-button").bounding_box()
            sim_box = page.locator("#simulate-button").bounding_box()
            assert launch_box and sim_box
            assert abs(sim_box["y"] - launch_box["y"]) < 2 and sim_box["x"] > launch_box["x"] + launch_box["width"]
            expect(page.locator("#simulate-fields")).to_be_visible()

            # A refused field comes back beside itself, and nothing is made.
            page.fill("#id_cluster_gpus", "0")
            page.click("#simulate-button")
            expect(page.locator('.field-error[data-field="cluster.gpus"]')).to_be_visible()
            page.fill("#id_name", "async on 32")
            page.fill("#id_cluster_gpus", "32")
            page.fill("#id_workload_median_tokens", "1024")
            page.fill("#id_workload_p90_tokens", "4096")
            page.fill("#id_steps", "10")
            page.click("#simulate-button")
            page.wait_for_url(f"{live_server.url}/runs/*/")
            sim_id = int(page.url.rstrip("/").rsplit("/", 1)[1])

            # The run page: the mark in the heading, after the name; the note; a chart drawn.
            mark = page.locator("#simulated-mark")
            expect(mark).to_be_visible()
            expect(mark).to_have_text("simulated")
            box, heading = mark.bounding_box(), page.locator("h1").bounding_box()
            assert box and heading and box["width"] > 20 and box["height"] > 8 and inside(box, heading)
            expect(page.locator("#simulation-note")).to_contain_text("32 × H100")
            # What the run says about itself: the pool that bounds it, and the knob.
            advice = page.locator("#simulation-advice li").first
            expect(advice).to_be_visible()
            expect(advice).to_contain_text("bounds this run")
            said = advice.inner_text()  # which pool: checked against the run's figures below
            advice_box = advice.bounding_box()
            assert advice_box and advice_box["height"] > 8 and advice_box["width"] > 100
            expect(page.locator(".status")).to_have_text("succeeded")

            # The run list: one mark, in the simulated run's row only, clear of its name.
            page.goto(f"{live_server.url}/")
            row = page.locator(f'tr[data-run-id="{sim_id}"]')
            expect(row.locator(".simulated-mark")).to_be_visible()
            expect(page.locator(f'tr[data-run-id="{real.pk}"] .simulated-mark')).to_have_count(0)
            mark_box = row.locator(".simulated-mark").bounding_box()
            name_box = row.locator("td a").first.bounding_box()
            cell_box = row.locator("td").nth(2).bounding_box()
            assert mark_box and name_box and cell_box
            assert inside(mark_box, cell_box) and apart(mark_box, name_box)

            # The compare page mixes both: the simulated one marked, the chart drawn from both.
            page.goto(f"{live_server.url}/compare/?runs={real.pk},{sim_id}")
            expect(page.locator(f'.simulated-mark[data-run="{sim_id}"]')).to_be_visible()
            expect(page.locator(f'.simulated-mark[data-run="{real.pk}"]')).to_have_count(0)
            chart = page.locator('[data-metric="samples/per_s"]')
            chart.scroll_into_view_if_needed()
            expect(chart).to_have_attribute("data-state", "drawn")
            # Same preset, yet two configurations: a simulated run is never a seed of a real one.
            assert chart.locator(".scatterlayer .trace").count() == 2
            expect(page.locator("#summary-table th", has_text="[simulated]")).to_have_count(1)
            expect(chart.locator(".legend", has_text="[simulated]")).to_be_visible()

            # Plan: beside Simulate; it opens the best setting's run, whose table ranks
            # the settings tried (the chosen one first, marked) and links the run as given.
            page.goto(f"{live_server.url}/runs/new/")
            page.select_option("#id_experiment", str(experiment.pk))
            page.select_option("#id_preset", "async")
            plan_box = page.locator("#plan-button").bounding_box()
            sim_box = page.locator("#simulate-button").bounding_box()
            assert plan_box and sim_box and abs(plan_box["y"] - sim_box["y"]) < 2
            assert plan_box["x"] >= sim_box["x"] + sim_box["width"]
            page.fill("#id_name", "planned 7B")
            page.fill("#id_steps", "30")
            page.click("#plan-button")
            page.wait_for_url(f"{live_server.url}/runs/*/")
            planned_id = int(page.url.rstrip("/").rsplit("/", 1)[1])
            table = page.locator("#simulation-plan table")
            table.scroll_into_view_if_needed()
            expect(table).to_be_visible()
            chosen = table.locator("tbody tr.chosen")
            expect(chosen).to_have_count(1)
            rows = table.locator("tbody tr")
            assert rows.count() == 10
            first, second = rows.nth(0).bounding_box(), rows.nth(1).bounding_box()
            assert first and second and first["height"] > 8 and second["y"] >= first["y"] + first["height"] - 0.5
            weights = [rows.nth(i).locator("td").first.evaluate("e => getComputedStyle(e).fontWeight") for i in (0, 1)]
            assert int(weights[0]) > int(weights[1])  # the chosen setting stands out
            # The search loosened the staleness bound here: the page says what that hides.
            caveat = page.locator("#plan-staleness")
            expect(caveat).to_be_visible()
            expect(caveat).to_contain_text("raises buffer.max_staleness from 1 to ")
            assert caveat.evaluate("e => getComputedStyle(e).backgroundColor") not in ("", "rgba(0, 0, 0, 0)")
            caveat_box = caveat.bounding_box()
            assert caveat_box and caveat_box["height"] > 8 and caveat_box["y"] < table.bounding_box()["y"]
            # Every other row is one click from its own simulated run: the chosen row is
            # this run, the next one's button simulates it and opens its page.
            expect(chosen.locator("td").last).to_have_text("this run")
            button = rows.nth(1).locator(".plan-row-form button")
            expect(button).to_be_visible()
            button_box = button.bounding_box()
            assert button_box and button_box["height"] > 8 and button_box["width"] > 20
            button.click()
            page.wait_for_url(f"{live_server.url}/runs/*/")
            row_id = int(page.url.rstrip("/").rsplit("/", 1)[1])
            assert row_id not in (planned_id,)
            expect(page.locator("#simulation-note")).to_be_visible()
            expect(page.locator(".messages", has_text=f"Row 2 of run #{planned_id}")).to_be_visible()
            page.go_back()
            page.reload()
            expect(page.locator("#simulation-plan tbody tr").nth(1).locator("a.plan-row-run")).to_have_text(
                f"run #{row_id}"
            )
            page.click("#plan-baseline")
            page.wait_for_url(f"{live_server.url}/runs/*/")
            baseline_id = int(page.url.rstrip("/").rsplit("/", 1)[1])
            expect(page.locator("#simulation-note")).to_be_visible()
            expect(page.locator("#simulation-plan")).to_have_count(0)
            # The default split of a 7B model on 64 GPUs: its page names the starving pool
            # and the knob that feeds it.
            baseline_advice = page.locator("#simulation-advice li").first
            expect(baseline_advice).to_be_visible()
            baseline_said = baseline_advice.inner_text()
        finally:
            browser.close()
    simulated = Run.objects.get(pk=sim_id)
    assert (simulated.simulated, simulated.status, simulated.launched_by) == (True, "succeeded", user)
    planned, baseline = Run.objects.get(pk=planned_id), Run.objects.get(pk=baseline_id)
    assert (planned.name, baseline.name) == ("planned 7B (planned)", "planned 7B")
    assert planned.simulation["plan"]["baseline_run"] == baseline.pk
    row = Run.objects.get(pk=row_id)
    assert row.name == "planned 7B (plan row 2)" and planned.simulation["plan"]["candidates"][1]["run"] == row.pk
    # Each page named the pool its own figures show starving.
    for run, text in ((simulated, said), (baseline, baseline_said)):
        summary = run.simulation["summary"]
        trainer_starves = summary["trainer_busy"] <= summary["inference_busy"]
        bounds = "generation bounds this run" if trainer_starves else "the trainer bounds this run"
        assert bounds in text, (run.name, summary, text)
    cluster, model = baseline.simulation["cluster"], baseline.simulation["model"]
    assert cluster["gpus"] == 64 and 6e9 < model["params"] < 9e9, (cluster, model)
    assert baseline.simulation["summary"]["trainer_busy"] < 0.5
    assert "The trainer waits" in baseline_said and "cluster.inference_share above" in baseline_said
    assert Run.objects.count() == 5  # with the run of the plan's second row


def test_a_run_simulated_elsewhere_appears_live_in_the_run_list_marked(daphne_url):
    skip_without_chromium()
    from django.contrib.auth import get_user_model
    from playwright.sync_api import expect, sync_playwright

    user = get_user_model().objects.create_user("livia", password=PASSWORD)
    team = Team.objects.create(name="Live sims")
    Membership.objects.create(team=team, user=user, role=Membership.Role.MEMBER)
    experiment = Experiment.objects.create(team=team, name="live")
    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            watcher = log_in(browser, daphne_url, "livia")
            watcher.goto(f"{daphne_url}/")
            expect(watcher.locator("tr.empty")).to_be_visible()
            form = log_in(browser, daphne_url, "livia")
            form.goto(f"{daphne_url}/runs/new/")
            form.select_option("#id_experiment", str(experiment.pk))
            form.fill("#id_cluster_gpus", "8")
            form.fill("#id_steps", "5")
            form.click("#simulate-button")
            form.wait_for_url(f"{daphne_url}/runs/*/")
            # The watcher's list got the run over its WebSocket: a new row, marked.
            mark = watcher.locator("tbody tr .simulated-mark")
            expect(mark).to_be_visible()
            expect(mark).to_have_text("simulated")
        finally:
            browser.close()
