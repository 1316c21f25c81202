"""A failed run says why in a sentence, with the traceback kept apart (Run.error and
Run.error_detail): taken in from the ingest and from a gone driver's spool, validated,
written by the launch and by reconcile, exposed by the API and the status events, and
shown on the run's page with the traceback folded in a <details>, live as well."""

from __future__ import annotations

import html
import json
import re

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from runs import in_ray, queue, reconcile
from runs.events import run_group
from runs.models import MetricPoint, Run
from tests.platform.server_paths import assert_no_server_path
from workers.run.failures import DETAIL_MAX

Status = Run.Status

SENTENCE = "The trainer ran out of memory: lower trainer.batch_groups or trainer.group_size, or use a smaller model."
TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/srv/rollway/workers/run/actors.py", line 371, in _loop\n'
    "    metrics = self.trainer.train_step(groups)\n"
    "MemoryError: <unable to allocate 2.0 GiB>"
)


def post_status(client, run, body):
    return client.post(
        f"/api/runs/{run.pk}/status",
        data=json.dumps(body),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {run.ingest_token}",
    )


def failed(**fields) -> dict:
    return {"status": "failed", "error": SENTENCE, "error_detail": TRACEBACK, **fields}


# --- the ingest ----------------------------------------------------------------------


def test_the_ingest_stores_the_sentence_and_the_traceback_apart(client, make_run):
    run = make_run(Status.RUNNING)
    r = post_status(client, run, failed())
    assert r.status_code == 200, r.content
    run.refresh_from_db()
    assert (run.status, run.error, run.error_detail) == (Status.FAILED, SENTENCE, TRACEBACK)


def test_the_api_and_the_status_event_carry_both(
    client, client_for, owner, make_run, django_capture_on_commit_callbacks
):
    run = make_run(Status.RUNNING)
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(run_group(run.pk), channel)
    with django_capture_on_commit_callbacks(execute=True):
        post_status(client, run, failed())
    event = async_to_sync(layer.receive)(channel)
    assert (event["run"]["error"], event["run"]["error_detail"]) == (SENTENCE, TRACEBACK)
    detail = client_for(owner).get(f"/api/runs/{run.pk}").json()
    assert (detail["error"], detail["error_detail"]) == (SENTENCE, TRACEBACK)


def test_a_failure_without_a_detail_still_fails_the_run(client, make_run):
    run = make_run(Status.RUNNING)
    assert post_status(client, run, {"status": "failed", "error": SENTENCE}).status_code == 200
    run.refresh_from_db()
    assert (run.status, run.error, run.error_detail) == (Status.FAILED, SENTENCE, "")


def test_a_detail_on_a_run_that_already_ended_changes_nothing(client, make_run):
    run = make_run(Status.SUCCEEDED)
    assert post_status(client, run, failed()).json()["changed"] is False
    run.refresh_from_db()
    assert (run.status, run.error, run.error_detail) == (Status.SUCCEEDED, "", "")


@pytest.mark.parametrize(
    ("detail", "says"),
    [
        ("x" * (DETAIL_MAX + 1), f"at most {DETAIL_MAX} characters"),
        (12345, "valid string"),
        (["Traceback", "MemoryError"], "valid string"),
        (None, "valid string"),
    ],
)
def test_a_too_long_or_wrongly_typed_detail_is_a_400_naming_the_field(client, make_run, detail, says):
    run = make_run(Status.RUNNING)
    r = post_status(client, run, failed(error_detail=detail))
    assert r.status_code == 400
    assert says in r.json()["errors"]["error_detail"]
    run.refresh_from_db()
    assert (run.status, run.error, run.error_detail) == (Status.RUNNING, "", "")


# --- the run's page ------------------------------------------------------------------


def test_the_run_page_shows_the_sentence_and_folds_the_traceback(client_for, owner, make_run):
    run = make_run(Status.FAILED, error=SENTENCE, error_detail=TRACEBACK)
    page = client_for(owner).get(f"/runs/{run.pk}/").content.decode()
    box = re.search(r'<div class="run-failure" id="run-failure"\s*>(.*?)</div>', page, re.S)
    assert box, "the failure box is shown"
    sentence = re.search(r'<p class="error" id="run-error">(.*?)</p>', box.group(1), re.S)
    assert html.unescape(sentence.group(1)) == SENTENCE
    folded = re.search(
        r'<details id="run-error-detail"\s*>\s*<summary>(.*?)</summary>\s*<pre[^>]*>(.*?)</pre>', page, re.S
    )
    assert folded, "the traceback sits in a closed <details>"
    assert html.unescape(folded.group(2)) == TRACEBACK  # escaped in the page, intact once read
    assert "<unable to allocate" not in page  # the traceback's own text never becomes markup


def test_a_run_that_did_not_fail_shows_no_failure_box(client_for, owner, make_run):
    page = client_for(owner).get(f"/runs/{make_run(Status.RUNNING).pk}/").content.decode()
    assert re.search(r'id="run-failure" hidden', page)
    assert re.search(r'<details id="run-error-detail" hidden', page)


# --- the other writers: the launch, the spool, reconcile -----------------------------


def test_a_launch_that_cannot_reach_ray_names_the_address_and_keeps_the_traceback(driver, make_run, settings):
    settings.RAY_ADDRESS = "10.0.0.9:6380"
    run = make_run(phase=queue.SCHEDULED)
    try:  # as ray.init raises it
        raise RuntimeError("Failed to connect to GCS. Last connection error: RpcError: Timed out")
    except RuntimeError as gcs:
        driver.fail_with = ConnectionError("Failed to connect to Ray cluster at 10.0.0.9:6380")
        driver.fail_with.__cause__ = gcs
    in_ray.do_start_in_ray(run.pk)
    run.refresh_from_db()
    assert run.status == Status.FAILED
    assert run.error == "Ray at 10.0.0.9:6380 is unreachable: check RAY_ADDRESS and that the Ray head is running."
    assert "error: ConnectionError: Failed to connect to Ray cluster at 10.0.0.9:6380" in run.error_detail
    assert "Failed to connect to GCS" in run.error_traceback  # the whole chain, for admins


def spool_a_failure(run, settings, detail: str = "", failure=None) -> None:
    """A real MetricsReporter whose site is down ends by spooling its failure."""
    from workers.run.reporter import MetricsReporter

    rep = MetricsReporter(run.pk, "http://127.0.0.1:9", run.ingest_token, settings.ROLLWAY_CACHE_DIR, timeout_s=0.2)
    rep.post_status("failed", SENTENCE, error_detail=detail, failure=failure)
    assert rep.close(timeout_s=0.2) is False


def test_reconcile_takes_in_a_spooled_failure_with_its_detail(driver, make_run, settings):
    run = make_run(Status.RUNNING)
    spool_a_failure(run, settings, TRACEBACK)
    assert reconcile.do_reconcile_runs()["recovered"] == 1
    run.refresh_from_db()
    assert (run.status, run.error, run.error_detail) == (Status.FAILED, SENTENCE, TRACEBACK)


def test_a_spooled_record_keeps_its_traceback_for_admins_and_shows_no_server_path(
    driver, make_run, settings, client_for, owner
):
    from workers.model.loading import load_model
    from workers.run.failures import explain

    settings.ROLLWAY_MODEL_ROOTS = [str(settings.REPO_ROOT)]
    run = make_run(Status.RUNNING)
    try:  # a real error, raised in the server's own files
        load_model("a-model-that-is-not-here")
    except Exception as exc:
        failure = explain(exc, actor="trainer", actor_name=f"run-{run.pk}-trainer", operation="loop")
    assert str(settings.REPO_ROOT) in failure.traceback
    spool_a_failure(run, settings, failure=failure)
    assert reconcile.do_reconcile_runs()["recovered"] == 1
    run.refresh_from_db()
    assert (run.status, run.error, run.error_detail) == (Status.FAILED, failure.message, failure.detail)
    assert run.failure == {
        "kind": "actor_error",
        "actor": "trainer",
        "actor_name": f"run-{run.pk}-trainer",
        "operation": "loop",
        "error": failure.error,
    }
    assert run.error_traceback == failure.traceback
    client = client_for(owner)
    for path in (f"/api/runs/{run.pk}", f"/runs/{run.pk}/"):
        body = client.get(path).content
        assert b"Traceback" not in body
        assert_no_server_path(body, settings, what=path)


def test_the_ingest_takes_a_record_and_refuses_a_bad_one_naming_its_field(client, make_run):
    run = make_run(Status.RUNNING)
    record = {"kind": "actor_error", "message": SENTENCE, "actor": "trainer", "traceback": TRACEBACK}
    r = post_status(client, run, {**failed(), "failure": {**record, "kind": "melted"}})
    assert r.status_code == 400 and "failure.kind" in r.json()["errors"]
    r = post_status(client, run, {**failed(), "failure": {**record, "actor": "x" * 3000}})
    assert r.status_code == 400 and "at most 2000 characters" in r.json()["errors"]["failure.actor"]
    assert post_status(client, run, {**failed(), "failure": record}).status_code == 200
    run.refresh_from_db()
    assert (run.failure, run.error_traceback) == ({"kind": "actor_error", "actor": "trainer"}, TRACEBACK)


def test_a_spooled_detail_that_fails_validation_is_not_taken_in(driver, make_run, settings):
    from workers.run.reporter import status_spool_path

    run = make_run(Status.RUNNING)
    spool_a_failure(run, settings, TRACEBACK)
    path = status_spool_path(settings.ROLLWAY_CACHE_DIR, run.pk)
    spooled = json.loads(path.read_text())
    path.write_text(json.dumps({**spooled, "error_detail": ["not", "text"]}))
    assert reconcile.do_reconcile_runs()["lost"] == 1  # what it spooled is refused as a post would be
    run.refresh_from_db()
    assert run.status == Status.FAILED and "is gone from" in run.error
    assert run.error_detail.startswith("Reconcile at ")


def test_a_lost_run_says_its_driver_is_gone_and_what_it_last_reported(driver, make_run, settings):
    settings.RAY_ADDRESS = "10.0.0.9:6380"
    run = make_run(Status.RUNNING, ray_actor="run-77", phase="stepping")
    MetricPoint.objects.upsert(run.pk, [("policy/version", s, float(s), 1_763_700_000.0 + s) for s in (1, 2, 3)])
    assert reconcile.do_reconcile_runs()["lost"] == 1
    run.refresh_from_db()
    assert run.error == (
        "The run's driver (Ray actor run-77) is gone from Ray at 10.0.0.9:6380 without reporting how the run "
        "ended (last heard: stepping, step 3): it was killed, crashed or lost its node. Launch the run again; "
        "the driver's log in Ray may say more."
    )
    assert "has no live driver actor for run" in run.error_detail
    assert "Last trained step: 3" in run.error_detail


def test_a_run_that_never_started_in_ray_says_so(driver, make_run, settings):
    from datetime import timedelta

    from django.utils import timezone

    run = make_run(Status.STARTING)
    stale = timezone.now() - timedelta(seconds=settings.ROLLWAY_STARTING_GRACE_S + 1)
    Run.objects.filter(pk=run.pk).update(status_changed_at=stale)
    assert reconcile.do_reconcile_runs()["lost"] == 1
    run.refresh_from_db()
    assert run.error.startswith("The run's driver (its Ray actor) never appeared in the local Ray cluster within ")
    assert "No trained step was reported." in run.error_detail


# --- live, in Chromium ---------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_the_run_page_shows_a_failure_as_it_happens(live_server):
    from tests.browser import PASSWORD, launch, log_in, skip_without_chromium

    skip_without_chromium()
    from django.contrib.auth import get_user_model
    from playwright.sync_api import expect, sync_playwright

    from runs.models import Experiment
    from teams.models import Membership, Team
    from workers.config.presets import build

    user = get_user_model().objects.create_user("fern", password=PASSWORD)
    team = Team.objects.create(name="Failures")
    Membership.objects.create(team=team, user=user, role=Membership.Role.ADMIN)
    experiment = Experiment.objects.create(team=team, name="oom")
    run = Run.objects.create(
        experiment=experiment, name="big batch", preset="async", config=build("async").model_dump(mode="json")
    )
    Run.objects.filter(pk=run.pk).update(status=Status.RUNNING)
    # Playwright's sync API runs an event loop in this thread: no ORM calls inside.
    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            page = log_in(browser, live_server.url, "fern")
            page.goto(f"{live_server.url}/runs/{run.pk}/")
            expect(page.locator("#run-failure")).to_be_hidden()
            # The driver reports its failure through the ingest, as a real one does.
            answer = page.request.post(
                f"{live_server.url}/api/runs/{run.pk}/status",
                data=json.dumps(failed()),
                headers={"Authorization": f"Bearer {run.ingest_token}", "Content-Type": "application/json"},
            )
            assert answer.status == 200, answer.text()
            # No shared channel layer under the live server: the page's status poll brings it.
            expect(page.locator("#run-error")).to_have_text(SENTENCE, timeout=15_000)
            details = page.locator("#run-error-detail")
            expect(details).to_be_visible()
            expect(page.locator("#run-error-traceback")).to_be_hidden()  # folded until asked
            details.locator("summary").click()
            expect(page.locator("#run-error-traceback")).to_have_text(TRACEBACK)
        finally:
            browser.close()
