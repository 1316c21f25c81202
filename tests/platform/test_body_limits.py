"""Request body limits (foundation/bodylimits.py): an oversized body is a 413 naming `body`
and the limit, for the JSON API, the pages' forms and the engine's ingest alike, whether
the size is declared (Content-Length) or only found on reading (a chunked body through
the ASGI stack); a body under the limit goes through. WebSocket messages have their own
small limit, enforced by the consumers with a close code."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest
from channels.testing import HttpCommunicator, WebsocketCommunicator
from django.test import Client

from runs.consumers import CLOSE_TOO_LARGE
from workers.run.reporter import INGEST_ENDPOINTS

API_LIMIT = 1024 * 1024  # the defaults docs/configuration.md documents
INGEST_LIMIT = 16 * 1024 * 1024


def padded(payload: dict, size: int) -> str:
    """`payload` as JSON of exactly `size` bytes: trailing whitespace is still valid JSON."""
    text = json.dumps(payload)
    assert len(text) <= size
    return text + " " * (size - len(text))


def point(step: int) -> dict:
    return {"series": "reward/mean", "step": step, "value": 0.5, "time": 1763700000.0 + step}


def assert_too_large(response, limit: int) -> None:
    assert response.status_code == 413, response.content[:300]
    body = response.json()
    assert str(limit) in body["errors"]["body"]
    assert body["limit"] == limit


@pytest.fixture
def errors_logged(caplog):
    """ERROR records logged while the test runs: a refused body must leave none (Django's
    own RequestDataTooBig path logs one with a traceback)."""
    caplog.set_level(logging.WARNING)
    return lambda: [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_the_defaults_keep_ingest_generous_and_the_rest_small(settings):
    assert settings.ROLLWAY_MAX_BODY_BYTES == API_LIMIT
    assert settings.ROLLWAY_MAX_INGEST_BODY_BYTES == INGEST_LIMIT
    assert settings.DATA_UPLOAD_MAX_MEMORY_SIZE == INGEST_LIMIT


# --- the JSON API -------------------------------------------------------------------------


def test_an_oversized_api_body_is_a_413_naming_body(client_for, owner, team, errors_logged):
    body = padded({"team": team.pk, "name": "too big"}, API_LIMIT + 1)
    r = client_for(owner).post("/api/experiments", body, content_type="application/json")
    assert_too_large(r, API_LIMIT)
    assert "ROLLWAY_MAX_BODY_BYTES" in r.json()["errors"]["body"]
    assert not team.experiments.filter(name="too big").exists()
    assert not errors_logged()


def test_an_api_body_at_the_limit_goes_through(client_for, owner, team):
    body = padded({"team": team.pk, "name": "just fits"}, API_LIMIT)
    r = client_for(owner).post("/api/experiments", body, content_type="application/json")
    assert r.status_code == 201, r.content
    assert team.experiments.filter(name="just fits").exists()


def test_a_view_that_never_reads_its_body_still_refuses_an_oversized_one(client_for, owner, run):
    # Django itself only checks a body when something reads it; the cancel view does not.
    r = client_for(owner).post(f"/api/runs/{run.pk}/cancel", "x" * (API_LIMIT + 1), content_type="text/plain")
    assert_too_large(r, API_LIMIT)
    run.refresh_from_db()
    assert run.status == "queued"


def test_an_oversized_form_post_is_a_413_not_an_html_400(db, errors_logged):
    client = Client(enforce_csrf_checks=True)  # the CSRF check reads the form: where Django raised
    r = client.post("/accounts/login/", {"username": "x" * (API_LIMIT + 1), "password": "pw"})
    assert_too_large(r, API_LIMIT)
    assert not errors_logged()


def test_a_malformed_content_length_is_a_400_naming_body(client_for, owner):
    r = client_for(owner).generic(
        "POST", "/api/experiments", "{}", content_type="application/json", CONTENT_LENGTH="lots"
    )
    assert r.status_code == 400
    assert "Content-Length" in r.json()["errors"]["body"]


# --- the engine's ingest ------------------------------------------------------------------


def ingest(client, run, body: str):
    return client.post(
        f"/api/runs/{run.pk}/metrics",
        body,
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {run.ingest_token}",
    )


def test_ingest_takes_a_batch_far_over_the_api_limit(client, run):
    # 4 MB: four times what any other endpoint takes, a quarter of the ingest's limit.
    r = ingest(client, run, padded({"points": [point(1), point(2)]}, 4 * API_LIMIT))
    assert r.status_code == 200, r.content[:300]
    assert r.json() == {"accepted": 2}


def test_an_oversized_ingest_batch_is_a_413_and_stores_nothing(client, run, errors_logged):
    r = ingest(client, run, padded({"points": [point(1)]}, INGEST_LIMIT + 1))
    assert_too_large(r, INGEST_LIMIT)
    assert "ROLLWAY_MAX_INGEST_BODY_BYTES" in r.json()["errors"]["body"]
    assert not run.points.exists()
    assert not errors_logged()


@pytest.mark.parametrize("endpoint", INGEST_ENDPOINTS)
def test_every_endpoint_the_engine_posts_to_takes_the_ingest_limit(client, run, endpoint):
    r = client.post(
        f"/api/runs/{run.pk}/{endpoint}",
        padded({}, 2 * API_LIMIT),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {run.ingest_token}",
    )
    assert r.status_code == 400  # past the body limit: the view refuses the empty report by field
    assert "body" not in r.json()["errors"]


@pytest.mark.parametrize("endpoint", INGEST_ENDPOINTS)
def test_no_endpoint_the_engine_posts_to_is_redirected_to_https(client, run, settings, endpoint):
    """The reporter posts to ROLLWAY_PUBLIC_URL, often plain HTTP inside the cluster, and
    does not follow redirects."""
    settings.SECURE_SSL_REDIRECT = True
    r = client.post(f"/api/runs/{run.pk}/{endpoint}", "{}", content_type="application/json")
    assert r.status_code == 401
    assert client.get("/api/runs/1").status_code == 301  # the rest of the site is


def test_the_ingest_limit_is_a_setting(client, run, settings):
    settings.ROLLWAY_MAX_INGEST_BODY_BYTES = 4096
    under = [point(s) for s in range(10)]
    assert ingest(client, run, json.dumps({"points": under})).status_code == 200
    over = [point(s) for s in range(100)]  # ~7 KB
    assert_too_large(ingest(client, run, json.dumps({"points": over})), 4096)
    assert run.points.count() == 10


# --- through the ASGI stack: a body without a Content-Length ------------------------------


async def post_asgi(path: str, body: bytes, headers: list[tuple[bytes, bytes]]) -> dict:
    from rollway.asgi import application

    communicator = HttpCommunicator(application, "POST", path, body=body, headers=headers)
    return await communicator.get_response(timeout=10)


@pytest.mark.django_db(transaction=True)
def test_a_chunked_body_over_the_limit_is_found_on_reading(run, errors_logged):
    # No Content-Length (as with Transfer-Encoding: chunked): only the body read can tell.
    body = padded({"points": [point(1)]}, INGEST_LIMIT + 10).encode()
    headers = [
        (b"host", b"127.0.0.1"),
        (b"content-type", b"application/json"),
        (b"authorization", f"Bearer {run.ingest_token}".encode()),
    ]
    response = asyncio.run(post_asgi(f"/api/runs/{run.pk}/metrics", body, headers))
    assert response["status"] == 413
    assert "body" in json.loads(response["body"])["errors"]
    assert not run.points.exists()
    assert not errors_logged()


def session_headers(user) -> list[tuple[bytes, bytes]]:
    client = Client()
    client.force_login(user)
    return [
        (b"host", b"127.0.0.1"),
        (b"origin", b"http://127.0.0.1:8000"),
        (b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode()),
    ]


@pytest.mark.django_db(transaction=True)
def test_a_chunked_api_body_over_the_api_limit_is_refused(owner, team):
    # Under Django's own DATA_UPLOAD_MAX_MEMORY_SIZE (the ingest's 16 MB): only the
    # endpoint's limit, applied to the bytes read, refuses it.
    body = padded({"team": team.pk, "name": "chunked"}, 2 * API_LIMIT).encode()
    headers = [*session_headers(owner), (b"content-type", b"application/json")]
    response = asyncio.run(post_asgi("/api/experiments", body, headers))
    assert response["status"] == 413
    assert str(API_LIMIT) in json.loads(response["body"])["errors"]["body"]
    assert not team.experiments.filter(name="chunked").exists()


# --- WebSocket messages -------------------------------------------------------------------


async def send_and_see(path: str, headers, **message) -> dict | None:
    """Connect, send one message; the close the server answered with, or None if the
    socket stayed open."""
    from rollway.asgi import application

    comm = WebsocketCommunicator(application, path, headers=headers)
    connected, _ = await comm.connect()
    assert connected
    await comm.send_to(**message)
    if await comm.receive_nothing(timeout=1):
        await comm.disconnect()
        return None
    output = await comm.receive_output()
    await comm.wait()
    return output


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("kind", ["text_data", "bytes_data"])
def test_an_oversized_websocket_message_closes_the_socket_cleanly(owner, run, settings, kind, errors_logged):
    size = settings.ROLLWAY_MAX_WS_MESSAGE_BYTES + 1
    data = "x" * size if kind == "text_data" else b"x" * size
    output = asyncio.run(send_and_see(f"/ws/runs/{run.pk}/", session_headers(owner), **{kind: data}))
    assert output == {"type": "websocket.close", "code": CLOSE_TOO_LARGE}
    assert not errors_logged()


@pytest.mark.django_db(transaction=True)
def test_a_websocket_message_under_the_limit_does_not_close_the_socket(owner, settings):
    small = json.dumps({"ping": "x" * (settings.ROLLWAY_MAX_WS_MESSAGE_BYTES - 20)})
    output = asyncio.run(send_and_see("/ws/runs/", session_headers(owner), text_data=small))
    assert output is None or output["type"] != "websocket.close", output


@pytest.mark.django_db(transaction=True)
def test_a_deeply_nested_frame_is_closed_before_it_is_parsed(owner, errors_logged):
    # 200 KB of brackets would send the JSON decoder into a RecursionError.
    output = asyncio.run(send_and_see("/ws/runs/", session_headers(owner), text_data="[" * 100_000 + "]" * 100_000))
    assert output == {"type": "websocket.close", "code": CLOSE_TOO_LARGE}
    assert not errors_logged()
