"""Small helpers shared by the JSON views: error bodies, decorators, body parsing."""

from __future__ import annotations

import json
from functools import wraps
from typing import Callable

from django.http import HttpRequest, JsonResponse
from pydantic import ValidationError


def errors_response(errors: dict[str, str], status: int = 400) -> JsonResponse:
    """The one error shape of the API: {"errors": {field: message}}."""
    return JsonResponse({"errors": errors}, status=status)


def validation_errors(exc: ValidationError) -> dict[str, str]:
    """{"points.3.value": "Input should be a finite number"}: dotted location → message."""
    errors: dict[str, str] = {}
    for err in exc.errors():
        field = ".".join(str(part) for part in err["loc"]) or "body"
        message = err["msg"]
        if err["type"] == "json_invalid":
            message = f"invalid JSON: {err.get('ctx', {}).get('error', message)}"
        errors.setdefault(field, message.removeprefix("Value error, "))
    return errors


def api_login_required(view: Callable) -> Callable:
    """401 JSON for anonymous callers (no redirect to a login page: this is an API)."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args, **kwargs):
        if not request.user.is_authenticated:
            return errors_response({"auth": "log in first (session cookie)"}, status=401)
        return view(request, *args, **kwargs)

    return wrapper


def bad_input_response(exc: Exception) -> JsonResponse:
    """400 for any of the API's bad-input exceptions (BadBody, pydantic ValidationError,
    runs.actions.ActionError — each carries its errors by field)."""
    if isinstance(exc, ValidationError):
        return errors_response(validation_errors(exc))
    return errors_response(exc.errors)


class BadBody(Exception):
    def __init__(self, message: str):
        super().__init__(message)
        self.errors = {"body": message}


def json_object(request: HttpRequest) -> dict:
    """The request body as a JSON object, or BadBody saying what is wrong with it."""
    try:
        data = json.loads(request.body or b"{}")
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadBody(f"invalid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise BadBody("must be a JSON object")
    return data


class BadParam(Exception):
    def __init__(self, name: str, message: str):
        super().__init__(message)
        self.errors = {name: message}


def int_param(request: HttpRequest, name: str, default: int | None, *, lo: int | None = None,
              hi: int | None = None) -> int | None:
    """An integer query parameter; BadParam names the parameter and the fix."""
    raw = request.GET.get(name)
    if raw in (None, ""):
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadParam(name, f"{name} must be an integer (got {raw!r})") from None
    if lo is not None and value < lo:
        raise BadParam(name, f"{name} must be ≥ {lo} (got {value})")
    if hi is not None and value > hi:
        raise BadParam(name, f"{name} must be ≤ {hi} (got {value})")
    return value
