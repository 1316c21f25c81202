"""Request body limits, checked before any view runs.

Django compares a body with DATA_UPLOAD_MAX_MEMORY_SIZE only when something reads
request.body or request.POST, and then raises RequestDataTooBig, which becomes an HTML
400 page with a traceback in the error log; a view that never reads its body accepts any
size. Here each request gets the limit that fits its endpoint (the engine's ingest takes
large metric batches, everything else is small), the declared Content-Length is checked
first and the body actually received (a chunked one has no Content-Length) second, and
an oversized body is a 413 in the API's error shape, {"errors": {"body": ...}}.
"""

from __future__ import annotations

import re

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, JsonResponse, UnreadablePostError

# Methods whose body a view may read.
BODY_METHODS = {"POST", "PUT", "PATCH", "DELETE"}


def body_limit(request: HttpRequest) -> tuple[int, str]:
    """The largest body this request may carry, and the setting that says so."""
    if request.method == "POST" and re.match(settings.ROLLWAY_INGEST_PATHS, request.path_info.lstrip("/")):
        return settings.ROLLWAY_MAX_INGEST_BODY_BYTES, "ROLLWAY_MAX_INGEST_BODY_BYTES"
    return settings.ROLLWAY_MAX_BODY_BYTES, "ROLLWAY_MAX_BODY_BYTES"


def too_large(size: int | None, limit: int, setting: str) -> JsonResponse:
    said = f"{size} bytes" if size is not None else "larger than the limit"
    message = (
        f"the request body is {said}; this endpoint takes at most {limit} bytes ({setting}). "
        "Send less per request (split a batch)."
    )
    return JsonResponse({"errors": {"body": message}, "limit": limit}, status=413)


class RequestBodyLimitMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest):
        limit, setting = body_limit(request)
        raw_length = request.META.get("CONTENT_LENGTH") or ""
        if raw_length.strip():
            try:
                declared = int(raw_length)
            except ValueError:
                declared = -1
            if declared < 0:
                return JsonResponse(
                    {"errors": {"body": f"Content-Length must be a number of bytes (got {raw_length!r})"}},
                    status=400,
                )
            if declared > limit:
                return too_large(declared, limit, setting)
        if request.method in BODY_METHODS:
            # Read it now, bounded: Django checks the size it actually received (also
            # without a Content-Length) against DATA_UPLOAD_MAX_MEMORY_SIZE, the largest
            # limit; the view then reads the same bytes from memory.
            try:
                size = len(request.body)
            except RequestDataTooBig:
                return too_large(None, limit, setting)
            except UnreadablePostError:  # the client went away mid-body: nobody to answer
                return JsonResponse({"errors": {"body": "the request body was cut off"}}, status=400)
            if size > limit:
                return too_large(size, limit, setting)
        return self.get_response(request)
