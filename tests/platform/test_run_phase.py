"""A run's phase as its driver reports it with the status: validated, stored once,
pushed to the run's page, shown there."""

from __future__ import annotations

import json

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from runs.events import run_group
from runs.models import Run

Status = Run.Status


def post_status(client, run, body):
    return client.post(
        f"/api/runs/{run.pk}/status",
        data=json.dumps(body),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {run.ingest_token}",
    )


def listen(group: str) -> str:
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(group, channel)
    return channel


def test_the_ingest_stores_the_reported_phase_and_its_detail(client, make_run):
    run = make_run(Status.STARTING)
    r = post_status(client, run, {"status": "running", "phase": "warm_start", "phase_detail": "step 3/10"})
    assert r.status_code == 200, r.content
    run.refresh_from_db()
    assert (run.status, run.phase, run.phase_detail) == (Status.RUNNING, "warm_start", "step 3/10")


def test_the_same_phase_again_changes_nothing(client, make_run):
    run = make_run(Status.RUNNING)
    first = post_status(client, run, {"status": "running", "phase": "stepping"})
    again = post_status(client, run, {"status": "running", "phase": "stepping"})
    assert first.json()["changed"] is True
    assert again.json()["changed"] is False


def test_a_bad_phase_is_refused_naming_the_field(client, make_run):
    run = make_run(Status.RUNNING)
    r = post_status(client, run, {"status": "running", "phase": "warming"})
    assert r.status_code == 400
    assert "phase" in r.json()["errors"]
    run.refresh_from_db()
    assert run.phase == ""


def test_a_too_long_detail_is_refused_naming_the_field(client, make_run):
    run = make_run(Status.RUNNING)
    r = post_status(client, run, {"status": "running", "phase": "stepping", "phase_detail": "x" * 201})
    assert r.status_code == 400
    assert "phase_detail" in r.json()["errors"]


def test_a_finished_run_takes_no_late_phase(client, make_run):
    run = make_run(Status.SUCCEEDED, phase="stepping")
    r = post_status(client, run, {"status": "running", "phase": "first_step"})
    assert r.status_code == 200
    run.refresh_from_db()
    assert (run.status, run.phase) == (Status.SUCCEEDED, "stepping")


def test_a_phase_change_is_pushed_to_the_runs_page(client, make_run, django_capture_on_commit_callbacks):
    run = make_run(Status.RUNNING, phase="warm_start")
    channel = listen(run_group(run.pk))
    with django_capture_on_commit_callbacks(execute=True):
        post_status(client, run, {"status": "running", "phase": "starting_engines", "phase_detail": "2 workers"})
    message = async_to_sync(get_channel_layer().receive)(channel)
    assert message["run"]["phase"] == "starting_engines"
    assert message["run"]["phase_detail"] == "2 workers"


def test_the_run_page_shows_the_phase_of_a_running_run(client_for, owner, make_run):
    run = make_run(Status.RUNNING, phase="first_step", phase_detail="waiting for the first trained step")
    page = client_for(owner).get(f"/runs/{run.pk}/").content.decode()
    assert 'id="phase-name">first_step<' in page
    assert "waiting for the first trained step" in page
    assert f'data-max-steps="{run.config["stop"]["max_steps"]}"' in page
