"""Wire and record models of Interlock. Imports nothing else of the project."""

from .agent import (
    AgentChunk,
    AgentInput,
    AgentOutput,
    ErrorInfo,
    FinishReason,
    ModelChunk,
    ToolResume,
    TurnEnd,
)
from .dead_letters import DeadLetter
from .decisions import (
    MAX_DECISION_BYTES,
    Decision,
    RespondEntry,
    RestartEntry,
    TurnRequest,
    decision_adapter,
)
from .events import (
    EVENT_TYPES,
    SCHEMA_VERSION,
    DecisionAccepted,
    DecisionRejected,
    Event,
    EventBase,
    InterruptInfo,
    TurnCompleted,
    TurnExpired,
    TurnFailed,
    TurnInterrupted,
    event_adapter,
)
from .model import ModelRequest, ModelResponse, ToolDefinition, Usage
from .parts import Media, Message, Part, Resource, Role, ToolRequest, ToolResponse
from .snapshot import Snapshot, SnapshotStatus
from .status import Status
from .times import utcnow, wire_time

__all__ = [
    "EVENT_TYPES",
    "MAX_DECISION_BYTES",
    "SCHEMA_VERSION",
    "AgentChunk",
    "AgentInput",
    "AgentOutput",
    "DeadLetter",
    "Decision",
    "DecisionAccepted",
    "DecisionRejected",
    "ErrorInfo",
    "Event",
    "EventBase",
    "FinishReason",
    "InterruptInfo",
    "Media",
    "Message",
    "ModelChunk",
    "ModelRequest",
    "ModelResponse",
    "Part",
    "Resource",
    "RespondEntry",
    "RestartEntry",
    "Role",
    "Snapshot",
    "SnapshotStatus",
    "Status",
    "ToolDefinition",
    "ToolRequest",
    "ToolResponse",
    "ToolResume",
    "TurnCompleted",
    "TurnEnd",
    "TurnExpired",
    "TurnFailed",
    "TurnInterrupted",
    "TurnRequest",
    "Usage",
    "decision_adapter",
    "event_adapter",
    "utcnow",
    "wire_time",
]
