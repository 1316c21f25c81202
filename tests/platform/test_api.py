"""The session JSON API: presets, schema, runs, cancel and metric reads (downsampled)."""

from __future__ import annotations

import json

import pytest

from runs.models import MetricPoint, Run
from teams.models import AuditEvent
from workers.config.presets import PRESETS

Status = Run.Status


def test_it_lists_presets_with_description_and_config(client_for, owner):
    presets = {p["name"]: p for p in client_for(owner).get("/api/presets").json()["presets"]}
    assert {"async", "sync"} <= set(presets)
    assert presets["sync"]["config"]["mode"] == "sync"
    assert "Synchronous" in presets["sync"]["description"]


def test_each_listed_preset_says_where_its_peer_scores_rewards(client_for, owner):
    presets = client_for(owner).get("/api/presets").json()["presets"]
    assert {p["name"]: p["rewards_where"] for p in presets} == {n: p["rewards_where"] for n, p in PRESETS.items()}
    assert "Rollway's default" in next(p for p in presets if p["name"] == "async")["rewards_where"]


def test_it_serves_the_engine_config_schema(client_for, owner):
    schema = client_for(owner).get("/api/config/schema").json()
    assert schema["title"] == "RunConfig"
    assert "buffer" in schema["properties"]


@pytest.mark.parametrize("url", ["/api/presets", "/api/runs", "/api/teams", "/api/config/schema"])
def test_anonymous_callers_get_401_not_a_login_page(client, db, url):
    r = client.get(url)
    assert r.status_code == 401
    assert "auth" in r.json()["errors"]


def test_the_runs_list_shows_only_the_users_teams(client_for, make_run, outsider, teammate):
    run = make_run()
    assert [r["id"] for r in client_for(teammate).get("/api/runs").json()["runs"]] == [run.pk]
    assert client_for(outsider).get("/api/runs").json()["runs"] == []


def test_run_detail_has_config_and_status(client_for, teammate, run):
    body = client_for(teammate).get(f"/api/runs/{run.pk}").json()
    assert body["status"] == "queued"
    assert body["config"] == run.config
    assert "ingest_token" not in json.dumps(body) and run.ingest_token not in json.dumps(body)


def test_an_outsider_gets_404_for_a_run(client_for, outsider, run):
    c = client_for(outsider)
    assert c.get(f"/api/runs/{run.pk}").status_code == 404
    assert c.get(f"/api/runs/{run.pk}/metrics").status_code == 404
    assert c.post(f"/api/runs/{run.pk}/cancel").status_code == 404
    assert status_of(run) == Status.QUEUED


def status_of(run):
    run.refresh_from_db()
    return run.status


@pytest.mark.parametrize(("persona", "launcher"), [("owner", None), ("owner", "teammate"), ("teammate", "teammate")])
def test_an_admin_cancels_any_run_a_member_their_own(
    client_for, make_run, persona, launcher, request, enqueued, django_capture_on_commit_callbacks
):
    user = request.getfixturevalue(persona)
    run = make_run(Status.RUNNING, launched_by=request.getfixturevalue(launcher) if launcher else None)
    with django_capture_on_commit_callbacks(execute=True):
        r = client_for(user).post(f"/api/runs/{run.pk}/cancel")
    assert r.status_code == 202
    assert r.json()["status"] == "cancelling"
    assert enqueued == [("cancel_run", run.pk)]
    event = AuditEvent.objects.get(action="cancel")
    assert (event.actor, event.team, event.subject) == (user, run.experiment.team, f"run {run.pk}")


def test_a_member_may_not_cancel_someone_elses_run(client_for, teammate, owner, make_run, enqueued):
    run = make_run(Status.RUNNING, launched_by=owner)
    r = client_for(teammate).post(f"/api/runs/{run.pk}/cancel")
    assert r.status_code == 403
    assert "admin role" in r.json()["errors"]["run"]
    assert status_of(run) == Status.RUNNING and enqueued == [] and not AuditEvent.objects.exists()


def test_cancelling_a_finished_run_is_a_409(client_for, owner, make_run, enqueued):
    run = make_run(status=Status.SUCCEEDED)
    r = client_for(owner).post(f"/api/runs/{run.pk}/cancel")
    assert r.status_code == 409
    assert "succeeded" in r.json()["errors"]["status"]
    assert enqueued == []


def test_cancel_is_post_only(client_for, owner, run):
    assert client_for(owner).get(f"/api/runs/{run.pk}/cancel").status_code == 405


# --- metrics -----------------------------------------------------------------------


def store(run, series, steps, value=lambda s: float(s)):
    MetricPoint.objects.upsert(run.pk, [(series, s, value(s), 1000.0 + s) for s in steps])


def test_metrics_come_back_per_series_in_step_order(client_for, owner, run):
    store(run, "loss", [3, 1, 2])
    store(run, "reward/mean", [1])
    series = client_for(owner).get(f"/api/runs/{run.pk}/metrics").json()["series"]
    assert series["loss"]["steps"] == [1, 2, 3]
    assert series["loss"]["values"] == [1.0, 2.0, 3.0]
    assert series["loss"]["last_step"] == 3 and series["loss"]["downsampled"] is False
    assert set(series) == {"loss", "reward/mean"}


def test_metrics_filter_by_series_and_after_step(client_for, owner, run):
    store(run, "loss", range(10))
    store(run, "reward/mean", range(10))
    c = client_for(owner)
    body = c.get(f"/api/runs/{run.pk}/metrics?series=loss&after_step=6").json()
    assert list(body["series"]) == ["loss"]
    assert body["series"]["loss"]["steps"] == [7, 8, 9]
    both = c.get(f"/api/runs/{run.pk}/metrics?series=loss,reward/mean").json()["series"]
    assert set(both) == {"loss", "reward/mean"}


def test_long_series_are_downsampled_keeping_spikes_and_the_last_point(client_for, owner, run):
    spike_at = 4321
    store(run, "staleness/max", range(20_000), value=lambda s: 50.0 if s == spike_at else 1.0)
    body = client_for(owner).get(f"/api/runs/{run.pk}/metrics?max_points=500").json()
    s = body["series"]["staleness/max"]
    assert len(s["steps"]) <= 500
    assert s["total"] == 20_000 and s["downsampled"] is True
    assert spike_at in s["steps"]
    assert s["steps"][-1] == 19_999 == s["last_step"]
    assert s["steps"] == sorted(s["steps"])


@pytest.mark.parametrize("query, field", [("after_step=x", "after_step"), ("max_points=1", "max_points")])
def test_bad_metric_query_parameters_are_400s(client_for, owner, run, query, field):
    r = client_for(owner).get(f"/api/runs/{run.pk}/metrics?{query}")
    assert r.status_code == 400
    assert field in r.json()["errors"]


# --- teams and experiments ------------------------------------------------------------


def test_a_member_can_create_an_experiment_in_their_team(client_for, teammate, team):
    r = client_for(teammate).post(
        "/api/experiments",
        data=json.dumps({"team": team.slug, "name": "capacity sweep"}),
        content_type="application/json",
    )
    assert r.status_code == 201
    again = client_for(teammate).post(
        "/api/experiments",
        data=json.dumps({"team": team.pk, "name": "capacity sweep"}),
        content_type="application/json",
    )
    assert again.status_code == 400 and "already has" in again.json()["errors"]["name"]


def test_the_teams_endpoint_lists_roles_and_experiments(client_for, owner, experiment):
    [team] = client_for(owner).get("/api/teams").json()["teams"]
    assert team["role"] == "admin"
    assert [e["name"] for e in team["experiments"]] == ["async-vs-sync"]


def test_the_runs_list_rejects_a_bad_experiment_filter(client_for, owner):
    r = client_for(owner).get("/api/runs?experiment=abc")
    assert r.status_code == 400
    assert "experiment must be an integer" in r.json()["errors"]["experiment"]


def post_experiment(client, body):
    return client.post("/api/experiments", data=json.dumps(body), content_type="application/json")


@pytest.mark.parametrize("name", ["", "   ", "x" * 101])
def test_an_experiment_name_must_be_1_to_100_characters(client_for, owner, team, name):
    r = post_experiment(client_for(owner), {"team": team.slug, "name": name})
    assert r.status_code == 400
    assert r.json() == {"errors": {"name": "must be 1 to 100 characters"}}
    assert not team.experiments.exists()


def test_an_outsider_cannot_create_an_experiment_in_a_team(client_for, outsider, team):
    r = post_experiment(client_for(outsider), {"team": team.slug, "name": "sneaky"})
    assert r.status_code == 400
    assert "not a member" in r.json()["errors"]["team"]
    assert not team.experiments.exists()


def test_a_duplicate_experiment_name_is_refused_on_the_name_field(owner, team, experiment):
    from foundation.errors import ActionError
    from runs.actions import do_create_experiment

    with pytest.raises(ActionError) as refused:
        do_create_experiment(owner, team, experiment.name)
    assert refused.value.http_status == 400
    assert refused.value.errors == {"name": "team lab already has an experiment 'async-vs-sync'"}
    assert team.experiments.count() == 1


def test_creating_an_experiment_records_who_made_it(client_for, teammate, team):
    r = post_experiment(
        client_for(teammate), {"team": team.pk, "name": "  lr sweep ", "description": "three learning rates"}
    )
    assert r.status_code == 201
    made = team.experiments.get(pk=r.json()["id"])
    assert (made.name, made.description, made.created_by) == ("lr sweep", "three learning rates", teammate)
