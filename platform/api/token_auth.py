"""Personal API tokens on the JSON API: `Authorization: Bearer rwp_…` on a /api/ path
makes the request its owner's, narrowed to the token's team and role (teams/tokens.py).

A script has no CSRF token to send and needs none: a bearer header is not something a
browser attaches by itself, so a token-authenticated request is exempt from the CSRF
check. A header with an unknown or revoked token is a 401 at once, never a silent fall
back to the session. Other bearer tokens (the engine's run ingest tokens) and other
paths are left alone.
"""

from __future__ import annotations

from django.http import JsonResponse

from teams import tokens


class PersonalTokenMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        header = request.META.get("HTTP_AUTHORIZATION", "")
        scheme, _, secret = header.partition(" ")
        if request.path.startswith("/api/") and scheme.lower() == "bearer" and secret.startswith(tokens.PREFIX):
            user = tokens.authenticate(secret.strip())
            if user is None:
                return JsonResponse(
                    {"errors": {"auth": "this API token is unknown or revoked: make a new one on /teams/"}},
                    status=401,
                )
            request.user = user
            request._dont_enforce_csrf_checks = True
        return self.get_response(request)
