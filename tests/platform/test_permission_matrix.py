"""The permission matrix: every URL the site routes and every WebSocket route, asked by
every persona, answers as the persona's role says (teams/roles.py).

The routes come from the URL configuration and the WebSocket router themselves, and
each must have a rule in permission_rules.py (`test_every_route_has_a_rule`): a new
endpoint cannot be missed. Django's own admin and login views are left out (the admin's
scoping is tested in test_roles.py). The two-team matrix (test_two_team_matrix.py) asks
the same rules across two teams.

Personas: the team's admin, a member, a viewer; a member of another team; a staff user
in no team; anonymous. A refused write changes nothing stored; an allowed write changes
something (so an "allowed" request that failed for another reason would show).
"""

from __future__ import annotations

import asyncio

import pytest
from django.contrib.auth import get_user_model
from django.db import transaction
from django.test import Client

from teams.models import Membership, Team
from tests.platform.permission_rules import (
    ASKS,
    TOKENS,
    WS_ASKS,
    Ask,
    World,
    allowed,
    populate,
    routes,
    send,
    stored,
    ws_routes,
)

PERSONAS = ("admin", "member", "viewer", "outsider", "staff", "anonymous")


def test_every_route_has_a_rule():
    assert set(routes()) == set(ASKS), "add a rule for each new route (and drop removed ones)"
    assert set(ws_routes()) == set(WS_ASKS)


@pytest.fixture
def world(db, settings, tmp_path) -> World:
    settings.ROLLWAY_EXPORT_DIR = str(tmp_path / "exports")
    settings.ROLLWAY_RUN_LOG_DIR = str(tmp_path / "logs")
    make = get_user_model().objects.create_user
    users = {
        "admin": make("olga", password="x"),
        "member": make("tom", password="x"),
        "viewer": make("vera", password="x"),
        "outsider": make("oscar", password="x"),
        "staff": make("sam", password="x", is_staff=True),
    }
    make("newbie", password="x")
    other = Team.objects.create(name="Elsewhere")
    Membership.objects.create(team=other, user=users["outsider"], role=Membership.Role.ADMIN)
    team = Team.objects.create(name="Lab")
    return populate(team, users, "lab", log_dir=tmp_path / "logs", checkpoint_root="/ck")


def answer_problem(w: World, ask: Ask, persona: str) -> str | None:
    """Ask as `persona`; what is wrong with the answer, or None."""
    client, headers = Client(enforce_csrf_checks=persona in TOKENS), {}
    if persona in TOKENS:  # a script: no session, no CSRF token
        headers = {"HTTP_AUTHORIZATION": f"Bearer {w.secrets[persona]}"}
    elif persona != "anonymous":
        client.force_login(w.users[persona])
    before = stored()
    r = send(client, ask, w, headers)
    said = f"{r.status_code} {b'(streamed)' if r.streaming else r.content[:200]!r}"
    if r.status_code >= 500:
        return f"a server error: {said}"
    writes = ask.method != "GET"
    if allowed(persona, ask, w):
        if r.status_code >= 400:
            return f"allowed, but refused: {said}"
        if writes and stored() == before:
            return f"allowed, but stored nothing (failed for another reason?): {said}"
        return None
    if persona in ("anonymous", "revoked-token") or ask.needs == "token":
        if ask.json or ask.needs == "token":
            expected = r.status_code == 401
        else:
            expected = r.status_code == 302 and r["Location"].startswith("/accounts/login/")
    elif ask.needs == "site":  # not a site admin, whatever their teams
        expected = r.status_code == 403
    elif ask.form:
        expected = r.status_code in (302, 200, 404)  # the page it lands on says why
    elif ask.needs == "self":  # someone else's token is not found
        expected = r.status_code == 404
    elif persona in ("outsider", "staff"):
        # Another team's objects are not found; naming them in a body is a 400 by field.
        expected = r.status_code in (400, 404)
    else:  # in the team, below the role the action needs
        expected = r.status_code == 403
    if not expected:
        return f"refused the wrong way: {said}"
    if writes and stored() != before:
        return f"refused, but changed what is stored: {said}"
    return None


ASK_IDS = [(name, i) for name, asks in ASKS.items() for i in range(len(asks))]


@pytest.mark.parametrize(("name", "index"), ASK_IDS, ids=[f"{ASKS[n][i].method} {n}" for n, i in ASK_IDS])
def test_each_route_answers_each_persona_as_its_role_allows(world, name, index, enqueued):
    """Each persona in a savepoint of its own, rolled back after: every persona meets the
    same stored world, without building it again."""
    ask = ASKS[name][index]
    problems = {}
    for persona in PERSONAS + tuple(TOKENS if ask.json else ()):
        with transaction.atomic():
            problem = answer_problem(world, ask, persona)
            transaction.set_rollback(True)
        if problem:
            problems[persona] = problem
    assert problems == {}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("route", sorted(WS_ASKS))
@pytest.mark.parametrize("persona", PERSONAS)
def test_each_websocket_route_admits_each_persona_as_its_role_allows(route, persona, settings, tmp_path, request):
    from tests.platform.test_consumers import communicator

    async def close_code(comm) -> int | None:
        """The code the server closed with right after accepting; None if it streams."""
        connected, _ = await comm.connect()
        assert connected, "refusals are sent as close codes after accepting"
        if await comm.receive_nothing(timeout=1):
            await comm.disconnect()
            return None
        message = await comm.receive_output(timeout=1)
        return message.get("code") if message["type"] == "websocket.close" else None

    w = request.getfixturevalue("world")
    needs, path = WS_ASKS[route]
    code = asyncio.run(close_code(communicator(path(w), None if persona == "anonymous" else w.users[persona])))
    if persona == "anonymous":
        assert code == 4401
    elif needs == "login" or persona in ("admin", "member", "viewer"):
        assert code is None  # accepted and streaming
    else:
        assert code == 4403
