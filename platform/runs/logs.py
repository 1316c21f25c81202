"""A run's driver log: where it is, who may read it, its tail and the whole file.

The run's driver appends its engine lines to `ROLLWAY_RUN_LOG_DIR/run-<id>.log`
(workers/core/logs.py, Confinement.log_file) on the Ray node it runs on. This host serves the
file when it sees that directory (a volume the nodes and the web process share, as the
exports are); otherwise, or once the file is removed, a read says so (NotFound with the
reason), never an error of the site. Anyone who may see the run may read its log: it
says what the run's page and its failure already say, in more lines.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.http import HttpRequest, StreamingHttpResponse

from configs.policy import confinement
from foundation.errors import NotFound
from runs.actions import check_run_access
from runs.models import Run

logger = logging.getLogger(__name__)

# The page and GET /api/runs/<id>/log show at most this much of the file's end: a long
# run's log grows without bound, a page must not.
TAIL_BYTES = 256 * 1024
# Bytes read from the file per chunk of a download.
CHUNK_BYTES = 1 << 20


def log_path(run_id: int) -> Path | None:
    """Where run `run_id`'s driver log is on this host (the file its driver writes, as the
    site's confinement names it); None when this site keeps none."""
    path = confinement().log_file(run_id)
    return Path(path) if path else None


def check_log(user, run_id: int) -> tuple[Run, Path]:
    """The run and its log file, if `user` may see the run and the file is here:
    NotFound otherwise, with a sentence that says which."""
    run = check_run_access(user, run_id)
    return run, log_file(run)


def log_file(run: Run) -> Path:
    """The run's log file on this host (a run the reader may see); NotFound with the
    reason when there is none here."""
    path = log_path(run.pk)
    if path is None:
        raise NotFound({"run": "this site keeps no run logs (ROLLWAY_RUN_LOG_DIR is empty): see Ray's logs"})
    if not path.is_file():
        if run.status == Run.Status.QUEUED:
            why = f"run {run.pk} is queued: its driver has not started, so there is no log yet"
        else:
            # The path stays in the site's own log: a reader is told the file's name only.
            logger.info("run %s: no driver log at %s", run.pk, path)
            why = (
                f"run {run.pk}'s driver log ({path.name}) is not on this host: its driver ran where this "
                "host does not see ROLLWAY_RUN_LOG_DIR, or the file was removed"
            )
        raise NotFound({"run": why})
    return path


def tail(path: Path, max_bytes: int = TAIL_BYTES) -> dict[str, Any]:
    """The last `max_bytes` of the file, cut to whole lines: {"size": the file's bytes,
    "offset": where the text starts, "truncated": whether the file starts earlier,
    "text"}. Bytes that are not UTF-8 are replaced, never an error."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        offset = max(0, size - max_bytes)
        f.seek(offset)
        data = f.read(size - offset)
    if offset and b"\n" in data:
        # The first line is cut: start at the next whole one.
        cut = data.index(b"\n") + 1
        data, offset = data[cut:], offset + cut
    return {"size": size, "offset": offset, "truncated": offset > 0, "text": data.decode("utf-8", errors="replace")}


def chunks(path: Path) -> Iterator[bytes]:
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            yield chunk


async def achunks(path: Path) -> AsyncIterator[bytes]:
    """`chunks` for the ASGI server: each read in a thread (Django would read a plain
    iterator whole before sending it)."""
    reader = chunks(path)

    def read() -> bytes | None:
        return next(reader, None)

    while (chunk := await sync_to_async(read, thread_sensitive=False)()) is not None:
        yield chunk


def download_response(request: HttpRequest, run: Run, path: Path) -> StreamingHttpResponse:
    """The whole log as a text download, `run-<id>-driver.log`, streamed as it is read."""
    body = achunks(path) if isinstance(request, ASGIRequest) else chunks(path)
    response = StreamingHttpResponse(body, content_type="text/plain; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="run-{run.pk}-driver.log"'
    return response
