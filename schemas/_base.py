"""Base classes for wire models: Genkit's camelCase on the wire, snake_case in Python."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, model_serializer
from pydantic.alias_generators import to_camel
from pydantic_core.core_schema import SerializerFunctionWrapHandler

__all__ = ["Envelope", "WireModel"]


class WireModel(BaseModel):
    """A model serialized with Genkit's camelCase names, omitting unset (None) fields."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        serialize_by_alias=True,
        extra="ignore",
    )

    omit_empty: ClassVar[frozenset[str]] = frozenset()
    """Wire names of list fields left out when empty, as Genkit's `omitempty` does."""

    @model_serializer(mode="wrap")
    def _drop_none(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        if isinstance(data, dict):
            omit = self.omit_empty
            return {k: v for k, v in data.items() if v is not None and not (k in omit and v == [])}
        return data

    def to_json(self) -> dict[str, Any]:
        """The JSON value of this model, as it goes on the wire."""
        return self.model_dump(mode="json")


class Envelope(BaseModel):
    """Our own queue envelopes (events, decisions): snake_case fields, nulls kept."""

    model_config = ConfigDict(extra="ignore")
