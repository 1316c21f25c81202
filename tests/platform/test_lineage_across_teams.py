"""Retry, resume, clone and a comparison's rerun create their runs only where the
caller's role launches runs, from every surface (the launch form, the run page, the JSON
API, the compare page), and the reconcile resumes a run only while its launcher still may.

Two teams: "Lab" (the conftest's `team`, with `owner` its admin) and "Field", with its own
admin; `vera` is a viewer of Lab and a member of Field. A refused request stores nothing:
each test counts the runs and the audit events before and after.
"""

from __future__ import annotations

import json
import re

import pytest
from django.contrib.auth import get_user_model

from compare.models import Comparison
from runs import reconcile
from runs.models import Checkpoint, Experiment, Run
from teams.models import AuditEvent, Membership, Team
from workers.config.presets import build

Status = Run.Status
Role = Membership.Role
SHA = "ab" * 32


@pytest.fixture
def field(db):
    team = Team.objects.create(name="Field")
    Membership.objects.create(team=team, user=get_user_model().objects.create_user("fran"), role=Role.ADMIN)
    return team


@pytest.fixture
def field_experiment(field):
    return Experiment.objects.create(team=field, name="field-runs")


@pytest.fixture
def vera(team, field):
    """A viewer of Lab who is a member of Field."""
    user = get_user_model().objects.create_user("vera")
    Membership.objects.create(team=team, user=user, role=Role.VIEWER)
    Membership.objects.create(team=field, user=user, role=Role.MEMBER)
    return user


@pytest.fixture
def parent(make_run):
    """An ended run of Lab, with a checkpoint to resume from."""
    run = make_run(Status.FAILED, preset="sync", name="lab-secret-recipe", overrides={"buffer": {"capacity": 3}})
    Checkpoint.objects.create(run=run, step=2, location="/ck/2", bytes=1, sha256=SHA)
    return run


def stored() -> tuple[int, int]:
    return Run.objects.count(), AuditEvent.objects.count()


def post_json(client, url, body):
    return client.post(url, data=json.dumps(body), content_type="application/json")


def clone_on_the_form(client, parent, experiment):
    return client.post(
        "/runs/new/",
        {
            "clone_of": str(parent.pk),
            "experiment": str(experiment.pk),
            "preset": "sync",
            "name": "my copy",
            "priority": "5",
            "overrides": json.dumps({"buffer": {"capacity": 5}}),
        },
    )


def clone_on_the_api(client, parent, experiment):
    return post_json(
        client,
        f"/api/runs/{parent.pk}/clone",
        {"experiment": experiment.pk, "name": "my copy", "priority": 5, "overrides": {"buffer": {"capacity": 5}}},
    )


SURFACES = {"form": clone_on_the_form, "api": clone_on_the_api}


@pytest.mark.parametrize("surface", SURFACES)
def test_a_viewer_may_not_clone_a_run_into_its_own_team(client_for, vera, parent, experiment, surface):
    before = stored()
    response = SURFACES[surface](client_for(vera), parent, experiment)
    assert response.status_code == 403
    need = "to launch runs in team lab you need the member role or higher (yours: viewer)"
    if surface == "api":
        assert response.json()["errors"] == {"experiment": need}
    else:  # the form comes back with the refusal under the experiment it names
        assert response.context["field_errors"] == {"experiment": need}
    assert stored() == before


@pytest.mark.parametrize("surface", SURFACES)
def test_a_viewer_may_clone_a_run_they_read_into_a_team_where_they_launch(
    client_for, vera, parent, team, field, field_experiment, surface
):
    before_runs, before_events = stored()
    response = SURFACES[surface](client_for(vera), parent, field_experiment)
    assert response.status_code in (201, 302), response.content
    child = Run.objects.get(parent=parent)
    assert (child.experiment, child.origin, child.launched_by, child.name) == (
        field_experiment,
        "clone",
        vera,
        "my copy",
    )
    assert child.config["buffer"]["capacity"] == 5 and child.priority == 5
    assert Run.objects.count() == before_runs + 1
    assert list(AuditEvent.objects.values_list("team", "action")) == [(field.pk, "clone")]
    assert AuditEvent.objects.count() == before_events + 1
    assert not AuditEvent.objects.filter(team=team).exists()


def test_a_clone_into_another_team_is_not_listed_among_the_parents_children(
    client_for, owner, vera, parent, field_experiment
):
    child_id = clone_on_the_api(client_for(vera), parent, field_experiment).json()["id"]
    assert client_for(owner).get(f"/api/runs/{parent.pk}").json()["children"] == []
    assert f"/runs/{child_id}/" not in client_for(owner).get(f"/runs/{parent.pk}/").content.decode()
    # the child, in Field, keeps where its config came from
    assert client_for(vera).get(f"/api/runs/{child_id}").json()["parent"] == parent.pk


def test_a_clone_without_an_experiment_lands_in_the_parents(client_for, teammate, parent, experiment):
    response = post_json(client_for(teammate), f"/api/runs/{parent.pk}/clone", {})
    assert response.status_code == 201
    assert response.json()["experiment"]["id"] == experiment.pk


def test_an_api_clone_into_an_experiment_of_a_team_not_theirs_names_the_field(
    client_for, teammate, parent, field_experiment
):
    before = stored()
    response = clone_on_the_api(client_for(teammate), parent, field_experiment)
    assert response.status_code == 400
    assert response.json()["errors"] == {"experiment": f"no experiment {field_experiment.pk} in your teams"}
    assert stored() == before


@pytest.mark.parametrize("surface", SURFACES)
def test_a_clone_of_a_run_the_caller_cannot_see_is_a_404_naming_nothing_of_it(
    client_for, field, field_experiment, parent, surface
):
    fran = Membership.objects.get(team=field).user
    before = stored()
    response = SURFACES[surface](client_for(fran), parent, field_experiment)
    assert response.status_code == 404
    body = response.content.decode()
    assert "lab-secret-recipe" not in body and "async-vs-sync" not in body and not re.search(r"\bLab\b", body)
    if surface == "api":
        assert response.json() == {"errors": {"run": f"run {parent.pk} not found"}}
    assert stored() == before


@pytest.mark.parametrize("what", ["retry", "resume"])
def test_a_viewer_may_not_retry_or_resume_a_run(client_for, vera, parent, what):
    before = stored()
    response = post_json(client_for(vera), f"/api/runs/{parent.pk}/{what}", {})
    assert response.status_code == 403
    assert response.json()["errors"] == {
        "run": "to launch runs in team lab you need the member role or higher (yours: viewer)"
    }
    page = client_for(vera).post(f"/runs/{parent.pk}/{what}/", follow=True)
    assert "to launch runs in team lab you need the member role" in page.content.decode()
    assert stored() == before


@pytest.mark.parametrize("what", ["retry", "resume"])
def test_a_retry_or_resume_lands_in_the_parents_experiment(client_for, teammate, parent, experiment, what):
    response = post_json(client_for(teammate), f"/api/runs/{parent.pk}/{what}", {})
    assert response.status_code == 201
    child = Run.objects.get(pk=response.json()["id"])
    assert child.experiment == experiment
    assert AuditEvent.objects.get(action=what).team_id == experiment.team_id


def test_a_viewer_may_not_rerun_a_comparison_from_the_api_or_its_page(client_for, owner, vera, experiment):
    created = post_json(
        client_for(owner),
        "/api/comparisons",
        {"experiment": experiment.pk, "name": "buffers", "configurations": ["async", "sync"], "seeds": [0]},
    )
    assert created.status_code == 201
    comparison = Comparison.objects.get(pk=created.json()["id"])
    before = stored()
    response = post_json(client_for(vera), f"/api/comparisons/{comparison.pk}/rerun", {"seeds": [4]})
    assert response.status_code == 403
    assert response.json()["errors"] == {
        "comparison": "to launch comparisons in team lab you need the member role or higher (yours: viewer)"
    }
    page = client_for(vera).post(f"/comparisons/{comparison.pk}/rerun/", {"seeds": "4"}, follow=True)
    assert "Nothing was launched: to launch comparisons in team lab" in page.content.decode()
    assert stored() == before
    comparison.refresh_from_db()
    assert comparison.seeds == [0]


# --- auto-resume --------------------------------------------------------------------


def resumable_run(make_run, launched_by):
    config = build("sync", {"stop": {"max_steps": 10}, "checkpoint": {"every_steps": 2, "max_restarts": 1}})
    run = make_run(Status.RUNNING, config=config.model_dump(mode="json"), launched_by=launched_by)
    Checkpoint.objects.create(run=run, step=4, location="/ck/4", bytes=1, sha256=SHA)
    return run


def report_lost_node(client, run):
    return client.post(
        f"/api/runs/{run.pk}/status",
        data=json.dumps({"status": "failed", "error": "The run lost a node.", "error_kind": "node_lost"}),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {run.ingest_token}",
    )


def driver_gone() -> dict:
    return reconcile.do_reconcile_runs()  # no driver is alive in the fake Ray


@pytest.mark.parametrize(
    ("change", "now"),
    [
        ("removed", "they are no longer a member"),
        ("demoted", "their role there is viewer"),
        ("deactivated", "their account is deactivated"),
    ],
)
@pytest.mark.parametrize("how", ["driver gone", "node lost"])
def test_a_run_is_not_resumed_once_its_launcher_may_no_longer_launch_runs_in_its_team(
    client, make_run, teammate, team, driver, enqueued, change, now, how
):
    run = resumable_run(make_run, teammate)
    if change == "removed":
        Membership.objects.filter(team=team, user=teammate).delete()
    elif change == "demoted":
        Membership.objects.filter(team=team, user=teammate).update(role=Role.VIEWER)
    else:
        type(teammate).objects.filter(pk=teammate.pk).update(is_active=False)
    before = stored()
    if how == "driver gone":
        assert driver_gone()["lost"] == 1
    else:
        assert report_lost_node(client, run).status_code == 200
    run.refresh_from_db()
    assert run.status == Status.FAILED
    assert run.error.endswith(f"It was not resumed: tom may no longer launch runs in team lab ({now}).")
    assert stored() == before and not Run.objects.filter(parent=run).exists()


@pytest.mark.parametrize("how", ["driver gone", "node lost"])
def test_a_run_whose_launcher_still_launches_runs_is_resumed(client, make_run, teammate, driver, enqueued, how):
    run = resumable_run(make_run, teammate)
    if how == "driver gone":
        assert driver_gone()["resumed"] == 1
    else:
        assert report_lost_node(client, run).status_code == 200
    child = Run.objects.get(parent=run)
    assert (child.launched_by, child.origin, child.restarts) == (teammate, "resume", 1)


def test_a_run_whose_launcher_was_deleted_is_not_resumed(client, make_run, teammate, enqueued):
    run = resumable_run(make_run, teammate)
    teammate.delete()
    assert report_lost_node(client, run).status_code == 200
    run.refresh_from_db()
    assert run.status == Status.FAILED and not Run.objects.filter(parent=run).exists()
    assert run.error.endswith(
        "It was not resumed: the user who launched it was deleted, and a resume in team lab runs as its launcher."
    )


@pytest.mark.parametrize("given", ["lab", 1.5, 10**30, -1])
def test_an_api_clone_into_no_experiment_is_a_400_naming_the_field(client_for, teammate, parent, given):
    before = stored()
    response = post_json(client_for(teammate), f"/api/runs/{parent.pk}/clone", {"experiment": given})
    assert response.status_code == 400
    assert "experiment" in response.json()["errors"]
    assert stored() == before
