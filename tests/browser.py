"""What every browser test shares: Debian's Chromium driven by Playwright, and logging in.

Playwright cannot download its own browser on these machines, so the tests drive the
system's Chromium (`make test` installs it). A test module imports these helpers; it
never imports another test module.
"""

from __future__ import annotations

import os
import re
import time

import pytest

CHROMIUM = "/usr/bin/chromium"
# Without the networking flags Chromium keeps dialling Google on a closed network.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
PASSWORD = "pw-browser-user"  # every browser test's user logs in with it


def skip_without_chromium() -> None:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"{CHROMIUM} is missing: `make test` installs Debian's chromium")


# Playwright's `expect` gives up after 5 s by default. A page that builds itself from a
# fetch (Swagger UI from the OpenAPI schema, the charts from the metrics API) can take
# longer on a 2-core host running the suite in parallel; only a wait past 30 s is a hang.
EXPECT_TIMEOUT_MS = 30_000


def launch(playwright):
    """Headless Chromium from a `sync_playwright()` context, with `expect` waiting as long
    as the pages' actions do."""
    from playwright.sync_api import expect

    expect.set_options(timeout=EXPECT_TIMEOUT_MS)
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)


def log_in(browser, base_url: str, username: str, password: str = PASSWORD):
    """A new page of `browser`, logged in to the site at `base_url` through its login form."""
    from playwright.sync_api import expect

    page = browser.new_page()
    page.set_default_timeout(30_000)
    page.goto(f"{base_url}/accounts/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("form button[type=submit]")
    expect(page).not_to_have_url(re.compile(r"/accounts/login/"))
    return page


def wait_for_value(page, js: str, done, timeout_s: float = 60.0):
    """Evaluate `js` (a function) in the page until `done(value)`; the value. Polled
    from here because Playwright's wait_for_function evaluates its text inside the page,
    which the site's Content-Security-Policy (no 'unsafe-eval') refuses."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = page.evaluate(js)
        if done(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"still {value!r} after {timeout_s:.0f} s: {js}")
        page.wait_for_timeout(250)
