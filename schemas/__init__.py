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
from .model import ModelRequest, ModelResponse, ToolDefinition, Usage
from .parts import Media, Message, Part, Role, ToolRequest, ToolResponse
from .snapshot import Snapshot, SnapshotStatus, utcnow
from .status import Status

__all__ = [
    "AgentChunk",
    "AgentInput",
    "AgentOutput",
    "ErrorInfo",
    "FinishReason",
    "Media",
    "Message",
    "ModelChunk",
    "ModelRequest",
    "ModelResponse",
    "Part",
    "Role",
    "Snapshot",
    "SnapshotStatus",
    "Status",
    "ToolDefinition",
    "ToolRequest",
    "ToolResponse",
    "ToolResume",
    "TurnEnd",
    "Usage",
    "utcnow",
]
