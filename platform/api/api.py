"""The JSON API on django-ninja: one NinjaAPI whose routers (api/views.py, configs.py,
comparisons.py, teams.py, tokens.py) are thin views over the actions layer.

Ninja adds the OpenAPI document (/api/openapi.json) and its Swagger page (/api/docs);
what a client sees is the site's own shape, not ninja's: every refusal is
{"errors": {field: message}} with the status of its kind (foundation/errors.py).

Auth: a personal API token (`Authorization: Bearer rwp_…`, checked by
api.token_auth before any view) or the session cookie. A session's POST needs its
CSRF token as any session form does; a token request is exempt (a browser never attaches
that header by itself).
"""

from __future__ import annotations

import copy
from functools import wraps
from typing import Any

import pydantic
from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import reverse
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, ValidationError
from ninja.openapi.views import openapi_view
from ninja.parser import Parser
from ninja.security import HttpBearer, SessionAuth
from ninja.utils import check_csrf

from api import comparisons, configs, lineage, teams, tokens, views
from foundation.errors import ActionError, errors_by_field
from foundation.http import LOGIN_FIRST, errors_response, json_object, refusal_response
from teams.tokens import PREFIX as TOKEN_PREFIX


class CsrfRefused(Exception):
    """A session POST without its CSRF token: Django's refusal (settings.CSRF_FAILURE_VIEW,
    JSON on the API), answered as it is."""

    def __init__(self, response: HttpResponse):
        super().__init__("CSRF check failed")
        self.response = response


class ApiToken(HttpBearer):
    """A personal API token. api.token_auth has already checked it and made the request
    its owner's (an unknown or revoked one never gets here: it is a 401 there)."""

    def authenticate(self, request: HttpRequest, token: str) -> Any:
        if token.startswith(TOKEN_PREFIX) and request.user.is_authenticated:
            return request.user
        return None


class SessionUser(SessionAuth):
    """The session's signed-in user, with Django's CSRF check for unsafe methods (it
    honours the exemption api.token_auth gives a token request). Ninja's own check
    would answer its own 403 body; this keeps Django's, whose failure view answers the
    API's shape (foundation/security.py)."""

    def _get_key(self, request: HttpRequest) -> str | None:
        refusal = check_csrf(request)
        if refusal is not None:
            raise CsrfRefused(refusal)
        return request.COOKIES.get(self.param_name)


class SafeJSONParser(Parser):
    """Bodies through foundation.jsonin (no NaN or 1e999, bounded depth) and only a JSON
    object: BadBody names "body" and what is wrong. Ninja wraps a parser's exception in
    an HttpError; `http_error` below answers the BadBody inside it."""

    def parse_body(self, request: HttpRequest) -> dict:
        return json_object(request)


def _docs_login_required(view):
    """The schema and its page are for signed-in users (session or token): the schema
    answers an anonymous script 401 as every endpoint does, the page sends a browser to
    log in."""
    is_page = getattr(view, "func", None) is openapi_view

    @wraps(view)
    def wrapper(request: HttpRequest, *args, **kwargs):
        if request.user.is_authenticated:
            return view(request, *args, **kwargs)
        if is_page:
            return redirect_to_login(request.get_full_path())
        return errors_response({"auth": LOGIN_FIRST}, status=401)

    return wrapper


class RollwayAPI(NinjaAPI):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._schemas: dict[str, dict] = {}  # get_openapi_schema's, by root path

    def get_root_path(self, path_params: dict) -> str:
        """/api/, from the schema's own URL: ninja would reverse its root view, which
        api/urls.py leaves out."""
        return reverse("api:openapi-json", kwargs=path_params).removesuffix(self.openapi_url.lstrip("/"))

    def get_openapi_schema(self, *, path_prefix: str | None = None, path_params: dict | None = None) -> dict:
        """As ninja makes it, but a body is the model alone: the views take an optional
        body (an empty one reads as {}), which ninja writes as "the model or null",
        while a JSON null is refused (the body must be an object).

        Made once per root path and copied out: ninja builds it anew from every route's
        models at each call (130 ms here for this API), while the routes are fixed once
        the URLconf has loaded."""
        if path_prefix is None:
            path_prefix = self.get_root_path(path_params or {})
        if path_prefix not in self._schemas:
            schema = super().get_openapi_schema(path_prefix=path_prefix, path_params=path_params)
            for operations in schema["paths"].values():
                for operation in operations.values():
                    media = operation.get("requestBody", {}).get("content", {}).get("application/json", {})
                    options = media.get("schema", {}).get("anyOf", [])
                    if len(options) == 2 and {"type": "null"} in options:
                        media["schema"] = next(o for o in options if o != {"type": "null"})
            self._schemas[path_prefix] = schema
        return copy.deepcopy(self._schemas[path_prefix])


api = RollwayAPI(
    title="Rollway API",
    version="1",
    description=(
        "Runs, metrics, configurations, comparisons, teams and tokens: everything the web UI does. "
        "Authenticate with the session cookie (POSTs then need the CSRF token) or a personal API "
        "token made on /teams/: `Authorization: Bearer rwp_…`. Every refusal is "
        '`{"errors": {field: message}}` with a status that says its kind (400 the input, 401 '
        "no login, 403 the role, 404 not found or not yours, 409 the object's state)."
    ),
    urls_namespace="api",
    auth=[ApiToken(), SessionUser()],
    parser=SafeJSONParser(),
    docs_url="/docs",
    openapi_url="/openapi.json",
    docs_decorator=_docs_login_required,
)


@api.exception_handler(ValidationError)
def validation_error(request: HttpRequest, exc: ValidationError) -> JsonResponse:
    """Named as the actions layer names fields: a body field by its dotted path inside
    the body ("overrides", "buffer.capacity"), a query or path parameter by its name."""
    relative = []
    for err in exc.errors:
        source, *loc = err["loc"]
        if source == "body":
            loc = loc[1:]  # the view's argument name: the body is that one model
        relative.append({**err, "loc": tuple(loc)})
    return errors_response(errors_by_field(relative))


@api.exception_handler(AuthenticationError)
def not_logged_in(request: HttpRequest, exc: AuthenticationError) -> JsonResponse:
    return errors_response({"auth": LOGIN_FIRST}, status=401)


@api.exception_handler(CsrfRefused)
def csrf_refused(request: HttpRequest, exc: CsrfRefused) -> HttpResponse:
    return exc.response


@api.exception_handler(ActionError)
def action_error(request: HttpRequest, exc: ActionError) -> JsonResponse:
    return refusal_response(exc)


@api.exception_handler(pydantic.ValidationError)
def body_error(request: HttpRequest, exc: pydantic.ValidationError) -> JsonResponse:
    """A model a view validates itself (an empty body as {} against required fields)."""
    return refusal_response(exc)


@api.exception_handler(HttpError)
def http_error(request: HttpRequest, exc: HttpError) -> JsonResponse:
    if isinstance(exc.__cause__, ActionError):  # SafeJSONParser's BadBody
        return refusal_response(exc.__cause__)
    return errors_response({"request": str(exc)}, status=exc.status_code)


for module in (views, lineage, configs, comparisons, teams, tokens):
    api.add_router("", module.router)
