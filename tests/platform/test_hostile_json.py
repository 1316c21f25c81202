"""JSON a config cannot hold — numbers that overflow to infinity, NaN/Infinity literals,
nesting deep enough to exhaust Python's recursion — is a 400 that says what is wrong,
from the API and from the launch form, and nothing is stored."""

from __future__ import annotations

import json

import pytest

from foundation import jsonin
from runs.models import Run

DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize(
    "overrides, words",
    [
        ('{"trainer": {"lr": 1e999}}', "overflows to infinity"),
        ('{"trainer": {"lr": NaN}}', "NaN is not a number"),
        ('{"trainer": {"lr": -Infinity}}', "-Infinity is not a number"),
        ('{"a": ' + DEEP + "}", "nested deeper than"),
    ],
)
def test_the_api_answers_hostile_json_with_400(client_for, owner, experiment, overrides, words):
    body = '{"experiment": ' + str(experiment.pk) + ', "preset": "async", "overrides": ' + overrides + "}"
    r = client_for(owner).post("/api/runs", data=body, content_type="application/json")
    assert r.status_code == 400, r.content
    assert words in r.json()["errors"]["body"]
    assert Run.objects.count() == 0


@pytest.mark.parametrize("overrides", ['{"trainer": {"lr": 1e999}}', '{"a": ' + DEEP + "}"])
def test_the_launch_form_shows_hostile_json_next_to_the_overrides(client_for, owner, experiment, overrides):
    r = client_for(owner).post(
        "/runs/new/", data={"experiment": experiment.pk, "preset": "async", "overrides": overrides}
    )
    assert r.status_code == 400
    assert "invalid JSON" in r.context["field_errors"]["overrides"]
    assert Run.objects.count() == 0


def test_a_seed_outside_what_the_engine_can_seed_with_is_refused(client_for, owner, experiment):
    r = client_for(owner).post(
        "/api/runs",
        data=json.dumps({"experiment": experiment.pk, "preset": "async", "overrides": {"seed": -1}}),
        content_type="application/json",
    )
    assert r.status_code == 400
    assert "seed" in r.json()["errors"]


def test_strict_loads_keeps_ordinary_json_and_brackets_inside_strings():
    assert jsonin.loads('{"a": [1, 2.5, "[[[[{"], "b": {"c": null}}') == {"a": [1, 2.5, "[[[[{"], "b": {"c": None}}
    assert jsonin.loads('"' + "[" * 1000 + '"') == "[" * 1000
    with pytest.raises(jsonin.BadJSON, match="not UTF-8"):
        jsonin.loads(b"\xff\xfe")
    with pytest.raises(jsonin.BadJSON, match="invalid JSON"):
        jsonin.loads("{")
