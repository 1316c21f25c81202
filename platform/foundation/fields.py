"""A model's text columns as the checks that fill them read their bounds."""

from __future__ import annotations

from django.db import models


def max_length(model: type[models.Model], field: str) -> int:
    """How many characters `model.field` holds (a CharField's max_length), so a check
    refuses longer input by name instead of the database failing the write."""
    length = getattr(model._meta.get_field(field), "max_length", None)
    if length is None:
        raise TypeError(f"{model.__name__}.{field} has no max_length")
    return length
