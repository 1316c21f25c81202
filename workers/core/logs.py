"""Log lines as one JSON object each, for a log collector (Loki, Elasticsearch, Cloud
Logging) to index by field: ROLLWAY_LOG_FORMAT=json in a process's environment. The
platform's processes (settings.LOGGING) and each run's driver (`configure_driver_logging`)
read the same switch, and a line about a run carries its `run_id`.

The standard library's logging only: the engine's and the CLI's installs stay as they are.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TextIO

LOG_FORMAT_ENV = "ROLLWAY_LOG_FORMAT"
FORMATS = ("plain", "json")
PLAIN = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def log_format(env: Mapping[str, str] = os.environ) -> str:
    """The format ROLLWAY_LOG_FORMAT names ("plain" when unset); anything else is an error."""
    value = env.get(LOG_FORMAT_ENV, "").strip().lower() or "plain"
    if value not in FORMATS:
        raise ValueError(f"{LOG_FORMAT_ENV} must be one of {', '.join(FORMATS)} (got {env[LOG_FORMAT_ENV]!r})")
    return value


class JsonFormatter(logging.Formatter):
    """{"time", "level", "logger", "message", "run_id"?, "exc"?}: `run_id` when the record
    has one (`extra={"run_id": …}`, RunIdFilter, or a "run %s" message), `exc` the
    traceback of an exception."""

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        run_id = getattr(record, "run_id", None)
        if run_id is None and isinstance(record.msg, str) and record.msg.startswith("run %s") and record.args:
            # Lines about a run begin "run %s" with its id first, on both sides: the id
            # is taken from there where the call gave no `extra`.
            first = record.args[0] if isinstance(record.args, tuple) else None
            run_id = first if isinstance(first, int) else None
        if run_id is not None:
            line["run_id"] = run_id
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


class RunIdFilter(logging.Filter):
    """Stamps every record that passes with the run's id (unless it names one)."""

    def __init__(self, run_id: int) -> None:
        super().__init__()
        self.run_id = run_id

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "run_id", None) is None:
            record.run_id = self.run_id
        return True


def configure_driver_logging(
    run_id: int, env: Mapping[str, str] = os.environ, stream: TextIO | None = None, log_file: str | None = None
) -> None:
    """In a run's driver process: the engine's log lines (the `workers` loggers) go to
    stderr, which Ray keeps in the actor's log file, as JSON with the run's id when
    ROLLWAY_LOG_FORMAT=json; unset, they stay in Ray's own format.

    `log_file`: the run's own log (Confinement.log_file), which the site serves on the
    run's page: every engine line at INFO and above is appended to it as well, plain or
    JSON as the switch says. Ray's actor logs hold every process's lines under a worker
    id, on whichever node ran it; this file holds the run's, under its id."""
    fmt = log_format(env)
    engine = logging.getLogger("workers")
    for handler in list(engine.handlers):
        if getattr(handler, "rollway_driver", False):
            engine.removeHandler(handler)  # a second driver in the same process
            handler.close()
    handlers: list[logging.Handler] = []
    if fmt == "json":
        handlers.append(logging.StreamHandler(stream or sys.stderr))
    if log_file:
        os.makedirs(os.path.dirname(log_file) or ".", exist_ok=True)
        handlers.append(logging.FileHandler(log_file, encoding="utf-8"))
    for handler in handlers:
        handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(PLAIN))
        handler.addFilter(RunIdFilter(run_id))
        handler.rollway_driver = True  # type: ignore[attr-defined]
        engine.addHandler(handler)
    if handlers:
        engine.setLevel(logging.INFO)
    if fmt == "json":
        engine.propagate = False  # not again in Ray's format
