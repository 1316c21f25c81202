"""The errors the actions layer raises, and the one translation of pydantic's errors.

Every refusal carries its messages by field ({"buffer.capacity": "..."}) and the HTTP
status that says what kind of refusal it is, so each front end maps it once: the JSON
API answers `http_status` with `{"errors": errors}`, the pages show the messages.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from pydantic import BaseModel, ValidationError


class ActionError(Exception):
    """A request the user may fix: `errors` maps a field (dotted for config fields,
    e.g. "buffer.capacity") to a message that says what to change."""

    http_status = 400

    def __init__(self, errors: dict[str, str]):
        super().__init__("; ".join(f"{k}: {v}" for k, v in errors.items()))
        self.errors = errors

    @property
    def message(self) -> str:
        """The messages alone, for a page that shows them in one line."""
        return "; ".join(self.errors.values())


class Conflict(ActionError):
    """The object is in a state that does not allow the request (cancelling a finished
    run): nothing the input could change."""

    http_status = 409


class Forbidden(ActionError):
    """The user sees the object but their role in its team does not allow the request
    (a viewer launching, a member cancelling someone else's run)."""

    http_status = 403


class Unavailable(ActionError):
    """A service the check needs did not answer (the Hugging Face Hub timed out or
    answered 429/5xx): nothing is wrong with the input, the same request may pass later."""

    http_status = 503


class NotFound(ActionError):
    """No such object, or the user may not see it (outsiders learn nothing)."""

    http_status = 404


@contextmanager
def collected(errors: dict[str, str]) -> Iterator[None]:
    """Run a check inside, adding its refusal's messages to `errors` instead of raising
    it: for a check that answers with every field error at once."""
    try:
        yield
    except ActionError as exc:
        errors.update(exc.errors)


def nul_errors(values: Mapping[str, object]) -> dict[str, str]:
    """{field: message} for each text value holding a NUL character: PostgreSQL stores
    none in a text column, so such a value would fail the write, not a check."""
    return {
        name: "must not contain a NUL character (\\x00); remove it"
        for name, value in values.items()
        if isinstance(value, str) and "\x00" in value
    }


def field_errors(exc: ValidationError, *, model: type[BaseModel] | None = None, root: str = "body") -> dict[str, str]:
    """Pydantic's errors as {"buffer.capacity": "Input should be ≥ 1"}: one message per
    dotted location (the first), `root` for an error about the whole input, worded for
    the person who wrote it. Given the `model` that was validated, an unknown field's
    message lists what its section accepts."""
    return errors_by_field(exc.errors(), model=model, root=root)


def errors_by_field(
    found: Iterable[Mapping[str, Any]], *, model: type[BaseModel] | None = None, root: str = "body"
) -> dict[str, str]:
    """field_errors over pydantic's error dicts themselves (django-ninja hands those on,
    with the location relative to the model they were found in)."""
    errors: dict[str, str] = {}
    for err in found:
        loc = [str(part) for part in err["loc"]]
        field = ".".join(loc) or root
        message = err["msg"].removeprefix("Value error, ")
        if err["type"] == "json_invalid":
            message = f"invalid JSON: {err.get('ctx', {}).get('error', message)}"
        elif err["type"] == "extra_forbidden" and model is not None:
            message = f"unknown field {loc[-1]!r}"
            allowed = _fields_at(model, loc[:-1])
            if allowed:
                where = ".".join(loc[:-1]) or f"the {root}"
                message += f"; {where} accepts: {', '.join(allowed)}"
        errors.setdefault(field, message)
    return errors


def _fields_at(model: type[BaseModel], path: list[str]) -> list[str]:
    """Field names of the section at `path` inside `model` (empty if not a section)."""
    for part in path:
        field = model.model_fields.get(part)
        annotation = getattr(field, "annotation", None)
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return []
        model = annotation
    return sorted(model.model_fields)
