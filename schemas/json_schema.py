"""JSON Schemas of every queue message, generated from the models."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

from .agent import AgentInput
from .dead_letters import DeadLetter
from .decisions import Decision, TurnRequest
from .events import (
    DecisionAccepted,
    DecisionRejected,
    TurnCompleted,
    TurnExpired,
    TurnFailed,
    TurnInterrupted,
    event_adapter,
)

__all__ = ["MESSAGES", "message_schemas", "render"]

MESSAGES: dict[str, type[BaseModel]] = {
    "decision": Decision,
    "turn.interrupted": TurnInterrupted,
    "turn.completed": TurnCompleted,
    "turn.failed": TurnFailed,
    "turn.expired": TurnExpired,
    "decision.accepted": DecisionAccepted,
    "decision.rejected": DecisionRejected,
    "run_turn": TurnRequest,
    "dead_letter": DeadLetter,
}


_ENVELOPE_PARTS = ("InterruptInfo",)
"""Models inside events that are serialized with every field, as the events are."""


def _always_present(schema: dict[str, Any]) -> None:
    """Events carry every field (null where unknown): mark them all required, and those
    of the envelope models inside them (`interrupts[]`: name, ref, input, payload)."""
    if "properties" in schema:
        schema["required"] = sorted(schema["properties"])
    for title in _ENVELOPE_PARTS:
        inner = schema.get("$defs", {}).get(title)
        if inner is not None and "properties" in inner:
            inner["required"] = sorted(inner["properties"])


def _typed_input(schema: dict[str, Any]) -> None:
    """`run_turn`'s `input` is an `AgentInput` (the model keeps it as a JSON object, so
    a bad one is answered with turn.failed rather than lost): the schema says which."""
    agent_input = AgentInput.model_json_schema(mode="validation")
    defs = schema.setdefault("$defs", {})
    defs.update(agent_input.pop("$defs", {}))
    defs["AgentInput"] = agent_input
    schema["properties"]["input"] = {"$ref": "#/$defs/AgentInput"}


def message_schemas() -> dict[str, dict[str, Any]]:
    """File name → JSON Schema, for each message and for the union of events."""
    out = {}
    for name, model in MESSAGES.items():
        schema = model.model_json_schema(mode="validation")
        if name.startswith(("turn.", "decision.")):
            _always_present(schema)
        if name == "run_turn":
            _typed_input(schema)
        out[f"{name}.schema.json"] = schema
    union = event_adapter.json_schema(mode="validation")
    for title, sub in union.get("$defs", {}).items():
        if title.startswith(("Turn", "Decision")) or title in _ENVELOPE_PARTS:
            _always_present(sub)
    out["event.schema.json"] = union
    for name, schema in out.items():
        schema["$id"] = f"https://interlock.dev/schemas/{name}"
        schema.setdefault("$schema", "https://json-schema.org/draft/2020-12/schema")
    return out


def render(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"
