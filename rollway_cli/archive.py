"""Unpacking a run's exported model zip into a directory, safely.

The zip comes over the network, so it is checked whole before anything is written:
an entry whose name is absolute, holds a `..` part, a backslash or a drive letter, or
that is a symbolic link, refuses the whole archive (UnsafeArchive); so does one that
would overwrite an existing file unless overwriting is asked for. The site wraps the
model in one folder (`run-<id>-model/`); that folder is dropped, so DIR itself is the
Hugging Face model directory (`from_pretrained(DIR)`).
"""

from __future__ import annotations

import shutil
import stat
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

CHUNK_BYTES = 1 << 20


class UnsafeArchive(Exception):
    pass


@dataclass(frozen=True)
class Entry:
    info: zipfile.ZipInfo
    parts: tuple[str, ...]  # the path below the archive's wrapping folder


def _parts(name: str) -> tuple[str, ...]:
    if "\\" in name or "\x00" in name:
        raise UnsafeArchive(f"entry {name!r}: backslashes and NUL characters are not allowed in a name")
    path = PurePosixPath(name)
    if path.is_absolute():
        raise UnsafeArchive(f"entry {name!r} is an absolute path")
    parts = tuple(p for p in path.parts if p != ".")
    if ".." in parts:
        raise UnsafeArchive(f"entry {name!r} climbs out of the directory (..)")
    if parts and len(parts[0]) >= 2 and parts[0][1] == ":":
        raise UnsafeArchive(f"entry {name!r} names a drive")
    return parts


def _is_link(info: zipfile.ZipInfo) -> bool:
    return stat.S_ISLNK(info.external_attr >> 16)


def entries(archive: zipfile.ZipFile) -> list[Entry]:
    """Every file entry with its path inside the destination; UnsafeArchive on the first
    entry that could write outside it."""
    checked: list[tuple[zipfile.ZipInfo, tuple[str, ...]]] = []
    for info in archive.infolist():
        parts = _parts(info.filename)
        if _is_link(info):
            raise UnsafeArchive(f"entry {info.filename!r} is a symbolic link")
        if parts and not info.is_dir():
            checked.append((info, parts))
    tops = {parts[0] for _, parts in checked}
    wrapped = len(tops) == 1 and all(len(parts) > 1 for _, parts in checked)
    return [Entry(info, parts[1:] if wrapped else parts) for info, parts in checked]


def unpack(zip_path: Path, dest: Path, *, overwrite: bool = False) -> list[Path]:
    """Write the archive's files under `dest` (made if missing); the files written."""
    with zipfile.ZipFile(zip_path) as archive:
        found = entries(archive)
        root = dest.resolve()
        targets = []
        for entry in found:
            target = root.joinpath(*entry.parts)
            # A link already in dest could still lead out: the resolved path must stay inside.
            if not target.resolve().is_relative_to(root):
                raise UnsafeArchive(f"entry {entry.info.filename!r} would be written outside {dest}")
            if target.exists() and not overwrite:
                raise UnsafeArchive(f"{target} exists already (pass --overwrite to replace it)")
            targets.append(target)
        written = []
        for entry, target in zip(found, targets, strict=True):
            target.parent.mkdir(parents=True, exist_ok=True)
            with archive.open(entry.info) as src, open(target, "wb") as out:
                shutil.copyfileobj(src, out, CHUNK_BYTES)
            written.append(target)
    return written
