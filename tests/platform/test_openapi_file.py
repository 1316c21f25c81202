"""docs/openapi.json is the OpenAPI document the site serves now (`manage.py openapi
--write` writes it), so a reader or a client generator can take it without a login."""

from __future__ import annotations

import json

from django.core.management import call_command

from api.management.commands.openapi import COMMAND, FILE, document


def test_docs_openapi_json_is_the_document_the_api_gives_now():
    assert FILE.read_text() == document(), (
        f"docs/{FILE.name} differs from the API's OpenAPI document now; regenerate it with:\n    {COMMAND}"
    )


def test_it_is_what_a_signed_in_user_fetches_from_the_site(client_for, owner):
    served = client_for(owner).get("/api/openapi.json")
    assert served.status_code == 200
    assert json.loads(FILE.read_text()) == served.json()
    assert "/api/runs" in served.json()["paths"]


def test_the_command_prints_the_document_without_write(capsys):
    call_command("openapi")
    assert capsys.readouterr().out == document()
