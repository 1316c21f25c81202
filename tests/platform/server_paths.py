"""What no response may show a user: the server's own directories.

`server_roots` lists every directory the site's settings configure (its home, cache,
exports, logs, checkpoints, scratch, trackers' directory, static files, the model, data
and sync roots), the repository, the system's temporary directory and whatever a test
adds (its tmp_path), each as set and as the OS resolves it. `assert_no_server_path`
fails, naming the root, when a body (JSON, HTML, or the bytes of a stored zip) contains
any of them.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

ROOT_SETTINGS = (
    "ROLLWAY_HOME",
    "ROLLWAY_CACHE_DIR",
    "ROLLWAY_EXPORT_DIR",
    "ROLLWAY_RUN_LOG_DIR",
    "ROLLWAY_CHECKPOINT_ROOT",
    "ROLLWAY_SCRATCH_DIR",
    "ROLLWAY_TENSORBOARD_DIR",
    "STATIC_ROOT",
    "REPO_ROOT",
)
ROOT_LIST_SETTINGS = ("ROLLWAY_MODEL_ROOTS", "ROLLWAY_DATA_ROOTS", "ROLLWAY_SYNC_ROOTS")


def server_roots(settings, extra: Iterable[str | Path] = ()) -> list[str]:
    """Every configured root (and `extra`), as set and resolved, longest first; never
    "/" alone, which every URL contains."""
    found: list[str] = [tempfile.gettempdir().rstrip("/") + "/"]  # "/tmp/"
    named = [getattr(settings, name, "") for name in ROOT_SETTINGS]
    for name in ROOT_LIST_SETTINGS:
        named.extend(getattr(settings, name, None) or [])
    for root in [*named, *extra]:
        if root and str(root) != "/":
            found += [str(root).rstrip("/"), os.path.realpath(str(root))]
    return sorted({r for r in found if r not in ("", "/")}, key=len, reverse=True)


def assert_no_server_path(
    body: bytes | str, settings, extra: Iterable[str | Path] = (), what: str = "the body"
) -> None:
    """Fail, naming the root, if `body` contains any of `server_roots`."""
    data = body.encode() if isinstance(body, str) else body
    for root in server_roots(settings, extra):
        assert root.encode() not in data, f"{what} names the server path {root!r}: {data[:400]!r}"
