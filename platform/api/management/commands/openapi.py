"""`python manage.py openapi --write`: docs/openapi.json, the API's OpenAPI document as
the site serves it at /api/openapi.json, for readers and client generators without a
login. Without --write it prints the document. tests/platform/test_openapi_file.py fails
when the file differs from what the API gives now.
"""

from __future__ import annotations

import json

from django.conf import settings
from django.core.management.base import BaseCommand

FILE = settings.REPO_ROOT / "docs" / "openapi.json"
COMMAND = ".venv/bin/python manage.py openapi --write"


def document() -> str:
    """The OpenAPI document, as docs/openapi.json holds it."""
    from api.api import api

    return json.dumps(api.get_openapi_schema(), indent=2, ensure_ascii=False) + "\n"


class Command(BaseCommand):
    help = "Print the API's OpenAPI document, or write it to docs/openapi.json (--write)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--write", action="store_true", help="write docs/openapi.json instead of printing")

    def handle(self, *args, write: bool = False, **options) -> None:
        text = document()
        if write:
            FILE.write_text(text)
            self.stdout.write(f"wrote {FILE}")
        else:
            self.stdout.write(text, ending="")
