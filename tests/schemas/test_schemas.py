"""Wire models (docs/concepts.md): Genkit's camelCase JSON parses and dumps back unchanged."""

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from pydantic import ValidationError

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
    TurnExpired,
    wire_time,
)


def roundtrip(model: Any, wire: dict[str, Any]) -> Any:
    """Parse `wire`, dump it back, and check the JSON is identical (also via a string)."""
    parsed = model.model_validate(wire)
    assert parsed.model_dump(mode="json") == wire
    assert json.loads(parsed.model_dump_json()) == wire
    assert model.model_validate_json(json.dumps(wire)) == parsed
    return parsed


# -- parts ------------------------------------------------------------------------------

PART_VARIANTS: list[dict[str, Any]] = [
    {"text": "hello"},
    {"text": ""},
    {"data": {"rows": [1, 2, 3], "nested": {"ok": True}}},
    {"data": [1, "two", 3.5]},
    {"media": {"url": "https://example.com/cat.png", "contentType": "image/png"}},
    {"media": {"url": "data:text/plain;base64,aGk="}},
    {"toolRequest": {"name": "transferMoney", "ref": "r1", "input": {"amount": 5}}},
    {"toolResponse": {"name": "transferMoney", "ref": "r1", "output": {"success": True}}},
    {"reasoning": "thinking about it"},
    {"custom": {"kind": "citation", "source": "doc-1"}},
    {"resource": {"uri": "file:///docs/terms.md"}},
    {"toolRequest": {"name": "search", "ref": "r2", "input": {"q": "x"}, "partial": True}},
    {
        "toolResponse": {
            "name": "screenshot",
            "ref": "r3",
            "output": {"ok": True},
            "content": [{"media": {"url": "data:image/png;base64,iVBO"}}, {"text": "a cat"}],
        }
    },
    {"text": "with metadata", "metadata": {"k": [1, None, {"x": "y"}]}},
]


@pytest.mark.parametrize("wire", PART_VARIANTS)
def test_part_variants_roundtrip(wire: dict[str, Any]) -> None:
    part = roundtrip(Part, wire)
    [field] = [k for k in wire if k != "metadata"]
    assert part.is_text() == (field == "text")
    assert part.is_tool_request() == (field == "toolRequest")
    assert part.is_tool_response() == (field == "toolResponse")
    assert part.metadata == wire.get("metadata")


def test_part_python_names_are_snake_case() -> None:
    part = Part.model_validate(
        {"toolRequest": {"name": "x", "ref": "1", "input": {}}, "metadata": {"interrupt": {}}}
    )
    assert part.tool_request == ToolRequest(name="x", ref="1", input={})
    assert part.is_tool_request() and not part.is_tool_response()
    # populate_by_name: snake_case works in Python too
    same = Part(tool_request=ToolRequest(name="x", ref="1", input={}), metadata={"interrupt": {}})
    assert same == part
    media = Part.model_validate({"media": {"url": "u", "contentType": "image/jpeg"}})
    assert media.media is not None and media.media.content_type == "image/jpeg"


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"metadata": {"a": 1}},
        {"text": "a", "data": {"b": 1}},
        {"text": "a", "reasoning": "r"},
        {
            "tool_request": ToolRequest(name="x", ref="1"),
            "tool_response": ToolResponse(name="x", ref="1"),
        },
    ],
)
def test_part_holds_exactly_one_content(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValidationError, match="exactly one of text, data, media"):
        Part(**kwargs)


def test_part_exactly_one_on_the_wire() -> None:
    with pytest.raises(ValidationError, match=r"got 2 \(text, custom\)"):
        Part.model_validate({"text": "a", "custom": {"x": 1}})
    with pytest.raises(ValidationError, match=r"got 0 \(none\)"):
        Part.model_validate({"metadata": {"x": 1}})


def test_part_exactly_one_counts_only_the_content_fields_given() -> None:
    """The check looks at the fields the input gave; null ones count as absent, and so
    do fields that are no content (metadata, or a subclass's own)."""
    assert Part.model_validate({"text": "a", "data": None, "metadata": {"k": 1}}).text == "a"
    assert Part(text=None, data={"x": 1}).data == {"x": 1}

    class Tagged(Part):
        tag: str | None = None

    assert Tagged.model_validate({"text": "a", "tag": "t"}).tag == "t"
    with pytest.raises(ValidationError, match=r"got 0 \(none\)"):
        Tagged.model_validate({"tag": "t", "text": None})


def test_is_interrupt() -> None:
    req = ToolRequest(name="x", ref="1", input={})
    assert Part(tool_request=req, metadata={"interrupt": {"a": 1}}).is_interrupt()
    assert not Part(tool_request=req).is_interrupt()
    assert not Part(tool_request=req, metadata={"resolvedInterrupt": {"a": 1}}).is_interrupt()
    assert not Part(text="x", metadata={"interrupt": {"a": 1}}).is_interrupt()
    resp = ToolResponse(name="x", ref="1", output={})
    assert not Part(tool_response=resp, metadata={"interrupt": {}}).is_interrupt()


def test_tool_request_and_response_roundtrip() -> None:
    req = roundtrip(ToolRequest, {"name": "lookup", "ref": "abc", "input": {"q": "x"}})
    assert (req.name, req.ref, req.input) == ("lookup", "abc", {"q": "x"})
    res = roundtrip(ToolResponse, {"name": "lookup", "ref": "abc", "output": [1, 2]})
    assert res.output == [1, 2]
    # ref and input/output are optional on the wire
    bare = roundtrip(ToolRequest, {"name": "noargs"})
    assert bare.ref is None and bare.input is None


def test_genkit_resource_and_multipart_fields_are_kept() -> None:
    """Genkit's resource parts, a tool request's `partial` flag and a multipart tool
    response's `content` parse into typed fields and are written back as they came."""
    part = roundtrip(Part, {"resource": {"uri": "gs://bucket/a.pdf"}, "metadata": {"k": 1}})
    assert part.resource is not None and part.resource.uri == "gs://bucket/a.pdf"
    assert not part.is_text() and not part.is_tool_request()
    res = roundtrip(ToolResponse, {"name": "shot", "ref": "1", "content": [{"text": "seen"}]})
    assert res.content == [Part(text="seen")] and res.output is None
    with pytest.raises(ValidationError, match="exactly one of"):
        ToolResponse.model_validate({"name": "shot", "content": [{"text": "a", "data": 1}]})
    with pytest.raises(ValidationError, match=r"got 2 \(text, resource\)"):
        Part.model_validate({"text": "a", "resource": {"uri": "x"}})


# -- messages ---------------------------------------------------------------------------

GENKIT_INTERRUPTED_MESSAGE = {
    "role": "model",
    "content": [
        {"text": "I need your approval first."},
        {
            "toolRequest": {
                "name": "transferMoney",
                "ref": "1",
                "input": {"amount": 500, "toAccount": "savings"},
            },
            "metadata": {
                "interrupt": {"action": "transferMoney", "details": "Transfer $500.00 to savings"}
            },
        },
        {
            "toolRequest": {"name": "getBalance", "ref": "2", "input": {}},
            "metadata": {"pendingOutput": {"balance": 1000}},
        },
    ],
    "metadata": {"model": "googleai/gemini-flash-latest"},
}


def test_genkit_message_roundtrip_identical() -> None:
    message = roundtrip(Message, GENKIT_INTERRUPTED_MESSAGE)
    assert message.role == "model"
    assert message.text == "I need your approval first."
    assert [p.tool_request.ref for p in message.tool_requests if p.tool_request] == ["1", "2"]
    assert len(message.interrupts) == 1
    assert message.interrupts[0].meta("interrupt")["action"] == "transferMoney"


def test_genkit_shaped_message_roundtrip() -> None:
    wire = {
        "role": "model",
        "content": [
            {
                "toolRequest": {"name": "x", "ref": "1", "input": {}},
                "metadata": {"interrupt": {"why": "approval"}},
            }
        ],
    }
    message = roundtrip(Message, wire)
    assert message.metadata is None
    assert message.interrupts[0].tool_request == ToolRequest(name="x", ref="1", input={})


@pytest.mark.parametrize("role", ["system", "user", "model", "tool"])
def test_message_roles(role: str) -> None:
    assert roundtrip(Message, {"role": role, "content": [{"text": "a"}, {"text": "b"}]}).text == (
        "ab"
    )


def test_message_rejects_unknown_role() -> None:
    with pytest.raises(ValidationError):
        Message.model_validate({"role": "assistant", "content": []})


def test_finish_reason_values() -> None:
    assert [r.value for r in FinishReason] == [
        "stop",
        "length",
        "blocked",
        "interrupted",
        "other",
        "unknown",
        "aborted",
        "failed",
        "expired",
    ]
    assert FinishReason("interrupted") is FinishReason.INTERRUPTED
    with pytest.raises(ValueError, match="'paused' is not a valid FinishReason"):
        FinishReason("paused")


# -- agent input / output ---------------------------------------------------------------


def test_tool_resume_roundtrip() -> None:
    wire = {
        "respond": [
            {
                "toolResponse": {"name": "a", "ref": "1", "output": {"ok": True}},
                "metadata": {"interruptResponse": True},
            }
        ],
        "restart": [
            {
                "toolRequest": {"name": "b", "ref": "2", "input": {"n": 1}},
                "metadata": {"resumed": {"approved": True}},
            }
        ],
    }
    resume = roundtrip(ToolResume, wire)
    assert resume.respond[0].tool_response is not None
    assert resume.restart[0].meta("resumed") == {"approved": True}
    # An empty list is left out, as Genkit's JSON does (`omitempty`, zod's optional)
    assert ToolResume().model_dump(mode="json") == {}
    only = {"respond": wire["respond"]}
    assert roundtrip(ToolResume, only).restart == []
    assert roundtrip(AgentInput, {"resume": only}).model_dump(mode="json") == {"resume": only}


def test_agent_input_message_or_resume() -> None:
    with_message = roundtrip(AgentInput, {"message": {"role": "user", "content": [{"text": "hi"}]}})
    assert with_message.resume is None and with_message.message is not None
    with_resume = roundtrip(AgentInput, {"resume": {}})
    assert with_resume.message is None and with_resume.resume == ToolResume()


def test_agent_input_exactly_one() -> None:
    with pytest.raises(ValidationError, match="exactly one of message and resume"):
        AgentInput()
    with pytest.raises(ValidationError, match="exactly one of message and resume"):
        AgentInput.model_validate(
            {"message": {"role": "user", "content": [{"text": "hi"}]}, "resume": {}}
        )


def test_agent_output_roundtrip_and_interrupts() -> None:
    wire = {
        "finishReason": "interrupted",
        "message": GENKIT_INTERRUPTED_MESSAGE,
        "sessionId": "s1",
        "snapshotId": "snap1",
    }
    out = roundtrip(AgentOutput, wire)
    assert out.finish_reason is FinishReason.INTERRUPTED
    assert (out.session_id, out.snapshot_id, out.state) == ("s1", "snap1", None)
    assert [p.tool_request.name for p in out.interrupts if p.tool_request] == ["transferMoney"]
    assert out.text == "I need your approval first."


def test_model_dump_is_the_wire_form_and_by_alias_false_the_python_names() -> None:
    """As docs/concepts.md says: the default dump is camelCase with None left out."""
    out = AgentOutput(finish_reason=FinishReason.STOP, session_id="s1")
    assert out.model_dump(mode="json") == {"finishReason": "stop", "sessionId": "s1"}
    assert json.loads(out.model_dump_json()) == {"finishReason": "stop", "sessionId": "s1"}
    assert out.model_dump(mode="json", by_alias=False) == {
        "finish_reason": "stop",
        "session_id": "s1",
    }
    assert Part(text="hi").model_dump() == {"text": "hi"}
    assert AgentOutput.model_validate(out.model_dump(mode="json", by_alias=False)) == out


def test_agent_output_state_and_error() -> None:
    wire = {
        "finishReason": "failed",
        "state": "v1.abc.def",
        "error": {"status": "INVALID_ARGUMENT", "message": "bad"},
    }
    out = roundtrip(AgentOutput, wire)
    assert out.error is not None and out.error.status is Status.INVALID_ARGUMENT
    assert out.interrupts == [] and out.text == ""


def test_chunks_roundtrip() -> None:
    model_chunk = roundtrip(
        AgentChunk,
        {"modelChunk": {"role": "model", "content": [{"text": "Hel"}, {"text": "lo"}]}},
    )
    assert model_chunk.model_chunk is not None and model_chunk.model_chunk.text == "Hello"
    assert model_chunk.turn_end is None
    end = roundtrip(AgentChunk, {"turnEnd": {"finishReason": "interrupted", "snapshotId": "x"}})
    assert end.turn_end == TurnEnd(finish_reason=FinishReason.INTERRUPTED, snapshot_id="x")
    assert ModelChunk().role == "model"
    tool_chunk = roundtrip(
        ModelChunk,
        {"role": "tool", "content": [{"toolResponse": {"name": "a", "ref": "1", "output": 3}}]},
    )
    assert tool_chunk.text == ""


# -- snapshots, status, model I/O -------------------------------------------------------


def test_snapshot_roundtrip() -> None:
    wire = {
        "snapshotId": "snap-2",
        "sessionId": "sess-1",
        "parentId": "snap-1",
        "agent": "bankingAgent",
        "status": "completed",
        "finishReason": "interrupted",
        "messages": [{"role": "user", "content": [{"text": "hi"}]}, GENKIT_INTERRUPTED_MESSAGE],
        "error": {"status": "INTERNAL", "message": "x"},
        "createdAt": "2024-05-01T12:00:00Z",
        "updatedAt": "2024-05-01T12:00:01Z",
        "resumedBy": "worker-1",
        "inherited": 0,
    }
    snap = Snapshot.model_validate(wire)
    assert snap.status is SnapshotStatus.COMPLETED and snap.is_interrupted
    assert snap.created_at == datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
    assert snap.resumed_by == "worker-1"
    last = snap.last_model_message
    assert last is not None and len(last.interrupts) == 1
    dumped = snap.model_dump(mode="json")
    assert dumped["snapshotId"] == "snap-2" and dumped["parentId"] == "snap-1"
    assert dumped["finishReason"] == "interrupted" and dumped["resumedBy"] == "worker-1"
    assert Snapshot.model_validate(dumped) == snap
    assert Snapshot.model_validate_json(snap.model_dump_json()) == snap


def test_snapshot_status_values() -> None:
    assert [s.value for s in SnapshotStatus] == [
        "pending",
        "completed",
        "failed",
        "aborted",
        "expired",
    ]


def test_status_codes() -> None:
    names = [s.value for s in Status]
    assert names == [
        "OK",
        "CANCELLED",
        "UNKNOWN",
        "INVALID_ARGUMENT",
        "DEADLINE_EXCEEDED",
        "NOT_FOUND",
        "ALREADY_EXISTS",
        "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED",
        "FAILED_PRECONDITION",
        "ABORTED",
        "OUT_OF_RANGE",
        "UNIMPLEMENTED",
        "INTERNAL",
        "UNAVAILABLE",
        "DATA_LOSS",
        "UNAUTHENTICATED",
    ]
    assert Status.OK.code == 0 and Status.INVALID_ARGUMENT.code == 3
    assert Status.UNAUTHENTICATED.code == 16
    assert Status.NOT_FOUND.http_status == 404
    assert Status("PERMISSION_DENIED") is Status.PERMISSION_DENIED


def test_model_request_and_response_roundtrip() -> None:
    request = roundtrip(
        ModelRequest,
        {
            "messages": [{"role": "user", "content": [{"text": "hi"}]}],
            "tools": [
                {
                    "name": "t",
                    "description": "d",
                    "inputSchema": {"type": "object"},
                    "outputSchema": {"type": "string"},
                }
            ],
            "config": {"temperature": 0},
        },
    )
    assert request.tools[0] == ToolDefinition(
        name="t", description="d", input_schema={"type": "object"}, output_schema={"type": "string"}
    )
    response = ModelResponse.model_validate({"message": {"role": "model", "content": []}})
    assert response.finish_reason is FinishReason.STOP
    roundtrip(
        ModelResponse,
        {
            "message": {"role": "model", "content": [{"text": "x"}]},
            "finishReason": "length",
            "usage": {"inputTokens": 3, "outputTokens": 4, "totalTokens": 7},
        },
    )


# -- fields left out of the JSON ----------------------------------------------------------


def _wire_models() -> list[type[Any]]:
    """The wire models of the `schemas` package (not the subclasses tests define)."""
    from schemas._base import WireModel

    found: list[type[Any]] = []
    todo: list[type[Any]] = [WireModel]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in found:
                found.append(sub)
                todo.append(sub)
    return [model for model in found if model.__module__.split(".")[0] == "schemas"]


def test_every_wire_field_that_defaults_to_none_is_left_out_while_none() -> None:
    """Genkit's JSON leaves an unset field out; a field declared `x: T | None = None`
    without `Omittable` would put `"x": null` on the wire."""
    models = _wire_models()
    assert {Part, Message, Snapshot, ToolRequest, AgentOutput} <= set(models)
    missing = [
        f"{model.__name__}.{name}"
        for model in models
        for name, field in model.model_fields.items()
        if field.default is None and (field.exclude_if is None or not field.exclude_if(None))
    ]
    assert missing == []


def test_nulls_inside_json_values_are_kept() -> None:
    """Only unset fields are left out: a null inside a tool's input, output or data, or
    inside metadata, is part of the value."""
    part = Part(
        tool_request=ToolRequest(name="t", ref="1", input={"note": None, "xs": [None, 1]}),
        metadata={"k": None},
    )
    assert json.loads(part.model_dump_json()) == {
        "toolRequest": {"name": "t", "ref": "1", "input": {"note": None, "xs": [None, 1]}},
        "metadata": {"k": None},
    }
    response = ToolResponse(name="t", ref="1", output=None)
    assert response.model_dump(mode="json") == {"name": "t", "ref": "1"}


@pytest.mark.parametrize("micro", [0, 5, 123456])
def test_wire_time_writes_times_as_the_events_do(micro: int) -> None:
    """One formatter for every time on the wire: UTC with a "Z", as an event's own times
    are written; a naive time is UTC; `microseconds` always gives six digits, so such
    strings sort as the times do."""
    paris = datetime(2026, 3, 1, 13, 4, 5, micro, tzinfo=timezone(timedelta(hours=1)))
    naive = datetime(2026, 3, 1, 12, 4, 5, micro)
    written = json.loads(TurnExpired(occurred_at=paris).model_dump_json())["occurred_at"]
    assert wire_time(paris) == wire_time(naive) == written
    assert written.startswith("2026-03-01T12:04:05") and written.endswith("Z")
    assert wire_time(naive, microseconds=True) == f"2026-03-01T12:04:05.{micro:06d}Z"
