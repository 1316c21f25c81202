"""The Content-Security-Policy in Debian's Chromium (driven by Playwright): the run list,
a run page, the launch form and the compare page load and draw under the site's own
policy without one violation, while a script injected inline is refused (so the
listener would have heard one). Under daphne (needs PostgreSQL: the server runs in a
forked process), the run page's WebSocket opens through connect-src and a live point
reaches its chart."""

from __future__ import annotations

import json

import pytest

from runs.models import Experiment, MetricPoint, Run
from teams.models import Membership, Team
from tests.browser import PASSWORD, launch, log_in, skip_without_chromium
from workers.config.presets import build

pytestmark = [pytest.mark.slow, pytest.mark.browser, pytest.mark.django_db(transaction=True)]

T0 = 1_700_000_000.0
REWARD_CHART = '.chart[data-series*="reward/mean"]'
# Runs before any of the page's own scripts, on every navigation (an init script is
# not subject to the page's CSP): records each violation the browser reports.
# `__violationsReach(n)` resolves once n are recorded: a test awaits it through evaluate,
# which the page's CSP does not govern, where Playwright's wait_for_function would poll
# with an eval that the policy (no 'unsafe-eval') refuses.
LISTEN = """
window.__violations = [];
const waiting = [];
window.__violationsReach = function (n) {
  return new Promise(function (resolve) { waiting.push([n, resolve]); settle(); });
};
function settle() {
  for (const [n, resolve] of waiting) if (window.__violations.length >= n) resolve(window.__violations.length);
}
document.addEventListener("securitypolicyviolation", function (e) {
  window.__violations.push(e.violatedDirective + " blocked " + (e.blockedURI || "inline"));
  settle();
});
"""


def seed(username: str) -> list[Run]:
    """A user with two finished runs that have reward points."""
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.create_user(username, password=PASSWORD)
    team = Team.objects.create(name=f"CSP {username}")
    Membership.objects.create(team=team, user=user, role=Membership.Role.ADMIN)
    experiment = Experiment.objects.create(team=team, name="policy")
    runs = []
    for seed_ in (1, 2):
        config = build("async").model_dump(mode="json")
        config["seed"] = seed_
        run = Run.objects.create(
            experiment=experiment,
            name=f"seed {seed_}",
            preset="async",
            overrides={"seed": seed_},
            config=config,
            status=Run.Status.SUCCEEDED,
        )
        MetricPoint.objects.upsert(run.pk, [("reward/mean", s, 0.1 * s, T0 + s) for s in range(20)])
        runs.append(run)
    return runs


def watch(page) -> list[str]:
    """Violations reported on `page`: the init script's, and the console's CSP errors
    (the console also names violations from before the listener could run)."""
    console: list[str] = []
    page.add_init_script(LISTEN)
    page.on(
        "console",
        lambda msg: console.append(msg.text) if "Content Security Policy" in msg.text else None,
    )
    return console


def violations(page, console: list[str]) -> list[str]:
    return [*page.evaluate("window.__violations || []"), *console]


def test_every_page_loads_and_draws_without_a_csp_violation(live_server):
    skip_without_chromium()
    from playwright.sync_api import expect, sync_playwright

    runs = seed("cecil")
    ids = ",".join(str(r.pk) for r in runs)
    # Playwright's sync API runs an event loop in this thread: no ORM calls inside.
    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            page = log_in(browser, live_server.url, "cecil")
            console = watch(page)
            seen: dict[str, list[str]] = {}

            page.goto(f"{live_server.url}/")
            expect(page.locator(f'[data-run-id="{runs[0].pk}"]').first).to_be_visible()
            seen["run list"] = violations(page, console)

            page.goto(f"{live_server.url}/runs/{runs[0].pk}/")
            chart = page.locator(REWARD_CHART).first
            expect(chart).to_have_attribute("data-points", "20")
            assert chart.locator(".main-svg").count() > 0  # Plotly drew its SVG
            seen["run page"] = violations(page, console)

            page.goto(f"{live_server.url}/runs/new/")
            expect(page.locator("#config-controls")).to_be_visible()  # launch.js built the controls
            seen["launch form"] = violations(page, console)

            page.goto(f"{live_server.url}/compare/?runs={ids}")
            reward = page.locator('[data-metric="reward/mean"]')
            expect(reward).to_have_attribute("data-traces", "3")  # one configuration: band low, high, mean
            assert reward.locator(".main-svg").count() > 0
            page.press("#target", "Enter")  # no form to submit: the page stays put
            assert page.url.startswith(f"{live_server.url}/compare/")
            seen["compare page"] = violations(page, console)

            assert seen == {name: [] for name in seen}, seen

            # The control: an inline script and an inline handler are refused and heard.
            page.evaluate(
                """() => {
                  const s = document.createElement("script");
                  s.textContent = "window.__inline = 1";
                  document.head.appendChild(s);
                  const b = document.createElement("button");
                  b.setAttribute("onclick", "window.__clicked = 1");
                  document.body.appendChild(b);
                  b.click();
                }"""
            )
            heard = page.evaluate(
                """() => Promise.race([
                  window.__violationsReach(2),
                  new Promise((resolve) => setTimeout(() => resolve(window.__violations.length), 10000)),
                ])"""
            )
            assert heard >= 2, page.evaluate("window.__violations")
            assert page.evaluate("[window.__inline, window.__clicked]") == [None, None]
            assert all("script-src" in v for v in page.evaluate("window.__violations")), page.evaluate(
                "window.__violations"
            )
        finally:
            browser.close()


def test_the_run_pages_websocket_opens_and_streams_under_the_policy(daphne_url):
    skip_without_chromium()
    from playwright.sync_api import expect, sync_playwright

    run = seed("wanda")[0]
    Run.objects.filter(pk=run.pk).update(status=Run.Status.RUNNING)
    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            page = log_in(browser, daphne_url, "wanda")
            console = watch(page)
            page.goto(f"{daphne_url}/runs/{run.pk}/")
            # A first connect that fails under a loaded suite retries after a backoff of up to 10 s.
            expect(page.locator("#live-state")).to_have_attribute("data-state", "live", timeout=40_000)
            chart = page.locator(REWARD_CHART).first
            expect(chart).to_have_attribute("data-points", "20")
            # The engine reports a step: it reaches the chart over the WebSocket.
            answer = page.request.post(
                f"{daphne_url}/api/runs/{run.pk}/metrics",
                data=json.dumps({"points": [{"series": "reward/mean", "step": 20, "value": 2.0, "time": T0 + 20}]}),
                headers={"Authorization": f"Bearer {run.ingest_token}", "Content-Type": "application/json"},
            )
            assert answer.status == 200, answer.text()
            expect(chart).to_have_attribute("data-points", "21", timeout=15_000)
            assert violations(page, console) == []
        finally:
            browser.close()
