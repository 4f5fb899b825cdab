"""Agent input, output and stream chunks."""

from __future__ import annotations

from enum import StrEnum

from pydantic import ConfigDict, Field, field_validator, model_validator

from ._base import Omittable, OmittableList, WireModel
from .parts import Message, Part, Role, exactly_one_of
from .status import Status

__all__ = [
    "AgentChunk",
    "AgentInput",
    "AgentOutput",
    "ErrorInfo",
    "FinishReason",
    "ModelChunk",
    "ToolResume",
    "TurnEnd",
]


class FinishReason(StrEnum):
    STOP = "stop"
    LENGTH = "length"
    BLOCKED = "blocked"
    INTERRUPTED = "interrupted"
    OTHER = "other"
    UNKNOWN = "unknown"
    ABORTED = "aborted"
    FAILED = "failed"
    EXPIRED = "expired"


class ErrorInfo(WireModel):
    """An error as it crosses a process boundary: `{"status", "message"}`. A status
    this version does not know (a newer sender's) is read as UNKNOWN, as gRPC clients
    read one; the message is kept."""

    status: Status
    message: str

    @field_validator("status", mode="before")
    @classmethod
    def _unknown_status(cls, value: object) -> object:
        if isinstance(value, str) and value not in Status.__members__:
            return Status.UNKNOWN
        return value


class ToolResume(WireModel):
    """Answers to the pending interrupts: respond parts and restart parts. An empty list
    is left out of the JSON, as Genkit does."""

    respond: OmittableList[Part] = Field(default_factory=list)
    restart: OmittableList[Part] = Field(default_factory=list)


class AgentInput(WireModel):
    """One turn's input: a new message, or a resume. Exactly one is set."""

    model_config = ConfigDict(json_schema_extra=exactly_one_of("message", "resume"))

    message: Omittable[Message] = None
    resume: Omittable[ToolResume] = None

    @model_validator(mode="after")
    def _exactly_one(self) -> AgentInput:
        if (self.message is None) == (self.resume is None):
            raise ValueError("an agent input holds exactly one of message and resume")
        return self


class AgentOutput(WireModel):
    finish_reason: FinishReason
    message: Omittable[Message] = None
    session_id: Omittable[str] = None
    snapshot_id: Omittable[str] = None
    state: Omittable[str] = None
    error: Omittable[ErrorInfo] = None

    @property
    def interrupts(self) -> list[Part]:
        """The interrupt parts of `message`, the ones waiting for an answer."""
        return self.message.interrupts if self.message is not None else []

    @property
    def text(self) -> str:
        return self.message.text if self.message is not None else ""


class ModelChunk(WireModel):
    role: Role = "model"
    content: list[Part] = Field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(p.text for p in self.content if p.text is not None)


class TurnEnd(WireModel):
    finish_reason: FinishReason
    snapshot_id: Omittable[str] = None


class AgentChunk(WireModel):
    model_chunk: Omittable[ModelChunk] = None
    turn_end: Omittable[TurnEnd] = None
