"""Events published on the topic exchange `interlock.events` (snake_case envelopes)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Discriminator, Field, TypeAdapter

from ._base import Envelope
from .agent import ErrorInfo, FinishReason
from .parts import Message
from .times import utcnow

__all__ = [
    "EVENT_TYPES",
    "SCHEMA_VERSION",
    "DecisionAccepted",
    "DecisionRejected",
    "Event",
    "EventBase",
    "InterruptInfo",
    "TurnCompleted",
    "TurnExpired",
    "TurnFailed",
    "TurnInterrupted",
    "event_adapter",
]

SCHEMA_VERSION = 1


def _uuid() -> str:
    return str(uuid.uuid4())


def _utc(ts: datetime) -> datetime:
    """Aware UTC: a naive time (SQLite hands them back) is taken to be UTC, so every
    time on the wire is RFC 3339 with its offset."""
    return ts.replace(tzinfo=UTC) if ts.tzinfo is None else ts.astimezone(UTC)


Instant = Annotated[datetime, AfterValidator(_utc)]


class EventBase(Envelope):
    """Fields every event carries. Ids are null where they cannot be known (a decision
    too malformed to name its snapshot)."""

    schema_version: Literal[1] = 1
    event_id: str = Field(default_factory=_uuid)
    type: str
    occurred_at: Instant = Field(default_factory=utcnow)
    agent: str | None = None
    session_id: str | None = None
    snapshot_id: str | None = None
    turn_id: str | None = None

    @property
    def routing_key(self) -> str:
        return self.type


class InterruptInfo(Envelope):
    """One pending interrupt: the tool call and the payload it paused with."""

    name: str
    ref: str
    input: Any = None
    payload: dict[str, Any] = Field(default_factory=dict)


class TurnInterrupted(EventBase):
    type: Literal["turn.interrupted"] = "turn.interrupted"
    interrupts: list[InterruptInfo]
    resume_token: str | None = None
    expires_at: Instant | None = None
    message: Message | None = None


class TurnCompleted(EventBase):
    type: Literal["turn.completed"] = "turn.completed"
    finish_reason: FinishReason
    message: Message | None = None


class TurnFailed(EventBase):
    type: Literal["turn.failed"] = "turn.failed"
    error: ErrorInfo
    last_snapshot_id: str | None = None


class TurnExpired(EventBase):
    type: Literal["turn.expired"] = "turn.expired"
    expires_at: Instant | None = None


class DecisionAccepted(EventBase):
    type: Literal["decision.accepted"] = "decision.accepted"
    decision_id: str
    reviewer: str | None = None


class DecisionRejected(EventBase):
    type: Literal["decision.rejected"] = "decision.rejected"
    decision_id: str | None = None
    reviewer: str | None = None
    error: ErrorInfo


Event = Annotated[
    TurnInterrupted
    | TurnCompleted
    | TurnFailed
    | TurnExpired
    | DecisionAccepted
    | DecisionRejected,
    Discriminator("type"),
]

event_adapter: TypeAdapter[Event] = TypeAdapter(Event)

EVENT_TYPES = (
    "turn.interrupted",
    "turn.completed",
    "turn.failed",
    "turn.expired",
    "decision.accepted",
    "decision.rejected",
)
