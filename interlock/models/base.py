"""The `Model` protocol and models built from plain functions."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from schemas import Message, ModelChunk, ModelRequest, ModelResponse, Status

from ..errors import StatusError
from ..tools import run_sync

__all__ = ["ChunkCallback", "FunctionModel", "Model", "as_response"]

ChunkCallback = Callable[[ModelChunk], None]


@runtime_checkable
class Model(Protocol):
    """A model, named `provider/model`. Streaming models call `on_chunk` as they go."""

    name: str

    def generate(
        self, request: ModelRequest, on_chunk: ChunkCallback | None = None
    ) -> ModelResponse: ...


def as_response(reply: Any, name: str) -> ModelResponse:
    """A `ModelResponse` from what a model function returned."""
    if isinstance(reply, ModelResponse):
        return reply
    if isinstance(reply, Message):  # the model's message, whatever role it was built with
        if reply.role != "model":
            reply = reply.model_copy(update={"role": "model"})
        return ModelResponse(message=reply)
    raise StatusError(
        Status.INTERNAL,
        f"model {name!r} returned {type(reply).__name__}; expected ModelResponse or Message",
    )


def _positional(fn: Callable[..., Any]) -> int:
    """How many arguments `fn` takes by position: a second one makes a streaming model
    (keyword-only parameters, such as a `temperature=` of its own, do not)."""
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(p.kind in kinds for p in inspect.signature(fn).parameters.values())


class FunctionModel:
    """A model from `fn(request)` or, streaming, `fn(request, on_chunk)`; sync or async."""

    def __init__(self, name: str, fn: Callable[..., Any]) -> None:
        self.name = name
        self.fn = fn
        self.streaming = _positional(fn) >= 2

    def __repr__(self) -> str:
        return f"<FunctionModel {self.name}>"

    def generate(
        self, request: ModelRequest, on_chunk: ChunkCallback | None = None
    ) -> ModelResponse:
        if self.streaming:
            reply = run_sync(self.fn(request, on_chunk or (lambda _chunk: None)))
        else:
            reply = run_sync(self.fn(request))
        return as_response(reply, self.name)
