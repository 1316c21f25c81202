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
"""

from __future__ import annotations

import logging
import sys

from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils.deprecation import MiddlewareMixin
from django.views.defaults import server_error as django_server_error

logger = logging.getLogger(__name__)

RETRY_AFTER_S = 5
MESSAGE = "the database cannot be reached right now; retry in a few seconds"
# Paths whose callers read JSON (api/urls.py, compare's /api/compare, /healthz).
JSON_PREFIXES = ("/api/", "/healthz")


def unavailable(request: HttpRequest, exception: BaseException | None) -> HttpResponse | None:
    """The 503 for a database outage (`exception` an OperationalError/InterfaceError),
    JSON under /api/ and /healthz; None for any other exception."""
    if not isinstance(exception, OperationalError | InterfaceError):
        return None
    # One line, no traceback: an outage would otherwise fill the log with them.
    logger.warning("database unavailable for %s %s: %s", request.method, request.path, exception)
    if request.path_info.startswith(JSON_PREFIXES):
        response = JsonResponse({"errors": {"database": MESSAGE}}, status=503)
    else:
        response = HttpResponse(
            f"503 Service Unavailable: {MESSAGE}.\n", status=503, content_type="text/plain; charset=utf-8"
        )
    response["Retry-After"] = str(RETRY_AFTER_S)
    return response


class DatabaseUnavailableMiddleware(MiddlewareMixin):
    """A view's OperationalError/InterfaceError → 503 (JSON under /api/ and /healthz)."""

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        return unavailable(request, exception)


def server_error(request: HttpRequest) -> HttpResponse:
    """handler500: Django calls it while handling the uncaught exception, so
    `sys.exc_info()` holds it. A database outage is a 503 as above; anything else is a
    bug and stays Django's 500 (its traceback already logged)."""
    return unavailable(request, sys.exc_info()[1]) or django_server_error(request)
