"""Strict JSON input: what every view that reads JSON from a request parses it with.

Python's `json` accepts what no config or metric can hold and what the database's JSON
columns refuse — `NaN`, `Infinity`, a number like 1e999 that overflows to infinity —
and recurses once per nesting level, so a body of 100,000 brackets raises
RecursionError. Each of these must be a 400 that says what is wrong, never a 500.
"""

from __future__ import annotations

import json
import math
from typing import Any

# Deeper than any config or payload this site takes (a config is three levels deep).
MAX_DEPTH = 32


class BadJSON(ValueError):
    """A message for a person: what is wrong with the JSON and where."""


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise BadJSON(f"the number {text} is too large (it overflows to infinity)")
    return value


def _constant(name: str) -> Any:
    raise BadJSON(f"{name} is not a number JSON allows here; use a finite number")


def _depth(text: str) -> int:
    """Deepest nesting of objects and arrays in `text` (strings skipped), without
    recursion. Malformed text is json's to report: this only measures."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def loads(raw: bytes | str) -> Any:
    """`json.loads` that raises BadJSON (a ValueError) for invalid JSON, non-finite
    numbers and nesting deeper than MAX_DEPTH, each with a readable message."""
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    except UnicodeDecodeError as exc:
        raise BadJSON(f"invalid JSON: not UTF-8 ({exc.reason} at byte {exc.start})") from None
    if _depth(text) > MAX_DEPTH:
        raise BadJSON(f"invalid JSON: nested deeper than {MAX_DEPTH} levels")
    try:
        return json.loads(text, parse_float=_finite, parse_constant=_constant)
    except json.JSONDecodeError as exc:
        raise BadJSON(f"invalid JSON: {exc}") from None
    except BadJSON as exc:
        raise BadJSON(f"invalid JSON: {exc}") from None
