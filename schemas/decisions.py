"""Decisions: a human's answer to a paused turn, as any dashboard would send it."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, TypeAdapter, field_validator

from ._base import Envelope
from .parts import Part

__all__ = [
    "MAX_DECISION_BYTES",
    "Decision",
    "RespondEntry",
    "RestartEntry",
    "TurnRequest",
    "decision_adapter",
]

MAX_DECISION_BYTES = 1 << 20


class RespondEntry(Envelope):
    """Answer an interrupt with the tool's output; the tool does not run."""

    name: str
    ref: str
    output: Any = None


class RestartEntry(Envelope):
    """Re-run the interrupted tool with `resumed` as its resume data. `input`, when
    given, must equal the interrupted call's input; when absent or null the stored one
    is used."""

    name: str
    ref: str
    resumed: dict[str, Any] | None = None
    input: Any = None

    @property
    def has_input(self) -> bool:
        """Whether the entry gives an input; `"input": null` (a client that writes
        every field) counts as absent."""
        return "input" in self.model_fields_set and self.input is not None


_NULL_IS_ABSENT = ("resume_token", "respond", "restart")
"""Fields a decision may send as null, meaning absent (a client that writes every field,
such as Go's encoding/json with a nil slice): no token, nothing to respond or restart."""


def _decision_schema(schema: dict[str, Any]) -> None:
    """`schema_version` required on the wire; null allowed where it means absent."""
    schema["required"] = ["schema_version", *schema.get("required", [])]
    properties = schema.get("properties", {})
    for name in _NULL_IS_ABSENT:
        field = properties.get(name)
        if field is None:
            continue
        outer = {k: field.pop(k) for k in ("title", "default", "description") if k in field}
        properties[name] = {"anyOf": [field, {"type": "null"}], **outer}


class Decision(Envelope):
    """A decision read from `interlock.decisions`. Entries are the plain JSON form, or
    the `Part`s that `tool.respond` / `tool.resume` built. On the wire `schema_version`
    is required (the consumer refuses a decision without it); in Python it defaults
    to 1. `resume_token`, `respond` and `restart` sent as null count as absent."""

    model_config = ConfigDict(json_schema_extra=_decision_schema)

    schema_version: Literal[1] = 1
    decision_id: str = Field(min_length=1, max_length=200)
    snapshot_id: str = Field(min_length=1, max_length=200)
    resume_token: str = Field(default="", max_length=500)
    reviewer: str | None = Field(default=None, max_length=500)
    respond: list[RespondEntry | Part] = Field(default_factory=list)
    restart: list[RestartEntry | Part] = Field(default_factory=list)

    @field_validator(*_NULL_IS_ABSENT, mode="before")
    @classmethod
    def _null_is_absent(cls, value: Any, info: Any) -> Any:
        if value is not None:
            return value
        return "" if info.field_name == "resume_token" else []


class TurnRequest(Envelope):
    """The JSON arguments of the `interlock.run_turn` task."""

    schema_version: Literal[1] = 1
    turn_id: str
    agent: str
    input: dict[str, Any]
    session_id: str | None = None
    snapshot_id: str | None = None
    claimed_by: str | None = None
    decision_id: str | None = None


decision_adapter: TypeAdapter[Decision] = TypeAdapter(Decision)
