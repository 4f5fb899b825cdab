"""Base classes for wire models: Genkit's camelCase on the wire, snake_case in Python."""

from __future__ import annotations

from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

__all__ = ["Envelope", "Omittable", "OmittableAny", "OmittableList", "WireModel"]

T = TypeVar("T")


def _is_none(value: object) -> bool:
    return value is None


def _is_none_or_empty(value: object) -> bool:
    return value is None or (isinstance(value, list) and not value)


Omittable = Annotated[T | None, Field(exclude_if=_is_none)]
"""A field of a `WireModel` left out of the JSON while it is None, as Genkit's
`omitempty` leaves out a nil pointer. Every field of a `WireModel` that defaults to None
is one (tests/schemas check it)."""

OmittableAny = Annotated[Any, Field(exclude_if=_is_none)]
"""`Omittable` for a field of any JSON value (its schema stays `{}`)."""

OmittableList = Annotated[list[T], Field(exclude_if=_is_none_or_empty)]
"""A list field of a `WireModel` left out of the JSON while it is empty."""


class WireModel(BaseModel):
    """A model serialized with Genkit's camelCase names, omitting unset (None) fields.

    The omission is declared per field (`Omittable`), not by a serializer wrapped
    around the model: pydantic-core then serializes a whole tree of parts and
    messages without calling back into Python for each model in it. A subclass
    declares the optional fields it adds the same way, or they go out as null."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        serialize_by_alias=True,
        extra="ignore",
    )

    def to_json(self) -> dict[str, Any]:
        """The JSON value of this model, as it goes on the wire."""
        return self.model_dump(mode="json")


class Envelope(BaseModel):
    """Our own queue envelopes (events, decisions): snake_case fields, nulls kept."""

    model_config = ConfigDict(extra="ignore")
