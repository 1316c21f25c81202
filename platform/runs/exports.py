"""A run's exported model: where it is, who may have it, and the zip it is served as.

The run's driver writes the final policy as a Hugging Face directory to
`ROLLWAY_EXPORT_DIR/run-<id>/` when the run succeeds (workers/train/export.py). The site
streams it as a zip, built while it is sent: a multi-GB checkpoint is never held in
memory or copied on disk. Entries are stored, not deflated (safetensors do not
compress), with zip64 headers, so files past 4 GiB are fine.
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.handlers.asgi import ASGIRequest
from django.http import HttpRequest, StreamingHttpResponse

from foundation.errors import Conflict, NotFound
from runs.actions import check_run_access
from runs.models import Run
from teams import audit, roles

# Bytes read from a file per chunk of the response.
CHUNK_BYTES = 1 << 20
# The directory holds a model only once the driver has renamed it into place.
MARKER = "config.json"


def export_dir(run_id: int) -> Path:
    return Path(settings.ROLLWAY_EXPORT_DIR) / f"run-{int(run_id)}"


def check_export(user, run_id: int) -> tuple[Run, Path]:
    """The run and its export directory, if `user` may download it now: NotFound for a
    run they may not see or one with no exported model, Conflict while it is not finished."""
    run = check_run_access(user, run_id)
    roles.require(user, run.experiment.team, "export models", field="run")
    if run.status not in Run.TERMINAL:
        raise Conflict(
            {"run": f"run {run.pk} is {run.status}: its model is exported when it succeeds; download it then"}
        )
    path = export_dir(run.pk)
    if not (path / MARKER).is_file():
        why = "only a run that succeeded exports its model" if run.status != Run.Status.SUCCEEDED else "none was kept"
        raise NotFound({"run": f"run {run.pk} ({run.status}) has no exported model: {why}"})
    return run, path


def do_record_export(user, run: Run) -> None:
    """The audit log's entry for a download about to start: whoever began it has the
    model's files."""
    audit.record(user, run.experiment.team, audit.Action.EXPORT, f"run {run.pk}", name=run.name)


def files(directory: Path) -> list[tuple[Path, str]]:
    """(file, name in the zip) for every regular file under `directory`, sorted; links
    are left out, so nothing outside the export is ever served."""
    out = []
    for root, dirs, names in os.walk(directory, followlinks=False):
        dirs.sort()
        for name in sorted(names):
            path = Path(root) / name
            if path.is_file() and not path.is_symlink():
                out.append((path, path.relative_to(directory).as_posix()))
    return out


class _Sink:
    """A write-only stream zipfile writes into; what it wrote is taken out in chunks."""

    def __init__(self) -> None:
        self._chunks: list[bytes] = []
        self._pos = 0

    def write(self, data) -> int:
        data = bytes(data)
        self._chunks.append(data)
        self._pos += len(data)
        return len(data)

    def tell(self) -> int:
        return self._pos

    def flush(self) -> None:
        pass

    def take(self) -> bytes:
        out = b"".join(self._chunks)
        self._chunks.clear()
        return out


def zip_chunks(directory: Path, root: str) -> Iterator[bytes]:
    """The zip of `directory`, its entries under `root/`, as it is written."""
    sink = _Sink()
    with zipfile.ZipFile(sink, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
        for path, name in files(directory):
            info = zipfile.ZipInfo.from_file(path, f"{root}/{name}")
            info.compress_type = zipfile.ZIP_STORED
            with open(path, "rb") as src, archive.open(info, "w", force_zip64=True) as dst:
                while chunk := src.read(CHUNK_BYTES):
                    dst.write(chunk)
                    yield sink.take()
            yield sink.take()
    yield sink.take()


async def azip_chunks(directory: Path, root: str) -> AsyncIterator[bytes]:
    """`zip_chunks` for the ASGI server: each chunk read in a thread, sent as it comes
    (Django would read a plain iterator whole before sending it)."""
    chunks = zip_chunks(directory, root)
    done = object()
    while (chunk := await sync_to_async(next, thread_sensitive=False)(chunks, done)) is not done:
        if chunk:
            yield chunk


def zip_response(request: HttpRequest, run: Run, directory: Path) -> StreamingHttpResponse:
    """The export as a zip download, `run-<id>-model.zip` holding `run-<id>-model/`."""
    root = f"run-{run.pk}-model"
    chunks = azip_chunks(directory, root) if isinstance(request, ASGIRequest) else zip_chunks(directory, root)
    response = StreamingHttpResponse(chunks, content_type="application/zip")
    response["Content-Disposition"] = f'attachment; filename="{root}.zip"'
    return response
