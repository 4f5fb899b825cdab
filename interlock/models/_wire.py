"""Mapping helpers shared by the model plugins: history checks, schemas, tool JSON."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

from schemas import Message, Part, Status

from .._ids import new_id
from ..errors import StatusError

__all__ = [
    "WRAPPED_INPUT",
    "check_history",
    "dump_input",
    "dump_output",
    "new_ref",
    "object_schema",
    "parse_arguments",
    "parse_data_url",
    "unwrap_input",
    "wrapped_tools",
]

log = logging.getLogger("interlock.models")


def new_ref() -> str:
    return new_id()


def check_history(messages: Sequence[Message], model: str) -> None:
    """Refuse a history that would show the model a tool call as if it had completed
    when it has not: a request still marked `metadata.interrupt` (a pending interrupt),
    or one with no tool response after it. After a resume the turn loop renames
    `interrupt` to `resolvedInterrupt` and appends the responses, so a well-formed
    history always passes."""
    answered = {
        p.tool_response.ref or p.tool_response.name
        for m in messages
        if m.role == "tool"
        for p in m.content
        if p.tool_response is not None
    }
    for message in messages:
        if message.role != "model":
            continue
        for part in message.content:
            req = part.tool_request
            if req is None:
                continue
            if part.is_interrupt():
                raise StatusError(
                    Status.FAILED_PRECONDITION,
                    f"cannot call {model}: tool call {req.name!r} (ref {req.ref}) is a pending "
                    "interrupt; answer it (respond or restart) before the model runs again",
                )
            if (req.ref or req.name) not in answered:
                raise StatusError(
                    Status.FAILED_PRECONDITION,
                    f"cannot call {model}: tool call {req.name!r} (ref {req.ref}) has no tool "
                    "response in the history",
                )


WRAPPED_INPUT = "input"
"""The one field of the object a tool's input travels in when that input is not itself
a JSON object (a string, a number, a list, a union): the APIs take object schemas
only."""


def object_schema(schema: dict[str, Any] | None) -> dict[str, Any]:
    """A tool's input schema as the APIs want it: an object schema. A tool without one
    (input typed `Any`) takes any object; a tool whose input is not an object (say
    `str`, or `Model | None`) takes an object whose one field `input` holds it, and
    `unwrap_input` takes it out of the model's arguments again."""
    if not schema:
        return {"type": "object", "properties": {}}
    target = _referred(schema)
    if target is not None and _is_object(target):  # a recursive model: `$ref` on top
        inline = {k: v for k, v in schema.items() if k != "$ref"}
        return {**target, **inline, "type": "object"}
    if not _wraps(schema):
        return dict(schema)
    inner = dict(schema)
    wrapped: dict[str, Any] = {
        "type": "object",
        "properties": {WRAPPED_INPUT: inner},
        "required": [WRAPPED_INPUT],
    }
    for key in _DEFINITIONS:  # `#/$defs/...` refs resolve from the top level
        if key in inner:
            wrapped[key] = inner.pop(key)
    return wrapped


_DEFINITIONS = ("$defs", "definitions")


def _referred(schema: dict[str, Any]) -> dict[str, Any] | None:
    """The definition a schema's top-level `$ref` names (`#/$defs/X`), if it has one."""
    ref = schema.get("$ref")
    if not isinstance(ref, str) or not ref.startswith("#/"):
        return None
    where, _, name = ref[2:].partition("/")
    found = schema.get(where, {}).get(name) if where in _DEFINITIONS else None
    return found if isinstance(found, dict) else None


def _is_object(schema: dict[str, Any]) -> bool:
    kind = schema.get("type")
    return kind == "object" or (kind is None and "properties" in schema)


def _wraps(schema: dict[str, Any] | None) -> bool:
    if not schema:
        return False
    target = _referred(schema)
    return not _is_object(target if target is not None else schema)


def wrapped_tools(tools: Sequence[Any]) -> frozenset[str]:
    """The names of the tools (`ToolDefinition`s) whose input `object_schema` wraps."""
    return frozenset(t.name for t in tools if _wraps(t.input_schema))


UNREADABLE_ARGUMENTS = "unreadableArguments"
"""The one field of what a tool in `wrapped` is given when the model's arguments were no
object (malformed JSON kept as its raw string, say): a tool taking a string would
otherwise run on that string."""


def unwrap_input(value: Any, name: str, wrapped: frozenset[str]) -> Any:
    """A tool call's input as the tool takes it: out of its `input` field for a tool in
    `wrapped` (arguments that are no object are put where no string, number or list
    input takes them, `{UNREADABLE_ARGUMENTS: ...}`); for any other tool, or an object
    without that field, as it is, for the tool's validation to judge."""
    if name not in wrapped:
        return value
    if isinstance(value, dict):
        return value.get(WRAPPED_INPUT, value)
    return {UNREADABLE_ARGUMENTS: value}


def parse_arguments(raw: Any, *, tool: str, ref: str, model: str) -> Any:
    """A tool call's input from the model's JSON arguments.

    Malformed JSON does not fail the model call: the call is kept with the raw string as
    its input, so the history shows exactly what the model sent, and the tool's input
    validation then refuses it (INVALID_ARGUMENT; a tool whose input is a model or a
    dict never runs on it). A warning names the bad JSON."""
    if raw is None:
        return {}
    if not isinstance(raw, str):  # a server that sends the arguments as JSON itself
        return raw
    if not raw.strip():
        return {}
    try:
        return json.loads(raw)
    except ValueError as exc:
        log.warning(
            "%s sent malformed JSON arguments for tool %r (call %s): %r (%s); keeping the "
            "call with the raw string as its input, which the tool's validation will refuse",
            model,
            tool,
            ref,
            raw,
            exc,
        )
        return raw


def dump_input(value: Any) -> str:
    """A tool call's input as the JSON arguments string (a raw string goes back as it came)."""
    if value is None:
        return "{}"
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def dump_output(value: Any) -> str:
    """A tool's output as the text of a tool result: strings as they are, else JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def parse_data_url(url: str) -> tuple[str, str] | None:
    """`(media_type, base64_data)` of a `data:...;base64,...` URL, else None."""
    if not url.startswith("data:"):
        return None
    header, sep, data = url[5:].partition(",")
    if not sep or not header.endswith(";base64"):
        return None
    return header[: -len(";base64")] or "application/octet-stream", data


def text_of(parts: Sequence[Part]) -> str:
    return "".join(p.text for p in parts if p.text is not None)
