"""Interrupts: a tool pauses the turn; the caller answers with respond or restart parts."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from datetime import timedelta
from typing import Any, NoReturn, TypeVar, overload

from pydantic import TypeAdapter, ValidationError

from schemas import Part, Status, ToolRequest, ToolResponse

from ._json import to_json_value
from .errors import StatusError

__all__ = [
    "InterruptDataError",
    "ToolInterrupt",
    "interrupt",
    "interrupt_as",
    "json_of",
    "misuses_watched",
    "respond",
    "restart",
]

T = TypeVar("T")


class InterruptDataError(StatusError):
    """`interrupt()` called with data that is no JSON object: the tool's misuse of the
    call, so the tool fails with this status (INVALID_ARGUMENT), not INTERNAL."""

    default_status = Status.INVALID_ARGUMENT


_MISUSES: ContextVar[list[InterruptDataError] | None] = ContextVar(
    "interlock_interrupt_misuses", default=None
)
"""Where `interrupt()` notes its misuse during a tool call (`misuses_watched`): the
error it raises is an `Exception`, which the tool may catch, yet the call still fails."""


@contextlib.contextmanager
def misuses_watched() -> Iterator[list[InterruptDataError]]:
    """Collect the `InterruptDataError`s that `interrupt()` raises within the block
    (also in an async tool's task, which runs in a copy of this context)."""
    seen: list[InterruptDataError] = []
    token = _MISUSES.set(seen)
    try:
        yield seen
    finally:
        _MISUSES.reset(token)


class ToolInterrupt(BaseException):
    """Raised by `interrupt()`. A `BaseException`, so `except Exception` cannot swallow it."""

    def __init__(self, data: dict[str, Any], expires_in: float | None = None) -> None:
        super().__init__("tool interrupted")
        self.data = data
        self.expires_in = expires_in


def seconds(value: float | timedelta | None) -> float | None:
    """A duration in seconds (None stays None); it must be positive."""
    if value is None:
        return None
    total = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if total <= 0:
        raise StatusError(Status.INVALID_ARGUMENT, f"expires_in must be positive, got {total}")
    return total


def interrupt(data: Any, *, expires_in: float | timedelta | None = None) -> NoReturn:
    """Pause the turn, surfacing `data` to the caller. Never returns. `data` must
    serialize to a JSON object (a pydantic model, a dict, a dataclass); anything else
    fails the tool with INVALID_ARGUMENT (raised as `InterruptDataError`; a tool that
    catches it fails all the same).

    `expires_in` (seconds or a timedelta) gives the pause a deadline: once it passes
    with no decision, the snapshot is marked `expired` and can no longer resume."""
    try:
        value = to_json_value(data)
    except ValueError:  # pydantic's serialization error: a value with no JSON form
        value = None
    if not isinstance(value, dict):
        error = InterruptDataError(
            Status.INVALID_ARGUMENT, "interrupt data must serialize to a JSON object"
        )
        watching = _MISUSES.get()
        if watching is not None:  # in a tool call: it fails even if the tool catches this
            watching.append(error)
        raise error
    raise ToolInterrupt(value, seconds(expires_in))


@overload
def interrupt_as(part: Part, type_: type[T]) -> T | None: ...
@overload
def interrupt_as(part: Part, type_: Any) -> Any: ...
def interrupt_as(part: Part, type_: type[T] | Any) -> T | None:
    """The typed payload of an interrupt part, or None when `part` is no interrupt
    or its payload does not validate as `type_`."""
    if not part.is_interrupt():
        return None
    try:
        result: T = TypeAdapter(type_).validate_python(part.meta("interrupt"))
    except ValidationError:
        return None
    return result


def json_of(value: Any, what: str) -> Any:
    """`value` as JSON; one with no JSON form (an arbitrary object, say) is
    INVALID_ARGUMENT naming `what`, not a serializer's error."""
    try:
        return to_json_value(value)
    except ValueError as exc:  # pydantic's serialization error
        raise StatusError(Status.INVALID_ARGUMENT, f"{what} has no JSON form: {exc}") from exc


def _request_of(part: Part, what: str) -> ToolRequest:
    if part.tool_request is None:
        raise StatusError(
            Status.INVALID_ARGUMENT, f"{what} needs the interrupted tool-request part"
        )
    return part.tool_request


def respond(part: Part, output: Any, metadata: dict[str, Any] | None = None) -> Part:
    """A tool-response part that answers the interrupt `part` with `output`. It is
    marked `metadata.interruptResponse`: `true`, or the `metadata` given, as Genkit's
    `RespondOptions.Metadata` is."""
    req = _request_of(part, "respond")
    marker: Any = True
    if metadata is not None:
        marker = json_of(metadata, "respond metadata")
        if not isinstance(marker, dict):
            raise StatusError(Status.INVALID_ARGUMENT, "respond metadata must be a JSON object")
    meta = {"interruptResponse": marker}
    value = json_of(output, "respond output")
    return Part(
        tool_response=ToolResponse(name=req.name, ref=req.ref, output=value),
        metadata=meta,
    )


def restart(part: Part, resumed: Any = None) -> Part:
    """A tool-request part that re-runs the interrupted tool, with `resumed` as its
    resume data: a JSON object (marked `resumed: true` when there is none)."""
    req = _request_of(part, "restart")
    data = json_of(resumed, "resume data") if resumed is not None else True
    if resumed is not None and not isinstance(data, dict):
        # `True` too: on the wire it means "no resume data", and the tool would get None.
        raise StatusError(
            Status.INVALID_ARGUMENT,
            f"resume data must serialize to a JSON object, not {type(data).__name__}",
        )
    return Part(
        tool_request=ToolRequest(name=req.name, ref=req.ref, input=req.input),
        metadata={"resumed": data},
    )
