"""The `scripted` provider: models whose replies are given by a script or a function.

For tests, examples and the demo: no network, fully deterministic.

    scripted.define(ai, "banking", lambda request: ...)        # -> "scripted/banking"
    scripted.define(ai, "two-steps", [scripted.tool_call("x", {...}), "done"])
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from schemas import Message, ModelRequest, ModelResponse, Part, Status, ToolRequest

from .._ids import new_id
from .._json import to_json_value
from ..errors import StatusError
from ..tools import run_sync
from .base import as_response

if TYPE_CHECKING:
    from ..registry import Interlock

__all__ = ["Reply", "define", "last_message", "reply", "text", "tool_call"]

Reply = ModelResponse | Message | Part | str | Callable[[ModelRequest], Any]


def text(value: str) -> Message:
    """A model message holding only `value`."""
    return Message(role="model", content=[Part(text=value)])


def tool_call(name: str, input: Any = None, ref: str | None = None) -> Part:
    """A tool-request part (give several to one `reply` for parallel calls)."""
    return Part(
        tool_request=ToolRequest(name=name, ref=ref or new_id(), input=to_json_value(input))
    )


def reply(*parts: Part | str) -> Message:
    """A model message of several parts; strings become text parts."""
    return Message(role="model", content=[Part(text=p) if isinstance(p, str) else p for p in parts])


def last_message(request: ModelRequest) -> Message:
    """The newest message of the request (what the model is answering)."""
    return request.messages[-1]


def _resolve(item: Reply, request: ModelRequest, name: str) -> ModelResponse:
    value = run_sync(item(request)) if callable(item) else item
    if isinstance(value, str):
        value = text(value)
    if isinstance(value, Part):
        value = reply(value)
    return as_response(value, name)


def define(ai: Interlock, name: str, script: Reply | Iterable[Reply]) -> str:
    """Register `scripted/<name>`. `script` is a function of the request, or a list of
    replies given in order (each a message, a response, a part such as a `tool_call`,
    a string or a function). A message, response, part or string alone, not in a
    list, is a script of one (a string is not read as a list of its characters)."""
    full = name if name.startswith("scripted/") else f"scripted/{name}"
    if isinstance(script, str | Message | ModelResponse | Part):
        script = [script]
    if callable(script):
        fn = script

        def generate(request: ModelRequest) -> ModelResponse:
            return _resolve(fn, request, full)
    else:
        replies = list(script)
        lock = threading.Lock()
        position = [0]

        def generate(request: ModelRequest) -> ModelResponse:
            with lock:
                if position[0] >= len(replies):
                    raise StatusError(
                        Status.OUT_OF_RANGE,
                        f"scripted model {full!r} has no reply left (it had {len(replies)})",
                    )
                item = replies[position[0]]
                position[0] += 1
            return _resolve(item, request, full)

    ai.define_model(full, generate)
    return full
