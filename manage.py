#!/usr/bin/env python
"""Django's command-line utility for Rollway.

platform/ is a source root, never a package (a package named `platform` would shadow
Python's stdlib module that torch, Ray and Celery import), so it goes on sys.path here,
with the repository root for `workers` and `migrations`.
"""

import os
import sys
from pathlib import Path


def main() -> None:
    root = Path(__file__).resolve().parent
    for path in (str(root / "platform"), str(root)):
        if path not in sys.path:
            sys.path.insert(0, path)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rollway.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
