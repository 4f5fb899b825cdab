"""Dead letters: a message a consumer could not use, kept with the reason."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import ConfigDict

from ._base import Envelope

__all__ = ["DeadLetter"]


def _version_required(schema: dict[str, Any]) -> None:
    """Every dead letter carries `schema_version`: the schema says so."""
    schema["required"] = ["schema_version", *schema.get("required", [])]


class DeadLetter(Envelope):
    """What `interlock.decisions.dead` and `interlock.turns.dead` hold: the message as
    it came (`body`, and its exact bytes in `body_base64`), its headers and the reason.
    A kept decision names the `decision_id` read from it (null when none could be) and
    the `event_id` of the outcome published for it; a kept task names its
    `content_type` and `content_encoding`, or the `turn_id` of a turn that failed at
    every try. Fields that do not apply are left out."""

    model_config = ConfigDict(json_schema_extra=_version_required)

    schema_version: Literal[1] = 1
    reason: str
    headers: dict[str, Any]
    decision_id: str | None = None
    event_id: str | None = None
    turn_id: str | None = None
    content_type: str | None = None
    content_encoding: str | None = None
    body: str
    body_base64: str

    def to_wire(self) -> str:
        """The JSON text: `schema_version` always, other fields as they were given. ASCII
        with escapes: what a dead letter quotes may hold text no encoder takes (a lone
        surrogate), and it must still be kept."""
        fields = {"schema_version"} | self.model_fields_set
        return json.dumps(self.model_dump(mode="json", include=fields))
