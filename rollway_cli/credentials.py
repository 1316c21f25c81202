"""Where the site's URL and the API token come from, and where `rollway login` keeps them.

Precedence, highest first: --url/--token on the command, ROLLWAY_URL/ROLLWAY_TOKEN in
the environment, then the credentials file ($ROLLWAY_CONFIG_DIR/credentials.json, else
~/.config/rollway/credentials.json). The file holds a secret, so it is written 0600 in a
0700 directory, through a temporary file renamed into place: a reader never sees half
of it and the secret is never readable by others, not even for a moment.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

FILE_NAME = "credentials.json"


@dataclass(frozen=True)
class Credentials:
    url: str | None
    token: str | None


def config_dir() -> Path:
    configured = os.environ.get("ROLLWAY_CONFIG_DIR")
    if configured:
        return Path(configured).expanduser()
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "rollway"


def credentials_path() -> Path:
    return config_dir() / FILE_NAME


def normalize_url(url: str) -> str:
    """The site's root without a trailing slash; http:// when no scheme is given."""
    url = url.strip().rstrip("/")
    if "://" not in url:
        url = "http://" + url
    return url


def stored() -> Credentials:
    """What `rollway login` saved (None for each part it did not)."""
    try:
        data = json.loads(credentials_path().read_text())
    except (OSError, ValueError):
        return Credentials(None, None)
    if not isinstance(data, dict):
        return Credentials(None, None)
    url, token = data.get("url"), data.get("token")
    return Credentials(url if isinstance(url, str) else None, token if isinstance(token, str) else None)


def resolve(url: str | None = None, token: str | None = None) -> Credentials:
    """The URL and token a command uses: its own flags, else the environment, else the file."""
    saved = stored()
    url = url or os.environ.get("ROLLWAY_URL") or saved.url
    token = token or os.environ.get("ROLLWAY_TOKEN") or saved.token
    return Credentials(normalize_url(url) if url else None, token.strip() if token else None)


def save(url: str, token: str) -> Path:
    path = credentials_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{FILE_NAME}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w") as out:
            json.dump({"url": normalize_url(url), "token": token}, out, indent=2)
            out.write("\n")
        os.chmod(tmp, 0o600)  # O_CREAT's mode is masked by the umask; this is not
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def remove() -> Path | None:
    """Delete the saved credentials; the path removed, or None if there were none."""
    path = credentials_path()
    try:
        path.unlink()
    except FileNotFoundError:
        return None
    return path
