"""rollway/dbdown.py on its own (the real outage, a stopped PostgreSQL behind daphne, is
tests/integration/test_faults.py): which errors become a 503, and in which shape."""

from __future__ import annotations

import json

import pytest
from django.db import DatabaseError, InterfaceError, OperationalError
from django.test import RequestFactory

from rollway.dbdown import DatabaseUnavailableMiddleware

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
