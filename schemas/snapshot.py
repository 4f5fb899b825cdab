"""Session snapshots: the state of a session after one turn."""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum

from pydantic import Field

from ._base import WireModel
from .agent import ErrorInfo, FinishReason
from .parts import Message

__all__ = ["Snapshot", "SnapshotStatus", "utcnow"]


def utcnow() -> datetime:
    return datetime.now(UTC)


class SnapshotStatus(StrEnum):
    PENDING = "pending"
    COMPLETED = "completed"
    FAILED = "failed"
    ABORTED = "aborted"
    EXPIRED = "expired"


class Snapshot(WireModel):
    """A point-in-time record of a session.

    `messages` is the whole history. A store may keep only what this snapshot added:
    `inherited` says how many leading messages are the parent's, unchanged.
    """

    snapshot_id: str
    session_id: str
    parent_id: str | None = None
    agent: str
    status: SnapshotStatus
    finish_reason: FinishReason | None = None
    messages: list[Message] = Field(default_factory=list)
    error: ErrorInfo | None = None
    created_at: datetime = Field(default_factory=utcnow)
    updated_at: datetime = Field(default_factory=utcnow)
    resumed_by: str | None = None
    turn_id: str | None = None
    inherited: int = 0
    expires_at: datetime | None = None
    resume_token_hash: str | None = None

    @property
    def is_interrupted(self) -> bool:
        return self.finish_reason == FinishReason.INTERRUPTED

    @property
    def last_model_message(self) -> Message | None:
        for m in reversed(self.messages):
            if m.role == "model":
                return m
        return None
