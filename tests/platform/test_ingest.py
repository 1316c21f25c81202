"""The engine's ingest endpoints: per-run bearer token, idempotent bulk upsert,
field-named 400s, terminal states that stick, and fan-out to the channel layer."""

from __future__ import annotations

import json
import math

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import connection
from django.test.utils import CaptureQueriesContext

from runs.events import RUNS_GROUP, run_group
from runs.models import MetricPoint, Run
from workers.run.reporter import INGEST_ENDPOINTS

Status = Run.Status


def post(client, run, path, body, token=None):
    token = run.ingest_token if token is None else token
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}
    data = body if isinstance(body, str) else json.dumps(body)
    return client.post(f"/api/runs/{run.pk}/{path}", data=data, content_type="application/json", **headers)


def point(series="reward/mean", step=1, value=0.5, time=1763700000.1):
    return {"series": series, "step": step, "value": value, "time": time}


def listen(group: str) -> str:
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(group, channel)
    return channel


def received(channel: str) -> dict:
    return async_to_sync(get_channel_layer().receive)(channel)


# --- auth -------------------------------------------------------------------------


def test_it_accepts_points_with_the_runs_token(client, run):
    r = post(client, run, "metrics", {"points": [point(step=1), point(step=2, value=0.7)]})
    assert r.status_code == 200
    assert r.json() == {"accepted": 2}
    assert list(run.points.order_by("step").values_list("step", "value")) == [(1, 0.5), (2, 0.7)]


@pytest.mark.parametrize("path", INGEST_ENDPOINTS)
def test_it_refuses_a_missing_token(client, run, path):
    r = post(client, run, path, {"points": []}, token="")
    assert r.status_code == 401
    assert r["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.parametrize("path", INGEST_ENDPOINTS)
def test_it_refuses_another_runs_token(client, make_run, path):
    mine, other = make_run(), make_run()
    body = {"points": [point()]} if path == "metrics" else {"status": "running"}
    r = post(client, mine, path, body, token=other.ingest_token)
    assert r.status_code == 401
    assert not MetricPoint.objects.exists()
    mine.refresh_from_db()
    assert mine.status == Status.QUEUED


def test_it_refuses_a_session_instead_of_a_token(client_for, owner, run):
    r = client_for(owner).post(
        f"/api/runs/{run.pk}/metrics", data=json.dumps({"points": [point()]}), content_type="application/json"
    )
    assert r.status_code == 401


@pytest.mark.parametrize("path", INGEST_ENDPOINTS)
def test_an_unknown_run_answers_as_a_wrong_token_does(client, run, path):
    # Checked in that order, a 404 would tell anyone which run ids exist.
    unknown = client.post(
        f"/api/runs/99999/{path}", data="{}", content_type="application/json", HTTP_AUTHORIZATION="Bearer guess"
    )
    wrong = post(client, run, path, {}, token="guess")
    assert unknown.status_code == wrong.status_code == 401
    assert unknown.content == wrong.content
    assert unknown["WWW-Authenticate"] == wrong["WWW-Authenticate"]


def test_only_a_hash_of_the_token_is_stored(run):
    token = run.ingest_token
    stored = Run.objects.filter(pk=run.pk).values().get()
    assert token and token not in json.dumps(stored, default=str)
    assert Run.objects.get(pk=run.pk).is_ingest_token(token)


@pytest.mark.parametrize("path", INGEST_ENDPOINTS)
def test_the_token_of_a_run_that_ended_past_its_grace_cannot_post(client, make_run, settings, path):
    from datetime import timedelta

    from django.utils import timezone

    settings.ROLLWAY_INGEST_TOKEN_GRACE_S = 600
    long_ago = timezone.now() - timedelta(seconds=601)
    ended = make_run(status=Status.SUCCEEDED, finished_at=long_ago, status_changed_at=long_ago)
    body = {"points": [point()]} if path == "metrics" else {"status": "running"}
    r = post(client, ended, path, body)
    assert r.status_code == 401
    assert "ROLLWAY_INGEST_TOKEN_GRACE_S=600 s ago: its ingest token has expired" in r.json()["errors"]["auth"]
    assert not MetricPoint.objects.exists()


def test_a_run_that_just_ended_takes_its_drivers_last_points(client, make_run, settings):
    from datetime import timedelta

    from django.utils import timezone

    settings.ROLLWAY_INGEST_TOKEN_GRACE_S = 600
    lately = timezone.now() - timedelta(seconds=599)
    ended = make_run(status=Status.SUCCEEDED, finished_at=lately, status_changed_at=lately)
    assert post(client, ended, "metrics", {"points": [point()]}).json() == {"accepted": 1}


def test_a_reissued_token_replaces_the_one_before(client, run):
    before = run.ingest_token
    after = Run.objects.get(pk=run.pk).issue_ingest_token()
    assert post(client, run, "metrics", {"points": [point()]}, token=before).status_code == 401
    assert post(client, run, "metrics", {"points": [point()]}, token=after).status_code == 200


def test_the_migration_hashes_the_tokens_stored_in_clear(run):
    import hashlib
    from importlib import import_module

    from django.apps import apps

    Run.objects.filter(pk=run.pk).update(ingest_digest="a-token-stored-in-clear")
    import_module("migrations.runs.0014_run_ingest_digest").hash_tokens(apps, None)
    assert Run.objects.get(pk=run.pk).ingest_digest == hashlib.sha256(b"a-token-stored-in-clear").hexdigest()


# --- idempotency and validation ------------------------------------------------------


def test_resending_a_batch_never_duplicates_points(client, run):
    batch = {"points": [point(step=s, value=s / 10) for s in range(5)]}
    assert post(client, run, "metrics", batch).status_code == 200
    assert post(client, run, "metrics", batch).status_code == 200
    assert run.points.count() == 5


def test_a_resent_point_replaces_the_stored_value(client, run):
    post(client, run, "metrics", {"points": [point(step=3, value=0.1)]})
    post(client, run, "metrics", {"points": [point(step=3, value=0.9)]})
    assert run.points.get().value == 0.9


@pytest.mark.parametrize(
    "bad, field, message",
    [
        ({"series": "Reward Mean"}, "points.0.series", "should match pattern"),
        ({"series": "x" * 65}, "points.0.series", "should match pattern"),
        ({"step": -1}, "points.0.step", "greater than or equal to 0"),
        ({"step": "three"}, "points.0.step", "valid integer"),
        ({"value": None}, "points.0.value", "valid number"),
        ({"speed": 3}, "points.0.speed", "Extra inputs are not permitted"),
    ],
)
def test_a_bad_point_is_a_400_naming_the_field(client, run, bad, field, message):
    r = post(client, run, "metrics", {"points": [point(step=9), {**point(), **bad}]})
    # the bad point is the second one: its index is in the field name
    field = field.replace("points.0", "points.1")
    assert r.status_code == 400
    assert message in r.json()["errors"][field]
    assert not MetricPoint.objects.exists()  # all or nothing


def test_a_non_finite_value_is_a_400(client, run):
    body = json.dumps({"points": [point(value=math.nan)]})  # json.dumps writes NaN
    r = post(client, run, "metrics", body)
    assert r.status_code == 400
    assert "points.0.value" in r.json()["errors"]


def test_a_missing_field_is_a_400(client, run):
    p = point()
    del p["time"]
    r = post(client, run, "metrics", {"points": [p]})
    assert r.json()["errors"] == {"points.0.time": "Field required"}


def test_a_body_that_is_not_json_is_a_400(client, run):
    r = post(client, run, "metrics", "{points")
    assert r.status_code == 400
    assert r.json()["errors"]["body"].startswith("invalid JSON")


def test_ingest_is_bulk_statements_not_a_query_per_point(client, run):
    def queries(points: list[dict]) -> int:
        with CaptureQueriesContext(connection) as captured:
            r = post(client, run, "metrics", json.dumps({"points": points}))
        assert r.json() == {"accepted": len(points)}
        return len(captured)

    # run lookup, one upsert of the points, then the rollups: a few statements per level
    small = queries([point(series=f"s{i % 10}", step=i) for i in range(100)])
    large = queries([point(series=f"s{i % 10}", step=i) for i in range(100, 10_100)])
    assert large == small <= 25
    assert run.points.count() == 10_100


# --- fan-out ------------------------------------------------------------------------


def test_points_are_fanned_out_to_the_runs_group(client, run, django_capture_on_commit_callbacks):
    channel = listen(run_group(run.pk))
    with django_capture_on_commit_callbacks(execute=True):
        post(client, run, "metrics", {"points": [point(step=4, value=0.25)]})
    message = received(channel)
    assert message["type"] == "metrics.points"
    assert json.loads(message["frame"]) == {"type": "points", "points": [point(step=4, value=0.25)]}


def test_a_rejected_batch_is_not_fanned_out(client, run, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        post(client, run, "metrics", {"points": [point(step=-4)]})
    assert callbacks == []


# --- status ------------------------------------------------------------------------


def test_running_sets_started_at_and_tells_the_runs_list(client, make_run, django_capture_on_commit_callbacks):
    run = make_run(status=Status.STARTING)
    channel = listen(RUNS_GROUP)
    with django_capture_on_commit_callbacks(execute=True):
        r = post(client, run, "status", {"status": "running"})
    assert r.json() == {"status": "running", "changed": True}
    run.refresh_from_db()
    assert run.status == Status.RUNNING and run.started_at is not None
    message = received(channel)
    assert message["type"] == "run.status"
    assert message["team_id"] == run.experiment.team_id
    assert message["run"]["id"] == run.pk and message["run"]["status"] == "running"


@pytest.mark.parametrize("terminal", [Status.CANCELLED, Status.SUCCEEDED, Status.FAILED])
def test_a_late_running_never_overwrites_a_terminal_state(client, make_run, terminal):
    run = make_run(status=terminal)
    r = post(client, run, "status", {"status": "running"})
    assert r.status_code == 200
    assert r.json() == {"status": terminal, "changed": False}
    run.refresh_from_db()
    assert run.status == terminal and run.started_at is None


def test_a_cancelling_run_is_told_so_when_it_reports_running(client, make_run):
    run = make_run(status=Status.CANCELLING)
    assert post(client, run, "status", {"status": "running"}).json()["status"] == "cancelling"


def test_failed_keeps_the_drivers_reason(client, make_run):
    run = make_run(status=Status.RUNNING)
    post(client, run, "status", {"status": "failed", "error": "trainer: loss is NaN"})
    run.refresh_from_db()
    assert (run.status, run.error) == (Status.FAILED, "trainer: loss is NaN")
    assert run.finished_at is not None


def test_an_unknown_status_is_a_400(client, run):
    r = post(client, run, "status", {"status": "cancelled"})
    assert r.status_code == 400
    assert "status" in r.json()["errors"]


# --- placement ------------------------------------------------------------------------


def place(actor="trainer rank 0", **fields):
    row = {
        "actor": actor,
        "node_id": "1f11c59d4fb8" + "0" * 44,
        "node_ip": "10.0.0.5",
        "labels": {"pool": "train"},
        "gpu_ids": ["0"],
        "cuda_visible_devices": "0",
        "pid": 4242,
    }
    return {**row, **fields}


def test_the_drivers_placement_is_kept_and_shown_in_the_api(client, client_for, owner, run):
    r = post(client, run, "placement", {"actors": [place(), place("inference worker 0", gpu_ids=[], threads=2)]})
    assert r.status_code == 200 and r.json() == {"actors": 2, "changed": True}
    assert (
        post(
            client, run, "placement", {"actors": [place(), place("inference worker 0", gpu_ids=[], threads=2)]}
        ).json()["changed"]
        is False
    )  # a resend changes nothing
    detail = client_for(owner).get(f"/api/runs/{run.pk}").json()
    assert [row["actor"] for row in detail["placement"]] == ["trainer rank 0", "inference worker 0"]
    assert detail["placement"][0]["labels"] == {"pool": "train"}
    assert detail["placement"][1]["threads"] == 2


@pytest.mark.parametrize(
    ("row", "field"),
    [
        (place(node_id="not hex"), "node_id"),
        (place(actor=""), "actor"),
        (place(pid=-1), "pid"),
        (place(threads=0), "threads"),
        (place(extra=1), "extra"),
        (place(labels={"k": "v" * 101}), "labels"),
    ],
)
def test_a_bad_placement_is_a_400_naming_the_field_and_keeps_the_last_good_one(client, run, row, field):
    post(client, run, "placement", {"actors": [place()]})
    r = post(client, run, "placement", {"actors": [row]})
    assert r.status_code == 400
    assert any(field in key for key in r.json()["errors"]), r.json()
    run.refresh_from_db()
    assert run.placement == [place()]


# --- schedule -------------------------------------------------------------------------

SCHEDULE = {
    "admissions": [[0, 0, 2], [1, 0, 2], [0, 1, 2]],
    "batches": [[0, ["w0-0", "w1-0", "w0-1", "w1-1"]], [1, ["w0-2", "w0-3"]]],
    "loads": [[0, 1, 3, 1]],
    "requeues": [[1, 1, ["w1-0"]]],
    "bytes": 99,
    "bytes_per_step": 49.5,
}


def test_the_drivers_schedule_is_kept_apart_from_the_run_and_sized_in_the_api(client, client_for, owner, run):
    from runs.models import RunSchedule
    from workers.run.schedule import Schedule

    r = post(client, run, "schedule", SCHEDULE)
    assert r.status_code == 200
    stored = RunSchedule.objects.get(run=run)
    # What the engine replays: the schedule as it was recorded, its size as compact JSON.
    kept = ("admissions", "batches", "loads", "requeues")
    assert Schedule.from_json(stored.as_json()).to_json() == {k: SCHEDULE[k] for k in kept}
    # A driver from before loads and requeues were recorded posts neither: none are kept.
    older = {k: SCHEDULE[k] for k in ("admissions", "batches")}
    assert post(client, run, "schedule", older).status_code == 200
    assert RunSchedule.objects.get(run=run).as_json() == {**older, "loads": [], "requeues": []}
    assert post(client, run, "schedule", SCHEDULE).status_code == 200
    stored = RunSchedule.objects.get(run=run)
    assert r.json() == {"batches": 2, "bytes": stored.bytes}
    assert stored.bytes == len(json.dumps(stored.as_json(), separators=(",", ":")))
    later = {**SCHEDULE, "batches": [[0, ["w1-0", "w0-0", "w0-1", "w1-1"]], [1, ["w0-2", "w0-3"]]]}
    assert post(client, run, "schedule", later).status_code == 200  # a later report replaces it
    assert RunSchedule.objects.get(run=run).batches == later["batches"]
    detail = client_for(owner).get(f"/api/runs/{run.pk}").json()
    assert detail["schedule"] == {"steps": 2, "bytes": stored.bytes}
    assert "schedule" not in client_for(owner).get("/api/runs").json()["runs"][0]  # listings stay lean


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({**SCHEDULE, "admissions": [[0, -1, 2]]}, "admissions"),
        ({**SCHEDULE, "admissions": [[0, 1]]}, "admissions"),
        ({**SCHEDULE, "batches": [[0, [""]]]}, "batches"),
        ({**SCHEDULE, "batches": [[0, ["a\x00b"]]]}, "batches"),
        ({**SCHEDULE, "batches": "all"}, "batches"),
        ({**SCHEDULE, "extra": 1}, "extra"),
        ({**SCHEDULE, "loads": [[0, 1, 3]]}, "loads"),
        ({**SCHEDULE, "requeues": [[0, 1, "w1-0"]]}, "requeues"),
        ({"batches": []}, "admissions"),
    ],
)
def test_a_bad_schedule_is_a_400_naming_the_field_and_keeps_the_last_good_one(client, run, body, field):
    from runs.models import RunSchedule

    post(client, run, "schedule", SCHEDULE)
    r = post(client, run, "schedule", body)
    assert r.status_code == 400
    assert any(field in key for key in r.json()["errors"]), r.json()
    assert RunSchedule.objects.get(run=run).batches == SCHEDULE["batches"]


def test_a_run_without_a_schedule_says_none(client_for, owner, run):
    assert client_for(owner).get(f"/api/runs/{run.pk}").json()["schedule"] is None


def test_a_retry_posts_with_its_own_launch_token_not_its_parents(client, make_run, owner, driver):
    from runs import in_ray, lineage, queue

    parent = make_run(Status.FAILED)
    child = lineage.do_retry(owner, parent)
    Run.objects.filter(pk=child.pk).update(phase=queue.SCHEDULED)
    in_ray.do_start_in_ray(child.pk)
    [launched] = [call[4] for call in driver.named("launch")]
    assert post(client, child, "metrics", {"points": [point()]}, token=parent.ingest_token).status_code == 401
    assert post(client, child, "metrics", {"points": [point()]}, token=launched).json() == {"accepted": 1}
