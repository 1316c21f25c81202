"""Presets and the override helpers that the launch form, the API and the benches share."""

import pytest
from pydantic import ValidationError

from workers.presets import PRESETS, UnknownPreset, build, deep_merge, dotted_overrides


def test_every_preset_is_a_valid_config():
    for name in PRESETS:
        assert build(name).model_dump() == PRESETS[name]["config"].model_dump()


def test_overrides_merge_into_the_preset_without_losing_siblings():
    cfg = build("async", {"buffer": {"capacity": 5}})
    assert cfg.buffer.capacity == 5
    assert cfg.buffer.max_staleness == PRESETS["async"]["config"].buffer.max_staleness


def test_deep_merge_leaves_its_inputs_alone():
    base = {"a": {"b": 1, "c": 2}}
    assert deep_merge(base, {"a": {"b": 3}}) == {"a": {"b": 3, "c": 2}}
    assert base == {"a": {"b": 1, "c": 2}}


def test_dotted_overrides_nest_keys_and_parse_json_values():
    assert dotted_overrides(["trainer.lr=0.002", "correction.method=masked_is", "seed=3"]) == {
        "trainer": {"lr": 0.002}, "correction": {"method": "masked_is"}, "seed": 3,
    }


def test_a_bad_override_names_the_field():
    with pytest.raises(ValidationError) as err:
        build("sync", dotted_overrides(["buffer.capacity=-1"]))
    assert "buffer.capacity" in str(err.value)


def test_an_unknown_preset_is_refused_with_the_choices():
    with pytest.raises(UnknownPreset, match="choose one of"):
        build("verl-9000")
