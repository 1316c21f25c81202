"""Launching a run from the API and the form: the engine config validates it, errors
name the field, and nothing is created or enqueued on error."""

from __future__ import annotations

import json

import pytest

from runs import tasks
from runs.models import Experiment, Run

URL = "/api/runs"


def post_json(client, url, body):
    return client.post(url, data=json.dumps(body), content_type="application/json")


def test_it_launches_a_run_and_asks_the_queue_to_schedule_it_after_commit(
    client_for, owner, experiment, enqueued, driver, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        r = post_json(
            client_for(owner),
            URL,
            {
                "experiment": experiment.pk,
                "name": "cap 4",
                "preset": "async",
                "overrides": {"buffer": {"capacity": 4}},
            },
        )
    assert r.status_code == 201, r.content
    run = Run.objects.get()
    assert r.json()["id"] == run.pk
    assert (run.status, run.name, run.preset, run.launched_by) == ("queued", "cap 4", "async", owner)
    assert run.config["buffer"]["capacity"] == 4
    assert run.config["mode"] == "async"
    assert run.overrides == {"buffer": {"capacity": 4}}
    # The launch goes through the queue: its scheduler, not the launch, sends launch_run.
    assert enqueued == [("schedule_queue", None)]
    with django_capture_on_commit_callbacks(execute=True):
        tasks.schedule_queue()
    assert enqueued == [("schedule_queue", None), ("launch_run", run.pk)]
    run.refresh_from_db()
    assert (run.status, run.phase, run.celery_task_id) == ("queued", "scheduled", "fake-task-id")


def test_it_does_not_enqueue_before_the_transaction_commits(client_for, owner, experiment, enqueued):
    # pytest-django's test transaction never commits: the launch must wait for it.
    r = post_json(client_for(owner), URL, {"experiment": experiment.pk, "preset": "sync"})
    assert r.status_code == 201
    assert enqueued == []


def test_a_teammate_may_launch_in_the_team(client_for, teammate, experiment):
    r = post_json(client_for(teammate), URL, {"experiment": experiment.pk, "preset": "sync"})
    assert r.status_code == 201
    assert Run.objects.get().launched_by == teammate


@pytest.mark.parametrize(
    "overrides, field, message",
    [
        ({"buffer": {"capacity": -1}}, "buffer.capacity", "Input should be greater than or equal to 1"),
        ({"buffer": {"capcity": 3}}, "buffer.capcity", "unknown field 'capcity'"),
        ({"trainer": {"lr": "fast"}}, "trainer.lr", "Input should be a valid number"),
        (
            {"model": {"hidden_size": 66, "num_heads": 4}},
            "model",
            "model.hidden_size (66) must be divisible by model.num_heads (4)",
        ),
        ({"turbo": True}, "turbo", "unknown field 'turbo'"),
        ([1, 2], "overrides", "must be a JSON object"),
    ],
)
def test_it_rejects_a_bad_config_with_field_errors_and_creates_nothing(
    client_for, owner, experiment, enqueued, overrides, field, message
):
    r = post_json(
        client_for(owner),
        URL,
        {
            "experiment": experiment.pk,
            "preset": "async",
            "overrides": overrides,
        },
    )
    assert r.status_code == 400
    assert message in r.json()["errors"][field]
    assert not Run.objects.exists()
    assert enqueued == []


def test_an_unknown_field_error_lists_what_the_section_accepts(client_for, owner, experiment):
    r = post_json(
        client_for(owner),
        URL,
        {
            "experiment": experiment.pk,
            "preset": "async",
            "overrides": {"buffer": {"capcity": 3}},
        },
    )
    message = r.json()["errors"]["buffer.capcity"]
    assert "buffer accepts:" in message
    accepted = [name.strip() for name in message.split("buffer accepts:")[1].split(",")]
    assert "capacity" in accepted and "max_staleness" in accepted


def test_it_rejects_an_unknown_preset(client_for, owner, experiment):
    r = post_json(client_for(owner), URL, {"experiment": experiment.pk, "preset": "verl-9000"})
    assert r.status_code == 400
    assert "unknown preset 'verl-9000'" in r.json()["errors"]["preset"]


def test_it_reports_every_bad_field_at_once(client_for, owner):
    r = post_json(
        client_for(owner),
        URL,
        {
            "experiment": 999_999,  # none such: refused beside the config's fields
            "preset": "async",
            "overrides": {"buffer": {"capacity": 0}, "stop": {"max_steps": 0}},
        },
    )
    assert set(r.json()["errors"]) == {"experiment", "buffer.capacity", "stop.max_steps"}


def test_it_rejects_an_unknown_top_level_key(client_for, owner, experiment):
    r = post_json(client_for(owner), URL, {"experiment": experiment.pk, "preset": "async", "overides": {}})
    assert r.status_code == 400
    assert "overides" in r.json()["errors"]


def test_it_rejects_a_body_that_is_not_json(client_for, owner):
    r = client_for(owner).post(URL, data="{nope", content_type="application/json")
    assert r.status_code == 400
    assert r.json()["errors"]["body"].startswith("invalid JSON")


def test_it_rejects_other_teams_experiment(client_for, outsider, experiment, enqueued):
    r = post_json(client_for(outsider), URL, {"experiment": experiment.pk, "preset": "async"})
    assert r.status_code == 400
    assert "no experiment" in r.json()["errors"]["experiment"]
    assert not Run.objects.exists()


def test_launching_by_team_uses_its_default_experiment(client_for, owner, team):
    r = post_json(client_for(owner), URL, {"team": team.slug, "preset": "async"})
    assert r.status_code == 201
    assert Run.objects.get().experiment == Experiment.objects.get(team=team, name="default")


def test_an_outsider_cannot_launch_into_a_team_by_slug(client_for, outsider, team):
    r = post_json(client_for(outsider), URL, {"team": team.slug, "preset": "async"})
    assert r.status_code == 400
    assert "not a member" in r.json()["errors"]["team"]


def test_anonymous_clients_get_401(client, experiment):
    r = post_json(client, URL, {"experiment": experiment.pk, "preset": "async"})
    assert r.status_code == 401


def test_session_posts_need_a_csrf_token(owner, experiment):
    from django.test import Client

    client = Client(enforce_csrf_checks=True)
    client.force_login(owner)
    r = post_json(client, URL, {"experiment": experiment.pk, "preset": "async"})
    assert r.status_code == 403
    assert not Run.objects.exists()


# --- the HTML form ---------------------------------------------------------------


def test_the_form_shows_config_errors_next_to_the_overrides_and_creates_nothing(client_for, owner, experiment):
    r = client_for(owner).post(
        "/runs/new/",
        {
            "experiment": experiment.pk,
            "preset": "async",
            "overrides": '{"buffer": {"capacity": -1}}',
        },
    )
    assert r.status_code == 400
    html = r.content.decode()
    assert 'data-field="buffer.capacity"' in html
    assert "Input should be greater than or equal to 1" in html
    assert "{&quot;buffer&quot;: {&quot;capacity&quot;: -1}}" in html  # the input is kept
    assert not Run.objects.exists()


def test_the_form_rejects_invalid_json_in_overrides(client_for, owner, experiment):
    r = client_for(owner).post(
        "/runs/new/",
        {
            "experiment": experiment.pk,
            "preset": "async",
            "overrides": "{buffer:",
        },
    )
    assert r.status_code == 400
    assert 'data-field="overrides"' in r.content.decode()
    assert not Run.objects.exists()


def test_the_form_launches_and_redirects_to_the_run_page(client_for, owner, experiment):
    r = client_for(owner).post(
        "/runs/new/",
        {
            "experiment": experiment.pk,
            "preset": "sync",
            "name": "baseline",
            "overrides": "",
        },
    )
    run = Run.objects.get()
    assert r.status_code == 302
    assert r["Location"] == f"/runs/{run.pk}/"
    assert run.name == "baseline"


def test_the_form_offers_only_the_users_experiments(client_for, owner, outsider, experiment):
    html = client_for(owner).get("/runs/new/").content.decode()
    assert "Lab / async-vs-sync" in html
    assert "theirs" not in html


def test_a_broker_outage_keeps_the_run_queued_for_reconcile(
    client_for, owner, experiment, monkeypatch, django_capture_on_commit_callbacks
):
    from rollway.celery import app

    def broker_down(name, args=(), **options):
        raise ConnectionError("broker folder missing")

    monkeypatch.setattr(app, "send_task", broker_down)
    with django_capture_on_commit_callbacks(execute=True):
        r = post_json(client_for(owner), URL, {"experiment": experiment.pk, "preset": "async"})
    assert r.status_code == 201
    assert Run.objects.get().status == "queued"


# --- priority ----------------------------------------------------------------------


def test_the_apis_priority_reaches_the_run_and_the_queue_schedules_it_first(
    client_for, owner, experiment, driver, settings, django_capture_on_commit_callbacks
):
    from runs import queue

    settings.ROLLWAY_MAX_RUNNING = 1
    client = client_for(owner)
    plain = post_json(client, URL, {"experiment": experiment.pk, "preset": "sync"})
    urgent = post_json(client, URL, {"experiment": experiment.pk, "preset": "sync", "priority": 10})
    low = post_json(client, URL, {"experiment": experiment.pk, "preset": "sync", "priority": -2})
    assert (plain.status_code, urgent.status_code, low.status_code) == (201, 201, 201)
    ids = [r.json()["id"] for r in (plain, urgent, low)]
    assert [Run.objects.get(pk=pk).priority for pk in ids] == [0, 10, -2]
    assert [r.pk for r in Run.objects.filter(status="queued").in_queue_order()] == [ids[1], ids[0], ids[2]]

    with django_capture_on_commit_callbacks(execute=True):
        assert queue.do_schedule_queue() == [ids[1]]


@pytest.mark.parametrize(
    ("priority", "says"),
    [
        (11, "must be from -10 to 10"),
        (-11, "must be from -10 to 10"),
        (1.5, "must be a whole number from -10 to 10"),
        ("high", "must be a whole number from -10 to 10"),
        (True, "must be a whole number from -10 to 10"),
        ([1], "must be a whole number from -10 to 10"),
    ],
)
def test_a_bad_priority_is_a_400_naming_it_and_creates_nothing(client_for, owner, experiment, enqueued, priority, says):
    r = post_json(client_for(owner), URL, {"experiment": experiment.pk, "preset": "async", "priority": priority})
    assert r.status_code == 400
    assert says in r.json()["errors"]["priority"]
    assert not Run.objects.exists()
    assert enqueued == []


# --- trackers ------------------------------------------------------------------------


@pytest.fixture
def trackers_on(settings, tmp_path):
    """A site exporting to TensorBoard only."""
    settings.ROLLWAY_MLFLOW_TRACKING_URI = settings.ROLLWAY_WANDB_PROJECT = ""
    settings.ROLLWAY_TENSORBOARD_DIR = str(tmp_path / "tb")


def test_a_launch_chooses_its_trackers_and_unset_takes_the_sites(client_for, owner, experiment, trackers_on):
    client = client_for(owner)
    chose = post_json(client, URL, {"experiment": experiment.pk, "preset": "sync", "trackers": ["tensorboard"]})
    none = post_json(client, URL, {"experiment": experiment.pk, "preset": "sync", "trackers": []})
    unset = post_json(client, URL, {"experiment": experiment.pk, "preset": "sync"})
    assert (chose.status_code, none.status_code, unset.status_code) == (201, 201, 201), chose.content
    assert [r.json()["trackers"] for r in (chose, none, unset)] == [["tensorboard"], [], None]
    assert [Run.objects.get(pk=r.json()["id"]).trackers for r in (chose, none, unset)] == [["tensorboard"], [], None]


@pytest.mark.parametrize(
    ("trackers", "says"),
    [
        (["neptune"], "'neptune' is not a tracker; the trackers are mlflow, tensorboard, wandb"),
        (["wandb"], "this site does not export to W&B: its operator sets ROLLWAY_WANDB_PROJECT"),
        ("tensorboard,mlflow", "this site does not export to MLflow: its operator sets ROLLWAY_MLFLOW_TRACKING_URI"),
        ([1], "must be a list of tracker names (mlflow, tensorboard, wandb), got [1]"),
        ({"wandb": True}, "must be a list of tracker names"),
    ],
)
def test_a_tracker_the_site_lacks_is_a_400_naming_it_and_creates_nothing(
    client_for, owner, experiment, enqueued, trackers_on, trackers, says
):
    r = post_json(client_for(owner), URL, {"experiment": experiment.pk, "preset": "sync", "trackers": trackers})
    assert r.status_code == 400
    assert says in r.json()["errors"]["trackers"]
    assert not Run.objects.exists() and enqueued == []


def test_the_form_offers_the_sites_trackers_and_none_ticked_exports_nowhere(client_for, owner, experiment, trackers_on):
    client = client_for(owner)
    html = client.get("/runs/new/").content.decode()
    assert 'name="trackers" value="tensorboard" checked' in html and 'value="wandb"' not in html
    fields = {"experiment": experiment.pk, "preset": "sync", "overrides": "", "trackers_shown": "1"}
    assert client.post("/runs/new/", fields).status_code == 302  # nothing ticked
    assert client.post("/runs/new/", {**fields, "trackers": "tensorboard"}).status_code == 302
    assert [run.trackers for run in Run.objects.order_by("pk")] == [[], ["tensorboard"]]
    clone = client.get(f"/runs/new/?clone={Run.objects.order_by('pk').first().pk}").content.decode()
    assert 'name="trackers" value="tensorboard" >' in clone  # the clone keeps its parent's choice: unticked


def test_a_site_without_trackers_shows_no_boxes(client_for, owner, experiment, settings):
    settings.ROLLWAY_MLFLOW_TRACKING_URI = settings.ROLLWAY_WANDB_PROJECT = settings.ROLLWAY_TENSORBOARD_DIR = ""
    assert 'name="trackers"' not in client_for(owner).get("/runs/new/").content.decode()


def test_the_run_page_says_which_trackers_the_run_goes_to(client_for, owner, make_run, trackers_on):
    client = client_for(owner)
    chose, none = make_run(trackers=["tensorboard"]), make_run(trackers=[])
    assert '<span id="trackers">exported to TensorBoard</span>' in client.get(f"/runs/{chose.pk}/").content.decode()
    assert '<span id="trackers">exported to no tracker</span>' in client.get(f"/runs/{none.pk}/").content.decode()
