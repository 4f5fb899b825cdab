"""What a model gets and gives back."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from ._base import Omittable, WireModel
from .agent import FinishReason
from .parts import Message

__all__ = ["ModelRequest", "ModelResponse", "ToolDefinition", "Usage"]


class ToolDefinition(WireModel):
    name: str
    description: str = ""
    input_schema: Omittable[dict[str, Any]] = None
    output_schema: Omittable[dict[str, Any]] = None


class Usage(WireModel):
    input_tokens: Omittable[int] = None
    output_tokens: Omittable[int] = None
    total_tokens: Omittable[int] = None


class ModelRequest(WireModel):
    messages: list[Message]
    tools: list[ToolDefinition] = Field(default_factory=list)
    config: Omittable[dict[str, Any]] = None


class ModelResponse(WireModel):
    message: Message
    finish_reason: FinishReason = FinishReason.STOP
    usage: Omittable[Usage] = None
