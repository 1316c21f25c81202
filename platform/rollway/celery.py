"""The Celery app. Run with `PYTHONPATH=platform:. celery -A rollway worker` / `beat`.

Configuration comes from Django settings (namespace CELERY_). Tasks stay short: they
launch, cancel and reconcile runs; the runs themselves live in Ray.
"""

from __future__ import annotations

import os
from pathlib import Path

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rollway.settings")

app = Celery("rollway")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


def _ensure_broker_folders() -> None:
    """The filesystem transport fails on a missing folder; create them once here so both
    the web process (producer) and the worker (consumer) can start in any order."""
    options = app.conf.broker_transport_options or {}
    for key in ("data_folder_in", "data_folder_out", "data_folder_processed", "control_folder"):
        if options.get(key):
            Path(options[key]).mkdir(parents=True, exist_ok=True)


@app.on_after_configure.connect
def _on_configure(sender, **kwargs):
    if str(sender.conf.broker_url or "").startswith("filesystem://"):
        _ensure_broker_folders()
