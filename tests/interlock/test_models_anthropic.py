"""The `anthropic` provider (official SDK, base URL pointed at a local server that speaks
the Messages API: tests/fake_llm_server.py): mapping, streaming, errors, retries, and the
banking agent's interrupt flow end to end."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator

import pytest

from examples.banking import ApprovalReply, TransferOutput, transferMoney
from interlock import (
    FinishReason,
    InMemorySessionStore,
    Interlock,
    Message,
    ModelChunk,
    ModelRequest,
    Part,
    Status,
    StatusError,
    ToolDefinition,
    ToolRequest,
    ToolResponse,
    ToolResume,
)
from interlock.models import ModelError, RetryPolicy
from interlock.models.anthropic import AnthropicModel, finish_reason
from tests.fake_llm_server import (
    FakeLLMServer,
    Reply,
    anthropic_error,
    anthropic_message,
    anthropic_stream,
    anthropic_text,
    anthropic_tool_pairs,
    anthropic_tool_use,
    split,
)

pytest.importorskip("anthropic")  # the optional extra; `make install` brings it

SYSTEM = "You are a banking assistant. Use transferMoney to move funds; it pauses for approval."
ASK = "Transfer $500 to my savings account."
TRANSFER = {"amount": 500, "toAccount": "savings"}
FAST = RetryPolicy(attempts=3, initial_delay=0.01, max_delay=0.02)


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeLLMServer]:
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "INTERLOCK_MODEL_MAX_ATTEMPTS"):
        monkeypatch.delenv(name, raising=False)
    with FakeLLMServer() as fake:
        yield fake


@pytest.fixture
def direct(server: FakeLLMServer) -> Iterator[AnthropicModel]:
    model = AnthropicModel(
        "anthropic/claude-test", api_key="sk-ant-test", base_url=server.url, retry=FAST
    )
    yield model
    model.close()


def request(*messages: Message, tools: list[ToolDefinition] | None = None) -> ModelRequest:
    return ModelRequest(messages=list(messages), tools=tools or [])


def user(text: str) -> Message:
    return Message(role="user", content=[Part(text=text)])


def keyed(headers: dict[str, str], key: str) -> bool:
    """The SDK sends the key as x-api-key (older releases) or a bearer token (newer)."""
    return headers.get("x-api-key") == key or headers.get("authorization") == f"Bearer {key}"


# -- text --------------------------------------------------------------------------------------


def test_plain_text_json(server: FakeLLMServer, direct: AnthropicModel) -> None:
    server.push(anthropic_message([{"type": "text", "text": "Hello! How can I help?"}]))
    system = Message(role="system", content=[Part(text="Be brief.")])
    out = direct.generate(request(system, user("Hi")))
    assert out.message.content == [Part(text="Hello! How can I help?")]
    assert out.finish_reason is FinishReason.STOP
    assert out.usage is not None
    assert (out.usage.input_tokens, out.usage.output_tokens) == (472, 89)
    (got,) = server.requests
    assert got.path == "/v1/messages"
    assert keyed(got.headers, "sk-ant-test")
    assert "anthropic-version" in got.headers
    assert got.body == {
        "model": "claude-test",
        "max_tokens": 4096,
        "system": "Be brief.",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
    }


def test_plain_text_streamed(server: FakeLLMServer, direct: AnthropicModel) -> None:
    server.push(anthropic_stream([{"type": "text", "text": "Hello there, friend."}], piece=4))
    chunks: list[ModelChunk] = []
    out = direct.generate(request(user("Hi")), chunks.append)
    assert out.message.text == "Hello there, friend."
    assert [c.text for c in chunks] == split("Hello there, friend.", 4)
    assert out.usage is not None and out.usage.output_tokens == 89
    assert server.requests[0].body["stream"] is True


def test_config_is_translated(server: FakeLLMServer, direct: AnthropicModel) -> None:
    server.push(anthropic_text("ok"))
    config = {"maxOutputTokens": 100, "topK": 5, "stopSequences": ["END"], "stream": False}
    direct.generate(ModelRequest(messages=[user("Hi")], config=config), lambda c: None)
    body = server.requests[0].body
    assert (body["max_tokens"], body["top_k"], body["stop_sequences"]) == (100, 5, ["END"])
    assert "stream" not in body  # `stream: false` in the config turns streaming off


# -- tool use ----------------------------------------------------------------------------------


def test_tool_use_json(server: FakeLLMServer, direct: AnthropicModel) -> None:
    server.push(anthropic_tool_use(("transferMoney", TRANSFER, "toolu_01A09q90qw90lq917835lq9")))
    out = direct.generate(request(user(ASK), tools=[transferMoney.definition()]))
    (part,) = out.message.content
    assert part.tool_request == ToolRequest(
        name="transferMoney", ref="toolu_01A09q90qw90lq917835lq9", input=TRANSFER
    )
    assert out.finish_reason is FinishReason.STOP
    (tool,) = server.requests[0].body["tools"]
    assert tool == {
        "name": "transferMoney",
        "description": transferMoney.description,
        "input_schema": transferMoney.definition().input_schema,
    }


def test_streamed_tool_use_split_mid_json_two_at_once(
    server: FakeLLMServer, direct: AnthropicModel
) -> None:
    second = {"amount": 25.5, "toAccount": 'checking "main"'}
    server.push(
        anthropic_stream(
            [
                {"type": "text", "text": "Both, then."},
                {"type": "tool_use", "id": "toolu_1", "name": "transferMoney", "input": TRANSFER},
                {"type": "tool_use", "id": "toolu_2", "name": "transferMoney", "input": second},
            ],
            stop_reason="tool_use",
            piece=3,
        )
    )
    chunks: list[ModelChunk] = []
    out = direct.generate(request(user(ASK)), chunks.append)
    assert out.message.text == "Both, then."
    requests = [p.tool_request for p in out.message.content if p.tool_request]
    assert requests == [
        ToolRequest(name="transferMoney", ref="toolu_1", input=TRANSFER),
        ToolRequest(name="transferMoney", ref="toolu_2", input=second),
    ]
    streamed = [p.tool_request for c in chunks for p in c.content if p.tool_request]
    assert streamed == requests  # each whole, as its block closes


def test_thinking_round_trips_with_its_signature(
    server: FakeLLMServer, direct: AnthropicModel
) -> None:
    server.push(
        anthropic_message(
            [
                {"type": "thinking", "thinking": "Needs approval.", "signature": "EqQBCgIYAhIM"},
                {"type": "tool_use", "id": "toolu_t", "name": "transferMoney", "input": TRANSFER},
            ],
            stop_reason="tool_use",
        )
    )
    out = direct.generate(request(user(ASK)))
    assert out.message.content[0].reasoning == "Needs approval."
    answer = Message(
        role="tool",
        content=[Part(tool_response=ToolResponse(name="transferMoney", ref="toolu_t", output={}))],
    )
    messages = direct.params(request(user(ASK), out.message, answer))["messages"]
    assert messages[1]["content"][0] == {
        "type": "thinking",
        "thinking": "Needs approval.",
        "signature": "EqQBCgIYAhIM",
    }


# -- stop reasons ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("wire", "ours"),
    [
        ("end_turn", FinishReason.STOP),
        ("tool_use", FinishReason.STOP),
        ("stop_sequence", FinishReason.STOP),
        ("max_tokens", FinishReason.LENGTH),
        ("refusal", FinishReason.BLOCKED),
        ("pause_turn", FinishReason.OTHER),
        (None, FinishReason.UNKNOWN),
    ],
)
def test_stop_reasons(wire: str | None, ours: FinishReason) -> None:
    assert finish_reason(wire) is ours


def test_refusal_and_max_tokens_on_the_wire(server: FakeLLMServer, direct: AnthropicModel) -> None:
    server.push(
        anthropic_stream(
            [{"type": "text", "text": "I can't help with that."}], stop_reason="refusal"
        ),
        anthropic_text("The history of banking", stop_reason="max_tokens"),
    )
    out = direct.generate(request(user("bad")), lambda c: None)
    assert (out.finish_reason, out.message.text) == (
        FinishReason.BLOCKED,
        "I can't help with that.",
    )
    out = direct.generate(request(user("long")))
    assert (out.finish_reason, out.message.text) == (FinishReason.LENGTH, "The history of banking")


def test_malformed_partial_json_keeps_the_raw_string(
    server: FakeLLMServer, direct: AnthropicModel, caplog: pytest.LogCaptureFixture
) -> None:
    bad = '{"amount": 500, "toAccount": '
    server.push(
        anthropic_stream(
            [
                {
                    "type": "tool_use",
                    "id": "toolu_bad",
                    "name": "transferMoney",
                    "input": {},
                    "raw": bad,
                }
            ],
            stop_reason="max_tokens",
        )
    )
    with caplog.at_level(logging.WARNING, logger="interlock.models"):
        out = direct.generate(request(user(ASK)), lambda c: None)
    (part,) = out.message.content
    assert part.tool_request == ToolRequest(name="transferMoney", ref="toolu_bad", input=bad)
    assert bad in caplog.text
    assert out.finish_reason is FinishReason.LENGTH


def test_a_pending_interrupt_is_never_sent(server: FakeLLMServer, direct: AnthropicModel) -> None:
    paused = Message(
        role="model",
        content=[
            Part(
                tool_request=ToolRequest(name="transferMoney", ref="toolu_1", input=TRANSFER),
                metadata={"interrupt": {"action": "transferMoney"}},
            )
        ],
    )
    with pytest.raises(StatusError) as info:
        direct.generate(request(user(ASK), paused, user("well?")), lambda c: None)
    assert info.value.status is Status.FAILED_PRECONDITION
    assert server.requests == []


# -- errors ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "kind", "status"),
    [
        (400, "invalid_request_error", Status.INVALID_ARGUMENT),
        (401, "authentication_error", Status.UNAUTHENTICATED),
        (403, "permission_error", Status.PERMISSION_DENIED),
        (404, "not_found_error", Status.NOT_FOUND),
    ],
)
def test_client_errors_map_and_are_not_retried(
    server: FakeLLMServer, direct: AnthropicModel, code: int, kind: str, status: Status
) -> None:
    server.push(anthropic_error(code, kind, f"provider says {code}"))
    with pytest.raises(ModelError) as info:
        direct.generate(request(user("Hi")), lambda c: None)
    assert info.value.status is status
    assert info.value.http_status == code
    assert f"provider says {code}" in info.value.message
    assert len(server.requests) == 1


def test_429_retried_after_retry_after(server: FakeLLMServer, direct: AnthropicModel) -> None:
    server.push(
        anthropic_error(
            429, "rate_limit_error", "Number of requests exceeded", headers={"retry-after": "0"}
        ),
        anthropic_text("finally"),
    )
    assert direct.generate(request(user("Hi")), lambda c: None).message.text == "finally"
    assert len(server.requests) == 2


def test_overloaded_is_retried_then_unavailable(
    server: FakeLLMServer, direct: AnthropicModel
) -> None:
    for _ in range(3):
        server.push(anthropic_error(529, "overloaded_error", "Overloaded"))
    with pytest.raises(ModelError) as info:
        direct.generate(request(user("Hi")), lambda c: None)
    assert info.value.status is Status.UNAVAILABLE
    assert "Overloaded" in info.value.message and "after 3 attempts" in info.value.message
    assert len(server.requests) == 3


def test_500_then_success(server: FakeLLMServer, direct: AnthropicModel) -> None:
    server.push(anthropic_error(500, "api_error", "Internal server error"), anthropic_text("ok"))
    assert direct.generate(request(user("Hi"))).message.text == "ok"


def test_error_event_after_text_is_not_retried(
    server: FakeLLMServer, direct: AnthropicModel
) -> None:
    stream = anthropic_stream([{"type": "text", "text": "Partial answer"}], piece=20)
    assert stream.events is not None
    events = stream.events[:4]  # message_start, block start, ping, one text delta
    events.append(
        ("error", {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
    )
    server.push(Reply(events=events), anthropic_text("never"))
    chunks: list[ModelChunk] = []
    with pytest.raises(ModelError) as info:
        direct.generate(request(user("Hi")), chunks.append)
    assert info.value.status is Status.UNAVAILABLE
    assert "not retried" in info.value.message
    assert [c.text for c in chunks] == ["Partial answer"]
    assert len(server.requests) == 1


def test_timeout_is_deadline_exceeded(server: FakeLLMServer) -> None:
    model = AnthropicModel(
        "anthropic/claude-test",
        api_key="k",
        base_url=server.url,
        timeout=0.2,
        retry=RetryPolicy(attempts=2, initial_delay=0.01),
    )
    server.push(Reply(body={}, delay=2), Reply(body={}, delay=2))
    try:
        with pytest.raises(ModelError) as info:
            model.generate(request(user("Hi")), lambda c: None)
    finally:
        model.close()
    assert info.value.status is Status.DEADLINE_EXCEEDED
    assert len(server.requests) == 2


# -- choosing the model --------------------------------------------------------------------------


def test_missing_key_names_the_variable(server: FakeLLMServer, registries: list[Interlock]) -> None:
    ai = Interlock()
    registries.append(ai)
    with pytest.raises(StatusError) as info:
        ai.lookup_model("anthropic/claude-test")
    assert info.value.status is Status.UNAUTHENTICATED
    assert info.value.message == (
        "ANTHROPIC_API_KEY is not set; export it to use anthropic/claude-test"
    )
    assert server.requests == []


def test_missing_package_says_how_to_install(
    monkeypatch: pytest.MonkeyPatch, registries: list[Interlock]
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "k")
    monkeypatch.setitem(sys.modules, "anthropic", None)  # import anthropic -> ImportError
    ai = Interlock()
    registries.append(ai)
    with pytest.raises(StatusError) as info:
        ai.lookup_model("anthropic/claude-test")
    assert info.value.status is Status.FAILED_PRECONDITION
    assert info.value.message == (
        "the anthropic provider needs the anthropic package: pip install 'interlock[anthropic]'"
    )


# -- the banking flow ------------------------------------------------------------------------------


def _agent(
    server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch, registries: list[Interlock]
) -> Interlock:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", server.url)
    ai = Interlock()
    registries.append(ai)
    ai.define_agent(
        "bankingAgent",
        model="anthropic/claude-test",
        system=SYSTEM,
        tools=[transferMoney],
        store=InMemorySessionStore(),
    )
    return ai


@pytest.mark.parametrize("answer", ["restart", "respond"])
def test_banking_flow(
    answer: str,
    server: FakeLLMServer,
    monkeypatch: pytest.MonkeyPatch,
    registries: list[Interlock],
) -> None:
    agent = _agent(server, monkeypatch, registries).lookup_agent("bankingAgent")
    server.push(
        anthropic_tool_use(("transferMoney", TRANSFER, "toolu_01Xf3"), text="Let me set that up."),
        anthropic_text("Done: $500.00 moved to savings."),
    )
    out = agent.run_text(ASK)
    assert out.finish_reason is FinishReason.INTERRUPTED
    (part,) = out.interrupts
    assert part.tool_request == ToolRequest(name="transferMoney", ref="toolu_01Xf3", input=TRANSFER)
    assert len(server.requests) == 1
    if answer == "restart":
        resume = ToolResume(restart=[transferMoney.resume(part, ApprovalReply(approved=True))])
    else:
        output = TransferOutput(success=True, transaction_id="txn-9")
        resume = ToolResume(respond=[transferMoney.respond(part, output)])
    final = agent.run(resume, session_id=out.session_id)
    assert (final.finish_reason, final.text) == (
        FinishReason.STOP,
        "Done: $500.00 moved to savings.",
    )

    first, second = server.requests
    assert first.body["system"] == SYSTEM == second.body["system"]
    assert anthropic_tool_pairs(first.body) == []
    assert [m["role"] for m in first.body["messages"]] == ["user"]
    messages = second.body["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert messages[1]["content"] == [
        {"type": "text", "text": "Let me set that up."},
        {"type": "tool_use", "id": "toolu_01Xf3", "name": "transferMoney", "input": TRANSFER},
    ]
    assert anthropic_tool_pairs(second.body) == [("toolu_01Xf3", "toolu_01Xf3")]
    (result,) = messages[2]["content"]
    output = json.loads(result["content"])
    assert output["success"] is True
    if answer == "respond":
        assert output["transactionId"] == "txn-9"
    assert "resolvedInterrupt" not in json.dumps(second.body)


def test_streaming_reaches_the_connection(
    server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch, registries: list[Interlock]
) -> None:
    agent = _agent(server, monkeypatch, registries).lookup_agent("bankingAgent")
    server.push(
        anthropic_tool_use(("transferMoney", TRANSFER, "toolu_s"), text="One moment please."),
        anthropic_text("All done, transfer complete."),
    )
    with agent.connect() as conn:
        conn.send_text(ASK)
        chunks = list(conn.receive())
        texts = [c.model_chunk.text for c in chunks if c.model_chunk and c.model_chunk.text]
        assert texts == split("One moment please.", 6)
        assert chunks[-1].turn_end is not None
        part = conn.output().interrupts[0]
        conn.send_resume(
            ToolResume(restart=[transferMoney.resume(part, ApprovalReply(approved=True))])
        )
        chunks = list(conn.receive())
        texts = [c.model_chunk.text for c in chunks if c.model_chunk and c.model_chunk.text]
        assert texts == split("All done, transfer complete.", 6)
        assert conn.output().text == "All done, transfer complete."
