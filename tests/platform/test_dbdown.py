"""foundation/dbdown.py on its own (the real outage, a stopped PostgreSQL behind daphne, is
tests/integration/test_faults.py): which errors become a 503, and in which shape."""

from __future__ import annotations

import json

import psycopg
import psycopg_pool
import pytest
from django.db import DatabaseError, InterfaceError, OperationalError
from django.test import RequestFactory

from foundation import dbdown
from foundation.dbdown import DatabaseUnavailableMiddleware

middleware = DatabaseUnavailableMiddleware(lambda request: None)


@pytest.mark.parametrize("error", [OperationalError("connection refused"), InterfaceError("connection already closed")])
@pytest.mark.parametrize("path", ["/api/runs", "/api/runs/3/metrics", "/healthz"])
def test_the_api_gets_a_json_503(path, error):
    r = middleware.process_exception(RequestFactory().post(path), error)
    assert r.status_code == 503
    assert r["Content-Type"] == "application/json"
    assert json.loads(r.content) == {
        "errors": {"database": "the database cannot be reached right now; retry in a few seconds"}
    }
    assert r["Retry-After"] == "5"


def test_a_page_gets_a_plain_503():
    r = middleware.process_exception(RequestFactory().get("/runs/3/"), OperationalError("connection refused"))
    assert r.status_code == 503
    assert r["Content-Type"].startswith("text/plain")
    assert b"database cannot be reached" in r.content


@pytest.mark.parametrize("error", [DatabaseError("syntax error"), ValueError("a bug")])
def test_other_errors_stay_500s(error):
    # Not an outage: a bug, which must surface as one (logged with its traceback).
    assert middleware.process_exception(RequestFactory().get("/api/runs"), error) is None


class RaisingMiddleware:
    """Raises settings.TEST_RAISE as the response goes out: a middleware's own query (the
    session's save) meeting the outage, outside any view. (A setting, not a class
    attribute: Django may import this module under another name than pytest did.)"""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        from django.conf import settings

        response = self.get_response(request)
        if getattr(settings, "TEST_RAISE", None) is not None:
            raise settings.TEST_RAISE
        return response


@pytest.fixture
def raising(settings, client_for, owner):
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, "tests.platform.test_dbdown.RaisingMiddleware"]
    client = client_for(owner)
    client.raise_request_exception = False  # as a real server: the handler answers
    return client


@pytest.mark.django_db
@pytest.mark.parametrize(("path", "json_body"), [("/api/presets", True), ("/runs/new/", False)])
def test_a_database_error_outside_any_view_is_a_503_too(raising, settings, path, json_body):
    settings.TEST_RAISE = OperationalError("connection refused")
    r = raising.get(path)
    assert r.status_code == 503, r.content[:200]
    assert r["Retry-After"] == "5"
    assert (r["Content-Type"] == "application/json") is json_body


@pytest.mark.django_db
def test_a_bug_outside_any_view_stays_a_500(raising, settings):
    settings.TEST_RAISE = ZeroDivisionError("a bug")
    assert raising.get("/api/presets").status_code == 500


# -- holding the outage: no pool wait per request while the database is down ----------


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


@pytest.fixture(autouse=True)
def held(monkeypatch):
    """A fresh outage on a clock the test moves, for every test here: one that trips
    the process's own would hold the next tests' requests."""
    clock = Clock()
    fresh = dbdown.Outage(hold_s=2.0, clock=clock)
    monkeypatch.setattr(dbdown, "outage", fresh)
    return clock


def _django_error(cause: Exception) -> OperationalError:
    # As Django's wrapper raises it: its own class, psycopg's error as the cause.
    error = OperationalError(str(cause))
    error.__cause__ = cause
    return error


@pytest.mark.parametrize(
    "cause",
    [psycopg_pool.PoolTimeout("couldn't get a connection after 3.00 sec"), psycopg.OperationalError("refused")],
)
def test_an_unreachable_database_answers_the_next_requests_at_once_for_a_while(held, cause):
    factory = RequestFactory()
    assert middleware.process_request(factory.get("/api/runs")) is None
    assert middleware.process_exception(factory.get("/api/runs"), _django_error(cause)).status_code == 503
    # Held: answered before any view (or the pool) is reached, in each path's shape.
    api = middleware.process_request(factory.post("/api/runs/3/metrics"))
    assert api.status_code == 503 and json.loads(api.content)["errors"]["database"] == dbdown.MESSAGE
    assert api["Retry-After"] == "5"
    page = middleware.process_request(factory.get("/runs/3/"))
    assert page.status_code == 503 and page["Content-Type"].startswith("text/plain")
    assert middleware.process_request(factory.get("/static/dashboard.js")) is None  # no database there
    held.t += 1.9
    assert middleware.process_request(factory.get("/api/runs")).status_code == 503
    held.t += 0.2  # past the hold: the next request tries the database again
    assert middleware.process_request(factory.get("/api/runs")) is None


@pytest.mark.parametrize(
    "error",
    [
        _django_error(psycopg.errors.QueryCanceled("canceling statement due to statement timeout")),
        _django_error(psycopg.errors.DeadlockDetected("deadlock detected")),
        OperationalError("database is locked"),  # SQLite's
    ],
)
def test_a_query_of_its_own_failing_holds_nothing(held, error):
    assert middleware.process_exception(RequestFactory().get("/api/runs"), error).status_code == 503
    assert middleware.process_request(RequestFactory().get("/api/runs")) is None


def test_a_cut_connection_holds_the_site_too(held):
    middleware.process_exception(RequestFactory().get("/api/runs"), InterfaceError("connection already closed"))
    assert middleware.process_request(RequestFactory().get("/api/runs")).status_code == 503
