"""Parts and messages, JSON-compatible with Genkit's wire form."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, model_validator
from pydantic.alias_generators import to_camel

from ._base import Omittable, OmittableAny, WireModel

__all__ = ["Media", "Message", "Part", "Resource", "Role", "ToolRequest", "ToolResponse"]

Role = Literal["system", "user", "model", "tool"]

_CONTENT_FIELDS = (
    "text",
    "data",
    "media",
    "tool_request",
    "tool_response",
    "reasoning",
    "custom",
    "resource",
)
_CONTENT_SET = frozenset(_CONTENT_FIELDS)


class Media(WireModel):
    url: str
    content_type: Omittable[str] = None


class Resource(WireModel):
    """What a resource part points at (Genkit's `{"resource": {"uri": ...}}`)."""

    uri: str


class ToolRequest(WireModel):
    """A model's request to call a tool. `ref` identifies the call; `partial` marks a
    request still being streamed (Genkit's field, kept as it came)."""

    name: str
    ref: Omittable[str] = None
    input: OmittableAny = None
    partial: Omittable[bool] = None


class ToolResponse(WireModel):
    """A tool's answer to the request with the same `ref`. `content` holds the parts of a
    multipart answer (Genkit's field, kept as it came; Interlock's tools answer with
    `output`)."""

    name: str
    ref: Omittable[str] = None
    output: OmittableAny = None
    content: Omittable[list[Part]] = None


def exactly_one_of(*fields: str) -> Any:
    """A `json_schema_extra` that says in a model's JSON Schema what its validator checks:
    exactly one of `fields` (snake_case) is present and not null (null counts as absent)."""

    def extra(schema: dict[str, Any]) -> None:
        schema["oneOf"] = [
            {"required": [name], "properties": {name: {"not": {"type": "null"}}}}
            for name in (to_camel(field) for field in fields)
        ]

    return extra


class Part(WireModel):
    """One piece of a message: exactly one content field, plus optional metadata."""

    model_config = ConfigDict(json_schema_extra=exactly_one_of(*_CONTENT_FIELDS))

    text: Omittable[str] = None
    data: OmittableAny = None
    media: Omittable[Media] = None
    tool_request: Omittable[ToolRequest] = None
    tool_response: Omittable[ToolResponse] = None
    reasoning: Omittable[str] = None
    custom: Omittable[dict[str, Any]] = None
    resource: Omittable[Resource] = None
    metadata: Omittable[dict[str, Any]] = None

    @model_validator(mode="after")
    def _exactly_one(self) -> Part:
        # Runs for every part parsed (a long history loads thousands): count, without
        # building a list, the content fields among those the input gave (a part parsed
        # from JSON names one or two: its content and metadata); the rest are None.
        values = self.__dict__
        count = 0
        for name in self.__pydantic_fields_set__:
            if name in _CONTENT_SET and values[name] is not None:
                count += 1
        if count != 1:
            present = [f for f in _CONTENT_FIELDS if values[f] is not None]
            raise ValueError(
                "a part holds exactly one of text, data, media, toolRequest, toolResponse, "
                f"reasoning, custom, resource; got {len(present)} ({', '.join(present) or 'none'})"
            )
        return self

    def is_text(self) -> bool:
        return self.text is not None

    def is_tool_request(self) -> bool:
        return self.tool_request is not None

    def is_tool_response(self) -> bool:
        return self.tool_response is not None

    def is_interrupt(self) -> bool:
        """True for a tool request that paused the turn and is still waiting for an answer."""
        return (
            self.tool_request is not None
            and bool(self.metadata)
            and "interrupt" in (self.metadata or {})
        )

    def meta(self, key: str, default: Any = None) -> Any:
        """A metadata value, or `default`."""
        return (self.metadata or {}).get(key, default)


class Message(WireModel):
    role: Role
    content: list[Part]
    metadata: Omittable[dict[str, Any]] = None

    @property
    def text(self) -> str:
        """The concatenated text of the text parts."""
        return "".join(p.text for p in self.content if p.text is not None)

    @property
    def tool_requests(self) -> list[Part]:
        return [p for p in self.content if p.tool_request is not None]

    @property
    def interrupts(self) -> list[Part]:
        return [p for p in self.content if p.is_interrupt()]


ToolResponse.model_rebuild()
