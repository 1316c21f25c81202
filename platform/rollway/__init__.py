"""The Rollway Django project: settings, URLs, the ASGI application and the Celery app.

Importing it loads the Celery app, so `@shared_task`s bind to it in every process, and
puts the repository root on sys.path (for `workers` and `migrations`).
"""

import sys
from pathlib import Path

# rollway.celery needs neither path below, so it is imported first.
from rollway.celery import app as celery_app

__all__ = ["celery_app"]

_PLATFORM_DIR = Path(__file__).resolve().parents[1]
for _path in (str(_PLATFORM_DIR.parent), str(_PLATFORM_DIR)):
    if _path not in sys.path:
        sys.path.append(_path)
