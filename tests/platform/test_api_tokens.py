"""Personal API tokens: made by a signed-in person (UI or API), shown once, stored as a
hash, one team and a role no higher than the maker's, revocable, last use stamped; a
script sends `Authorization: Bearer rwp_…` to /api/ with no session and no CSRF token."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from runs.models import Experiment, Run
from teams import tokens
from teams.models import ApiToken, Membership, Team

Role = Membership.Role


def post_json(client, url, body, **headers):
    return client.post(url, data=json.dumps(body), content_type="application/json", **headers)


def bearer(secret: str) -> dict:
    return {"HTTP_AUTHORIZATION": f"Bearer {secret}"}


@pytest.fixture
def make_token(client_for, team):
    def make(user, role: str, name: str = "script", team_=None) -> str:
        r = post_json(client_for(user), "/api/tokens", {"team": (team_ or team).slug, "role": role, "name": name})
        assert r.status_code == 201, r.content
        return r.json()["token"]

    return make


def test_a_token_is_shown_once_and_stored_only_as_its_hash(client_for, owner, make_token):
    secret = make_token(owner, "member")
    token = ApiToken.objects.get()
    assert secret.startswith("rwp_") and len(secret) > 40
    assert token.digest == tokens.digest(secret) and secret not in (token.digest, token.prefix)
    assert secret.startswith(token.prefix)
    listed = client_for(owner).get("/api/tokens").json()["tokens"]
    assert [t["name"] for t in listed] == ["script"] and secret not in json.dumps(listed)


def test_a_script_launches_with_a_member_token_without_session_or_csrf(owner, experiment, make_token, enqueued):
    secret = make_token(owner, "member")
    script = Client(enforce_csrf_checks=True)
    r = post_json(script, "/api/runs", {"experiment": experiment.pk, "preset": "sync"}, **bearer(secret))
    assert r.status_code == 201, r.content
    assert Run.objects.get().launched_by == owner
    assert ApiToken.objects.get().last_used_at is not None
    # The same request with a session and no CSRF token is refused: tokens are the exemption.
    session = Client(enforce_csrf_checks=True)
    session.force_login(owner)
    assert post_json(session, "/api/runs", {"experiment": experiment.pk, "preset": "sync"}).status_code == 403


def test_a_launch_that_names_no_place_goes_to_the_tokens_team_or_the_only_team(
    owner, experiment, client_for, make_token, enqueued
):
    other = Team.objects.create(name="Second")
    Membership.objects.create(team=other, user=owner, role=Role.ADMIN)
    # The token has one team: the run goes to its default experiment.
    r = post_json(Client(), "/api/runs", {"preset": "sync"}, **bearer(make_token(owner, "member")))
    assert r.status_code == 201, r.content
    assert Run.objects.get(pk=r.json()["id"]).experiment.team == experiment.team
    # Signed in, the owner has two teams: the launch must say which.
    r = post_json(client_for(owner), "/api/runs", {"preset": "sync"})
    assert r.status_code == 400
    assert r.json()["errors"]["experiment"].endswith("you belong to several teams")
    Membership.objects.filter(team=other).delete()
    r = post_json(client_for(owner), "/api/runs", {"preset": "sync"})
    assert r.status_code == 201, r.content
    assert Run.objects.get(pk=r.json()["id"]).experiment.team == experiment.team


def test_a_token_acts_with_its_role_in_its_team_only(owner, experiment, make_run, make_token):
    mine = make_run()
    other = Team.objects.create(name="Second")
    Membership.objects.create(team=other, user=owner, role=Role.ADMIN)
    elsewhere = Run.objects.create(
        experiment=Experiment.objects.create(team=other, name="x"), name="x", preset="sync", config={}
    )
    secret = make_token(owner, "viewer")  # the owner is admin in both teams
    script = Client()
    assert [r["id"] for r in script.get("/api/runs", **bearer(secret)).json()["runs"]] == [mine.pk]
    assert script.get(f"/api/runs/{elsewhere.pk}", **bearer(secret)).status_code == 404
    r = post_json(script, "/api/runs", {"experiment": experiment.pk, "preset": "sync"}, **bearer(secret))
    assert r.status_code == 403 and "(yours: viewer)" in r.json()["errors"]["experiment"]
    assert [t["role"] for t in script.get("/api/teams", **bearer(secret)).json()["teams"]] == ["viewer"]


def test_a_token_cannot_outrank_its_maker_nor_make_tokens(client_for, teammate, owner, team, make_token):
    r = post_json(client_for(teammate), "/api/tokens", {"team": team.slug, "role": "admin", "name": "x"})
    assert r.status_code == 400 and "at most your own role" in r.json()["errors"]["role"]
    r = post_json(client_for(teammate), "/api/tokens", {"team": "nowhere", "role": "viewer", "name": ""})
    assert r.status_code == 400 and set(r.json()["errors"]) == {"team", "name"}
    secret = make_token(owner, "admin")
    r = post_json(Client(), "/api/tokens", {"team": team.slug, "role": "viewer", "name": "y"}, **bearer(secret))
    assert r.status_code == 403 and ApiToken.objects.count() == 1


def test_revoked_unknown_and_orphaned_tokens_are_401(client_for, owner, teammate, team, make_token):
    secret = make_token(owner, "member")
    token = ApiToken.objects.get()
    script = Client()
    assert script.get("/api/runs", **bearer(secret)).status_code == 200
    assert client_for(owner).delete(f"/api/tokens/{token.pk}").json()["revoked_at"]
    assert script.get("/api/runs", **bearer(secret)).status_code == 401
    assert script.get("/api/runs", **bearer("rwp_not-a-token")).status_code == 401
    # A teammate's token stops working when they leave the team; and a demoted owner's
    # token is demoted with them.
    theirs = make_token(teammate, "member", name="t")
    assert script.get("/api/runs", **bearer(theirs)).status_code == 200
    Membership.objects.filter(user=teammate).update(role=Role.VIEWER)
    assert script.get("/api/teams", **bearer(theirs)).json()["teams"][0]["role"] == "viewer"
    Membership.objects.filter(user=teammate).delete()
    assert script.get("/api/runs", **bearer(theirs)).status_code == 401
    assert client_for(teammate).delete(f"/api/tokens/{token.pk}").status_code == 404  # not theirs


def test_a_token_opens_the_api_only_not_the_pages(owner, make_token):
    secret = make_token(owner, "admin")
    r = Client().get("/", **bearer(secret))
    assert r.status_code == 302 and r["Location"].startswith("/accounts/login/")


def test_the_teams_page_makes_a_token_shows_it_once_and_revokes_it(client_for, owner, team):
    client = client_for(owner)
    page = client.post("/teams/tokens/", {"name": "ci", "team": team.slug, "role": "member"}).content.decode()
    secret = page.split('id="new-token-secret">')[1].split("<")[0]
    assert secret.startswith("rwp_") and ApiToken.objects.get().digest == tokens.digest(secret)
    again = client.get("/teams/").content.decode()
    assert secret not in again and "ci" in again
    assert client.post("/teams/tokens/", {"name": "", "team": team.slug, "role": "member"}).status_code == 400
    assert client.post(f"/teams/tokens/{ApiToken.objects.get().pk}/revoke/").status_code == 302
    assert Client().get("/api/runs", **bearer(secret)).status_code == 401


def test_removing_a_member_deletes_their_tokens_in_that_team_only(client_for, owner, teammate, team, make_token):
    elsewhere = Team.objects.create(name="Annex", slug="annex")
    Membership.objects.create(team=elsewhere, user=teammate, role=Role.MEMBER)
    make_token(teammate, "member", "in-lab")
    make_token(teammate, "member", "in-annex", team_=elsewhere)
    r = client_for(owner).delete(f"/api/teams/{team.slug}/members/{teammate.username}")
    assert r.status_code in (200, 204), r.content
    listed = client_for(teammate).get("/api/tokens").json()["tokens"]
    assert [(t["name"], t["team"]) for t in listed] == [("in-annex", "annex")]
    assert team.slug not in json.dumps(listed)
