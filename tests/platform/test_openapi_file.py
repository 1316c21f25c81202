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


def test_it_documents_the_compare_api_its_parameters_and_answers():
    """/api/compare is a plain Django view (it answers CSV too); it is in the document all
    the same, with the query it reads."""
    operation = json.loads(document())["paths"]["/api/compare"]["get"]
    parameters = {p["name"]: p for p in operation["parameters"]}
    assert {"runs", "target", "budget", "max_points", "after_step", "series", "format", "what"} <= set(parameters)
    assert parameters["runs"]["required"] is True
    assert set(operation["responses"]["200"]["content"]) == {"application/json", "text/csv"}
    assert {"400", "401", "404"} <= set(operation["responses"])


def test_the_compare_operation_adds_no_route_of_its_own(client_for, owner):
    from django.urls import resolve

    from compare import views

    assert resolve("/api/compare").func is views.api
    assert client_for(owner).get("/api/compare?runs=").status_code == 400


def test_the_api_makes_its_schema_once_per_root_path_and_hands_out_copies(monkeypatch):
    from ninja import NinjaAPI

    from api.api import RollwayAPI

    made = []
    real = NinjaAPI.get_openapi_schema

    def counting(self, **kwargs):
        made.append(kwargs["path_prefix"])
        return real(self, **kwargs)

    monkeypatch.setattr(NinjaAPI, "get_openapi_schema", counting)
    fresh = RollwayAPI(title="t", urls_namespace="schema-cache-test")
    first = fresh.get_openapi_schema(path_prefix="/a/")
    first["paths"]["/added-by-a-caller"] = {}  # a caller's change stays in its copy
    again = fresh.get_openapi_schema(path_prefix="/a/")
    assert made == ["/a/"] and again["paths"] == {} and again["info"]["title"] == "t"
    fresh.get_openapi_schema(path_prefix="/b/")
    assert made == ["/a/", "/b/"]
