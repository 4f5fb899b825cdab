"""What a model gets and gives back."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from ._base import WireModel
from .agent import FinishReason
from .parts import Message

__all__ = ["ModelRequest", "ModelResponse", "ToolDefinition", "Usage"]


class ToolDefinition(WireModel):
    name: str
    description: str = ""
    input_schema: dict[str, Any] | None = None
    output_schema: dict[str, Any] | None = None


class Usage(WireModel):
    input_tokens: int | None = None
    output_tokens: int | None = None
    total_tokens: int | None = None


class ModelRequest(WireModel):
    messages: list[Message]
    tools: list[ToolDefinition] = Field(default_factory=list)
    config: dict[str, Any] | None = None


class ModelResponse(WireModel):
    message: Message
    finish_reason: FinishReason = FinishReason.STOP
    usage: Usage | None = None
