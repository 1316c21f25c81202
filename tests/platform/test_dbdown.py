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
