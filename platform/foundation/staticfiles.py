"""Serve Plotly's JS from the `plotly` Python package (no CDN, no vendored copy).

Only plotly.min.js is exposed, as static/plotly/plotly.min.js: the package's data folder
also holds datasets and a widget bundle that have no business on the site.
"""

from __future__ import annotations

import os

import plotly
from django.contrib.staticfiles.finders import BaseFinder
from django.core.files.storage import FileSystemStorage

PLOTLY_DATA_DIR = os.path.join(os.path.dirname(plotly.__file__), "package_data")
PLOTLY_FILE = "plotly.min.js"
PREFIX = "plotly"


class PlotlyFinder(BaseFinder):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.storage = FileSystemStorage(location=PLOTLY_DATA_DIR)
        # Where collectstatic puts the files, as Django's own finders say it.
        self.storage.prefix = PREFIX  # type: ignore[attr-defined]

    def check(self, **kwargs):
        if not os.path.exists(os.path.join(PLOTLY_DATA_DIR, PLOTLY_FILE)):
            from django.core.checks import Error

            return [Error(f"plotly.min.js not found in {PLOTLY_DATA_DIR}; reinstall plotly")]
        return []

    def find(self, path, find_all=False, **kwargs):
        if path == f"{PREFIX}/{PLOTLY_FILE}":
            match = os.path.join(PLOTLY_DATA_DIR, PLOTLY_FILE)
            return [match] if find_all else match
        return []  # like Django's finders: an empty list, whatever find_all says

    def list(self, ignore_patterns):
        yield PLOTLY_FILE, self.storage
