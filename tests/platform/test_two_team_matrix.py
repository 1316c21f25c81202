"""The two-team permission matrix: every route of the URL configuration, every operation
of the API schema and every WebSocket route, asked about team A's objects by people
whose standing in A differs, while their own team B has objects of its own.

Personas (`PERSONAS`): A's member; a viewer of A who is a member of B; B's admin; a
signed-in user in no team; a member removed from A (now only in B); anonymous (a
script: no CSRF token); and, on the JSON API, a revoked token of A, B's member token
of the viewer above, and the token the removed member made in A before the removal.
The rules are the one-team matrix's (permission_rules.py): a persona with a role in A
gets what that role gets there; one without any gets 401 (not signed in), a 404 or a
400 naming the field (another team's objects are not found), never a 403.

Every cell also checks what the answer shows: no body names the objects of a team the
persona is not in (their names, the team's name, its only-members' usernames), save
what the request itself sent, and none names a server path (the test's roots for
models, data, checkpoints, exports, logs and caches). A refused write changes nothing
stored. Lists are cells too: what B's people list holds nothing of A.

`OPEN_HOLES` lists the cells that fail on today's code, each with why; a cell that
starts to pass while listed fails (strict xfail), so the list shrinks as the fixes come.
`pytest tests/platform/test_two_team_matrix.py -s` prints the matrix's size.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.contrib.auth import get_user_model
from django.db import transaction
from django.test import Client, override_settings

from foundation.channel_layer import LOST_EVENT
from runs import events
from runs.models import Run
from teams import tokens
from teams.models import Membership, Team
from tests.platform.permission_rules import (
    ASKS,
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
from tests.platform.test_consumers import closed_with, communicator

# Cells that fail on today's code: cell id → why. Remove an entry when its fix merges.
OPEN_HOLES: dict[str, str] = {}

# persona → (the persona of the one-team rules whose role in A it has, or None: no role
# in A; whether it is a personal API token, asked on the JSON API only).
PERSONAS: dict[str, tuple[str | None, bool]] = {
    "member-a": ("member", False),
    "viewer-a-member-b": ("viewer", False),
    "admin-b": (None, False),
    "outsider": (None, False),
    "removed": (None, False),
    "anonymous": ("anonymous", False),
    "revoked-token": ("revoked-token", True),
    "token-b": (None, True),
    "removed-token": ("revoked-token", True),
}
# The WebSocket routes are asked by the personas who sign in to the site (a removed
# member connecting after the removal; one connected before it is another test's).
WS_PERSONAS = ("member-a", "viewer-a-member-b", "admin-b", "outsider", "removed", "anonymous")
SIGNED_OUT = ("anonymous", "revoked-token", "removed-token")
INGEST_ROUTES = {  # the engine's report routes: (name as the URL conf has it, path after the run id)
    "api:run-status": "status",
    "api:run-placement": "placement",
    "api:run-metrics": "metrics",
    "api:run-checkpoints": "checkpoints",
}
UNKNOWN_RUN = 987654


@dataclass
class TwoTeams:
    a: World
    b: World
    people: dict  # persona → user, for those who sign in
    secrets: dict  # persona → bearer secret, for the token personas and B's run's ingest token
    private: dict[str, list[str]]  # "a" or "b" → what only that team's people may see named
    server_paths: list[str]

    def teams_of(self, persona: str) -> set[str]:
        return {
            "member-a": {"a"},
            "viewer-a-member-b": {"a", "b"},
            "admin-b": {"b"},
            "removed": {"b"},
            "token-b": {"b"},
        }.get(persona, set())


def _names(w: World, only_here: list) -> list[str]:
    return [
        w.team.name,
        w.team.slug,
        w.experiment.name,
        w.run.name,
        w.done.name,
        w.comparison.name,
        w.saved.name,
        *(u.username for u in only_here),
    ]


def _roots(root: Path) -> dict:
    """The site's roots for the test: all under `root`, so an answer naming one is seen."""
    return {
        "ROLLWAY_MODEL_ROOTS": [str(root / "models")],
        "ROLLWAY_DATA_ROOTS": [str(root / "data")],
        "ROLLWAY_CHECKPOINT_ROOT": str(root / "checkpoints"),
        "ROLLWAY_EXPORT_DIR": str(root / "exports"),
        "ROLLWAY_RUN_LOG_DIR": str(root / "logs"),
        "ROLLWAY_CACHE_DIR": str(root / "cache"),
        "ROLLWAY_SCRATCH_DIR": str(root / "scratch"),
    }


def build_two_teams(root: Path) -> TwoTeams:
    """Team A ("Qzxa Lab") and team B ("Bravo Works"), each with the objects of
    `populate`; Vera is A's viewer and B's member, Rita was a member of A (she made a
    token there) until an admin removed her, and is B's viewer. With `_roots(root)` set."""
    roots = _roots(root)
    make = get_user_model().objects.create_user  # no password: force_login signs in
    a_users = {"admin": make("olga_qzxa"), "member": make("tom_qzxa"), "viewer": make("vera")}
    b_users = {"admin": make("bob_bravo"), "member": a_users["viewer"], "viewer": make("rita")}
    make("newbie")  # whom the rules add to a team
    outsider = make("oscar")
    teams = {}
    for label, name, users in (("qzxa", "Qzxa Lab", a_users), ("bravo", "Bravo Works", b_users)):
        team = Team.objects.create(name=name)
        teams[label] = populate(
            team, users, label, log_dir=root / "logs", checkpoint_root=roots["ROLLWAY_CHECKPOINT_ROOT"]
        )
    a, b = teams["qzxa"], teams["bravo"]
    removed = b_users["viewer"]
    membership = Membership.objects.create(team=a.team, user=removed, role=Membership.Role.MEMBER)
    _, removed_secret = tokens.do_create(removed, a.team, "member", "before-removal")
    membership.delete()
    b.run.ingest_token = "ingest-token-of-bravo"
    b.run.save(update_fields=["ingest_digest"])
    return TwoTeams(
        a=a,
        b=b,
        people={
            "member-a": a_users["member"],
            "viewer-a-member-b": a_users["viewer"],
            "admin-b": b_users["admin"],
            "outsider": outsider,
            "removed": removed,
        },
        secrets={
            "revoked-token": a.secrets["revoked-token"],
            "token-b": b.secrets["member-token"],  # the viewer of A's own token for B
            "removed-token": removed_secret,
            "ingest-token-b": b.run.ingest_token,
        },
        private={
            "a": _names(a, [a_users["admin"], a_users["member"]]),
            "b": _names(b, [b_users["admin"]]),
        },
        server_paths=[str(root), *roots["ROLLWAY_MODEL_ROOTS"], *roots["ROLLWAY_DATA_ROOTS"]]
        + [v for v in roots.values() if isinstance(v, str)],
    )


@pytest.fixture(scope="class")
def two_teams(django_db_setup, django_db_blocker, tmp_path_factory):
    """Built once for the class, inside a transaction rolled back after it; each cell
    runs in a savepoint of its own (pytest-django's per-test atomic), so every cell
    meets the same stored world without building it again."""
    root = tmp_path_factory.mktemp("two-teams")
    with override_settings(**_roots(root)), django_db_blocker.unblock(), transaction.atomic():
        yield build_two_teams(root)
        transaction.set_rollback(True)


# The cells: (cell id, ask, persona). Each route's asks from the shared rules, each asked
# by each persona (the token personas on the JSON API only).
@dataclass(frozen=True)
class Cell:
    ask: Ask | None  # None: a cross-team or unknown-run request, `special` says which
    persona: str
    special: str = ""
    route: str = ""


def _cells() -> dict[str, Cell]:
    cells = {}
    for name, asks in ASKS.items():
        for ask in asks:
            for persona, (_, is_token) in PERSONAS.items():
                if is_token and not ask.json:
                    continue  # on a page a token is no one: the anonymous cells cover it
                cells[f"{ask.method} {name} as {persona}"] = Cell(ask, persona, route=name)
            if ask.needs == "token":  # the engine's routes: a run's ingest token of team B
                cells[f"{ask.method} {name} as ingest-token-b"] = Cell(ask, "ingest-token-b", route=name)
    for name, tail in INGEST_ROUTES.items():
        for persona in ("anonymous", "ingest-token-b"):
            cells[f"POST ingest:{name.split(':')[1]} of an unknown run as {persona}"] = Cell(
                None, persona, special=tail, route=name
            )
    for persona in PERSONAS:
        if not PERSONAS[persona][1]:
            cells[f"POST dashboard:launch cloning A's run into B's experiment as {persona}"] = Cell(
                None, persona, special="clone", route="dashboard:launch"
            )
    return cells


CELLS = _cells()


def _param(cell_id: str):
    marks = [pytest.mark.xfail(strict=True, reason=OPEN_HOLES[cell_id])] if cell_id in OPEN_HOLES else []
    return pytest.param(cell_id, id=cell_id, marks=marks)


def test_every_route_and_api_operation_has_a_rule(db, client):
    """The routes of the URL configuration, the operations of the API's own schema and
    the WebSocket routes: each has a rule, so each is in the matrix."""
    assert set(routes()) == set(ASKS), "add a rule to permission_rules.py for each new route"
    assert set(ws_routes()) == set(WS_ASKS)
    patterns = routes()
    asked = {
        (ask.method.lower(), "/" + re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", patterns[name]))
        for name, asks in ASKS.items()
        for ask in asks
    }
    user = get_user_model().objects.create_user("schema-reader")
    client.force_login(user)
    schema = client.get("/api/openapi.json").json()
    operations = {(method, path) for path, ops in schema["paths"].items() for method in ops}
    assert len(operations) >= 20
    assert operations - asked == set(), "each operation of the API schema needs a rule"
    assert set(OPEN_HOLES) <= set(CELLS), "an open hole names a cell the matrix does not have"


def test_the_matrix_covers_every_route_for_every_persona(capsys):
    """Its size, printed for the record: every route × every persona that can ask it."""
    page_asks = sum(1 for asks in ASKS.values() for ask in asks if not ask.json)
    json_asks = sum(1 for asks in ASKS.values() for ask in asks if ask.json)
    signed_in = sum(1 for _, is_token in PERSONAS.values() if not is_token)
    assert len(CELLS) >= page_asks * signed_in + json_asks * len(PERSONAS)
    assert len(CELLS) >= len(routes()) * signed_in
    ws_cells = len(WS_ASKS) * len(WS_PERSONAS)
    with capsys.disabled():
        print(
            f"\ntwo-team matrix: {len(routes())} routes ({page_asks + json_asks} requests) × {len(PERSONAS)} personas "
            f"-> {len(CELLS)} HTTP cells + {ws_cells} WebSocket cells = {len(CELLS) + ws_cells}; "
            f"{len(OPEN_HOLES)} open holes"
        )


def _body_text(r) -> str:
    if r.streaming:
        return b"".join(r.streaming_content).decode("utf-8", "replace")
    return r.content.decode("utf-8", "replace")


def _leaks(t: TwoTeams, persona: str, sent: str, text: str) -> list[str]:
    """What the answer names that the persona may not see: another team's objects (less
    what the request itself sent) or a server path."""
    low, sent = text.lower(), sent.lower()
    found = [p for p in t.server_paths if p.lower() in low]
    for team, names in t.private.items():
        if team in t.teams_of(persona):
            continue
        found += [n for n in names if n.lower() in low and n.lower() not in sent]
    return found


def _client(t: TwoTeams, persona: str, *, script: bool = True) -> tuple[Client, dict]:
    # A script (a token, or anonymous on the API) has no CSRF token to send; a browser's
    # form sends the one its page carries, as the signed-in personas' clients do here.
    if persona in t.secrets:
        return Client(enforce_csrf_checks=True), {"HTTP_AUTHORIZATION": f"Bearer {t.secrets[persona]}"}
    if persona == "anonymous":
        return Client(enforce_csrf_checks=script), {}
    client = Client()
    client.force_login(t.people[persona])
    return client, {}


def _runs_of(team: Team) -> int:
    return Run.objects.filter(experiment__team=team).count()


def _ask_special(t: TwoTeams, cell: Cell, client: Client, headers: dict):
    if cell.special == "clone":
        body = {
            "clone_of": str(t.a.done.pk),
            "experiment": str(t.b.experiment.pk),
            "preset": "sync",
            "overrides": "{}",
            "name": "cross-clone",
        }
        return client.post("/runs/new/", data=body, **headers), json.dumps(body)
    path = f"/api/runs/{UNKNOWN_RUN}/{cell.special}"
    return client.post(path, data="{}", content_type="application/json", **headers), path


def problem_of(t: TwoTeams, cell: Cell) -> str | None:
    """Ask the cell's request; what is wrong with the answer, or None."""
    client, headers = _client(t, cell.persona, script=cell.ask is None or cell.ask.json)
    before, a_runs = stored(), _runs_of(t.a.team)
    if cell.ask is None:
        r, sent = _ask_special(t, cell, client, headers)
    else:
        r = send(client, cell.ask, t.a, headers)
        sent = cell.ask.path(t.a) + json.dumps(cell.ask.body(t.a) if cell.ask.body else {})
    text = _body_text(r)
    said = f"{r.status_code} {text[:200]!r}"
    if r.status_code >= 500:
        return f"a server error: {said}"
    if leaks := _leaks(t, cell.persona, sent, text):
        return f"the answer names {leaks}: {said}"
    if cell.special == "clone":
        if _runs_of(t.a.team) != a_runs:
            return f"a run was created in team A: {said}"
        return None
    if cell.special:  # an unknown run, without its token: refused for the token first
        return None if r.status_code == 401 else f"not 401: {said}"
    ask, writes = cell.ask, cell.ask.method != "GET"
    expected = _expected(t, cell, r)
    if expected is True:
        if r.status_code >= 400:
            return f"allowed, but refused: {said}"
        if writes and stored() == before:
            return f"allowed, but stored nothing (failed for another reason?): {said}"
        return None
    if not expected:
        return f"refused the wrong way: {said}"
    if writes and stored() != before:
        return f"refused, but changed what is stored: {said}"
    if ask.json and not r["Content-Type"].startswith("application/json"):
        return f"an API refusal that is not JSON: {said}"
    return None


def _expected(t: TwoTeams, cell: Cell, r) -> bool | str:
    """True: the request is allowed. Else whether the refusal is the right one (a truthy
    string describing it)."""
    ask, persona = cell.ask, cell.persona
    assert ask is not None
    rule, is_token = PERSONAS.get(persona, (None, True))
    if persona == "ingest-token-b":  # another run's ingest token
        return r.status_code == 401 and "401"
    if ask.needs == "public":
        return True
    if rule is not None and allowed(rule, ask, t.a):
        return True
    if rule is None and ask.needs == "login":  # a list: theirs only (the leak check)
        return True
    status = r.status_code
    if persona in SIGNED_OUT or ask.needs == "token":
        if ask.json or ask.needs == "token":
            return status == 401 and "401"
        return status == 302 and r["Location"].startswith("/accounts/login/") and "to the login page"
    if is_token and ask.needs == "session":  # a token never makes tokens, whoever made it
        return status == 403 and "403"
    if ask.needs == "site":  # no persona here is a site admin
        return status == 403 and "403"
    if ask.form:
        return status in (302, 200, 404) and "the page it lands on"
    if ask.needs == "self":  # someone else's token is not found
        return status == 404 and "404"
    if rule is None:  # no role in A: A's objects are not found, or the field naming them is refused
        return status in (400, 404) and "400 or 404"
    return status == 403 and "403"  # in A, below the role the action needs


@pytest.mark.usefixtures("two_teams")
class TestTwoTeams:
    @pytest.mark.parametrize("cell_id", [_param(c) for c in CELLS])
    def test_each_cell_answers_as_the_role_allows_and_names_nothing_of_another_team(
        self, db, two_teams, cell_id, enqueued
    ):
        assert problem_of(two_teams, CELLS[cell_id]) is None

    def test_the_leak_check_sees_names_when_they_are_shown(self, db, two_teams):
        """The lists do show names: B's admin sees B's runs in the run list (so their
        not seeing A's means A's are left out, not that names are never shown)."""
        client, _ = _client(two_teams, "admin-b")
        text = _body_text(client.get("/api/runs"))
        assert {two_teams.b.run.name, two_teams.b.done.name} <= set(_leaks(two_teams, "outsider", "", text))
        assert _leaks(two_teams, "admin-b", "", text) == []


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("persona", WS_PERSONAS)
def test_the_runs_stream_sends_each_persona_the_status_of_its_teams_runs_only(persona, settings, tmp_path):
    for name, value in _roots(tmp_path).items():
        setattr(settings, name, value)
    t = build_two_teams(tmp_path)

    comm = communicator("/ws/runs/", t.people.get(persona))  # signs in: not in the event loop

    async def received() -> tuple[list[str], int]:
        """A's run's status is sent, then B's, then the "channel layer lost" event that
        closes every open socket (1011): the run names the socket got before it closed,
        and the close code (so what was left out shows without waiting for it)."""
        connected, _ = await comm.connect()
        assert connected, "refusals are sent as close codes after accepting"
        await sync_to_async(events.send_status)(t.a.run)
        await sync_to_async(events.send_status)(t.b.run)
        await get_channel_layer().group_send(events.RUNS_GROUP, {"type": LOST_EVENT})
        names = []
        while (message := await comm.receive_output(timeout=2))["type"] != "websocket.close":
            names.append(json.loads(message["text"])["run"]["name"])
        await comm.wait()
        return names, message.get("code")

    names, code = asyncio.run(received())
    if persona == "anonymous":
        assert (names, code) == ([], 4401)
    else:
        mine = [w.run.name for team, w in (("a", t.a), ("b", t.b)) if team in t.teams_of(persona)]
        assert (names, code) == (mine, 1011)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("persona", WS_PERSONAS)
def test_a_run_page_stream_admits_only_the_runs_team(persona, settings, tmp_path):
    for name, value in _roots(tmp_path).items():
        setattr(settings, name, value)
    t = build_two_teams(tmp_path)
    if "a" in t.teams_of(persona):
        comm = communicator(f"/ws/runs/{t.a.run.pk}/", t.people[persona])

        async def first_frame() -> dict:
            await comm.connect()
            await sync_to_async(events.send_status)(t.a.run)
            frame = await comm.receive_json_from(timeout=2)
            await comm.disconnect()
            return frame

        assert asyncio.run(first_frame())["run"]["id"] == t.a.run.pk
    else:
        code = asyncio.run(closed_with(communicator(f"/ws/runs/{t.a.run.pk}/", t.people.get(persona))))
        assert code == (4401 if persona == "anonymous" else 4403)  # the removed member too
