"""Session snapshots: the state of a session after one turn."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import Field

from ._base import Omittable, WireModel
from .agent import ErrorInfo, FinishReason
from .parts import Message
from .times import utcnow

__all__ = ["Snapshot", "SnapshotStatus"]


class SnapshotStatus(StrEnum):
    PENDING = "pending"
    COMPLETED = "completed"
    FAILED = "failed"
    ABORTED = "aborted"
    EXPIRED = "expired"


class Snapshot(WireModel):
    """A point-in-time record of a session.

    `messages` is the whole history. A store may keep only what this snapshot added:
    `inherited` says how many leading messages are the parent's, unchanged (a promise
    made to `save_snapshot`; a snapshot read from a store has 0).
    """

    snapshot_id: str
    session_id: str
    parent_id: Omittable[str] = None
    agent: str
    status: SnapshotStatus
    finish_reason: Omittable[FinishReason] = None
    messages: list[Message] = Field(default_factory=list)
    error: Omittable[ErrorInfo] = None
    created_at: datetime = Field(default_factory=utcnow)
    updated_at: datetime = Field(default_factory=utcnow)
    resumed_by: Omittable[str] = None
    turn_id: Omittable[str] = None
    inherited: int = 0
    expires_at: Omittable[datetime] = None
    resume_token_hash: Omittable[str] = None

    @property
    def is_interrupted(self) -> bool:
        return self.finish_reason == FinishReason.INTERRUPTED

    @property
    def last_model_message(self) -> Message | None:
        for m in reversed(self.messages):
            if m.role == "model":
                return m
        return None
