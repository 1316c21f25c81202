"""What the OpenAPI document says of the JSON views: the error shape, the answers each
operation documents, and query parameters a view reads itself (the answers themselves
are foundation/http.py's)."""

from __future__ import annotations

from typing import Any

from ninja import Schema


class Errors(Schema):
    """Every refusal: the field (or "body", "auth", a parameter) and what to change."""

    errors: dict[str, str]


def query_doc(*params: tuple[str, str, str]) -> dict:
    """OpenAPI parameters for query strings a view reads itself (as the page's forms do,
    through the actions layer's checks, whose messages name the parameter): ninja would
    otherwise validate them first with messages of its own. (name, type, description)."""
    return {
        "parameters": [
            {"in": "query", "name": name, "required": False, "schema": {"type": kind}, "description": text}
            for name, kind, text in params
        ]
    }


def responses(ok: Any, status: int = 200, *refusals: int) -> dict[int, Any]:
    """The documented answers of an operation: `ok` at `status`, 401 (every operation
    needs a login), and the given refusal statuses, all in the error shape."""
    return {status: ok, 401: Errors, **dict.fromkeys(refusals, Errors)}
