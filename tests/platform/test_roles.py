"""Roles in a team: a viewer reads, a member launches and cancels their own runs, an
admin manages everything including members; every change lands in the audit log, and
the Django admin shows a staff user only the teams they administer."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth import get_user_model

from configs.models import SavedConfig
from runs.models import Experiment, Run
from teams.models import AuditEvent, Membership, Team

Role = Membership.Role


def post_json(client, url, body):
    return client.post(url, data=json.dumps(body), content_type="application/json")


@pytest.fixture
def viewer(team):
    user = get_user_model().objects.create_user("vera", password="x")
    Membership.objects.create(team=team, user=user, role=Role.VIEWER)
    return user


def test_a_viewer_reads_but_launches_saves_and_compares_nothing(client_for, viewer, experiment, make_run, team):
    run = make_run(Run.Status.SUCCEEDED)
    client = client_for(viewer)
    assert client.get(f"/api/runs/{run.pk}").status_code == 200
    assert client.get(f"/runs/{run.pk}/").status_code == 200
    refused = [
        post_json(client, "/api/runs", {"experiment": experiment.pk, "preset": "sync"}),
        post_json(client, "/api/experiments", {"team": team.slug, "name": "mine"}),
        post_json(client, "/api/configs", {"team": team.slug, "name": "c", "base_preset": "sync"}),
        post_json(
            client,
            "/api/comparisons",
            {"team": team.slug, "name": "cmp", "configurations": ["sync"], "seeds": [0]},
        ),
        client.post("/runs/new/", {"experiment": str(experiment.pk), "preset": "sync", "overrides": "{}"}),
    ]
    assert [r.status_code for r in refused] == [403] * 5
    assert "you need the member role or higher (yours: viewer)" in refused[0].json()["errors"]["experiment"]
    assert "launch runs" in refused[4].content.decode()
    assert Run.objects.count() == 1 and Experiment.objects.count() == 1 and not SavedConfig.objects.exists()
    assert not AuditEvent.objects.exists()


def test_a_members_launch_is_in_the_audit_log(client_for, teammate, experiment):
    r = post_json(client_for(teammate), "/api/runs", {"experiment": experiment.pk, "preset": "sync", "name": "x"})
    assert r.status_code == 201
    event = AuditEvent.objects.get()
    assert (event.actor, event.action, event.subject, event.detail) == (
        teammate,
        "launch",
        f"run {r.json()['id']}",
        {"name": "x", "preset": "sync"},
    )


def test_an_admin_adds_a_member_changes_the_role_and_removes_them(client_for, owner, team):
    get_user_model().objects.create_user("nina", password="x")
    client = client_for(owner)
    url = f"/api/teams/{team.slug}/members"
    r = post_json(client, url, {"username": "nina", "role": "viewer"})
    assert r.status_code == 201 and r.json()["role"] == "viewer"
    r = post_json(client, url, {"username": "nina", "role": "member"})
    assert r.status_code == 200 and team.role_of(get_user_model().objects.get(username="nina")) == "member"
    assert [m["username"] for m in client.get(url).json()["members"]] == ["nina", "olga"]
    assert client.delete(f"{url}/nina").status_code == 200
    assert not team.memberships.filter(user__username="nina").exists()
    log = client.get(f"/api/teams/{team.slug}/audit").json()["events"]
    assert [(e["actor"], e["action"], e["subject"]) for e in log] == [
        ("olga", "member_remove", "user nina"),
        ("olga", "member_role", "user nina"),
        ("olga", "member_add", "user nina"),
    ]
    assert log[1]["detail"] == {"role": "member", "was": "viewer"}


def test_the_last_admin_can_be_neither_demoted_nor_removed(client_for, owner, team):
    client = client_for(owner)
    r = post_json(client, f"/api/teams/{team.slug}/members", {"username": "olga", "role": "member"})
    assert r.status_code == 409 and "last admin" in r.json()["errors"]["username"]
    assert client.delete(f"/api/teams/{team.slug}/members/olga").status_code == 409
    assert team.role_of(owner) == "admin" and not AuditEvent.objects.exists()


@pytest.mark.parametrize(
    ("body", "field"),
    [({"username": "nobody", "role": "member"}, "username"), ({"username": "olga", "role": "owner"}, "role")],
)
def test_a_bad_member_request_names_the_field(client_for, owner, team, body, field):
    r = post_json(client_for(owner), f"/api/teams/{team.slug}/members", body)
    assert r.status_code == 400 and field in r.json()["errors"]


def test_members_and_viewers_may_not_manage_members_and_outsiders_see_no_team(
    client_for, teammate, viewer, outsider, team
):
    url = f"/api/teams/{team.slug}/members"
    for user in (teammate, viewer):
        r = post_json(client_for(user), url, {"username": user.username, "role": "admin"})
        assert r.status_code == 403 and "admin role" in r.json()["errors"]["team"]
        assert client_for(user).get(f"/api/teams/{team.slug}/audit").status_code == 403
        assert client_for(user).get(url).status_code == 200  # reading the members is fine
    assert team.role_of(teammate) == "member" and team.role_of(viewer) == "viewer"
    assert client_for(outsider).get(url).status_code == 404
    assert post_json(client_for(outsider), url, {"username": "oscar", "role": "admin"}).status_code == 404
    assert client_for(outsider).post(f"/teams/{team.slug}/members/", {"username": "oscar"}).status_code == 404


def test_the_teams_page_shows_roles_and_gives_forms_to_admins_only(client_for, owner, teammate, team):
    page = client_for(owner).get("/teams/").content.decode()
    assert 'class="add-member"' in page and "Audit log" in page
    page = client_for(teammate).get("/teams/").content.decode()
    assert 'class="add-member"' not in page and "Audit log" not in page
    assert '<span class="my-role">member</span>' in page
    # The admin's form sets a role and comes back to the page.
    r = client_for(owner).post(f"/teams/{team.slug}/members/", {"action": "role", "username": "tom", "role": "viewer"})
    assert r.status_code == 302 and team.role_of(teammate) == "viewer"
    assert client_for(teammate).post(f"/teams/{team.slug}/members/", {"username": "tom"}).status_code == 403


def test_the_django_admin_shows_staff_only_the_teams_they_administer(client_for, owner, teammate, team, make_run):
    run = make_run()
    other = Team.objects.create(name="Other")
    elsewhere = Run.objects.create(
        experiment=Experiment.objects.create(team=other, name="e"), name="theirs", preset="sync", config={}
    )
    for user in (owner, teammate):
        user.is_staff = True
        user.save()
    from django.contrib.auth.models import Permission

    owner.user_permissions.set(Permission.objects.filter(codename__in=["view_run", "view_team"]))
    teammate.user_permissions.set(Permission.objects.filter(codename__in=["view_run", "view_team"]))
    listing = client_for(owner).get("/admin/runs/run/").content.decode()
    assert f"/admin/runs/run/{run.pk}/change/" in listing and f"/admin/runs/run/{elsewhere.pk}/" not in listing
    assert client_for(owner).get(f"/admin/runs/run/{elsewhere.pk}/change/").status_code == 302  # not found → index
    # A member who is staff administers no team: the admin shows them none of its runs.
    listing = client_for(teammate).get("/admin/runs/run/").content.decode()
    assert f"/admin/runs/run/{run.pk}/change/" not in listing
