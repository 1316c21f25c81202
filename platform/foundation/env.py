"""Strict readers for settings that come from the environment.

A setting that is present but malformed is an error that names the variable and the
fix, never a silent default: `DJANGO_DEBUG=flase` must not quietly mean False.
"""

from __future__ import annotations

import os
from typing import overload

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


@overload
def env_str(name: str, default: str) -> str: ...
@overload
def env_str(name: str, default: None = None) -> str | None: ...
def env_str(name: str, default: str | None = None) -> str | None:
    """The variable's value, or `default` when it is unset or empty."""
    value = os.environ.get(name, "")
    return value if value.strip() else default


def env_bool(name: str, default: bool) -> bool:
    """A boolean variable; anything other than 1/0, true/false, yes/no, on/off is an error."""
    raw = env_str(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name} must be one of {sorted(_TRUE | _FALSE)} (got {raw!r})")


def env_int(name: str, default: int) -> int:
    raw = env_str(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be an integer (got {raw!r})") from None


def env_float(name: str, default: float) -> float:
    raw = env_str(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be a number (got {raw!r})") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise ImproperlyConfigured(f"{name} must be a finite number (got {raw!r})")
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    """A comma-separated list; blanks around items are dropped."""
    raw = env_str(name)
    if raw is None:
        return list(default)
    return [item.strip() for item in raw.split(",") if item.strip()]
