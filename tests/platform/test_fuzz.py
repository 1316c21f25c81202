"""No input gets a 5xx: a fuzz over every route of the URL configuration and every
WebSocket route, with hypothesis.

Each HTTP route (enumerated from the resolver, so a new one cannot be missed) gets a
fixed corpus, then hypothesis-drawn requests. The corpus: hostile bodies (deep nesting,
NaN, 1e999, 5000 digits, invalid UTF-8, not JSON, broken multipart), and each query or
form parameter the view reads and each field of its pydantic body models set to each of
a few hostile values in turn ("²", NUL, 2**63, long text...), the rest valid. The drawn
requests: valid and hostile path values, the view's parameters, bodies built from its
models, forms and junk, from an anonymous caller, a team member, an outsider (an admin
on admin pages), with the run's ingest token, a wrong one or none. Every response must
be < 500, with no exception (a streamed body is read too) and no ERROR log record. Each
request runs in a rolled-back savepoint, so every example sees the same objects and a
failure shrinks to the request that caused it.

Each WebSocket route gets hypothesis frames; the consumer must answer with an error,
close with a code, or ignore the frame and keep streaming, never raise.

`pytest tests/platform/test_fuzz.py -s` prints the count by status class at the end.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
from dataclasses import dataclass, field
from http.cookies import SimpleCookie
from urllib.parse import urlencode

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings as django_settings
from django.contrib.auth import get_user_model
from django.contrib.auth.tokens import default_token_generator
from django.contrib.contenttypes.models import ContentType
from django.db import transaction
from django.test import Client
from django.urls import Resolver404, resolve
from django.utils.encoding import force_bytes
from django.utils.http import urlsafe_base64_encode
from hypothesis import HealthCheck, Phase, find, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from compare.models import Comparison
from configs.models import SavedConfig
from foundation import jsonin
from runs import events, listing
from runs.models import Experiment, Run
from teams.models import Membership, Team
from tests.platform.fuzz_helpers import (
    FIXED_BODIES,
    HUGE_INTS,
    FuzzRequest,
    Raw,
    Route,
    Tally,
    dumps,
    field_bodies,
    hostile_json,
    http_routes,
    long_text,
    model_schema,
    overrides,
    param_variants,
    paths,
    requests_for,
    view_reads,
    ws_routes,
)
from workers.config.presets import PRESETS, build
from workers.core.metric_names import NAMES as METRIC_NAMES

# Hypothesis and schemathesis runs over every route: `make test-fast` leaves them out.
pytestmark = [pytest.mark.fuzz, pytest.mark.usefixtures("short_league_simulations")]

# Fixed and derandomized: CI draws the same requests on every run.
hypothesis_settings.register_profile(
    "rollway-fuzz",
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=False,
    report_multiple_bugs=False,  # one failure, shrunk: the request to look at
    suppress_health_check=list(HealthCheck),
)
FUZZ = hypothesis_settings.get_profile("rollway-fuzz")


def fuzz_settings(max_examples: int) -> hypothesis_settings:
    return hypothesis_settings(FUZZ, max_examples=max_examples)


EXAMPLES = 12  # per route of the site's own apps, after the fixed corpus
ADMIN_EXAMPLES = 2  # per admin route: Django's own views, behind the staff login
WS_EXAMPLES = 24  # frames per kind, over the WebSocket routes

ROUTES = http_routes()
WS_ROUTES = ws_routes()

# A SuspiciousOperation (a too-large body, a bad Host) is a 400 that Django itself logs
# at ERROR on django.security.*: that is Django's design, not a failure of a view.
ALLOWED_ERROR_LOGGERS = ("django.security",)


@pytest.fixture(scope="module")
def tally():
    counts = Tally()
    yield counts
    print("\n" + counts.summary())


# --- the objects the fuzz aims at ---------------------------------------------------------


@dataclass
class World:
    valid: dict[str, list[str]]  # path kwarg → valid values
    hints: dict[str, st.SearchStrategy]  # parameter / body field → valid-ish values
    sessions: dict[str, str]  # persona → session key
    tokens: dict[int, str]  # run id → ingest token
    admin_ids: dict[str, str]  # "app/model/" → a stored object's pk
    # Valid query and form values by parameter name: the corpus varies one at a time.
    get_baseline: dict[str, str]
    post_baseline: dict[str, str]
    # One client for every request: each new Client loads the middleware again, and
    # WhiteNoise's scan of the static files alone costs 40 ms.
    client: Client = field(default_factory=lambda: Client(raise_request_exception=False))

    def valid_for(self, route: Route) -> dict[str, list[str]]:
        valid = dict(self.valid)
        model_prefix = next((str(level.pattern) for level in route.chain[1:-1]), "")
        if model_prefix in self.admin_ids:
            valid["object_id"] = [self.admin_ids[model_prefix]]
        return valid


def _session(user) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies[django_settings.SESSION_COOKIE_NAME].value


def _user(username: str, **fields):
    # No password: hashing one costs half a second here, and the fuzz logs in by session.
    return get_user_model().objects.create(username=username, password="!", **fields)


def build_world() -> World:
    """A member's team with an experiment, a run with points, a finished run, a saved
    configuration and a comparison (with its runs); an outsider's team; an admin."""
    owner, outsider = _user("olga"), _user("oscar")
    admin = _user("root", is_staff=True, is_superuser=True)
    team, elsewhere = Team.objects.create(name="Lab"), Team.objects.create(name="Elsewhere")
    Membership.objects.create(team=team, user=owner, role=Membership.Role.ADMIN)
    Membership.objects.create(team=elsewhere, user=outsider, role=Membership.Role.ADMIN)
    experiment = Experiment.objects.create(team=team, name="async-vs-sync", created_by=owner)
    theirs = Experiment.objects.create(team=elsewhere, name="theirs", created_by=outsider)
    config = build("async").model_dump(mode="json")
    run, finished = (
        Run.objects.create(
            experiment=experiment, name=f"{status} run", preset="async", config=config, status=status, launched_by=owner
        )
        for status in (Run.Status.RUNNING, Run.Status.SUCCEEDED)
    )
    member = Client()
    member.force_login(owner)
    points = [
        {"series": name, "step": step, "value": step / 10, "time": 1000.0 + step}
        for name in ("reward/mean", "policy/version", "loss")
        for step in range(20)
    ]
    r = member.post(
        f"/api/runs/{run.pk}/metrics",
        json.dumps({"points": points}),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {run.ingest_token}",
    )
    assert r.status_code == 200, r.content
    saved = SavedConfig.objects.create(
        team=team, name="wide", base_preset="async", overrides={"buffer": {"capacity": 4}}, created_by=owner
    )
    r = member.post(
        "/api/comparisons",
        json.dumps(
            {"experiment": experiment.pk, "name": "cmp", "configurations": ["async", f"saved:{saved.pk}"], "seeds": [0]}
        ),
        content_type="application/json",
    )
    assert r.status_code == 201, r.content
    comparison = Comparison.objects.get(pk=r.json()["id"])
    run_ids = [run.pk, finished.pk, *comparison.runs.values_list("pk", flat=True)]
    presets = [*PRESETS, f"saved:{saved.pk}"]
    ints = st.one_of(st.integers(-3, 3), st.sampled_from(HUGE_INTS))
    id_values = st.one_of(st.sampled_from(run_ids), st.sampled_from([0, -1, *HUGE_INTS]))
    hints: dict[str, st.SearchStrategy] = {
        "runs": st.one_of(st.just(run_ids), st.lists(id_values, max_size=4)),
        "run": id_values,
        "experiment": st.sampled_from([experiment.pk, theirs.pk, str(experiment.pk), f"team:{team.pk}"]),
        "team": st.sampled_from([team.pk, team.slug, str(team.pk), elsewhere.pk, elsewhere.slug]),
        "target": st.one_of(st.sampled_from([f"team:{team.pk}", str(experiment.pk)]), st.floats()),
        "budget": st.floats(),
        "saved_config": st.sampled_from([saved.pk, str(saved.pk), f"saved:{saved.pk}"]),
        "preset": st.sampled_from(presets),
        "base_preset": st.sampled_from(presets),
        "configurations": st.lists(st.sampled_from(presets), max_size=3),
        "seeds": st.one_of(st.lists(st.integers(-1, 4), max_size=3), st.sampled_from(["0,1", "0, 1, 2", "1,1"])),
        "overrides": overrides(),
        "priority": st.integers(-12, 12),
        "series": st.lists(st.sampled_from(sorted(METRIC_NAMES)), max_size=3),
        "status": st.sampled_from([*Run.Status.values, "running,queued", "succeeded"]),
        "sort": st.sampled_from([*listing.SORTS, *(f"-{k}" for k in listing.SORTS)]),
        "page": ints,
        "page_size": ints,
        "max_points": st.one_of(st.integers(0, 200_000), st.sampled_from(HUGE_INTS)),
        "after_step": ints,
        "x": st.sampled_from(["step", "wall", "samples"]),
        "format": st.sampled_from(["json", "csv"]),
        "what": st.sampled_from(["all", "summary", "series", "charts"]),
        "next": st.sampled_from(["/", "//evil.example/", "https://evil.example/", "/runs/new/"]),
        "action": st.sampled_from(["save", "launch", "delete_selected"]),
        "created_from": st.dates(dt.date(1, 1, 1), dt.date(9999, 12, 31)).map(str),
        "created_to": st.dates(dt.date(1, 1, 1), dt.date(9999, 12, 31)).map(str),
        "launcher": st.sampled_from([owner.username, "nobody"]),
    }
    return World(
        valid={
            "run_id": [str(run.pk), str(finished.pk)],
            "comparison_id": [str(comparison.pk)],
            "config_id": [str(saved.pk), "async"],
            "id": [str(owner.pk)],
            "object_id": [str(run.pk)],
            "content_type_id": [str(ContentType.objects.get_for_model(Run).pk)],
            "uidb64": [urlsafe_base64_encode(force_bytes(owner.pk))],
            "token": [default_token_generator.make_token(owner)],
        },
        hints=hints,
        get_baseline={
            "runs": f"{run.pk},{finished.pk}",
            "series": "loss",
            "status": "running",
            "sort": "name",
            "page": "1",
            "page_size": "10",
            "max_points": "100",
            "after_step": "0",
            "target": "0.5",
            "budget": "10",
            "x": "step",
            "format": "json",
            "what": "all",
            "experiment": str(experiment.pk),
            "preset": "async",
            "q": "run",
            "launcher": owner.username,
            "created_from": "2000-01-01",
            "created_to": "2100-01-01",
        },
        post_baseline={
            "experiment": str(experiment.pk),
            "preset": "async",
            "overrides": "{}",
            "priority": "0",
            "name": "fuzz",
            "target": f"team:{team.pk}",
            "configurations": "async",
            "seeds": "0",
            "runs": str(finished.pk),
            "next": "/",
        },
        sessions={"member": _session(owner), "outsider": _session(outsider), "admin": _session(admin)},
        tokens={r.pk: r.issue_ingest_token() for r in Run.objects.all()},
        admin_ids={
            "auth/user/": str(owner.pk),
            "teams/team/": str(team.pk),
            "teams/membership/": str(owner.memberships.first().pk),
            "runs/experiment/": str(experiment.pk),
            "runs/run/": str(run.pk),
            "runs/metricpoint/": str(run.points.first().pk),
            "configs/savedconfig/": str(saved.pk),
            "compare/comparison/": str(comparison.pk),
        },
    )


# --- sending ------------------------------------------------------------------------------


def _authorization(world: World, request: FuzzRequest) -> str | None:
    if request.bearer is None:
        return None
    if request.bearer == "right":
        try:
            run_id = int(resolve(request.path).kwargs.get("run_id", 0))
        except (Resolver404, ValueError):
            run_id = 0
        return f"Bearer {world.tokens.get(run_id, 'no-such-run')}"
    if request.bearer == "wrong":
        return "Bearer " + "0" * 43
    return request.bearer


def send(world: World, request: FuzzRequest, caplog, tally: Tally) -> int:
    """Send `request` in a savepoint that is rolled back; fail on a 5xx, an exception
    (in the view or while streaming the body) or an ERROR log record."""
    client = world.client
    client.cookies = SimpleCookie()  # a logout or login answer must not carry over
    if request.persona in world.sessions:
        client.cookies[django_settings.SESSION_COOKIE_NAME] = world.sessions[request.persona]
    extra = {}
    authorization = _authorization(world, request)
    if authorization is not None:
        extra["HTTP_AUTHORIZATION"] = authorization
    url = request.path + ("?" + request.query if request.query else "")
    seen = len(caplog.records)
    with transaction.atomic():
        response = client.generic(request.method, url, data=request.body, content_type=request.content_type, **extra)
        # A streamed body runs its generator only now: an error there is a broken 200.
        b"".join(response.streaming_content) if response.streaming else response.content
        transaction.set_rollback(True)
    tally.add(response.status_code)
    assert response.exc_info is None, f"{request!r} raised {response.exc_info[1]!r}"
    assert response.status_code < 500, f"{request!r} → {response.status_code}: {response.content[:500]!r}"
    errors = [
        f"{r.name}: {r.getMessage()}"
        for r in caplog.records[seen:]
        if r.levelno >= logging.ERROR and not r.name.startswith(ALLOWED_ERROR_LOGGERS)
    ]
    assert not errors, f"{request!r} logged {errors}"
    return response.status_code


# --- the fuzz -------------------------------------------------------------------------------


@pytest.fixture(scope="class")
def world(django_db_setup, django_db_blocker):
    """Built once for the class, in a transaction rolled back after it: each test's own
    savepoint (the `db` fixture) and each request's sit inside it."""
    with django_db_blocker.unblock():
        outer = transaction.atomic()
        outer.__enter__()
        try:
            built = build_world()
        except BaseException:
            transaction.set_rollback(True)
            outer.__exit__(None, None, None)
            raise
    yield built
    with django_db_blocker.unblock():
        transaction.set_rollback(True)
        outer.__exit__(None, None, None)


@pytest.mark.django_db
class TestEveryRoute:
    def test_the_fuzz_covers_every_route_of_the_url_configuration(self):
        templates = {route.template for route in ROUTES}
        assert len(ROUTES) >= 40, sorted(templates)
        for expected in (
            "api/runs/<int:run_id>/metrics",
            "api/runs/<int:run_id>/status",
            "api/compare",
            "api/configs/<str:config_id>/versions",
            "api/comparisons/<int:comparison_id>/rerun",
            "runs/new/",
            "comparisons/new/",
            "admin/",
        ):
            assert expected in templates
        assert {str(route) for route in WS_ROUTES} == {"/ws/runs/", "/ws/runs/<int:run_id>/"}

    def test_the_fuzz_knows_what_each_view_reads(self):
        """Parameter names and body models come from the views' code: they are found
        for the views whose inputs are known."""
        by_name = {route.name: route for route in ROUTES}
        compare_api = view_reads(by_name["compare:api"].view).params
        assert {"runs", "target", "budget", "max_points", "after_step", "format", "what", "series"} <= compare_api
        assert {"status", "sort", "page", "page_size", "q"} <= view_reads(by_name["api:runs"].view).params
        assert "LaunchIn" in {getattr(m, "__name__", "") for m in view_reads(by_name["api:runs"].view).models}
        ingest = [json.dumps(model_schema(m)) for m in view_reads(by_name["api:run-metrics"].view).models]
        assert any('"points"' in schema for schema in ingest)
        assert {"overrides", "preset", "experiment", "action"} <= view_reads(by_name["dashboard:launch"].view).params

    @pytest.mark.parametrize("route", ROUTES, ids=str)
    def test_no_request_to_any_route_gets_a_5xx_or_logs_an_error(self, route, world, caplog, tally):
        valid = world.valid_for(route)
        # The path the fuzz builds from valid values reaches this route's view.
        url = find(paths(route, valid, hostile=False), lambda _: True, settings=FUZZ)
        if route.pattern.name is not None:  # an unnamed catch-all may match what an earlier route takes
            assert resolve(url).func == route.pattern.callback, url
        if not route.is_admin:  # Django's admin parses forms only: its examples below suffice
            self.send_corpus(route, url, world, caplog, tally)

        @fuzz_settings(ADMIN_EXAMPLES if route.is_admin else EXAMPLES)
        @given(requests_for(route, valid, world.hints))
        def fuzz(request):
            send(world, request, caplog, tally)

        fuzz()

    @staticmethod
    def send_corpus(route: Route, url: str, world: World, caplog, tally: Tally) -> None:
        """The fixed part: hostile bodies, then each query/form parameter and each body
        field the view reads set to each hostile value in turn (methods it refuses with
        405 skipped)."""

        def member(method: str, query: str = "", body: bytes = b"", content_type: str = "") -> int:
            return send(world, FuzzRequest("member", method, url, query, body, content_type, "right"), caplog, tally)

        reads = view_reads(route.view)
        form = "application/x-www-form-urlencoded"
        if member("GET", urlencode(world.get_baseline)) != 405:
            for query in param_variants(reads.params, world.get_baseline):
                member("GET", query)
        if member("POST", "", urlencode(world.post_baseline).encode(), form) != 405:
            for raw, content_type in FIXED_BODIES:
                member("POST", "", raw, content_type)
            for body in param_variants(reads.params, world.post_baseline):
                member("POST", "", body.encode(), form)
            for body in field_bodies(reads.models):
                member("POST", "", body, "application/json")


# --- what the fuzz found: each a 500 before its fix, now a 400 naming the field ------------


def post_json(client, url: str, body: str, **extra):
    return client.post(url, body, content_type="application/json", **extra)


def test_a_json_integer_longer_than_int_converts_is_a_400(client_for, owner, experiment):
    r = post_json(client_for(owner), "/api/runs", f'{{"experiment": {experiment.pk}, "priority": {"9" * 5000}}}')
    assert r.status_code == 400
    assert "5000 digits" in r.json()["errors"]["body"]
    with pytest.raises(jsonin.BadJSON, match="digits"):
        jsonin.loads("-" + "1" * 4301)


@pytest.mark.parametrize(
    "url, body, where",
    [
        ("/api/experiments", '{"team": "lab", "name": "a\\u0000b"}', "name"),
        ("/api/runs", '{"preset": "async", "overrides": {"model": {"path": "/m\\u0000"}}}', "overrides.model.path"),
        (
            "/api/configs",
            '{"team": "lab", "name": "x", "base_preset": "async", "description": "\\u0000"}',
            "description",
        ),
    ],
)
def test_a_nul_character_in_a_json_string_is_a_400_naming_where(client_for, owner, team, url, body, where):
    r = post_json(client_for(owner), url, body)
    assert r.status_code == 400, r.content
    assert f"{where} holds a NUL character" in r.json()["errors"]["body"]


@pytest.mark.parametrize("field", ["q", "preset", "launcher", "status"])
def test_a_nul_character_in_a_run_list_parameter_is_a_400_naming_it(client_for, owner, run, field):
    client = client_for(owner)
    r = client.get("/api/runs", {field: "a\x00"})
    assert r.status_code == 400
    assert field in r.json()["errors"]
    assert client.get("/", {field: "a\x00"}).status_code == 400


def test_a_run_list_page_past_a_bigint_offset_is_a_400_naming_page(client_for, owner, run):
    client = client_for(owner)
    for page in (2**63, 10**30):
        r = client.get("/api/runs", {"page": page})
        assert r.status_code == 400
        assert "page must be between 1 and" in r.json()["errors"]["page"]
        assert "page" in client.get("/", {"page": page}).context["errors"]
    assert client.get("/api/runs", {"page": listing.MAX_PAGE}).json()["runs"] == []


def test_a_run_list_experiment_past_a_bigint_is_a_400_naming_experiment(client_for, owner, run):
    client = client_for(owner)
    r = client.get("/api/runs", {"experiment": 2**63})
    assert r.status_code == 400
    assert "experiment must be between 1 and" in r.json()["errors"]["experiment"]
    assert "experiment" in client.get("/", {"experiment": 2**63}).context["errors"]
    assert client.get("/api/runs", {"experiment": listing.MAX_ID}).json()["runs"] == []


@pytest.mark.parametrize("item", ["²", "9" * 5000])
def test_bulk_cancel_refuses_a_run_id_that_only_looks_like_digits(client_for, owner, run, item):
    client = client_for(owner)
    r = post_json(client, "/api/runs/cancel", json.dumps({"runs": [item]}))
    assert r.status_code == 400
    assert "run ids are positive integers" in r.json()["errors"]["runs"]
    r = client.post("/runs/cancel/", {"runs": [item]}, follow=True)
    assert "run ids are positive integers" in " ".join(str(m) for m in r.context["messages"])


def test_a_team_that_only_looks_like_an_id_is_refused_on_team(client_for, owner, team):
    for value in ("²", "9" * 5000):
        r = post_json(client_for(owner), "/api/experiments", json.dumps({"team": value, "name": "x"}))
        assert r.status_code == 400
        assert "you are not a member of team" in r.json()["errors"]["team"]


@pytest.mark.parametrize("seeds", ["²", "0,²", "9" * 5000])
def test_seeds_that_only_look_like_digits_are_refused_on_seeds(client_for, owner, experiment, seeds):
    client = client_for(owner)
    body = {"experiment": experiment.pk, "name": "c", "configurations": ["async"], "seeds": seeds}
    r = post_json(client, "/api/comparisons", json.dumps(body))
    assert r.status_code == 400
    assert "seeds are non-negative integers" in r.json()["errors"]["seeds"]
    form = {"target": str(experiment.pk), "name": "c", "configurations": "async", "seeds": seeds}
    r = client.post("/comparisons/new/", form)
    assert r.status_code == 400
    assert "seeds are non-negative integers" in r.context["field_errors"]["seeds"]
    assert not Comparison.objects.exists()


def test_a_metric_step_past_a_bigint_is_refused_on_its_point(client, run):
    def ingest(step: int):
        point = {"series": "loss", "step": step, "value": 1.0, "time": 1.0}
        return post_json(
            client,
            f"/api/runs/{run.pk}/metrics",
            json.dumps({"points": [point]}),
            HTTP_AUTHORIZATION=f"Bearer {run.ingest_token}",
        )

    for step in (2**63, 10**30):
        r = ingest(step)
        assert r.status_code == 400
        assert "less than or equal to 9223372036854775807" in r.json()["errors"]["points.0.step"]
    assert ingest(2**63 - 1).json() == {"accepted": 1}  # the largest step a bigint holds is stored
    assert run.points.get().step == 2**63 - 1


@pytest.mark.parametrize("field", ["error", "error_detail", "phase_detail"])
def test_a_nul_character_in_a_reported_status_is_refused_on_its_field(client, run, field):
    body = {"status": "running", "phase": "stepping", field: "boom\x00"}
    r = post_json(
        client, f"/api/runs/{run.pk}/status", json.dumps(body), HTTP_AUTHORIZATION=f"Bearer {run.ingest_token}"
    )
    assert r.status_code == 400
    assert "NUL character" in r.json()["errors"][field]
    run.refresh_from_db()
    assert run.status == Run.Status.QUEUED


@pytest.mark.parametrize("series", ["a\x00", "LOSS", "x" * 65])
def test_a_series_name_the_ingest_cannot_store_is_a_400_naming_series(client_for, owner, run, series):
    client = client_for(owner)
    r = client.get(f"/api/runs/{run.pk}/metrics", {"series": f"loss,{series}"})
    assert r.status_code == 400
    if "\x00" in series:  # refused before the view, for every route (foundation/nulguard.py)
        assert "NUL character" in r.json()["errors"]["series"]
    else:
        assert "series are names such as reward/mean" in r.json()["errors"]["series"]
    assert client.get(f"/api/runs/{run.pk}/metrics", {"series": "loss,reward/mean"}).status_code == 200


def test_the_forms_show_a_nul_character_beside_its_field(client_for, owner, experiment):
    client = client_for(owner)
    r = client.post("/runs/new/", {"experiment": experiment.pk, "preset": "async", "name": "a\x00"})
    assert r.status_code == 400
    assert "NUL character" in r.context["field_errors"]["name"]
    form = {"target": str(experiment.pk), "name": "c", "description": "\x00", "configurations": "async", "seeds": "0"}
    r = client.post("/comparisons/new/", form)
    assert r.status_code == 400
    assert "NUL character" in r.context["field_errors"]["description"]
    assert not Run.objects.exists()


# --- WebSockets ----------------------------------------------------------------------------

ORIGIN = (b"origin", b"http://127.0.0.1:8000")


def _not_json(text: str) -> bool:
    try:
        json.loads(text)
    except (ValueError, RecursionError):
        return True
    return False


FRAMES = {
    "text that is not JSON": st.text(min_size=1).filter(_not_json).map(lambda t: {"text_data": t}),
    "JSON of wrong shapes": hostile_json().map(lambda v: {"text_data": dumps(v) or "0"}),
    "huge numbers": st.sampled_from([Raw("9" * 5000), Raw("1e999"), Raw("NaN"), *HUGE_INTS]).map(
        lambda v: {"text_data": dumps([v])}
    ),
    "deep nesting": st.sampled_from([2_000, 100_000]).map(lambda n: {"text_data": "[" * n + "]" * n}),
    "binary": st.binary(min_size=1).map(lambda b: {"bytes_data": b}),
    "very long text": long_text().map(lambda t: {"text_data": t}),
}


# How long a consumer may take to answer one frame: it returns as soon as the consumer
# answers or raises, so the bound only decides when a silent consumer fails the test. A
# busy 2-core host (the whole suite beside it) took more than 2 s for one answer.
ANSWER_S = 60


async def _next_output(comm: WebsocketCommunicator, timeout: float = ANSWER_S) -> dict:
    """The consumer's next message, or its exception as soon as it raised one (the
    communicator's receive_output sees a crash only after its whole timeout)."""
    message = asyncio.ensure_future(comm.output_queue.get())
    await asyncio.wait({message, comm.future}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    if message.done():
        return message.result()
    message.cancel()
    if comm.future.done():
        comm.future.result()  # raises what the consumer raised
    raise TimeoutError(f"no answer in {timeout} s")


async def _frame_outcome(comm: WebsocketCommunicator, frame: dict, run: Run) -> str:
    """What the consumer did with one client frame: "error" (answered with an error
    message), "closed" (with a close code), or "ignored" (the status change sent after
    the frame still arrives). An exception the consumer raised propagates from the
    communicator at the latest when the socket is closed (the frame is handled before
    the disconnect), and fails the test."""
    connected, _ = await comm.connect(timeout=ANSWER_S)
    assert connected
    await comm.send_to(**frame)
    await sync_to_async(events.send_status)(run)
    message = await _next_output(comm)
    if message["type"] == "websocket.close":
        code = message.get("code", 1000)
        assert 1000 <= code <= 1015 or 4000 <= code <= 4999, message
        outcome = "closed"
    else:
        assert message["type"] == "websocket.send", message
        answer = json.loads(message["text"])
        assert answer.get("type") in ("error", "status"), answer
        assert answer["type"] == "status" or answer.get("message"), answer
        outcome = "error" if answer["type"] == "error" else "ignored"
    await comm.disconnect(timeout=ANSWER_S)
    return outcome


KINDS = sorted(FRAMES)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("kind", KINDS)
def test_no_websocket_frame_escapes_as_an_exception(kind, run, owner, tally):
    from rollway.asgi import application

    client = Client()
    client.force_login(owner)
    cookie = (b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode())
    urls = ["/" + route.template.replace("<int:run_id>", str(run.pk)) for route in WS_ROUTES]
    assert all(resolve_ws(url) for url in urls), urls

    # No shrinking: a frame is one value, shown as drawn, and each try costs a connection.
    @hypothesis_settings(FUZZ, max_examples=WS_EXAMPLES, phases=[Phase.explicit, Phase.reuse, Phase.generate])
    @given(st.sampled_from(urls), FRAMES[kind])
    def fuzz(url, frame):
        comm = WebsocketCommunicator(application, url, headers=[ORIGIN, cookie])
        tally.ws[asyncio.run(_frame_outcome(comm, frame, run))] += 1

    fuzz()


def resolve_ws(url: str) -> bool:
    """Whether a WebSocket route takes `url` (the routes are not in the HTTP resolver)."""
    return any(route.pattern.resolve(url.lstrip("/")) for route in WS_ROUTES)
