"""The site's JSON API over httpx with a personal API token, every failure turned into
a CliError that says what to do (errors.py): no command shows a traceback for a refused
request or a site that is down."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx

from rollway_cli.credentials import Credentials
from rollway_cli.errors import NOT_ALLOWED, UNREACHABLE, ApiError, CliError

# Reads of a run are small, but a launch is checked before it is stored, and the site's
# first check of a model directory imports transformers: on a loaded 2-core host that
# answer once took over 30 s (the first-model walkthrough's launch, beside the test suite).
TIMEOUT_S = 120.0


def explain(status: int, errors: dict[str, str], url: str) -> str:
    """One line for an error answer, in the site's words where it has them."""
    if status == 401:
        said = errors.get("auth", "")
        return f"the site refused the API token ({said or 'unauthorized'}): run `rollway login` with a valid token"
    if errors:
        return "; ".join(f"{field}: {message}" for field, message in errors.items())
    return f"{url} answered HTTP {status}"


class Api:
    def __init__(self, credentials: Credentials, *, transport: httpx.BaseTransport | None = None):
        if not credentials.url:
            raise CliError("no site URL: run `rollway login`, set ROLLWAY_URL or pass --url", NOT_ALLOWED)
        if not credentials.token:
            raise CliError("no API token: run `rollway login`, set ROLLWAY_TOKEN or pass --token", NOT_ALLOWED)
        self.base = credentials.url
        self.http = httpx.Client(
            base_url=self.base,
            headers={"Authorization": f"Bearer {credentials.token}", "Accept": "application/json"},
            timeout=TIMEOUT_S,
            transport=transport,
        )

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Api:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def page_url(self, path: str) -> str:
        """A site page's absolute URL (the API gives runs' pages as paths)."""
        return self.base + path

    def get(self, path: str, **params: Any) -> dict:
        return self._json(self._send("GET", path, params={k: v for k, v in params.items() if v not in (None, "")}))

    def post(self, path: str, body: dict) -> dict:
        return self._json(self._send("POST", path, json=body))

    def delete(self, path: str) -> dict:
        return self._json(self._send("DELETE", path))

    @contextmanager
    def stream(self, path: str) -> Iterator[httpx.Response]:
        """A download: the response, its body not yet read; errors raised before yielding."""
        request = self.http.build_request("GET", path)
        try:
            response = self.http.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from None
        try:
            if response.status_code >= 400:
                response.read()
                self._json(response)
            yield response
        finally:
            response.close()

    def _send(self, method: str, path: str, **kwargs) -> httpx.Response:
        try:
            return self.http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from None

    def _unreachable(self, exc: httpx.HTTPError) -> CliError:
        if isinstance(exc, httpx.ConnectError):
            why = "connection refused or host not found"
        elif isinstance(exc, httpx.TimeoutException):
            why = f"no answer within {TIMEOUT_S:.0f} s"
        else:
            why = str(exc) or type(exc).__name__
        return CliError(f"cannot reach the site at {self.base}: {why} ({type(exc).__name__})", UNREACHABLE)

    def _json(self, response: httpx.Response) -> dict:
        try:
            data = response.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            data = None
        if response.status_code >= 400:
            errors = data.get("errors") if isinstance(data, dict) else None
            errors = {str(k): str(v) for k, v in errors.items()} if isinstance(errors, dict) else {}
            raise ApiError(response.status_code, explain(response.status_code, errors, str(response.url)), errors)
        if not isinstance(data, dict):
            raise CliError(
                f"{response.url} answered HTTP {response.status_code} without a JSON object: "
                f"is {self.base} a Rollway site?",
                UNREACHABLE,
            )
        return data
