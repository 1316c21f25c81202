"""The JSON side of a view, for every app that answers JSON: the one error shape, a
login check that answers 401 instead of redirecting, the body as a JSON object and
numeric query parameters read strictly, each refusal naming its field."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import wraps

from django.http import HttpRequest, JsonResponse
from pydantic import ValidationError

from foundation import jsonin
from foundation.errors import ActionError, field_errors

# Why an anonymous caller is refused anywhere on the API.
LOGIN_FIRST = "log in first (session cookie) or send an API token"


def errors_response(errors: dict[str, str], status: int = 400) -> JsonResponse:
    """The one error shape of the API: {"errors": {field: message}}."""
    return JsonResponse({"errors": errors}, status=status)


def api_login_required(view: Callable) -> Callable:
    """401 JSON for anonymous callers (no redirect to a login page: this is an API)."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args, **kwargs):
        if not request.user.is_authenticated:
            return errors_response({"auth": "log in first (session cookie)"}, status=401)
        return view(request, *args, **kwargs)

    return wrapper


def refusal_response(exc: ValidationError | ActionError) -> JsonResponse:
    """The answer to a refused request: a pydantic ValidationError of the body is a 400
    by field; an ActionError (BadBody, BadParam and the actions layer's NotFound,
    Conflict...) answers its own `http_status`."""
    if isinstance(exc, ValidationError):
        return errors_response(field_errors(exc))
    return errors_response(exc.errors, status=exc.http_status)


class BadBody(ActionError):
    def __init__(self, message: str):
        super().__init__({"body": message})


def json_object(request: HttpRequest) -> dict:
    """The request body as a JSON object, or BadBody saying what is wrong with it."""
    try:
        data = jsonin.loads(request.body or b"{}")
    except jsonin.BadJSON as exc:
        raise BadBody(str(exc)) from None
    if not isinstance(data, dict):
        raise BadBody("must be a JSON object")
    return data


class BadParam(ActionError):
    def __init__(self, name: str, message: str):
        super().__init__({name: message})


def int_param(
    request: HttpRequest, name: str, default: int | None, *, lo: int | None = None, hi: int | None = None
) -> int | None:
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


def float_param(request: HttpRequest, name: str, default: float) -> float:
    """A finite number as a query parameter; BadParam names the parameter and the fix."""
    raw = request.GET.get(name)
    if raw in (None, ""):
        return default
    try:
        value = float(raw)
    except ValueError:
        raise BadParam(name, f"{name} must be a number (got {raw!r})") from None
    if not math.isfinite(value):
        raise BadParam(name, f"{name} must be a finite number (got {raw!r})")
    return value
