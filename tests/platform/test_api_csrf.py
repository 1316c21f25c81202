"""A write to the JSON API without a login, or from a session without its CSRF token, is
answered in the API's shape: a JSON 401 or 403 with a sentence, never Django's HTML page.
Pages keep Django's own CSRF page."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from api.api import api
from runs.models import Run

UNSAFE = ("post", "put", "patch", "delete")


def unsafe_operations() -> list[tuple[str, str]]:
    """(method, path) of every write in the API's schema, its path parameters set to 1."""
    schema = api.get_openapi_schema(path_prefix="/api/")
    return [
        (method, re.sub(r"\{[^}]+\}", "1", path))
        for path, operations in schema["paths"].items()
        for method in operations
        if method in UNSAFE
    ]


def send(client: Client, method: str, path: str):
    return getattr(client, method)(path, data="{}", content_type="application/json")


def test_the_schema_has_writes_to_ask():
    assert ("post", "/api/runs") in unsafe_operations()


@pytest.mark.parametrize(("method", "path"), unsafe_operations())
def test_an_anonymous_write_is_a_json_401(db, method, path):
    r = send(Client(enforce_csrf_checks=True), method, path)
    assert r.status_code == 401, r.content[:200]
    assert r["Content-Type"] == "application/json"
    assert r.json() == {"errors": {"auth": "log in first (session cookie) or send an API token"}}


@pytest.mark.parametrize(("method", "path"), unsafe_operations())
def test_a_session_write_without_its_csrf_token_is_a_json_403(owner, method, path):
    client = Client(enforce_csrf_checks=True)
    client.force_login(owner)
    r = send(client, method, path)
    assert r.status_code == 403, r.content[:200]
    assert "CSRF token" in r.json()["errors"]["csrf"]


def test_a_post_to_a_read_only_api_route_is_json_too(db):
    r = Client(enforce_csrf_checks=True).post("/api/compare", data="{}", content_type="application/json")
    assert r.status_code == 401 and r.json()["errors"]["auth"]


def test_an_anonymous_launch_creates_nothing(experiment):
    body = f'{{"experiment": {experiment.pk}, "preset": "async"}}'
    r = Client(enforce_csrf_checks=True).post("/api/runs", data=body, content_type="application/json")
    assert r.status_code == 401 and not Run.objects.exists()


def test_a_page_form_keeps_djangos_csrf_page(owner):
    client = Client(enforce_csrf_checks=True)
    client.force_login(owner)
    r = client.post("/runs/new/", {"preset": "async"})
    assert r.status_code == 403 and r["Content-Type"].startswith("text/html")
