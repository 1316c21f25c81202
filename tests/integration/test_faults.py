"""Faults injected against the real services, each with its expected outcome checked:
how it ends, how long until it shows, and that no metric point is lost or stored twice.

- An actor of a running run killed (ray.kill) on the real stack (Celery worker, daphne,
  Ray head, PostgreSQL): the trainer → the driver fails the run naming it; the driver →
  reconcile (called directly, as the beat would) fails it as gone. No `run-<id>*` actor
  is left, and every point the site had stays.
- The Ray head crashed and back (a head of the test's own, beside the session's): the
  run fails, said by its driver or by reconcile once the head answers again, and no
  process of the run outlives the crash.
- PostgreSQL, Redis and the web process, each the test's own (fault_helpers.py), since
  the machine's are shared: a reporter posts a known sequence while PostgreSQL restarts
  or daphne restarts, and everything sent is stored exactly once; with Redis (the
  channel layer) down a run page in Chromium keeps drawing by polling, goes live again
  when Redis is back, and its chart has every step; a point stored between the metrics
  API's two reads, then pushed again, is drawn once.

Each test prints what it measured (`FAULT …` lines, shown with `pytest -s`).
"""

from __future__ import annotations

import shutil
import time

import httpx
import pytest

from tests.browser import launch as launch_browser
from tests.browser import log_in, skip_without_chromium
from tests.integration.fault_helpers import (
    PASSWORD,
    SERIES,
    PrivateRayHead,
    PrivateRedis,
    PrivateSite,
    RayControl,
    Sender,
    run_actor_processes,
    skip_reason,
    value_of,
)
from tests.integration.helpers import launch, overrides, status
from tests.integration.stack import Stack, short_home, wait_for
from workers.run.reporter import MetricsReporter, spool_path

pytestmark = [pytest.mark.slow]

DETECT_BUDGET_S = 60.0  # a killed actor or driver shows as a failed run within a minute


def report(fault: str, **figures) -> None:
    shown = ", ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in figures.items())
    print(f"\nFAULT {fault}: {shown}")


# --- actors killed mid-run, on the real stack ------------------------------------------


@pytest.fixture
def member(db):
    from django.contrib.auth import get_user_model

    from runs.actions import do_ensure_demo

    user = get_user_model().objects.create_user("fay", password="pw-fay")
    _, experiment = do_ensure_demo(user, team_name="Faults")
    return user, experiment


@pytest.fixture(scope="module")
def ray_control(stack):
    control = RayControl(stack.ray_address, stack.env, stack.log_path)
    yield control
    control.close()


def stored_points(run) -> dict[tuple[str, int], float]:
    from runs.models import MetricPoint

    rows = list(MetricPoint.objects.filter(run_id=run.pk).values_list("series", "step", "value"))
    stored = {(series, step): value for series, step, value in rows}
    assert len(stored) == len(rows), f"{len(rows) - len(stored)} points stored twice"
    return stored


def trained_steps(run) -> int:
    from runs.models import MetricPoint

    return MetricPoint.objects.filter(run_id=run.pk, series="loss").count()


def running_run(stack, member):
    """A tiny run launched through the worker, once it has trained two steps."""
    from runs.models import Run

    stack.ensure_worker()
    run = launch(member, "async", overrides(max_steps=10_000, max_minutes=3))
    wait_for(lambda: trained_steps(run) >= 2 or status(run) in Run.TERMINAL, 300, f"run {run.pk} to train 2 steps")
    assert status(run) == Run.Status.RUNNING, f"run {run.pk} {run.status}: {run.error}"
    return run


def assert_points_kept(run, before: dict, stack) -> dict:
    """Every point the site had before the kill is still stored with its value, nothing
    is stored twice, every trained step has its trainer series, and the driver left no
    point undelivered in its spool. Returns the points stored now."""
    after = stored_points(run)
    lost = sorted(k for k in before if k not in after)
    assert not lost, f"{len(lost)} points lost after the kill: {lost[:10]}"
    changed = sorted(k for k in before if after[k] != before[k])
    assert not changed, f"points changed after the kill: {changed[:10]}"
    last = max(step for series, step in after if series == "loss")
    for series in ("loss", "reward/mean", "policy/version"):
        missing = [s for s in range(1, last + 1) if (series, s) not in after]
        assert not missing, f"{series} has no point at steps {missing}"
    assert not spool_path(str(stack.home / "cache"), run.pk).exists(), "points were left in the driver's spool"
    return after


@pytest.mark.django_db(transaction=True)
def test_the_trainer_killed_mid_run_fails_the_run_naming_it(stack, member, ray_control, show_logs_on_failure):
    from runs.models import Run

    run = running_run(stack, member)
    before = stored_points(run)
    ray_control.kill(f"run-{run.pk}-trainer")
    killed = time.monotonic()

    wait_for(lambda: status(run) in Run.TERMINAL, DETECT_BUDGET_S, f"run {run.pk} to end after its trainer died")
    detect_s = time.monotonic() - killed
    assert run.status == Run.Status.FAILED, f"run {run.pk} {run.status}: {run.error}"
    assert run.error == (
        f"The trainer (Ray actor run-{run.pk}-trainer) died: it was killed (ray.kill). Launch the run again."
    )
    wait_for(lambda: not ray_control.names(run.pk), 30, f"the run-{run.pk}* actors to go")
    gone_s = time.monotonic() - killed
    after = assert_points_kept(run, before, stack)
    report(
        "trainer killed",
        detect_s=detect_s,
        actors_gone_s=gone_s,
        points_before=len(before),
        points_after=len(after),
        lost=0,
    )


@pytest.mark.django_db(transaction=True)
def test_the_driver_killed_mid_run_is_failed_by_reconcile(stack, member, ray_control, show_logs_on_failure):
    from runs.models import Run

    run = running_run(stack, member)
    before = stored_points(run)
    ray_control.kill(f"run-{run.pk}")
    killed = time.monotonic()

    passes = []

    def reconciled() -> bool:  # what the beat does every 15 s, here once a second
        passes.append(ray_control.reconcile())
        return status(run) in Run.TERMINAL

    wait_for(reconciled, DETECT_BUDGET_S, f"reconcile to settle run {run.pk}", interval_s=1.0)
    detect_s = time.monotonic() - killed
    assert run.status == Run.Status.FAILED, f"run {run.pk} {run.status}: {run.error}"
    assert run.error.startswith(f"The run's driver (Ray actor run-{run.pk}) is gone from Ray at {stack.ray_address}")
    assert passes[-1]["lost"] >= 1, passes
    wait_for(lambda: not ray_control.names(run.pk), 30, f"the run-{run.pk}* actors to go")
    gone_s = time.monotonic() - killed
    after = assert_points_kept(run, before, stack)
    report(
        "driver killed",
        detect_s=detect_s,
        reconcile_passes=len(passes),
        actors_gone_s=gone_s,
        points_before=len(before),
        points_after=len(after),
        lost=0,
    )


@pytest.mark.django_db(transaction=True)
def test_the_driver_killed_mid_run_is_resumed_from_its_checkpoint(stack, member, ray_control, show_logs_on_failure):
    """checkpoint.max_restarts=1: reconcile fails the dead run saying so and a child run
    resumes it from its latest checkpoint, its steps going on from there; the parent's
    points stay as they were."""
    from runs.actions import check_cancel, do_cancel_run
    from runs.models import Checkpoint, MetricPoint, Run

    stack.ensure_worker()
    config = {**overrides(max_steps=10_000, max_minutes=3), "checkpoint": {"every_steps": 2, "max_restarts": 1}}
    run = launch(member, "sync", config)
    wait_for(
        lambda: Checkpoint.objects.filter(run=run).exists() or status(run) in Run.TERMINAL,
        300,
        f"run {run.pk} to write a checkpoint",
    )
    assert status(run) == Run.Status.RUNNING, f"run {run.pk} {run.status}: {run.error}"
    ray_control.kill(f"run-{run.pk}")
    killed = time.monotonic()

    def reconciled() -> bool:  # what the beat does every 15 s, here once a second
        ray_control.reconcile()
        return status(run) in Run.TERMINAL

    wait_for(reconciled, DETECT_BUDGET_S, f"reconcile to resume run {run.pk}", interval_s=1.0)
    detect_s = time.monotonic() - killed
    child = Run.objects.select_related("resume_from").get(parent=run)
    resumed_at = child.resume_from.step
    assert run.status == Run.Status.FAILED
    assert f"resumed as run {child.pk} from its checkpoint at step {resumed_at}" in run.error, run.error
    assert (child.origin, child.restarts, child.resume_from.run_id) == ("resume", 1, run.pk)

    def child_stepped() -> bool:
        return MetricPoint.objects.filter(run=child, series="loss").exists() or status(child) in Run.TERMINAL

    wait_for(child_stepped, 300, f"resumed run {child.pk} to train a step")
    next_step_s = time.monotonic() - killed
    steps = MetricPoint.objects.filter(run=child, series="loss").order_by("step").values_list("step", flat=True)
    assert steps and steps[0] == resumed_at + 1, f"run {child.pk} ({child.status}: {child.error}) steps {list(steps)}"
    # The parent as it stands once the child trains: its driver's last post, in flight
    # when the driver was killed, may be stored after reconcile settled the run (the
    # ingest takes a failed run's late points), but not after the child's first step,
    # which comes a whole actor start later. Training on, the child must not add to it.
    before = stored_points(run)
    first = max(steps)
    wait_for(
        lambda: (
            MetricPoint.objects.filter(run=child, series="loss", step__gt=first).exists()
            or status(child) in Run.TERMINAL
        ),
        300,
        f"resumed run {child.pk} to train another step",
    )
    assert stored_points(run) == before, "the parent's points changed while the child trained"
    do_cancel_run(member[0], check_cancel(member[0], child.pk))
    wait_for(lambda: status(child) in Run.TERMINAL, 60, f"run {child.pk} to cancel")
    report(
        "driver killed (max_restarts=1)",
        detect_s=detect_s,
        resumed_at_step=resumed_at,
        to_next_step_s=next_step_s,
        parent_points=len(before),
    )


def scheduled_run(member):
    """A tiny run the queue has scheduled, as the launch_run task finds it (created here,
    not launched: no message reaches the session's worker, which would start it on the
    session's Ray head)."""
    from runs.models import Run
    from workers.config.presets import build

    user, experiment = member
    settings = overrides(max_steps=10_000, max_minutes=3)
    return Run.objects.create(
        experiment=experiment,
        name="ray-head",
        preset="async",
        overrides=settings,
        config=build("async", settings).model_dump(mode="json"),
        launched_by=user,
        phase=Run.QUEUE_SCHEDULED,
        phase_detail=Run.QUEUE_SCHEDULED_DETAIL,
    )


@pytest.mark.django_db(transaction=True)
def test_the_ray_head_crashed_and_back_fails_the_run(stack, member, show_logs_on_failure):
    """The head crashes (its GCS and raylet die at once) and comes back on its address,
    as a restarted head pod does. The run's actors lose their node: the driver, if it
    notices first, fails the run saying an actor is unreachable; otherwise reconcile
    fails it as gone once the head answers again. The process that runs reconcile (the
    Celery worker's part) lives through it all: while the head is down a pass returns
    at once settling nothing, instead of blocking until Ray ends the process, and the
    first pass after the head is back joins it afresh. No process of the run outlives
    the crash."""
    from runs.models import Run

    ray_stack = Stack(short_home())  # its own supervisor and log, beside the session's
    head = PrivateRayHead(ray_stack)
    env = {**stack.env, **head.env}  # the session's site and database, this head
    controls: list[RayControl] = []
    try:
        head.start()
        controls.append(RayControl(head.address, env, ray_stack.log_path))
        run = scheduled_run(member)
        controls[-1].start(run.pk)
        wait_for(lambda: trained_steps(run) >= 2 or status(run) in Run.TERMINAL, 300, f"run {run.pk} to train")
        assert status(run) == Run.Status.RUNNING, f"run {run.pk} {run.status}: {run.error}"

        before = stored_points(run)
        head.crash()
        crashed = time.monotonic()
        # Ray gives each worker a process group of its own: they go once they see their
        # raylet gone, not with the head's group.
        wait_for(lambda: not run_actor_processes(head.address), 30, "the run's actor processes to exit")
        orphans_gone_s = time.monotonic() - crashed

        t = time.monotonic()
        down_pass = controls[-1].reconcile()  # the head is down: nothing is settled
        down_pass_s = time.monotonic() - t
        assert down_pass == {"lost": 0, "cancelled": 0, "resent": 0, "recovered": 0, "resumed": 0}, down_pass
        # The driver names the actor when Ray's actor table answers for it, else "A run actor".
        unreachable = "died: Ray could not reach it. Launch the run again."
        assert status(run) == Run.Status.RUNNING or " died: " in run.error, run.error

        head.start()
        back = time.monotonic()
        passes = []

        def reconciled() -> bool:
            passes.append(controls[-1].reconcile())
            return status(run) in Run.TERMINAL

        wait_for(reconciled, DETECT_BUDGET_S, f"run {run.pk} to be settled", interval_s=1.0)
        failed_s = time.monotonic() - crashed
        assert run.status == Run.Status.FAILED, f"run {run.pk} {run.status}: {run.error}"
        by_driver = run.error.endswith(unreachable)
        assert by_driver or run.error.startswith(
            f"The run's driver (Ray actor run-{run.pk}) is gone from Ray at {head.address}"
        ), run.error
        # Asked from a process that joined the head as it is now: when the driver failed
        # the run first, reconcile had nothing to ask Ray, so the first control never left
        # the cluster that died.
        controls.append(RayControl(head.address, env, ray_stack.log_path))
        assert not controls[-1].names(run.pk)
        after = assert_points_kept(run, before, stack)
    except BaseException:
        print(f"--- last lines of {ray_stack.log_path} ---\n{ray_stack.log_tail()}")
        raise
    finally:
        for control in controls:
            control.close(timeout_s=15)
        ray_stack.stop()
        shutil.rmtree(ray_stack.home, ignore_errors=True)
    report(
        "ray head crashed and back",
        failed_by="driver" if by_driver else "reconcile",
        failed_after_crash_s=failed_s,
        head_down_s=back - crashed,
        actor_processes_gone_s=orphans_gone_s,
        reconcile_pass_while_down_s=down_pass_s,
        reconcile_passes=len(passes),
        points_before=len(before),
        points_after=len(after),
        lost=0,
    )


# --- PostgreSQL, Redis and the web process: the test's own servers ---------------------


@pytest.fixture(scope="module")
def site():
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    private = PrivateSite(["pg", "pgdown", "redis", "web", "race"])
    try:
        yield private.start()
    finally:
        private.stop()


def ingest_through(site, run: dict, cache_dir, fault) -> dict:
    """Post a known sequence through a reporter while `fault()` breaks the site (it
    returns once the site should work again); check that every point is stored exactly
    once with its value. Returns the timings."""
    with Sender(site.url, run, cache_dir) as sender:
        sender.wait_steps(15)
        wait_for(lambda: site.points(run["id"]), 10, "the first points to be stored")
        broken, broken_step = time.monotonic(), sender.step
        fault()
        back = time.monotonic()
        back_step = sender.step
        expected = sender.sent(back_step)
        # Caught up: what was sent until the site came back is stored, through the
        # reporter's own retries (its close() would force it: not yet).
        wait_for(lambda: expected.keys() <= site.points(run["id"]).keys(), 30, "the reporter to catch up")
        caught_up_s = time.monotonic() - back
        sender.wait_steps(10)
        assert sender.stop(close_timeout_s=30), f"the reporter kept points undelivered: {sender.reporter.last_error}"

    assert sender.down_at is not None, "the reporter never saw the site down: the fault did not bite"
    stored, sent = site.points(run["id"]), sender.sent()
    assert len(stored) == len(sent) == 3 * sender.step
    assert stored == sent, "stored points differ from those sent"
    assert sender.reporter.dropped == 0
    assert not spool_path(str(cache_dir), run["id"]).exists()
    return {
        "outage_s": back - broken,
        "detect_s": sender.down_at - broken,
        "caught_up_s": caught_up_s,
        "points": len(stored),
        "sent_during_outage": 3 * (back_step - broken_step),
        "lost": 0,
        "duplicated": 0,
        "answer_while_down": sender.first_error,
    }


def test_postgresql_restarted_during_ingest_loses_no_point(site, tmp_path):
    def restart():
        site.pg.stop()
        time.sleep(3)  # long enough for the reporter to meet the outage on several flushes
        site.pg.start()

    report("postgresql restarted", **ingest_through(site, site.runs["pg"], tmp_path, restart))


def log_in_http(site) -> httpx.Client:
    """A client holding the private site's user's session, logged in through the form."""
    client = httpx.Client(base_url=site.url, timeout=30, trust_env=False)
    client.get("/accounts/login/")
    client.post(
        "/accounts/login/",
        data={"username": site.username, "password": PASSWORD, "csrfmiddlewaretoken": client.cookies["csrftoken"]},
        headers={"Referer": f"{site.url}/accounts/login/"},
    )
    assert "sessionid" in client.cookies, "login failed"
    return client


def test_with_postgresql_down_the_api_answers_a_json_503_and_pages_a_plain_one(site):
    """The private PostgreSQL stopped (fast shutdown: the server is gone, its port
    refuses connections): every request that needs the database answers 503 with
    Retry-After, the API and /healthz in the API's error shape, pages in plain text."""
    run = site.runs["pgdown"]
    ingest = {"Authorization": f"Bearer {run['token']}"}
    point = {"points": [{"series": "reward/mean", "step": 1_000_000, "value": 0.5, "time": time.time()}]}
    client = log_in_http(site)
    try:
        assert client.get("/api/runs").status_code == 200
        site.pg.stop()
        try:
            stopped = time.monotonic()
            answers = {
                "api": client.get("/api/runs"),
                "ingest": client.post(f"/api/runs/{run['id']}/metrics", json=point, headers=ingest),
                "healthz": client.get("/healthz"),
                "page": client.get(f"/runs/{run['id']}/"),
            }
            answered_s = time.monotonic() - stopped
        finally:
            site.pg.start()
        for name in ("api", "ingest", "healthz"):
            r = answers[name]
            assert r.status_code == 503, (name, r.status_code, r.text[:300])
            assert r.headers["content-type"] == "application/json", name
            assert r.json() == {
                "errors": {"database": "the database cannot be reached right now; retry in a few seconds"}
            }
            assert r.headers["retry-after"] == "5"
        page = answers["page"]
        assert page.status_code == 503
        assert page.headers["content-type"].startswith("text/plain")
        assert "database cannot be reached" in page.text and "<html" not in page.text.lower()
        # Back: the same session and run work again, and the refused point was not stored.
        wait_for(lambda: client.get("/api/runs").status_code == 200, 15, "the API to answer again")
    finally:
        client.close()
    assert ("reward/mean", 1_000_000) not in site.points(run["id"])
    report("postgresql down", four_requests_answered_s=answered_s)


def test_the_web_process_restarted_mid_run_loses_no_point(site, tmp_path):
    # SIGTERM to daphne, as a deploy does, then a new one on the same port.
    report("web restarted", **ingest_through(site, site.runs["web"], tmp_path, site.stack.restart_web))


def test_the_channel_layer_reconnects_after_a_redis_restart_and_tells_its_consumers(tmp_path):
    """The site's channel layer (foundation/channel_layer.py, configured as settings.py
    does) on a private redis-server, in two processes' roles: a web process with a
    viewer, and one that only publishes (the ingest of a process nobody watches,
    Celery). Stopping Redis tells the viewer's consumer (it closes, so the page catches
    up); after the restart the very first publish of either works (the pool's
    connections Redis dropped are reconnected, not failed on), and a new viewer gets
    what is published."""
    import asyncio

    from foundation.channel_layer import LOST_EVENT, PubSubChannelLayer, publish_retry

    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    stack = Stack(tmp_path)
    redis = PrivateRedis(stack)
    message = {"type": "metrics.points", "run_id": 1, "frame": "[]"}

    async def scenario() -> dict:
        hosts = [{"address": redis.url(0), "socket_timeout": 5, **publish_retry()}]
        web, publisher = PubSubChannelLayer(hosts=hosts), PubSubChannelLayer(hosts=hosts)
        try:
            viewer = await web.new_channel()
            await web.group_add("run-1", viewer)
            await publisher.group_send("run-1", message)
            assert await asyncio.wait_for(web.receive(viewer), 5) == message

            redis.stop()
            stopped = time.monotonic()
            assert await asyncio.wait_for(web.receive(viewer), 10) == {"type": LOST_EVENT}
            told_s = time.monotonic() - stopped

            redis.start()
            # The first calls after the restart: no error.
            await publisher.group_send("run-1", message)
            await web.group_send("run-1", message)
            viewer = await web.new_channel()
            await web.group_add("run-1", viewer)
            await publisher.group_send("run-1", message)
            assert await asyncio.wait_for(web.receive(viewer), 5) == message
            return {"consumers_told_s": told_s}
        finally:
            await web.flush()
            await publisher.flush()

    try:
        redis.start()
        figures = asyncio.run(scenario())
    finally:
        stack.stop()
    report("redis restarted (channel layer)", **figures)


LIVE_STATE_JS = "() => document.getElementById('live-state').dataset.state"
# The last step drawn in the reward chart, and every step it shows.
REWARD_STEPS_JS = """() => {
    const el = [...document.querySelectorAll('.chart')].find(e => e.dataset.series.split(',')[0] === 'reward/mean');
    return ((el.data || [])[0] || {x: []}).x;
}"""


@pytest.mark.browser
def test_with_redis_down_the_run_page_polls_then_goes_live_again(site, tmp_path):
    skip_without_chromium()
    from playwright.sync_api import sync_playwright

    run = site.runs["redis"]
    frames: list[float] = []  # when each WebSocket message with points reached the page

    def on_socket(ws) -> None:
        ws.on("framereceived", lambda payload: frames.append(time.monotonic()) if '"points"' in str(payload) else None)

    def drawn_last() -> int:
        steps = page.evaluate(REWARD_STEPS_JS)
        return steps[-1] if steps else 0

    def frames_seen() -> int:
        page.wait_for_timeout(100)  # Playwright hands this thread the page's events only in its own calls
        return len(frames)

    with Sender(site.url, run, tmp_path, rate=10) as sender, sync_playwright() as pw:
        browser = launch_browser(pw)
        try:
            page = log_in(browser, site.url, site.username, PASSWORD)
            page.on("websocket", on_socket)
            page.goto(f"{site.url}/runs/{run['id']}/")
            wait_for(lambda: page.evaluate(LIVE_STATE_JS) == "live" and frames_seen(), 30, "live points on the page")

            site.redis.stop()
            stopped = time.monotonic()
            wait_for(lambda: page.evaluate(LIVE_STATE_JS) != "live", 15, "the page to see its socket close")
            socket_closed_s = time.monotonic() - stopped
            live_frames, last = frames_seen(), drawn_last()
            # New steps keep appearing with no socket: the page polls the metrics API.
            wait_for(lambda: drawn_last() >= last + 4, 20, "the chart to grow while Redis is down")
            polled_s = time.monotonic() - stopped
            assert page.evaluate(LIVE_STATE_JS) != "live"
            assert frames_seen() == live_frames, "points came over the socket while Redis was down"

            site.redis.start()
            started = time.monotonic()
            wait_for(lambda: page.evaluate(LIVE_STATE_JS) == "live", 40, "the socket to be live again")
            live_again_s = time.monotonic() - started
            drawn_when_live = drawn_last()
            wait_for(lambda: frames_seen() >= live_frames + 3, 15, "points over the socket again")
            frames_again_s = time.monotonic() - started

            assert sender.stop(close_timeout_s=30), sender.reporter.last_error
            final = sender.step
            wait_for(lambda: drawn_last() == final, 15, f"step {final} on the chart")
            steps = page.evaluate(REWARD_STEPS_JS)
        finally:
            browser.close()
            site.redis.ensure_up()  # for whatever runs next, had the test failed with it down
    missing = sorted(set(range(1, final + 1)) - set(steps))
    assert steps == list(range(1, final + 1)), (
        f"the reward chart misses steps {missing} or has one twice (last drawn: {last} when the socket closed, "
        f"{drawn_when_live} when it was live again)"
    )
    stored = site.points(run["id"])
    assert stored == sender.sent(), "stored points differ from those sent"
    report(
        "redis down",
        socket_closed_s=socket_closed_s,
        chart_grows_by_polling_s=polled_s,
        live_again_after_redis_s=live_again_s,
        socket_points_again_s=frames_again_s,
        steps_drawn=len(steps),
        lost=0,
    )


@pytest.mark.browser
def test_a_point_stored_between_the_metrics_apis_two_reads_is_drawn_once(site, tmp_path):
    """The metrics API reads a series' last step and its points in two queries, so a
    point stored in between is in `steps` but newer than `last_step`; the same point then
    comes over the socket. The page must draw it once (it keeps the last step it drew)."""
    skip_without_chromium()
    from playwright.sync_api import sync_playwright

    run = site.runs["race"]
    reporter = MetricsReporter(run["id"], site.url, run["token"], str(tmp_path))

    def post(*steps: int) -> None:
        for step in steps:
            reporter.add_many({series: value_of(series, step) for series in SERIES}, step)
        assert reporter.flush() == 3 * len(steps)

    def as_if_raced(route) -> None:
        answer = route.fetch()
        body = answer.json()
        if "after_step" not in route.request.url:  # the first read: the race's outcome
            for data in body["series"].values():
                data["last_step"] = data["steps"][-2]
        route.fulfill(response=answer, json=body)

    post(1, 2, 3, 4, 5)
    with sync_playwright() as pw:
        browser = launch_browser(pw)
        try:
            page = log_in(browser, site.url, site.username, PASSWORD)
            page.route(f"**/api/runs/{run['id']}/metrics*", as_if_raced)
            page.goto(f"{site.url}/runs/{run['id']}/")
            wait_for(lambda: page.evaluate(LIVE_STATE_JS) == "live" and page.evaluate(REWARD_STEPS_JS), 30, "the chart")
            post(5)  # stored again (idempotent) and sent over the socket again, as the racing point was
            post(6)
            wait_for(lambda: page.evaluate(REWARD_STEPS_JS)[-1:] == [6], 15, "step 6 on the chart")
            steps = page.evaluate(REWARD_STEPS_JS)
        finally:
            browser.close()
            reporter.close(timeout_s=0)
    assert steps == [1, 2, 3, 4, 5, 6]
