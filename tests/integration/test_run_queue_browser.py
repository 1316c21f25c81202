"""A queued run's place and reason in Chromium against daphne: the run page says where
the run stands in the queue and what it waits for, and moves up live (no reload) when
the run ahead of it is scheduled. The runs are written to the database directly and the
scheduler runs in this process with a stand-in for Ray: no engine needed."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.browser import PASSWORD, launch, log_in, skip_without_chromium

pytestmark = [pytest.mark.slow, pytest.mark.browser, pytest.mark.django_db(transaction=True)]

WAITS = "1 run is active (ROLLWAY_MAX_RUNNING=1)"


class RoomyCluster:
    """What the scheduler asks of Ray, answered with a cluster that has room for any run."""

    def __init__(self):
        from workers.run.admission import Capacity

        self.capacity = Capacity(cpus=8.0, memory_bytes=64 * 2**30)

    def cluster_capacity(self, *, ray_address):
        return self.capacity

    def available_capacity(self, *, ray_address):
        return self.capacity


@pytest.fixture
def one_slot(settings, monkeypatch):
    """The scheduler in this process: one run at a time, a roomy cluster, and the
    launch_run messages it sends recorded instead of reaching a worker (which would
    start real runs)."""
    from rollway.celery import app
    from runs import in_ray

    settings.ROLLWAY_MAX_RUNNING = 1
    monkeypatch.setattr(in_ray, "ray_lifecycle", RoomyCluster)
    sent: list[tuple[str, list]] = []

    class Sent:
        id = "recorded"

    def send_task(name, args=(), **options):
        sent.append((name, list(args)))
        return Sent()

    monkeypatch.setattr(app, "send_task", send_task)
    return sent


@pytest.fixture
def line(db):
    """A running run and two queued behind it, the scheduler's reasons recorded."""
    from django.contrib.auth import get_user_model

    from runs.actions import do_ensure_demo
    from runs.models import Run
    from workers.config.presets import build

    user = get_user_model().objects.create_user("queenie", password=PASSWORD)
    _, experiment = do_ensure_demo(user, team_name="Line")
    config = build("async").model_dump(mode="json")

    def run(name, status=Run.Status.QUEUED):
        return Run.objects.create(
            experiment=experiment, name=name, preset="async", config=config, launched_by=user, status=status
        )

    return user, run("ahead", Run.Status.RUNNING), run("next"), run("last")


def off_playwright_thread(fn):
    """Run `fn` (ORM calls) in another thread: Playwright's sync API runs an event loop
    in this one, where Django refuses synchronous database calls."""

    def call():
        from django.db import connection

        try:
            return fn()
        finally:
            connection.close()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(call).result()


def test_a_queued_run_shows_its_place_and_reason_and_moves_up_live(stack, line, one_slot, show_logs_on_failure):
    skip_without_chromium()
    from playwright.sync_api import expect, sync_playwright

    from runs import queue
    from runs.actions import do_set_run_status
    from runs.models import Run

    user, ahead, nxt, last = line
    assert queue.do_schedule_queue() == []  # one slot, taken by "ahead": both wait

    def ahead_ends_and_the_scheduler_runs():
        do_set_run_status(Run.objects.get(pk=ahead.pk), Run.Status.SUCCEEDED)
        return queue.do_schedule_queue()

    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            page = log_in(browser, stack.url, user.username)

            page.goto(f"{stack.url}/runs/{last.pk}/")
            queue_info = page.locator("[data-role=queue]")
            expect(queue_info).to_have_text(f"#2 in queue · {WAITS}")
            # Live once the page's WebSocket is open (and in its run's group).
            expect(page.locator("#live-state[data-state=live]")).to_have_count(1)

            assert off_playwright_thread(ahead_ends_and_the_scheduler_runs) == [nxt.pk]
            # "next" was scheduled (it holds the one slot), so "last" is first in line now.
            expect(queue_info).to_have_text(f"#1 in queue · {WAITS}")
            expect(page.locator("[data-role=status]")).to_have_text("queued")

            page.goto(f"{stack.url}/")  # the run list
            row = page.locator("tr", has=page.locator(f"a[href='/runs/{last.pk}/']"))
            expect(row.locator("[data-role=queue]")).to_have_text(f"#1 in queue · {WAITS}")
        finally:
            browser.close()
    assert ("runs.tasks.launch_run", [nxt.pk]) in one_slot
