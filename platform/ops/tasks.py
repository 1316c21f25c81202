"""Operational Celery tasks.

`probe_environment` reports what a worker process really imports, so an operator (and
tests/test_layout.py) can check a deployed worker: the stdlib `platform` module, not the
repository's platform/ source root, and the engine and Ray versions it would run.
"""

from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path

from celery import shared_task


def environment_report() -> dict:
    """Where `platform`, `workers` and `ray` come from in this process."""
    import ray

    import workers

    return {
        "pid": os.getpid(),
        "platform_file": platform.__file__,
        "python_version": platform.python_version(),
        "workers_file": workers.__file__,
        "ray_version": ray.__version__,
        "executable": sys.executable,
    }


@shared_task(ignore_result=True)
def probe_environment(report_path: str) -> None:
    """Write `environment_report()` as JSON to `report_path` (results are not stored)."""
    path = Path(report_path)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(environment_report()))
    tmp.replace(path)  # a reader never sees half a file
