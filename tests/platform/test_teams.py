"""Teams and people in the product: a site admin creates a team (page and API) with its
first admin, a team's admin adds people by username or email, changes roles and
removes them; each write is in the audit log, each refusal a 4xx naming the field, and
`manage.py first_admin` makes the first site admin of a fresh site with their team."""

from __future__ import annotations

import json
import re

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.test import Client

from teams import tokens
from teams.models import AuditEvent, Membership, Team

Role = Membership.Role


def post_json(client, url, body):
    return client.post(url, data=json.dumps(body), content_type="application/json")


@pytest.fixture
def staff(db):
    return get_user_model().objects.create_user("sam", password="x", email="sam@example.org", is_staff=True)


@pytest.fixture
def nina(db):
    return get_user_model().objects.create_user("nina", password="x", email="Nina@Example.org")


# --- creating a team: the API ---------------------------------------------------------


def test_a_site_admin_creates_a_team_and_becomes_its_admin(client_for, staff):
    r = post_json(client_for(staff), "/api/teams", {"name": "Robotics Lab"})
    assert r.status_code == 201, r.content
    assert r.json() | {"id": 0} == {"id": 0, "slug": "robotics-lab", "name": "Robotics Lab", "admin": "sam"}
    team = Team.objects.get(slug="robotics-lab")
    assert team.role_of(staff) == "admin"
    event = AuditEvent.objects.get()
    assert (event.team, event.actor, event.action, event.subject) == (team, staff, "team_create", "team robotics-lab")
    assert event.detail == {"name": "Robotics Lab", "admin": "sam"}
    # The new team is the creator's now: it is in their list, and they may manage it.
    listed = client_for(staff).get("/api/teams").json()["teams"]
    assert [(t["slug"], t["role"]) for t in listed] == [("robotics-lab", "admin")]


def test_a_site_admin_names_another_first_admin_by_email_and_stays_out(client_for, staff, nina):
    r = post_json(client_for(staff), "/api/teams", {"name": "Vision", "slug": "cv", "admin": "nina@example.org"})
    assert r.status_code == 201 and r.json()["admin"] == "nina"
    team = Team.objects.get(slug="cv")
    assert list(team.memberships.values_list("user__username", "role")) == [("nina", "admin")]
    assert client_for(staff).get("/api/teams/cv/members").status_code == 404  # staff is no member


def test_only_a_site_admin_creates_teams(client_for, owner, team, staff):
    r = post_json(client_for(owner), "/api/teams", {"name": "Mine"})
    assert r.status_code == 403 and "site admin" in r.json()["errors"]["team"]
    # Through a token: a site admin's admin-role token may; their viewer-role one may not.
    Membership.objects.create(team=team, user=staff, role=Role.ADMIN)
    _, admin_secret = tokens.do_create(staff, team, "admin", "script")
    _, viewer_secret = tokens.do_create(staff, team, "viewer", "read-only")
    script = Client(enforce_csrf_checks=True)
    r = script.post(
        "/api/teams", '{"name": "Ro"}', content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {viewer_secret}"
    )
    assert r.status_code == 403
    r = script.post(
        "/api/teams", '{"name": "Ro"}', content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {admin_secret}"
    )
    assert r.status_code == 201
    assert sorted(Team.objects.values_list("slug", flat=True)) == ["lab", "ro"]
    assert list(AuditEvent.objects.values_list("action", flat=True)) == ["team_create"]


@pytest.mark.parametrize(
    ("body", "status", "field", "says"),
    [
        ({}, 400, "name", "give the team's name"),
        ({"name": "  "}, 400, "name", "give the team's name"),
        ({"name": "x" * 101}, 400, "name", "at most 100"),
        ({"name": "!!!"}, 400, "name", "gives no slug"),
        ({"name": "Lab two", "slug": "Lab Two"}, 400, "slug", "lowercase letters"),
        ({"name": "Lab"}, 409, "slug", "exists already"),
        ({"name": "New", "admin": "nobody"}, 400, "admin", "no user 'nobody'"),
        ({"name": "New", "owner": "sam"}, 400, "owner", ""),
        ({"name": "New\x00"}, 400, "body", "name holds a NUL"),
    ],
)
def test_a_bad_new_team_is_refused_naming_the_field(client_for, staff, team, body, status, field, says):
    r = post_json(client_for(staff), "/api/teams", body)
    assert r.status_code == status, r.content
    assert says in r.json()["errors"][field]
    assert list(Team.objects.values_list("slug", flat=True)) == ["lab"] and not AuditEvent.objects.exists()


# --- members by username or email -----------------------------------------------------


def test_an_admin_adds_a_member_by_email_changes_the_role_and_removes_them(client_for, owner, team, nina):
    client, url = client_for(owner), f"/api/teams/{team.slug}/members"
    r = post_json(client, url, {"username": "NINA@example.org", "role": "viewer"})
    assert r.status_code == 201 and r.json()["username"] == "nina"
    assert post_json(client, url, {"username": "nina", "role": "admin"}).status_code == 200
    r = client.delete(f"{url}/nina@example.org")
    assert r.status_code == 200 and r.json() == {"removed": "nina"}
    assert [(e.action, e.subject) for e in AuditEvent.objects.order_by("pk")] == [
        ("member_add", "user nina"),
        ("member_role", "user nina"),
        ("member_remove", "user nina"),
    ]


def test_an_email_two_accounts_share_is_refused_asking_for_the_username(client_for, owner, team, nina):
    get_user_model().objects.create_user("nina2", email="nina@example.org")
    r = post_json(client_for(owner), f"/api/teams/{team.slug}/members", {"username": "nina@example.org"})
    assert r.status_code == 400 and "give the username" in r.json()["errors"]["username"]


def test_removing_someone_not_in_the_team_is_a_404_naming_them(client_for, owner, team, nina):
    r = client_for(owner).delete(f"/api/teams/{team.slug}/members/nina")
    assert r.status_code == 404 and "nina is not in team lab" in r.json()["errors"]["username"]


# --- the page -------------------------------------------------------------------------


def test_the_new_team_form_is_a_site_admins_only(client_for, staff, owner, team):
    assert 'class="new-team"' in client_for(staff).get("/teams/").content.decode()
    assert 'class="new-team"' not in client_for(owner).get("/teams/").content.decode()
    r = client_for(owner).post("/teams/new/", {"name": "Mine"})
    assert r.status_code == 403 and "site admin" in r.content.decode()
    assert list(Team.objects.values_list("slug", flat=True)) == ["lab"]


def test_a_site_admin_creates_a_team_on_the_page(client_for, staff, nina):
    client = client_for(staff)
    r = client.post("/teams/new/", {"name": "Speech", "slug": "", "admin": "nina"})
    assert r.status_code == 302 and r["Location"] == "/teams/"
    assert list(Team.objects.get(slug="speech").memberships.values_list("user__username", "role")) == [
        ("nina", "admin")
    ]
    page = client.get("/teams/").content.decode()
    assert "Created team Speech (speech) with nina as its admin." in page
    assert AuditEvent.objects.get().action == "team_create"


@pytest.mark.parametrize(
    ("form", "status", "field", "says"),
    [
        ({"name": "Lab"}, 409, "slug", "exists already"),
        ({"name": "New", "admin": "ghost"}, 400, "admin", "no user &#x27;ghost&#x27;"),
    ],
)
def test_a_refused_new_team_form_shows_the_message_beside_its_field(client_for, staff, team, form, status, field, says):
    r = client_for(staff).post("/teams/new/", form)
    assert r.status_code == status
    page = r.content.decode()
    shown = re.search(rf'<span class="error" data-field="{field}">([^<]*)</span>', page)
    assert shown and says in shown.group(1), page[-3000:]
    assert f'value="{form["name"]}"' in page  # what was typed is kept
    assert list(Team.objects.values_list("slug", flat=True)) == ["lab"]


def test_the_page_forms_need_their_csrf_token(staff, owner, team, nina):
    for user, path, form in (
        (staff, "/teams/new/", {"name": "Forged"}),
        (owner, f"/teams/{team.slug}/members/", {"action": "add", "username": "nina", "role": "admin"}),
    ):
        client = Client(enforce_csrf_checks=True)
        client.force_login(user)
        assert client.post(path, form).status_code == 403
    assert list(Team.objects.values_list("slug", flat=True)) == ["lab"] and not team.has_member(nina)


@pytest.mark.parametrize(
    ("form", "status", "says"),
    [
        ({"action": "add", "username": "ghost", "role": "member"}, 400, "username: no user &#x27;ghost&#x27;"),
        ({"action": "add", "username": "tom", "role": "owner"}, 400, "role: choose one of viewer, member, admin"),
        ({"action": "role", "username": "olga", "role": "member"}, 409, "olga is team lab&#x27;s last admin"),
        ({"action": "remove", "username": "olga"}, 409, "cannot be removed"),
        ({"action": "remove", "username": "nina"}, 404, "username: nina is not in team lab"),
    ],
)
def test_a_refused_members_form_answers_its_status_and_names_the_field(
    client_for, owner, teammate, team, nina, form, status, says
):
    r = client_for(owner).post(f"/teams/{team.slug}/members/", form)
    assert r.status_code == status
    assert says in r.content.decode()
    assert team.role_of(owner) == "admin" and team.role_of(teammate) == "member" and not AuditEvent.objects.exists()


# --- the first admin ------------------------------------------------------------------


def test_first_admin_makes_the_site_admin_and_their_team_once(db, monkeypatch, capsys):
    monkeypatch.setenv("ROLLWAY_ADMIN_PASSWORD", "long-enough-passphrase-7")
    call_command("first_admin", "ada", "--email", "ada@example.org", "--team", "Core ML", "--no-input")
    ada = get_user_model().objects.get(username="ada")
    assert ada.is_superuser and ada.is_staff and ada.check_password("long-enough-passphrase-7")
    team = Team.objects.get(slug="core-ml")
    assert team.name == "Core ML" and team.role_of(ada) == "admin"
    assert "ada is now a site admin and the admin of team Core ML (core-ml)" in capsys.readouterr().out
    # Again: nothing changes (the password neither), and it says so.
    monkeypatch.setenv("ROLLWAY_ADMIN_PASSWORD", "another-passphrase-8")
    call_command("first_admin", "ada", "--team", "Core ML", "--no-input")
    assert "ada was already a site admin" in capsys.readouterr().out
    assert get_user_model().objects.get(username="ada").check_password("long-enough-passphrase-7")
    assert Team.objects.count() == 1 and Membership.objects.count() == 1
    assert list(AuditEvent.objects.values_list("action", flat=True)) == ["team_create"]
    # Someone else, once the site has an admin: refused, nothing made.
    with pytest.raises(CommandError, match=r"this site has an admin already \(ada\)"):
        call_command("first_admin", "bob", "--team", "Other", "--no-input")
    assert not get_user_model().objects.filter(username="bob").exists() and Team.objects.count() == 1


@pytest.mark.parametrize(
    ("env", "says"),
    [("", "ROLLWAY_ADMIN_PASSWORD, which is empty"), ("short", "password: This password is too short")],
)
def test_first_admin_refuses_a_missing_or_weak_password(db, monkeypatch, settings, env, says):
    settings.AUTH_PASSWORD_VALIDATORS = [{"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"}]
    monkeypatch.setenv("ROLLWAY_ADMIN_PASSWORD", env)
    with pytest.raises(CommandError, match=says):
        call_command("first_admin", "ada", "--no-input")
    assert not get_user_model().objects.exists() and not Team.objects.exists()


def test_first_admin_promotes_no_existing_account(db, monkeypatch):
    get_user_model().objects.create_user("demo", password="demo")
    monkeypatch.setenv("ROLLWAY_ADMIN_PASSWORD", "long-enough-passphrase-7")
    with pytest.raises(CommandError, match="exists and is not a site admin"):
        call_command("first_admin", "demo", "--no-input")
    assert not get_user_model().objects.get(username="demo").is_superuser


def test_first_admin_makes_an_existing_team_theirs(db, monkeypatch):
    Team.objects.create(name="Lab")
    monkeypatch.setenv("ROLLWAY_ADMIN_PASSWORD", "long-enough-passphrase-7")
    call_command("first_admin", "ada", "--team", "Lab", "--no-input")
    assert Team.objects.get(slug="lab").role_of(get_user_model().objects.get(username="ada")) == "admin"
    assert list(AuditEvent.objects.values_list("action", "subject")) == [("member_add", "user ada")]
