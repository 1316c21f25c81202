"""The database unreachable: a 503 the caller can act on, instead of an HTML 500.

When PostgreSQL is down (restarting, failed over, out of connections) every view that
touches it raises `django.db.OperationalError` (or `InterfaceError` on a connection that
broke mid-request). That is no bug in the site, and the callers retry: the engine's
reporter resends its batch, a script backs off, a person reloads. So the JSON API and
/healthz answer 503 in the API's error shape, {"errors": {"database": ...}}, and pages a
plain-text 503, both with `Retry-After`.

A view's error reaches the middleware below. One raised outside any view — by a
middleware, e.g. the session saved as the response goes out — never does: Django turns
it into a 500 at that layer. `server_error` (the site's handler500) sees those, and
answers the same 503 when the database is the cause.

While PostgreSQL is down, each request would first wait the connection pool's timeout
(DATABASE_POOL_SIZE's pool: 3 s) before its 503, and requests pile up behind that wait.
So once a request has found the database unreachable, the process answers every request
of the next HOLD_S seconds with the 503 at once (static files excepted: they need no
database); the first request after that tries the database again. A query cancelled or
a SQLite lock is an OperationalError too, but no outage: those do not hold the site.
"""

from __future__ import annotations

import logging
import sys
import time

import psycopg
from django.conf import settings
from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils.deprecation import MiddlewareMixin
from django.views.defaults import server_error as django_server_error
from psycopg_pool import PoolTimeout

logger = logging.getLogger(__name__)

RETRY_AFTER_S = 5
MESSAGE = "the database cannot be reached right now; retry in a few seconds"
# Paths whose callers read JSON (api/urls.py, compare's /api/compare, /healthz).
JSON_PREFIXES = ("/api/", "/healthz")
# How long the site answers 503 at once after a request found the database unreachable.
HOLD_S = 2.0


class Outage:
    """When this process last found the database unreachable: `trip()` then; `held()`
    is true for `hold_s` after. One per process (`outage`), shared by daphne's threads
    (one float, replaced whole: the last trip wins, which is all a hold needs)."""

    def __init__(self, hold_s: float = HOLD_S, clock=time.monotonic) -> None:
        self.hold_s = hold_s
        self.clock = clock
        self._until = float("-inf")

    def trip(self) -> None:
        self._until = self.clock() + self.hold_s

    def held(self) -> bool:
        return self.clock() < self._until


outage = Outage()


def unreachable(exception: BaseException) -> bool:
    """Whether a database error means the server cannot be reached: no connection (the
    pool's timeout, a refused connect) or one cut mid-request. psycopg raises its base
    OperationalError for those and a subclass for a query's own failure (cancelled,
    deadlock); Django keeps psycopg's error as the cause."""
    if isinstance(exception, InterfaceError):
        return True
    cause = exception.__cause__
    return type(cause) is psycopg.OperationalError or isinstance(cause, PoolTimeout)


def _response(request: HttpRequest) -> HttpResponse:
    response: HttpResponse
    if request.path_info.startswith(JSON_PREFIXES):
        response = JsonResponse({"errors": {"database": MESSAGE}}, status=503)
    else:
        response = HttpResponse(
            f"503 Service Unavailable: {MESSAGE}.\n", status=503, content_type="text/plain; charset=utf-8"
        )
    response["Retry-After"] = str(RETRY_AFTER_S)
    return response


def unavailable(request: HttpRequest, exception: BaseException | None) -> HttpResponse | None:
    """The 503 for a database outage (`exception` an OperationalError/InterfaceError),
    JSON under /api/ and /healthz; None for any other exception."""
    if not isinstance(exception, OperationalError | InterfaceError):
        return None
    # One line, no traceback: an outage would otherwise fill the log with them.
    logger.warning("database unavailable for %s %s: %s", request.method, request.path, exception)
    if unreachable(exception):
        outage.trip()
    return _response(request)


class DatabaseUnavailableMiddleware(MiddlewareMixin):
    """A view's OperationalError/InterfaceError → 503 (JSON under /api/ and /healthz);
    while the outage is held, every request but a static file's → that 503 at once."""

    def process_request(self, request: HttpRequest) -> HttpResponse | None:
        if outage.held() and not request.path_info.startswith(settings.STATIC_URL):
            return _response(request)
        return None

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        return unavailable(request, exception)


def server_error(request: HttpRequest) -> HttpResponse:
    """handler500: Django calls it while handling the uncaught exception, so
    `sys.exc_info()` holds it. A database outage is a 503 as above; anything else is a
    bug and stays Django's 500 (its traceback already logged)."""
    return unavailable(request, sys.exc_info()[1]) or django_server_error(request)
