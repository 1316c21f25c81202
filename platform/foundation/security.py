"""The site's web security beyond Django's settings: the Content-Security-Policy header,
the CSRF refusal's answer, and the login lockout's page and client address (settings.py,
"web security")."""

from __future__ import annotations

import math

from csp.middleware import CSPMiddleware, PolicyParts
from django.conf import settings
from django.contrib.auth.forms import AuthenticationForm
from django.core.exceptions import DisallowedHost
from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import render
from django.views.csrf import csrf_failure as django_csrf_failure

from foundation.dbdown import JSON_PREFIXES
from foundation.http import LOGIN_FIRST, errors_response

CSRF_MISSING = (
    "a signed-in session's POST needs its CSRF token (the X-CSRFToken header or a "
    "csrfmiddlewaretoken field); a script sends an API token instead"
)


class ContentSecurityPolicyMiddleware(CSPMiddleware):
    """django-csp's middleware, plus this host's own ws:// and wss:// in connect-src for
    the live pages' WebSockets: CSP Level 3 lets 'self' cover them, but browsers that
    predate it (older Safari) do not."""

    def get_policy_parts(
        self, request: HttpRequest, response: HttpResponseBase, report_only: bool = False
    ) -> PolicyParts:
        parts = super().get_policy_parts(request, response, report_only)
        try:
            host = request.get_host()  # one of ALLOWED_HOSTS, so safe to put in the header
        except DisallowedHost:
            return parts  # the 400 for a foreign Host header: no page, no socket
        update = dict(parts.update or {})
        update["connect-src"] = [*update.get("connect-src", []), f"ws://{host}", f"wss://{host}"]
        parts.update = update
        return parts


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    """Django's CSRF refusal (settings.CSRF_FAILURE_VIEW), in the API's shape where
    callers read JSON: 401 for an anonymous caller, who must log in or send an API token
    first, as everywhere on the API; 403 for a signed-in session that left its token
    out. Pages keep Django's own page."""
    if not request.path.startswith(JSON_PREFIXES):
        return django_csrf_failure(request, reason)
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return errors_response({"auth": LOGIN_FIRST}, status=401)
    return errors_response({"csrf": CSRF_MISSING}, status=403)


def client_ip(request: HttpRequest) -> str | None:
    """The address a login attempt counts against. Behind ROLLWAY_PROXY_COUNT proxies,
    each appending the address it saw to X-Forwarded-For, the entry that many from the
    right was written by the outermost proxy: the client cannot forge it (it can only
    prepend entries of its own)."""
    count = settings.ROLLWAY_PROXY_COUNT
    if count:
        forwarded = [a.strip() for a in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",") if a.strip()]
        if len(forwarded) >= count:
            return forwarded[-count]
    return request.META.get("REMOTE_ADDR")


def lockout_response(request: HttpRequest, original_response=None, credentials=None) -> HttpResponse:
    """The login page again, with why it refused and for how long (HTTP 429)."""
    minutes = math.ceil(settings.AXES_COOLOFF_TIME.total_seconds() / 60)
    form = AuthenticationForm(request, initial={"username": request.POST.get("username", "")})
    context = {
        "form": form,
        "locked_out": True,
        "lockout_minutes": minutes,
        "failure_limit": settings.AXES_FAILURE_LIMIT,
        "next": request.POST.get("next", request.GET.get("next", "")),
    }
    return render(request, "registration/login.html", context, status=429)
