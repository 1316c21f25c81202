"""What tells a production site from a one-machine one, and what production asks of its
secret key.

A site is production when it answers to a host beyond this machine: DJANGO_ALLOWED_HOSTS
names anything but loopback (the default names only 127.0.0.1, localhost and [::1]).
DEBUG does not tell them apart: it is off by default on a laptop too. There, the key
Django signs sessions, password-reset links and CSRF tokens with must be one no one can
guess: set explicitly (every process of the site shares it), long, varied and not a
placeholder copied from a deploy file. On loopback the key made once under ROLLWAY_HOME
is used when none is set.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable

from django.core.checks.security.base import SECRET_KEY_MIN_LENGTH, SECRET_KEY_MIN_UNIQUE_CHARACTERS

MAKE_KEY = "python -c 'import secrets; print(secrets.token_urlsafe(50))'"
# Words of the placeholders deploy files and tutorials ship ("CHANGE-ME", "your-secret-key",
# "django-insecure-..."), looked for in the key lowercased with its punctuation dropped.
# Six letters or more: a random key (token_urlsafe) holds one by chance in fewer than one
# key in ten million.
PLACEHOLDER_WORDS = ("changeme", "secret", "password", "placeholder", "example", "insecure", "replace", "default")


def is_loopback(host: str) -> bool:
    """Whether a host name or bind address is reachable from this machine only."""
    host = host.strip().removeprefix("[").removesuffix("]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name other than localhost may resolve to anything
        return False


def beyond_loopback(allowed_hosts: Iterable[str]) -> list[str]:
    """The hosts of ALLOWED_HOSTS that reach beyond this machine ("*" and ".domain" do)."""
    return [host for host in allowed_hosts if not is_loopback(host)]


def secret_key_problem(key: str | None) -> str | None:
    """What makes `key` unfit for a production site's DJANGO_SECRET_KEY, or None."""
    if key is None:
        return "is unset"
    letters = re.sub(r"[^a-z0-9]", "", key.lower())
    if word := next((w for w in PLACEHOLDER_WORDS if w in letters), None):
        return f'looks like a placeholder (it contains "{word}")'
    if len(key) < SECRET_KEY_MIN_LENGTH:
        return f"is {len(key)} characters long, fewer than {SECRET_KEY_MIN_LENGTH}"
    if len(set(key)) < SECRET_KEY_MIN_UNIQUE_CHARACTERS:
        return f"has {len(set(key))} distinct characters, fewer than {SECRET_KEY_MIN_UNIQUE_CHARACTERS}"
    return None


def production_key_error(key: str | None, allowed_hosts: Iterable[str]) -> str | None:
    """The start-up refusal of a production site whose key is unfit (None: start)."""
    public = beyond_loopback(allowed_hosts)
    problem = secret_key_problem(key) if public else None
    if problem is None:
        return None
    return (
        f"DJANGO_SECRET_KEY {problem}: a site that answers to {', '.join(public)} (DJANGO_ALLOWED_HOSTS) "
        f"needs a key of {SECRET_KEY_MIN_LENGTH} or more random characters, the same in its web, worker "
        f"and beat processes. Make one with: {MAKE_KEY}"
    )
