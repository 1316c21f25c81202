"""Strict JSON input: what every view that reads JSON from a request parses it with.

Python's `json` accepts what no config or metric can hold and what the database's JSON
columns refuse — `NaN`, `Infinity`, a number like 1e999 that overflows to infinity —
and recurses once per nesting level, so a body of 100,000 brackets raises
RecursionError; it also reads "\u0000", which PostgreSQL stores in no text or JSON
column. Each of these must be a 400 that says what is wrong, never a 500.
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


def _int(text: str) -> int:
    # int() refuses more than sys.get_int_max_str_digits() (4300) digits with a bare
    # ValueError, which json.loads lets through.
    try:
        return int(text)
    except ValueError:
        raise BadJSON(
            f"the number {text[:12]}… has {len(text.lstrip('-'))} digits; no field takes one that long"
        ) from None


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


def _nul_at(value: Any, path: str = "") -> str | None:
    """The dotted path of the first string (or key) in `value` holding a NUL character."""
    if isinstance(value, str):
        return (path or "the body") if "\x00" in value else None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, inner in items:
        where = f"{path}.{key}" if path else str(key)
        if isinstance(key, str) and "\x00" in key:
            return where
        found = _nul_at(inner, where)  # recursion is bounded: MAX_DEPTH was checked
        if found:
            return found
    return None


def loads(raw: bytes | str) -> Any:
    """`json.loads` that raises BadJSON (a ValueError) for invalid JSON, non-finite
    numbers, integers too long to convert, nesting deeper than MAX_DEPTH and NUL
    characters in strings, each with a readable message."""
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    except UnicodeDecodeError as exc:
        raise BadJSON(f"invalid JSON: not UTF-8 ({exc.reason} at byte {exc.start})") from None
    if _depth(text) > MAX_DEPTH:
        raise BadJSON(f"invalid JSON: nested deeper than {MAX_DEPTH} levels")
    try:
        value = json.loads(text, parse_float=_finite, parse_int=_int, parse_constant=_constant)
    except json.JSONDecodeError as exc:
        raise BadJSON(f"invalid JSON: {exc}") from None
    except BadJSON as exc:
        raise BadJSON(f"invalid JSON: {exc}") from None
    where = _nul_at(value)
    if where:
        raise BadJSON(f"invalid JSON: {where} holds a NUL character (\\u0000); remove it")
    return value
