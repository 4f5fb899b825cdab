"""The `openai` provider and its presets (`googleai`, `ollama`) against a local server
that speaks Chat Completions (tests/fake_llm_server.py): the wire mapping both ways,
streaming, errors and retries, and the banking agent's interrupt flow end to end."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner
from pydantic import BaseModel

from examples.banking import ApprovalReply, TransferOutput, transferMoney
from interlock import (
    Agent,
    AgentChunk,
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
    ToolFailedError,
    ToolRequest,
    ToolResponse,
    ToolResume,
    status_of,
)
from interlock.models import ModelError, RetryPolicy
from interlock.models.openai import OpenAIModel, finish_reason
from tests.fake_llm_server import (
    FakeLLMServer,
    Reply,
    openai_chunk,
    openai_completion,
    openai_error,
    openai_stream,
    openai_text,
    openai_tool_calls,
    openai_tool_pairs,
    split,
)

SYSTEM = "You are a banking assistant. Use transferMoney to move funds; it pauses for approval."
ASK = "Transfer $500 to my savings account."
TRANSFER = {"amount": 500, "toAccount": "savings"}
FAST = RetryPolicy(attempts=3, initial_delay=0.01, max_delay=0.02)

ENV_VARS = (
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "GEMINI_API_KEY",
    "GOOGLE_API_KEY",
    "GEMINI_BASE_URL",
    "OLLAMA_BASE_URL",
    "OLLAMA_API_KEY",
    "INTERLOCK_MODEL_MAX_ATTEMPTS",
    "INTERLOCK_MODEL_TIMEOUT",
)


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeLLMServer]:
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    with FakeLLMServer() as fake:
        yield fake


@pytest.fixture
def direct(server: FakeLLMServer) -> Iterator[OpenAIModel]:
    """`openai/gpt-4o-mini` on the fake server, with fast retries."""
    model = OpenAIModel(
        "openai/gpt-4o-mini",
        base_url=f"{server.url}/v1",
        api_key="sk-test",
        retry=FAST,
        timeout=5,
    )
    yield model
    model.close()


class Balance(BaseModel):
    account: str


class BalanceOut(BaseModel):
    balance: float


def banking(model: str, registries: list[Interlock]) -> tuple[Agent, list[str]]:
    """An agent like `bankingAgent`, on `model`, with a second (ordinary) tool; returns
    it and the list of accounts `getBalance` was run for."""
    ai = Interlock()
    registries.append(ai)
    runs: list[str] = []

    @ai.tool(name="getBalance", description="The balance of an account.")
    def get_balance(inp: Balance) -> BalanceOut:
        runs.append(inp.account)
        return BalanceOut(balance=1234.5)

    agent = ai.define_agent(
        "bankingAgent",
        model=model,
        system=SYSTEM,
        tools=[transferMoney, get_balance],
        store=InMemorySessionStore(),
    )
    return agent, runs


def request(*messages: Message, tools: list[ToolDefinition] | None = None) -> ModelRequest:
    return ModelRequest(messages=list(messages), tools=tools or [])


def user(text: str) -> Message:
    return Message(role="user", content=[Part(text=text)])


# -- plain text ------------------------------------------------------------------------------


def test_plain_text_json(server: FakeLLMServer, direct: OpenAIModel) -> None:
    server.push(openai_completion(content="Hello! How can I help?", usage=(19, 10)))
    system = Message(role="system", content=[Part(text="Be brief.")])
    out = direct.generate(request(system, user("Hi")))
    assert out.message.role == "model"
    assert out.message.content == [Part(text="Hello! How can I help?")]
    assert out.finish_reason is FinishReason.STOP
    assert out.usage is not None
    assert (out.usage.input_tokens, out.usage.output_tokens, out.usage.total_tokens) == (19, 10, 29)
    (got,) = server.requests
    assert got.path == "/v1/chat/completions"
    assert got.headers["authorization"] == "Bearer sk-test"
    assert got.body == {
        "model": "gpt-4o-mini",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
        ],
    }


def test_plain_text_streamed(server: FakeLLMServer, direct: OpenAIModel) -> None:
    server.push(openai_text("Hello there, friend.", piece=3))
    chunks: list[ModelChunk] = []
    out = direct.generate(request(user("Hi")), chunks.append)
    assert out.message.text == "Hello there, friend."
    assert [c.text for c in chunks] == ["Hel", "lo ", "the", "re,", " fr", "ien", "d."]
    assert out.usage is not None and out.usage.total_tokens == 98
    body = server.requests[0].body
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert server.requests[0].headers["accept"] == "text/event-stream"


def test_config_is_translated_and_passed_through(
    server: FakeLLMServer, direct: OpenAIModel
) -> None:
    server.push(openai_completion(content="ok"))
    direct.generate(
        ModelRequest(
            messages=[user("Hi")],
            config={"temperature": 0.2, "maxOutputTokens": 50, "topK": 3, "seed": 7},
        )
    )
    body = server.requests[0].body
    assert body["temperature"] == 0.2
    assert body["max_tokens"] == 50  # the preset for api.openai.com: max_completion_tokens
    assert body["seed"] == 7
    assert "topK" not in body and "top_k" not in body


# -- tool calls ------------------------------------------------------------------------------


def test_tool_call_json(server: FakeLLMServer, direct: OpenAIModel) -> None:
    server.push(openai_tool_calls(("transferMoney", TRANSFER, "call_Xf3Jq8")))
    out = direct.generate(request(user(ASK), tools=[transferMoney.definition()]))
    (part,) = out.message.content
    assert part.tool_request == ToolRequest(name="transferMoney", ref="call_Xf3Jq8", input=TRANSFER)
    assert out.finish_reason is FinishReason.STOP  # tool_calls: the loop decides by requests
    (tool,) = server.requests[0].body["tools"]
    assert tool == {
        "type": "function",
        "function": {
            "name": "transferMoney",
            "description": transferMoney.description,
            "parameters": transferMoney.definition().input_schema,
        },
    }
    assert tool["function"]["parameters"]["required"] == ["amount", "toAccount"]


def test_streamed_tool_call_deltas_are_assembled(
    server: FakeLLMServer, direct: OpenAIModel
) -> None:
    """id, type and name come only in a call's first delta; the arguments are cut every
    few characters, mid-JSON; two calls are made at once."""
    second = {"amount": 25.5, "toAccount": 'checking "main"'}
    server.push(
        openai_tool_calls(
            ("transferMoney", TRANSFER, "call_one"),
            ("transferMoney", second, "call_two"),
            text="Both, then.",
            piece=3,
        )
    )
    chunks: list[ModelChunk] = []
    out = direct.generate(request(user(ASK), tools=[transferMoney.definition()]), chunks.append)
    assert out.message.text == "Both, then."
    requests = [p.tool_request for p in out.message.content if p.tool_request]
    assert requests == [
        ToolRequest(name="transferMoney", ref="call_one", input=TRANSFER),
        ToolRequest(name="transferMoney", ref="call_two", input=second),
    ]
    # Text streamed as it came; the calls arrive whole, with their refs, in one chunk.
    assert "".join(c.text for c in chunks) == "Both, then."
    assert [p.tool_request for p in chunks[-1].content] == requests


def test_two_parallel_calls_json(server: FakeLLMServer, direct: OpenAIModel) -> None:
    server.push(
        openai_tool_calls(
            ("getBalance", {"account": "savings"}, "call_a"),
            ("transferMoney", TRANSFER, "call_b"),
        )
    )
    out = direct.generate(request(user("check and move")))
    assert [
        (p.tool_request.ref, p.tool_request.name) for p in out.message.content if p.tool_request
    ] == [
        ("call_a", "getBalance"),
        ("call_b", "transferMoney"),
    ]


def test_calls_sent_whole_without_index_and_extra_content(
    server: FakeLLMServer, direct: OpenAIModel
) -> None:
    """Gemini's compatible endpoint: each call whole in one delta, no index, with a thought
    signature in `extra_content` that must go back with the call."""
    extra = {"google": {"thought_signature": "CiQBcsjafDk0gQkz"}}
    calls = [
        {
            "extra_content": extra,
            "function": {"arguments": json.dumps(TRANSFER), "name": "transferMoney"},
            "id": "function-call-1",
            "type": "function",
        },
        {
            "function": {"arguments": '{"account":"savings"}', "name": "getBalance"},
            "id": "function-call-2",
            "type": "function",
        },
    ]
    server.push(
        openai_stream(
            [
                openai_chunk({"role": "assistant", "tool_calls": calls}, "tool_calls"),
            ]
        )
    )
    out = direct.generate(request(user(ASK)), lambda c: None)
    first, second = out.message.content
    assert first.tool_request == ToolRequest(
        name="transferMoney", ref="function-call-1", input=TRANSFER
    )
    assert first.metadata == {"openai": {"extra_content": extra}}
    assert second.tool_request is not None and second.tool_request.ref == "function-call-2"
    # ... and back: the signature rides with the call in the next request.
    history = [
        user(ASK),
        out.message,
        Message(
            role="tool",
            content=[
                Part(
                    tool_response=ToolResponse(
                        name="transferMoney", ref="function-call-1", output={"success": True}
                    )
                ),
                Part(
                    tool_response=ToolResponse(
                        name="getBalance", ref="function-call-2", output={"balance": 1}
                    )
                ),
            ],
        ),
    ]
    wire = direct.body(request(*history))["messages"]
    assert wire[1]["tool_calls"][0]["extra_content"] == extra
    assert "extra_content" not in wire[1]["tool_calls"][1]
    assert [m.get("tool_call_id") for m in wire[2:]] == ["function-call-1", "function-call-2"]


# -- finish reasons, refusals ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("wire", "ours"),
    [
        ("stop", FinishReason.STOP),
        ("length", FinishReason.LENGTH),
        ("tool_calls", FinishReason.STOP),
        ("content_filter", FinishReason.BLOCKED),
        ("something_new", FinishReason.OTHER),
        (None, FinishReason.UNKNOWN),
    ],
)
def test_finish_reasons(wire: str | None, ours: FinishReason) -> None:
    assert finish_reason(wire) is ours


def test_refusal_is_blocked_and_kept_as_text(server: FakeLLMServer, direct: OpenAIModel) -> None:
    refusal = "I'm sorry, I can't help with that."
    server.push(openai_completion(content=None, refusal=refusal))
    out = direct.generate(request(user("something bad")))
    assert out.finish_reason is FinishReason.BLOCKED
    assert out.message.content == [Part(text=refusal)]
    # streamed, the refusal comes in `delta.refusal`
    server.push(
        openai_stream(
            [
                openai_chunk({"role": "assistant", "content": None, "refusal": ""}),
                openai_chunk({"refusal": "I'm sorry, "}),
                openai_chunk({"refusal": "I can't help with that."}),
                openai_chunk({}, "stop"),
            ]
        )
    )
    chunks: list[ModelChunk] = []
    out = direct.generate(request(user("something bad")), chunks.append)
    assert out.finish_reason is FinishReason.BLOCKED
    assert out.message.text == refusal
    assert "".join(c.text for c in chunks) == refusal


def test_length_finish(server: FakeLLMServer, direct: OpenAIModel) -> None:
    server.push(
        openai_stream(
            [openai_chunk({"content": "The history of banking begins"}), openai_chunk({}, "length")]
        )
    )
    out = direct.generate(request(user("Tell me everything")), lambda c: None)
    assert out.finish_reason is FinishReason.LENGTH
    assert out.message.text == "The history of banking begins"


# -- malformed tool arguments ------------------------------------------------------------------

BAD_JSON = '{"amount": 500, "toAccount": "savings"'


def test_malformed_arguments_keep_the_call_with_the_raw_string(
    server: FakeLLMServer, direct: OpenAIModel, caplog: pytest.LogCaptureFixture
) -> None:
    server.push(openai_tool_calls(("transferMoney", BAD_JSON, "call_bad"), piece=5))
    with caplog.at_level(logging.WARNING, logger="interlock.models"):
        out = direct.generate(request(user(ASK)), lambda c: None)
    (part,) = out.message.content
    assert part.tool_request == ToolRequest(name="transferMoney", ref="call_bad", input=BAD_JSON)
    assert BAD_JSON in caplog.text and "malformed JSON" in caplog.text
    # The call goes back exactly as the model sent it.
    call = direct.body(request(user(ASK), out.message, _answer("call_bad")))["messages"][1]
    assert call["tool_calls"][0]["function"]["arguments"] == BAD_JSON


def _answer(ref: str, name: str = "transferMoney") -> Message:
    return Message(
        role="tool", content=[Part(tool_response=ToolResponse(name=name, ref=ref, output={}))]
    )


def test_malformed_arguments_fail_the_tool_with_invalid_argument(
    server: FakeLLMServer, registries: list[Interlock], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("OPENAI_BASE_URL", f"{server.url}/v1")
    agent, _ = banking("openai/test-model", registries)
    server.push(openai_tool_calls(("transferMoney", BAD_JSON, "call_bad")))
    with pytest.raises(ToolFailedError) as info:
        agent.run_text(ASK)
    assert status_of(info.value) is Status.INVALID_ARGUMENT
    assert "invalid input for tool 'transferMoney'" in info.value.message
    assert f"the model sent arguments that are not JSON: {BAD_JSON!r}" in info.value.message
    assert agent.store is not None and info.value.snapshot_id is not None
    failed = agent.store.get_snapshot(info.value.snapshot_id)
    assert failed is not None
    (call,) = [p for p in failed.messages[-1].content if p.tool_request]
    assert call.tool_request is not None and call.tool_request.input == BAD_JSON


# -- the history guard -----------------------------------------------------------------------


def test_a_pending_interrupt_is_never_sent_as_completed(
    server: FakeLLMServer, direct: OpenAIModel
) -> None:
    paused = Message(
        role="model",
        content=[
            Part(
                tool_request=ToolRequest(name="transferMoney", ref="call_1", input=TRANSFER),
                metadata={"interrupt": {"action": "transferMoney"}},
            )
        ],
    )
    with pytest.raises(StatusError) as info:
        direct.generate(request(user(ASK), paused, user("and now?")))
    assert info.value.status is Status.FAILED_PRECONDITION
    assert "pending interrupt" in info.value.message
    unanswered = Message(
        role="model", content=[paused.content[0].model_copy(update={"metadata": None})]
    )
    with pytest.raises(StatusError, match="has no tool response"):
        direct.generate(request(user(ASK), unanswered, user("and now?")))
    assert server.requests == []


# -- errors and retries ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "kind", "status"),
    [
        (400, "invalid_request_error", Status.INVALID_ARGUMENT),
        (401, "invalid_request_error", Status.UNAUTHENTICATED),
        (403, "permission_error", Status.PERMISSION_DENIED),
        (404, "invalid_request_error", Status.NOT_FOUND),
    ],
)
def test_client_errors_map_and_are_not_retried(
    server: FakeLLMServer, direct: OpenAIModel, code: int, kind: str, status: Status
) -> None:
    message = f"provider says {code}: Incorrect API key provided: sk-test."
    server.push(openai_error(code, message, type=kind, code="invalid_api_key"))
    with pytest.raises(ModelError) as info:
        direct.generate(request(user("Hi")), lambda c: None)
    assert info.value.status is status
    assert info.value.http_status == code
    assert message in info.value.message
    assert len(server.requests) == 1


def test_429_is_retried_after_retry_after(server: FakeLLMServer, direct: OpenAIModel) -> None:
    server.push(
        openai_error(
            429,
            "Rate limit reached for gpt-4o-mini on requests per min (RPM): Limit 3.",
            type="requests",
            code="rate_limit_exceeded",
            headers={"Retry-After": "0"},
        ),
        openai_text("finally"),
    )
    out = direct.generate(request(user("Hi")), lambda c: None)
    assert out.message.text == "finally"
    assert len(server.requests) == 2


def test_429_asking_too_long_a_wait_is_not_retried(
    server: FakeLLMServer, direct: OpenAIModel
) -> None:
    server.push(
        openai_error(429, "quota", type="requests", headers={"Retry-After": "3600"}),
        openai_text("never"),
    )
    with pytest.raises(ModelError) as info:
        direct.generate(request(user("Hi")))
    assert info.value.status is Status.RESOURCE_EXHAUSTED
    assert "asks to wait 3600s" in info.value.message
    assert len(server.requests) == 1


def test_500_is_retried_then_unavailable(server: FakeLLMServer, direct: OpenAIModel) -> None:
    for _ in range(3):
        server.push(openai_error(500, "The server had an error.", type="server_error"))
    with pytest.raises(ModelError) as info:
        direct.generate(request(user("Hi")), lambda c: None)
    assert info.value.status is Status.UNAVAILABLE
    assert "The server had an error." in info.value.message
    assert "after 3 attempts" in info.value.message
    assert len(server.requests) == 3


def test_503_then_success(server: FakeLLMServer, direct: OpenAIModel) -> None:
    server.push(Reply(503, "upstream connect error"), openai_text("ok"))
    assert direct.generate(request(user("Hi"))).message.text == "ok"
    assert len(server.requests) == 2


def test_timeout_is_deadline_exceeded(server: FakeLLMServer) -> None:
    model = OpenAIModel(
        "openai/gpt-4o-mini",
        base_url=f"{server.url}/v1",
        api_key="sk-test",
        retry=RetryPolicy(attempts=2, initial_delay=0.01),
        timeout=0.2,
    )
    server.push(Reply(body={}, delay=2), Reply(body={}, delay=2))
    try:
        with pytest.raises(ModelError) as info:
            model.generate(request(user("Hi")), lambda c: None)
    finally:
        model.close()
    assert info.value.status is Status.DEADLINE_EXCEEDED
    assert "within 0.2s" in info.value.message
    assert len(server.requests) == 2


def test_connection_refused_is_unavailable(server: FakeLLMServer) -> None:
    url = server.url
    server.stop()
    model = OpenAIModel(
        "openai/gpt-4o-mini", base_url=f"{url}/v1", api_key="k", retry=RetryPolicy(attempts=1)
    )
    try:
        with pytest.raises(ModelError) as info:
            model.generate(request(user("Hi")))
    finally:
        model.close()
    assert info.value.status is Status.UNAVAILABLE
    assert "cannot reach" in info.value.message


def test_no_retry_once_the_stream_has_started(server: FakeLLMServer, direct: OpenAIModel) -> None:
    """An error after chunks reached the caller is not retried: the caller would see the
    same text twice."""
    server.push(
        openai_stream(
            [
                openai_chunk({"role": "assistant", "content": "Partial an"}),
                {"error": {"message": "The server had an error.", "type": "server_error"}},
            ],
            done=False,
        ),
        openai_text("never"),
    )
    chunks: list[ModelChunk] = []
    with pytest.raises(ModelError) as info:
        direct.generate(request(user("Hi")), chunks.append)
    assert info.value.status is Status.UNAVAILABLE
    assert "not retried" in info.value.message
    assert [c.text for c in chunks] == ["Partial an"]
    assert len(server.requests) == 1


def test_stream_error_before_any_chunk_is_retried(
    server: FakeLLMServer, direct: OpenAIModel
) -> None:
    server.push(
        openai_stream([{"error": {"message": "overloaded", "type": "server_error"}}], done=False),
        openai_text("ok"),
    )
    assert direct.generate(request(user("Hi")), lambda c: None).message.text == "ok"
    assert len(server.requests) == 2


def test_attempts_from_the_environment(
    server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("INTERLOCK_MODEL_MAX_ATTEMPTS", "1")
    model = OpenAIModel("openai/x", base_url=f"{server.url}/v1", api_key="k")
    server.push(openai_error(500, "boom", type="server_error"), openai_text("never"))
    try:
        with pytest.raises(ModelError):
            model.generate(request(user("Hi")))
    finally:
        model.close()
    assert len(server.requests) == 1


# -- choosing a model: providers, keys ----------------------------------------------------------


def test_missing_key_names_the_variable_before_any_network(
    server: FakeLLMServer, registries: list[Interlock]
) -> None:
    ai = Interlock()
    registries.append(ai)
    with pytest.raises(StatusError) as info:
        ai.lookup_model("openai/gpt-4o-mini")
    assert info.value.status is Status.UNAUTHENTICATED
    assert info.value.message == "OPENAI_API_KEY is not set; export it to use openai/gpt-4o-mini"
    agent = ai.define_agent("a", model="googleai/gemini-flash-latest", store=InMemorySessionStore())
    with pytest.raises(StatusError) as info:
        agent.run_text("hi")
    assert info.value.status is Status.UNAUTHENTICATED
    assert info.value.message == (
        "GEMINI_API_KEY is not set (GOOGLE_API_KEY is also accepted); "
        "export it to use googleai/gemini-flash-latest"
    )
    assert server.requests == []


def test_presets_resolve_from_the_environment(
    server: FakeLLMServer, registries: list[Interlock], monkeypatch: pytest.MonkeyPatch
) -> None:
    ai = Interlock()
    registries.append(ai)
    monkeypatch.setenv("GOOGLE_API_KEY", "g-key")
    gemini = ai.lookup_model("googleai/gemini-flash-latest")
    assert isinstance(gemini, OpenAIModel)
    assert gemini.base_url == "https://generativelanguage.googleapis.com/v1beta/openai"
    assert (gemini.api_key, gemini.model) == ("g-key", "gemini-flash-latest")
    ollama = ai.lookup_model("ollama/llama3.1:8b")
    assert isinstance(ollama, OpenAIModel)
    assert (ollama.base_url, ollama.api_key) == ("http://localhost:11434/v1", None)
    monkeypatch.setenv("OLLAMA_BASE_URL", "http://gpu-box:11434/")
    assert Interlock().lookup_model("ollama/x").base_url == "http://gpu-box:11434/v1"  # type: ignore[attr-defined]
    monkeypatch.setenv("OPENAI_API_KEY", "sk-1")
    openai = ai.lookup_model("openai/gpt-4o-mini")
    assert isinstance(openai, OpenAIModel)
    assert openai.base_url == "https://api.openai.com/v1"
    assert openai.max_tokens_field == "max_completion_tokens"
    assert server.requests == []


def test_hand_defined_models_win_over_providers(registries: list[Interlock]) -> None:
    ai = Interlock()
    registries.append(ai)
    mine = ai.define_model("openai/mine", lambda request: Message(role="model", content=[]))
    assert ai.lookup_model("openai/mine") is mine


# -- the banking flow over each provider ---------------------------------------------------------

PROVIDERS = {
    "openai": ("openai/test-model", "/v1/chat/completions", "Bearer sk-test"),
    "googleai": (
        "googleai/gemini-flash-latest",
        "/v1beta/openai/chat/completions",
        "Bearer gm-test",
    ),
    "ollama": ("ollama/llama3.1", "/v1/chat/completions", None),
}


def _point(provider: str, server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch) -> None:
    if provider == "openai":
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
        monkeypatch.setenv("OPENAI_BASE_URL", f"{server.url}/v1")
    elif provider == "googleai":
        monkeypatch.setenv("GEMINI_API_KEY", "gm-test")
        monkeypatch.setenv("GEMINI_BASE_URL", f"{server.url}/v1beta/openai")
    else:
        monkeypatch.setenv("OLLAMA_BASE_URL", server.url)  # the root URL; /v1 is added


@pytest.mark.parametrize("provider", list(PROVIDERS))
@pytest.mark.parametrize("answer", ["restart", "respond"])
def test_banking_flow(
    provider: str,
    answer: str,
    server: FakeLLMServer,
    registries: list[Interlock],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model, path, auth = PROVIDERS[provider]
    _point(provider, server, monkeypatch)
    agent, _ = banking(model, registries)
    server.push(
        openai_tool_calls(("transferMoney", TRANSFER, "call_Xf3Jq8"), text="Let me set that up."),
        openai_text("Done: $500.00 moved to savings."),
    )
    out = agent.run_text(ASK)
    assert out.finish_reason is FinishReason.INTERRUPTED
    (part,) = out.interrupts
    assert part.tool_request == ToolRequest(name="transferMoney", ref="call_Xf3Jq8", input=TRANSFER)
    assert part.meta("interrupt") == {
        "action": "transferMoney",
        "details": "Transfer $500.00 to savings",
    }
    assert out.text == "Let me set that up."
    assert len(server.requests) == 1

    if answer == "restart":
        reply = transferMoney.resume(part, ApprovalReply(approved=True))
        final = agent.run(ToolResume(restart=[reply]), session_id=out.session_id)
    else:
        reply = transferMoney.respond(part, TransferOutput(success=True, transaction_id="txn-9"))
        final = agent.run(ToolResume(respond=[reply]), session_id=out.session_id)
    assert final.finish_reason is FinishReason.STOP
    assert final.text == "Done: $500.00 moved to savings."

    first, second = server.requests
    for got in (first, second):
        assert got.path == path
        assert got.headers.get("authorization") == auth
        assert got.body["model"] == model.partition("/")[2]
        assert [t["function"]["name"] for t in got.body["tools"]] == [
            "transferMoney",
            "getBalance",
        ]
    # Before the resume: no tool call, no tool result.
    assert [m["role"] for m in first.body["messages"]] == ["system", "user"]
    assert openai_tool_pairs(first.body) == []
    # After it: the one call, answered once, under the model's call id.
    messages = second.body["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool"]
    assert messages[2] == {
        "role": "assistant",
        "content": "Let me set that up.",
        "tool_calls": [
            {
                "id": "call_Xf3Jq8",
                "type": "function",
                "function": {
                    "name": "transferMoney",
                    "arguments": json.dumps(TRANSFER).replace(" ", ""),
                },
            }
        ],
    }
    assert openai_tool_pairs(second.body) == [("call_Xf3Jq8", "call_Xf3Jq8")]
    result = json.loads(messages[3]["content"])
    if answer == "restart":
        assert result["success"] is True and result["transactionId"].startswith("txn-")
    else:
        assert result == {"success": True, "transactionId": "txn-9"}
    wire = json.dumps(second.body)
    assert "resolvedInterrupt" not in wire and "pendingOutput" not in wire


def test_parallel_calls_one_completed_one_interrupted(
    server: FakeLLMServer, registries: list[Interlock], monkeypatch: pytest.MonkeyPatch
) -> None:
    """getBalance runs at once (its output waits as pendingOutput); transferMoney pauses.
    Nothing is sent until the resume; then both calls go with both results, and
    getBalance is not run again."""
    _point("openai", server, monkeypatch)
    agent, runs = banking("openai/test-model", registries)
    server.push(
        openai_tool_calls(
            ("getBalance", {"account": "savings"}, "call_bal"),
            ("transferMoney", TRANSFER, "call_xfer"),
        ),
        openai_text("Balance 1234.50; transfer done."),
    )
    out = agent.run_text("Check my savings and move $500 there.")
    assert out.finish_reason is FinishReason.INTERRUPTED
    assert [p.tool_request.ref for p in out.interrupts if p.tool_request] == ["call_xfer"]
    assert runs == ["savings"]
    assert len(server.requests) == 1

    reply = transferMoney.resume(out.interrupts[0], ApprovalReply(approved=False))
    final = agent.run(ToolResume(restart=[reply]), session_id=out.session_id)
    assert final.text == "Balance 1234.50; transfer done."
    assert runs == ["savings"]
    body = server.requests[1].body
    assert openai_tool_pairs(body) == [("call_bal", "call_bal"), ("call_xfer", "call_xfer")]
    results = {
        m["tool_call_id"]: json.loads(m["content"]) for m in body["messages"] if m["role"] == "tool"
    }
    assert results == {
        "call_bal": {"balance": 1234.5},
        "call_xfer": {"success": False, "transactionId": ""},
    }


def test_two_interrupts_answered_by_respond_and_restart(
    server: FakeLLMServer, registries: list[Interlock], monkeypatch: pytest.MonkeyPatch
) -> None:
    _point("openai", server, monkeypatch)
    agent, _ = banking("openai/test-model", registries)
    other = {"amount": 20, "toAccount": "checking"}
    server.push(
        openai_tool_calls(
            ("transferMoney", TRANSFER, "call_1"), ("transferMoney", other, "call_2")
        ),
        openai_text("Both handled."),
    )
    out = agent.run_text("Transfer $500 to savings and $20 to checking.")
    first, second = out.interrupts
    resume = ToolResume(
        respond=[transferMoney.respond(first, TransferOutput(success=True, transaction_id="t1"))],
        restart=[transferMoney.resume(second, ApprovalReply(approved=True))],
    )
    assert agent.run(resume, session_id=out.session_id).text == "Both handled."
    body = server.requests[1].body
    assert openai_tool_pairs(body) == [("call_1", "call_1"), ("call_2", "call_2")]


def test_streaming_reaches_the_connection(
    server: FakeLLMServer, registries: list[Interlock], monkeypatch: pytest.MonkeyPatch
) -> None:
    _point("openai", server, monkeypatch)
    agent, _ = banking("openai/test-model", registries)
    server.push(
        openai_tool_calls(("transferMoney", TRANSFER, "call_s1"), text="One moment please."),
        openai_text("All done, transfer complete.", piece=5),
    )
    with agent.connect() as conn:
        conn.send_text(ASK)
        chunks = list(conn.receive())
        texts = _model_texts(chunks)
        assert len(texts) > 1 and "".join(texts) == "One moment please."
        calls = [
            p.tool_request.ref
            for c in chunks
            if c.model_chunk and c.model_chunk.role == "model"
            for p in c.model_chunk.content
            if p.tool_request
        ]
        assert calls == ["call_s1"]  # streamed whole, with the ref the interrupt will carry
        assert chunks[-1].turn_end is not None
        assert chunks[-1].turn_end.finish_reason is FinishReason.INTERRUPTED
        part = conn.output().interrupts[0]
        conn.send_resume(
            ToolResume(restart=[transferMoney.resume(part, ApprovalReply(approved=True))])
        )
        chunks = list(conn.receive())
        tool = [c.model_chunk for c in chunks if c.model_chunk and c.model_chunk.role == "tool"]
        assert tool and tool[0].content[0].tool_response is not None
        assert tool[0].content[0].tool_response.ref == "call_s1"
        texts = _model_texts(chunks)
        assert texts == split("All done, transfer complete.", 5)
        assert conn.output().text == "All done, transfer complete."


def _model_texts(chunks: list[AgentChunk]) -> list[str]:
    return [
        c.model_chunk.text
        for c in chunks
        if c.model_chunk and c.model_chunk.role == "model" and c.model_chunk.text
    ]


# -- interlock demo --model ------------------------------------------------------------------


def test_demo_without_a_key_names_the_variable(server: FakeLLMServer) -> None:
    from workers.cli import main

    result = CliRunner().invoke(
        main, ["demo", "--in-process", "--approve", "--model", "openai/gpt-4o-mini"]
    )
    assert result.exit_code == 1
    assert (
        "UNAUTHENTICATED: OPENAI_API_KEY is not set; export it to use openai/gpt-4o-mini"
        in result.output
    )
    assert server.requests == []


def test_demo_on_a_model(server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--in-process`; the embedded queue path uses the same override (`using_model`
    swaps the registry's agent, which the embedded worker looks up by name) and takes
    several seconds, so it is left to `interlock demo --model` by hand."""
    from examples.banking import ai as banking_ai
    from workers.cli import main

    _point("openai", server, monkeypatch)
    server.push(
        openai_tool_calls(("transferMoney", TRANSFER, "call_demo")),
        openai_text("Done: transferred $500.00 to savings."),
    )
    try:
        result = CliRunner().invoke(
            main, ["demo", "--in-process", "--approve", "--model", "openai/test-model"]
        )
    finally:
        model: Any = banking_ai.models.pop("openai/test-model", None)
        if model is not None:
            model.close()
    assert result.exit_code == 0, result.output
    assert "Done: transferred $500.00 to savings." in result.output.splitlines()[-1]
    assert banking_ai.lookup_agent("bankingAgent").model == "scripted/banking"
    assert openai_tool_pairs(server.requests[1].body) == [("call_demo", "call_demo")]


def test_demo_model_with_a_broker_says_where_to_set_it() -> None:
    from workers.demo import run_on_queues

    with pytest.raises(StatusError) as info:
        run_on_queues("hi", lambda part: True, broker="memory://", model="openai/gpt-4o-mini")
    assert info.value.status is Status.INVALID_ARGUMENT
    assert "INTERLOCK_BANKING_MODEL=openai/gpt-4o-mini" in info.value.message
