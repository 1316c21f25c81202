"""The Rollway Django project: settings, URLs, the ASGI application and the Celery app.

Importing it puts the repository root on sys.path (for `workers` and `migrations`) and
loads the Celery app so `@shared_task`s bind to it in every process.
"""

import sys
from pathlib import Path

_PLATFORM_DIR = Path(__file__).resolve().parents[1]
for _path in (str(_PLATFORM_DIR.parent), str(_PLATFORM_DIR)):
    if _path not in sys.path:
        sys.path.append(_path)

from rollway.celery import app as celery_app  # noqa: E402

__all__ = ["celery_app"]
