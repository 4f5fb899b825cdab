"""What both model plugins must agree on with the providers' wire formats, beyond the
banking flow: tools whose input is not a JSON object, calls sent without an index or
with empty or repeated ids, arguments sent as JSON rather than a string of it, and
replies that are not what they should be (an array, a bare value, bad JSON) or errors
named by their code. Against the local fake server (tests/fake_llm_server.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import BaseModel

from interlock import (
    Agent,
    FinishReason,
    InMemorySessionStore,
    Interlock,
    Message,
    ModelRequest,
    ModelResponse,
    Part,
    Status,
    ToolDefinition,
    ToolFailedError,
    ToolRequest,
    status_of,
)
from interlock.models import ModelError, RetryPolicy
from interlock.models._wire import object_schema, wrapped_tools
from interlock.models.openai import OpenAIModel
from tests.fake_llm_server import (
    FakeLLMServer,
    Reply,
    anthropic_text,
    anthropic_tool_use,
    openai_chunk,
    openai_completion,
    openai_stream,
    openai_text,
    openai_tool_calls,
)

FAST = RetryPolicy(attempts=3, initial_delay=0.01, max_delay=0.02)
ONCE = RetryPolicy(attempts=1)
ADD = ToolDefinition(
    name="add",
    description="Add two integers.",
    input_schema={
        "type": "object",
        "properties": {"left": {"type": "integer"}, "right": {"type": "integer"}},
    },
)


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeLLMServer]:
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("INTERLOCK_MODEL_MAX_ATTEMPTS", raising=False)
    with FakeLLMServer() as fake:
        yield fake


def openai_model(server: FakeLLMServer, retry: RetryPolicy = FAST) -> OpenAIModel:
    return OpenAIModel(
        "openai/gpt-4o-mini", base_url=f"{server.url}/v1", api_key="sk-test", retry=retry
    )


def generate(
    server: FakeLLMServer,
    request: ModelRequest,
    *,
    stream: bool = True,
    retry: RetryPolicy = FAST,
) -> ModelResponse:
    """One call of an OpenAI model on the fake server (streamed unless told not to)."""
    model = openai_model(server, retry)
    try:
        return model.generate(request, (lambda c: None) if stream else None)
    finally:
        model.close()


def failure(server: FakeLLMServer, request: ModelRequest) -> ModelError:
    """The error of one streamed call, tried once."""
    with pytest.raises(ModelError) as info:
        generate(server, request, retry=ONCE)
    return info.value


def ask(text: str, tools: list[ToolDefinition] | None = None) -> ModelRequest:
    return ModelRequest(
        messages=[Message(role="user", content=[Part(text=text)])], tools=tools or []
    )


class Account(BaseModel):
    account: str


def shouting_agent(
    model: str, registries: list[Interlock], stream: bool
) -> tuple[Agent, list[Any]]:
    """An agent with two tools whose inputs are not objects: `shout` takes a string,
    `lookup` an `Account` or nothing. Returns it and the inputs the tools were run on."""
    ai = Interlock()
    registries.append(ai)
    runs: list[Any] = []

    @ai.tool(name="shout", description="The text in capitals.")
    def shout(text: str) -> str:
        runs.append(text)
        return text.upper()

    @ai.tool(name="lookup", description="An account's owner, or the default one's.")
    def lookup(which: Account | None) -> str:
        runs.append(which)
        return "Ada" if which is None else f"owner of {which.account}"

    agent = ai.define_agent(
        "shouter",
        model=model,
        tools=[shout, lookup],
        store=InMemorySessionStore(),
        config=None if stream else {"stream": False},
    )
    return agent, runs


def _wrapped(schema: dict[str, Any] | None) -> dict[str, Any]:
    assert schema is not None
    inner = {k: v for k, v in schema.items() if k != "$defs"}
    out: dict[str, Any] = {
        "type": "object",
        "properties": {"input": inner},
        "required": ["input"],
    }
    if "$defs" in schema:
        out["$defs"] = schema["$defs"]
    return out


# -- tools whose input is not an object ---------------------------------------------------------


def test_object_schema_wraps_what_is_not_an_object_and_keeps_its_definitions() -> None:
    plain = {"type": "object", "properties": {"a": {"type": "string"}}}
    assert object_schema(plain) == plain
    assert object_schema(None) == {"type": "object", "properties": {}}
    assert object_schema({"type": "string"}) == {
        "type": "object",
        "properties": {"input": {"type": "string"}},
        "required": ["input"],
    }
    union = {
        "anyOf": [{"$ref": "#/$defs/Account"}, {"type": "null"}],
        "$defs": {"Account": {"type": "object", "properties": {"account": {"type": "string"}}}},
    }
    wrapped = object_schema(union)
    # The refs still resolve: the definitions moved to the top of the wrapper.
    assert wrapped["$defs"] == union["$defs"]
    assert wrapped["properties"]["input"] == {"anyOf": union["anyOf"]}
    assert wrapped["type"] == "object" and wrapped["required"] == ["input"]


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "json"])
def test_openai_tools_whose_input_is_not_an_object_travel_in_an_input_field(
    stream: bool,
    server: FakeLLMServer,
    registries: list[Interlock],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("OPENAI_BASE_URL", f"{server.url}/v1")
    agent, runs = shouting_agent("openai/gpt-4o-mini", registries, stream)
    server.push(
        openai_tool_calls(
            ("shout", {"input": "hello"}, "call_1"),
            ("lookup", {"input": {"account": "savings"}}, "call_2"),
            ("lookup", {"input": None}, "call_3"),
        ),
        openai_text("HELLO, and the owners."),
    )
    out = agent.run_text("Shout hello; who owns savings, and the default?")
    assert out.finish_reason is FinishReason.STOP
    assert runs == ["hello", Account(account="savings"), None]

    first, second = server.requests
    assert bool(first.body.get("stream")) is stream
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in first.body["tools"]}
    definitions = {t.name: t.definition().input_schema for t in agent.tools}
    assert schemas == {name: _wrapped(definitions[name]) for name in ("shout", "lookup")}
    # The history goes back as the model sent it: in the wrapper.
    calls = second.body["messages"][1]["tool_calls"]
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [
        {"input": "hello"},
        {"input": {"account": "savings"}},
        {"input": None},
    ]
    results = [m["content"] for m in second.body["messages"] if m["role"] == "tool"]
    assert results == ["HELLO", "owner of savings", "Ada"]
    # ... while the session keeps the tools' own inputs.
    assert agent.store is not None and out.snapshot_id is not None
    snapshot = agent.store.get_snapshot(out.snapshot_id)
    assert snapshot is not None
    model_turn = next(m for m in snapshot.messages if m.role == "model")
    assert [p.tool_request.input for p in model_turn.content if p.tool_request] == [
        "hello",
        {"account": "savings"},
        None,
    ]


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "json"])
def test_anthropic_tools_whose_input_is_not_an_object_travel_in_an_input_field(
    stream: bool,
    server: FakeLLMServer,
    registries: list[Interlock],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("anthropic")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", server.url)
    agent, runs = shouting_agent("anthropic/claude-test", registries, stream)
    server.push(
        anthropic_tool_use(
            ("shout", {"input": "hello"}, "toolu_1"),
            ("lookup", {"input": {"account": "savings"}}, "toolu_2"),
        ),
        anthropic_text("HELLO, and the owner."),
    )
    out = agent.run_text("Shout hello; who owns savings?")
    assert out.finish_reason is FinishReason.STOP
    assert runs == ["hello", Account(account="savings")]

    first, second = server.requests
    assert bool(first.body.get("stream")) is stream
    schemas = {t["name"]: t["input_schema"] for t in first.body["tools"]}
    definitions = {t.name: t.definition().input_schema for t in agent.tools}
    assert schemas == {name: _wrapped(definitions[name]) for name in ("shout", "lookup")}
    uses = [b for m in second.body["messages"] for b in m["content"] if b.get("type") == "tool_use"]
    assert [b["input"] for b in uses] == [{"input": "hello"}, {"input": {"account": "savings"}}]


# -- calls without an index, with empty or repeated ids -------------------------------------------


@pytest.mark.parametrize("ids", [["", ""], ["add", "add"]], ids=["empty", "repeated"])
def test_streamed_calls_without_index_and_with_empty_or_repeated_ids_stay_apart(
    ids: list[str], server: FakeLLMServer
) -> None:
    """Gemini's compatible endpoints: each call whole, no index, and ids that are empty
    (AI Studio, some releases) or the function's name (Vertex)."""
    calls = [
        {"id": ids[0], "type": "function", "function": {"name": "add", "arguments": '{"left":2}'}},
        {"id": ids[1], "type": "function", "function": {"name": "add", "arguments": '{"left":3}'}},
    ]
    server.push(openai_stream([openai_chunk({"role": "assistant", "tool_calls": calls}, "stop")]))
    out = generate(server, ask("2+2 and 3+5?", [ADD]))
    requests = [p.tool_request for p in out.message.content if p.tool_request]
    assert [(r.name, r.input) for r in requests] == [("add", {"left": 2}), ("add", {"left": 3})]
    if ids[0]:
        assert [r.ref for r in requests] == ids
    else:  # no id: each call gets a ref of its own
        assert len({r.ref for r in requests}) == 2 and all(r.ref for r in requests)


def test_continuation_fragments_without_index_join_their_call(server: FakeLLMServer) -> None:
    """Without an index, a fragment with no name continues the call before it."""
    first = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"le'}}
    rest = {"function": {"arguments": 'ft":7}'}}
    server.push(
        openai_stream(
            [
                openai_chunk({"role": "assistant", "tool_calls": [first]}),
                openai_chunk({"tool_calls": [rest]}, "tool_calls"),
            ]
        )
    )
    out = generate(server, ask("7?", [ADD]))
    assert [p.tool_request for p in out.message.content] == [
        ToolRequest(name="add", ref="c1", input={"left": 7})
    ]


# -- arguments sent as JSON, not as a string of it ----------------------------------------------


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "json"])
def test_arguments_sent_as_an_object_are_taken_as_they_are(
    stream: bool, server: FakeLLMServer
) -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": {"left": 4}}}
    if stream:
        server.push(openai_stream([openai_chunk({"role": "assistant", "tool_calls": [call]})]))
    else:
        server.push(openai_completion(tool_calls=[call], finish_reason="tool_calls"))
    out = generate(server, ask("4?", [ADD]), stream=stream)
    assert [p.tool_request for p in out.message.content] == [
        ToolRequest(name="add", ref="c1", input={"left": 4})
    ]


# -- replies that are not what they should be -------------------------------------------------


def test_a_streamed_error_array_is_a_model_error_and_is_retried(server: FakeLLMServer) -> None:
    """Google's errors come as a one-element JSON array, also as a stream's event."""
    overloaded: Any = [{"error": {"code": 503, "message": "The model is overloaded."}}]
    server.push(openai_stream([overloaded], done=False), openai_text("ok"))
    assert generate(server, ask("Hi")).message.text == "ok"
    assert len(server.requests) == 2  # the first was retried: 503 is worth another try

    server.push(openai_stream([overloaded], done=False))
    error = failure(server, ask("Hi"))
    assert error.status is Status.UNAVAILABLE and error.retryable
    assert "The model is overloaded." in error.message


def test_a_streamed_event_that_is_not_an_object_is_an_internal_error(
    server: FakeLLMServer,
) -> None:
    server.push(openai_stream([42], done=False))  # type: ignore[list-item]  # on purpose
    error = failure(server, ask("Hi"))
    assert error.status is Status.INTERNAL
    assert "not a JSON object: '42'" in error.message


def test_a_rate_limit_named_by_its_code_is_resource_exhausted(server: FakeLLMServer) -> None:
    """OpenAI's mid-stream rate limits: type "tokens" (or "requests"), code
    "rate_limit_exceeded"."""
    limited = {
        "error": {
            "message": "Rate limit reached for gpt-4o-mini on tokens per min (TPM).",
            "type": "tokens",
            "param": None,
            "code": "rate_limit_exceeded",
        }
    }
    server.push(openai_stream([limited], done=False))
    error = failure(server, ask("Hi"))
    assert error.status is Status.RESOURCE_EXHAUSTED and error.retryable
    assert "Rate limit reached" in error.message


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "json"])
def test_anthropic_reply_that_is_not_json_is_an_internal_model_error(
    stream: bool, server: FakeLLMServer
) -> None:
    pytest.importorskip("anthropic")
    from interlock.models.anthropic import AnthropicModel

    if stream:
        server.push(Reply(events=[("message_start", "{not json")]))
    else:
        server.push(Reply(body='{"id": "msg_1", "content": [', headers={}))
    model = AnthropicModel(
        "anthropic/claude-test", api_key="sk-ant-test", base_url=server.url, retry=ONCE
    )
    try:
        with pytest.raises(ModelError) as info:
            model.generate(ask("Hi"), (lambda c: None) if stream else None)
    finally:
        model.close()
    assert info.value.status is Status.INTERNAL
    assert "the reply is not JSON" in info.value.message


# -- what is worth another try ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "headers", "retried", "status"),
    [
        (408, {}, True, Status.DEADLINE_EXCEEDED),
        (409, {}, True, Status.ABORTED),
        (500, {"x-should-retry": "false"}, False, Status.UNAVAILABLE),
        (400, {"x-should-retry": "true"}, True, Status.INVALID_ARGUMENT),
        (400, {}, False, Status.INVALID_ARGUMENT),
    ],
)
@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_what_is_retried_follows_the_code_and_the_servers_word(
    provider: str,
    code: int,
    headers: dict[str, str],
    retried: bool,
    status: Status,
    server: FakeLLMServer,
) -> None:
    """408 and 409 are retried as the providers' SDKs retry them; `x-should-retry` has
    the last word. Two attempts: the second succeeds if the first is retried."""
    twice = RetryPolicy(attempts=2, initial_delay=0.01, max_delay=0.02)
    error = {"type": "error", "error": {"type": "api_error", "message": f"said {code}"}}
    model: Any
    if provider == "openai":
        model = openai_model(server, twice)
        ok = openai_text("ok")
    else:
        pytest.importorskip("anthropic")
        from interlock.models.anthropic import AnthropicModel

        model = AnthropicModel(
            "anthropic/claude-test", api_key="sk-ant-test", base_url=server.url, retry=twice
        )
        ok = anthropic_text("ok")
    server.push(Reply(code, error, headers=headers), ok)
    try:
        if retried:
            assert model.generate(ask("Hi"), lambda c: None).message.text == "ok"
        else:
            with pytest.raises(ModelError) as info:
                model.generate(ask("Hi"), lambda c: None)
            assert info.value.status is status and info.value.http_status == code
            assert f"said {code}" in info.value.message
    finally:
        model.close()
    assert len(server.requests) == (2 if retried else 1)


def test_streamed_content_sent_as_parts_is_text(server: FakeLLMServer) -> None:
    """Some compatible servers stream `content` as a list of parts, as they answer."""
    server.push(
        openai_stream(
            [
                openai_chunk({"role": "assistant", "content": [{"type": "text", "text": "Hel"}]}),
                openai_chunk({"content": [{"type": "text", "text": "lo"}]}, "stop"),
            ]
        )
    )
    chunks: list[Any] = []
    model = openai_model(server)
    try:
        out = model.generate(ask("Hi"), chunks.append)
    finally:
        model.close()
    assert out.message.text == "Hello"
    assert [c.text for c in chunks] == ["Hel", "lo"]


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "json"])
def test_a_string_tool_never_runs_on_malformed_arguments(
    stream: bool,
    server: FakeLLMServer,
    registries: list[Interlock],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Arguments cut short (a reply that ran out of tokens) are kept as their raw
    string: a tool that takes a string must not take that string for its input."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("OPENAI_BASE_URL", f"{server.url}/v1")
    agent, runs = shouting_agent("openai/gpt-4o-mini", registries, stream)
    server.push(openai_tool_calls(("shout", '{"input": "transfer $50', "call_1")))
    with pytest.raises(ToolFailedError) as info:
        agent.run_text("Shout it")
    assert runs == [], "the tool never ran"
    assert status_of(info.value) is Status.INVALID_ARGUMENT, info.value


def test_fragments_repeating_their_id_and_name_join_one_call(server: FakeLLMServer) -> None:
    """Some servers repeat the call's id and name in every fragment, without an index:
    a fragment that names the call again continues it until its arguments are whole."""
    pieces = ["", '{"le', 'ft":', "7}"]
    fragments = [
        {"id": "c1", "type": "function", "function": {"name": "add", "arguments": p}}
        for p in pieces
    ]
    server.push(
        openai_stream([openai_chunk({"role": "assistant", "tool_calls": [f]}) for f in fragments])
    )
    out = generate(server, ask("7?", [ADD]))
    assert [p.tool_request for p in out.message.content] == [
        ToolRequest(name="add", ref="c1", input={"left": 7})
    ]


def test_object_schemas_in_other_shapes_are_not_wrapped_and_draft7_refs_resolve() -> None:
    """A hand-written object schema without `type`, and a recursive model (pydantic puts
    a `$ref` on top), are objects: sent as objects (the latter inlined), not wrapped.
    A wrapped schema's draft-07 `definitions` move to the top, as `$defs` do."""

    class Node(BaseModel):
        name: str
        children: list[Node] = []

    untyped = {"properties": {"a": {"type": "string"}}}
    assert object_schema(untyped) == untyped
    recursive = Node.model_json_schema()
    assert "$ref" in recursive, recursive
    sent = object_schema(recursive)
    assert sent["type"] == "object" and "$ref" not in sent
    assert sent["properties"] == recursive["$defs"]["Node"]["properties"]
    assert sent["$defs"] == recursive["$defs"]
    draft7 = {
        "anyOf": [{"$ref": "#/definitions/A"}, {"type": "null"}],
        "definitions": {"A": {"type": "object"}},
    }
    wrapped = object_schema(draft7)
    assert wrapped["definitions"] == draft7["definitions"]
    assert wrapped["properties"]["input"] == {"anyOf": draft7["anyOf"]}
    definitions = [ToolDefinition(name=n, input_schema=s) for n, s in
                   (("u", untyped), ("r", recursive), ("d", draft7))]  # fmt: skip
    assert wrapped_tools(definitions) == frozenset({"d"})
