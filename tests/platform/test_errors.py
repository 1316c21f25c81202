"""Refusals: pydantic's errors by field, and the HTTP status each kind of refusal gets."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError, field_validator

from foundation.errors import ActionError, Conflict, NotFound, field_errors


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid")
    capacity: int = 1
    mode: str = "bounded"


class Config(BaseModel):
    model_config = ConfigDict(extra="forbid")
    buffer: Section = Section()
    lr: float = 0.1

    @field_validator("lr")
    @classmethod
    def positive(cls, value: float) -> float:
        if value <= 0:
            raise ValueError("lr must be > 0")
        return value


def errors_of(validate, *args, **options) -> dict[str, str]:
    with pytest.raises(ValidationError) as exc:
        validate(*args)
    return field_errors(exc.value, **options)


def test_errors_are_keyed_by_dotted_location():
    errors = errors_of(Config.model_validate, {"buffer": {"capacity": "many"}})
    assert errors == {"buffer.capacity": "Input should be a valid integer, unable to parse string as an integer"}


def test_a_validators_message_loses_pydantics_value_error_prefix():
    assert errors_of(Config.model_validate, {"lr": -1}) == {"lr": "lr must be > 0"}


def test_invalid_json_says_so():
    errors = errors_of(TypeAdapter(dict).validate_json, "{nope")
    assert list(errors) == ["body"] and errors["body"].startswith("invalid JSON: ")


def test_an_error_about_the_whole_input_goes_under_root():
    assert list(errors_of(Config.model_validate, [1], root="config")) == ["config"]
    assert list(errors_of(Config.model_validate, [1])) == ["body"]


def test_given_the_model_an_unknown_field_lists_what_its_section_accepts():
    errors = errors_of(Config.model_validate, {"buffer": {"capcity": 3}}, model=Config)
    assert errors == {"buffer.capcity": "unknown field 'capcity'; buffer accepts: capacity, mode"}
    top = errors_of(Config.model_validate, {"turbo": True}, model=Config, root="config")
    assert top == {"turbo": "unknown field 'turbo'; the config accepts: buffer, lr"}


def test_without_the_model_an_unknown_field_keeps_pydantics_message():
    errors = errors_of(Config.model_validate, {"turbo": True})
    assert errors == {"turbo": "Extra inputs are not permitted"}


def test_each_kind_of_refusal_carries_its_http_status():
    assert ActionError({"name": "taken"}).http_status == 400
    assert Conflict({"status": "run 3 is succeeded"}).http_status == 409
    assert NotFound({"run": "run 3 not found"}).http_status == 404
    assert isinstance(NotFound({}), ActionError) and isinstance(Conflict({}), ActionError)


def test_a_refusal_reads_as_its_fields_and_messages():
    refused = ActionError({"name": "taken", "preset": "unknown"})
    assert str(refused) == "name: taken; preset: unknown"
    assert refused.message == "taken; unknown"
