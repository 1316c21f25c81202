"""A NUL character in a query parameter is refused before any view sees it.

PostgreSQL stores no NUL in text, so a filter value carrying one fails in the database
with an error the view did not expect (a 500): the site's own views check their
parameters, but views it does not own, such as the Django admin's changelist filters
and autocomplete, pass them straight to a query. A 400 naming the parameter instead.
"""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse


class QueryNulMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest):
        for name, values in request.GET.lists():
            if "\x00" in name or any("\x00" in v for v in values):
                field = name.replace("\x00", "\\u0000")
                return JsonResponse(
                    {"errors": {field: f"{field} must not contain a NUL character (\\u0000)"}}, status=400
                )
        return self.get_response(request)
