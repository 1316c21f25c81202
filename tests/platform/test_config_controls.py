"""The launch form's config controls compiled from the run config's JSON schema
(dashboard/config_controls.py), on their own: no database and no page."""

from __future__ import annotations

import copy

import pytest

from dashboard import config_controls
from dashboard.config_controls import CONTROL_GROUPS, controls_with_errors, field_control, schema_field
from workers.config.run_config import RunConfig, json_schema
from workers.rl_tasks import BUILTINS


@pytest.fixture
def fresh_controls():
    """The controls are built once per process: a test that changes the schema or the
    groups builds them again, before and after."""
    config_controls.config_controls.cache_clear()
    yield
    config_controls.config_controls.cache_clear()


def leaves(model, prefix=""):
    """Every field path of a pydantic model, sections expanded."""
    for name, field in model.model_fields.items():
        inner = [a for a in (getattr(field.annotation, "__args__", None) or (field.annotation,)) if a is not type(None)]
        if len(inner) == 1 and isinstance(inner[0], type) and hasattr(inner[0], "model_fields"):
            yield from leaves(inner[0], f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}"


# --- one field -----------------------------------------------------------------------


def test_an_enum_is_a_select_of_its_values():
    made = field_control("buffer.on_stale", {"enum": ["drop", "keep"], "type": "string", "description": "What."})
    assert (made["kind"], made["options"], made["help"]) == ("select", ["drop", "keep"], "What.")
    assert (made["id"], made["label"]) == ("cfg-buffer-on_stale", "on_stale")


def test_a_constant_is_a_select_of_its_one_value():
    assert field_control("x.y", {"const": "only"})["options"] == ["only"]


def test_a_boolean_is_a_checkbox():
    assert field_control("lora.enabled", {"type": "boolean"})["kind"] == "checkbox"


def test_an_integer_is_a_number_input_with_its_inclusive_bounds():
    made = field_control("buffer.capacity", {"type": "integer", "minimum": 1, "maximum": 64})
    assert (made["kind"], made["min"], made["max"], made["step"]) == ("integer", 1, 64, "1")
    assert made["bounds"] == "≥ 1, ≤ 64"


def test_an_exclusive_bound_is_said_in_words_only():
    made = field_control("inference.gpu_memory_utilization", {"type": "number", "exclusiveMinimum": 0, "maximum": 1})
    assert (made["min"], made["max"], made["step"]) == (None, 1, "any")
    assert made["bounds"] == "> 0, ≤ 1"


def test_a_bound_beyond_what_a_browser_counts_exactly_is_not_said():
    assert field_control("seed", {"type": "integer", "minimum": 0, "maximum": 2**63})["bounds"] == "≥ 0"


def test_a_list_of_strings_is_comma_separated_text():
    made = field_control("lora.target_modules", {"type": "array", "items": {"type": "string"}})
    assert (made["kind"], made["bounds"]) == ("list", "comma-separated")


def test_a_string_is_text_and_a_suggested_one_a_choice_of_its_usual_values():
    assert field_control("task.alphabet", {"type": "string"})["kind"] == "text"
    made = field_control("task.name", {"type": "string"})
    assert (made["kind"], made["options"]) == ("choice", list(BUILTINS))


def test_a_field_that_may_be_null_takes_an_empty_value_for_unset():
    made = field_control(
        "buffer.max_head_offpolicyness", {"anyOf": [{"type": "integer", "minimum": 0}, {"type": "null"}]}
    )
    assert (made["kind"], made["nullable"], made["placeholder"], made["min"]) == ("integer", True, "unset", 0)


def test_a_field_of_a_section_that_may_be_null_shows_its_default_while_the_section_is_unset():
    made = field_control("task.dataset.split", {"type": "string", "default": "train"}, in_optional=True)
    assert (made["optional"], made["placeholder"]) == (True, "default: train")
    assert field_control("task.dataset.path", {"type": "string"}, in_optional=True)["placeholder"] == "not set"


@pytest.mark.parametrize(
    "schema",
    [{"type": "object"}, {"anyOf": [{"type": "integer"}, {"type": "string"}]}, {"type": "array", "items": {}}],
)
def test_a_field_no_control_can_show_is_refused_naming_it(schema):
    with pytest.raises(ValueError, match="lora.scales"):
        field_control("lora.scales", schema)


# --- finding a field in the schema ---------------------------------------------------------


def test_a_field_is_found_through_its_section():
    field, in_optional = schema_field(json_schema(), "buffer.capacity")
    assert field["type"] == "integer" and in_optional is False


def test_the_fields_of_a_section_that_may_be_null_are_marked_so():
    section, _ = schema_field(json_schema(), "task.dataset")
    assert "path" in section["properties"]
    assert schema_field(json_schema(), "task.dataset.path")[1] is True


def test_a_path_the_config_lacks_is_a_key_error_naming_it():
    with pytest.raises(KeyError, match="buffer.capacty"):
        schema_field(json_schema(), "buffer.capacty")


# --- the groups ----------------------------------------------------------------------


def test_every_field_but_the_warm_start_task_options_and_reward_weights_has_exactly_one_control(fresh_controls):
    paths = [c["path"] for group in config_controls.config_controls() for c in group["controls"]]
    assert len(paths) == len(set(paths))
    json_only = ("warm_start.", "task.options", "task.reward_weights")
    assert set(paths) == {p for p in leaves(RunConfig) if not p.startswith(json_only)}


def test_the_groups_come_in_order_and_a_section_wildcard_takes_only_what_is_left(fresh_controls):
    groups = config_controls.config_controls()
    assert [g["title"] for g in groups] == [title for title, _ in CONTROL_GROUPS]
    assert groups[0]["id"] == "axis-orchestration"
    staleness = next(g for g in groups if g["title"] == "Staleness")
    assert [c["path"] for c in staleness["controls"]] == [
        "buffer.max_staleness",
        "buffer.on_stale",
        "buffer.max_head_offpolicyness",
    ]


def test_a_field_added_to_the_config_gets_a_control_in_its_sections_group(monkeypatch, fresh_controls):
    schema = copy.deepcopy(json_schema())
    schema["$defs"]["StopConfig"]["properties"]["max_tokens"] = {"type": "integer", "minimum": 5}
    monkeypatch.setattr(config_controls, "json_schema", lambda: schema)
    stop = next(g for g in config_controls.config_controls() if g["title"] == "Stop")
    assert stop["controls"][-1] | {"help": ""} == field_control("stop.max_tokens", {"type": "integer", "minimum": 5})


def test_a_field_no_control_can_show_is_named_when_the_controls_are_built(monkeypatch, fresh_controls):
    schema = copy.deepcopy(json_schema())
    schema["$defs"]["LoRAConfig"]["properties"]["scales"] = {"type": "object"}
    monkeypatch.setattr(config_controls, "json_schema", lambda: schema)
    with pytest.raises(ValueError, match="lora.scales"):
        config_controls.config_controls()


def test_a_group_naming_a_field_the_config_lacks_is_refused(monkeypatch, fresh_controls):
    monkeypatch.setattr(config_controls, "CONTROL_GROUPS", [("Buffer", ["buffer.capacty"])])
    with pytest.raises(KeyError, match="buffer.capacty"):
        config_controls.config_controls()


# --- errors --------------------------------------------------------------------------


def test_an_error_goes_beside_its_control_and_one_no_control_shows_is_handed_back(fresh_controls):
    groups, unplaced = controls_with_errors({"buffer.capacity": "must be ≥ 1", "buffer": "unknown field 'x'"})
    shown = {c["path"]: c["error"] for g in groups for c in g["controls"]}
    assert shown["buffer.capacity"] == "must be ≥ 1"
    assert shown["buffer.mode"] == ""
    assert unplaced == {"buffer": "unknown field 'x'"}
    # the cached controls themselves carry no error
    assert all("error" not in c for g in config_controls.config_controls() for c in g["controls"])
