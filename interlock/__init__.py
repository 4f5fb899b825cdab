"""Interlock: agents that pause mid-turn for a human and resume where they stopped.

`SqlSessionStore` is imported on first use (see `interlock.stores`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from schemas import (
    AgentChunk,
    AgentInput,
    AgentOutput,
    FinishReason,
    Message,
    ModelChunk,
    ModelRequest,
    ModelResponse,
    Part,
    Snapshot,
    SnapshotStatus,
    Status,
    ToolDefinition,
    ToolRequest,
    ToolResponse,
    ToolResume,
    TurnEnd,
)

from .agent import Agent
from .connection import Connection
from .context import ToolContext
from .errors import (
    InterlockError,
    ResumeSnapshotNotFoundError,
    ResumeValidationError,
    SnapshotNotFoundError,
    StatusError,
    ToolFailedError,
    ToolNotFoundError,
    error_from_info,
    status_of,
)
from .interrupts import (
    InterruptDataError,
    ToolInterrupt,
    interrupt,
    interrupt_as,
    respond,
    restart,
)
from .middleware import Middleware, ToolApproval, approve, deny, is_approval_gate, tool_approval
from .models import FunctionModel, Model, ModelError, RetryPolicy, scripted
from .registry import Interlock
from .state import RandomSecretWarning
from .stores import InMemorySessionStore, LatestSnapshotId, SessionStore, SnapshotHeads
from .tools import InterruptibleTool, Tool

if TYPE_CHECKING:
    from .stores.sql import SqlSessionStore

__all__ = [
    "Agent",
    "AgentChunk",
    "AgentInput",
    "AgentOutput",
    "Connection",
    "FinishReason",
    "FunctionModel",
    "InMemorySessionStore",
    "Interlock",
    "InterlockError",
    "InterruptDataError",
    "InterruptibleTool",
    "LatestSnapshotId",
    "Message",
    "Middleware",
    "Model",
    "ModelChunk",
    "ModelError",
    "ModelRequest",
    "ModelResponse",
    "Part",
    "RandomSecretWarning",
    "ResumeSnapshotNotFoundError",
    "ResumeValidationError",
    "RetryPolicy",
    "SessionStore",
    "Snapshot",
    "SnapshotHeads",
    "SnapshotNotFoundError",
    "SnapshotStatus",
    "SqlSessionStore",
    "Status",
    "StatusError",
    "Tool",
    "ToolApproval",
    "ToolContext",
    "ToolDefinition",
    "ToolFailedError",
    "ToolInterrupt",
    "ToolNotFoundError",
    "ToolRequest",
    "ToolResponse",
    "ToolResume",
    "TurnEnd",
    "approve",
    "deny",
    "error_from_info",
    "interrupt",
    "interrupt_as",
    "is_approval_gate",
    "respond",
    "restart",
    "scripted",
    "status_of",
    "tool_approval",
]


if not TYPE_CHECKING:  # to a type checker, the names above are all there is

    def __getattr__(name: str) -> Any:
        if name == "SqlSessionStore":
            from .stores.sql import SqlSessionStore

            return SqlSessionStore
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
