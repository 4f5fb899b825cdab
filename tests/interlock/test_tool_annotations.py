"""Tool types from annotations (§2) under `from __future__ import annotations`, and what
the turn makes of a model's tool calls (§3): outputs checked against Out, inputs as JSON,
one ref per call."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, Field

from interlock import (
    AgentInput,
    InMemorySessionStore,
    Interlock,
    Message,
    ModelRequest,
    Part,
    Status,
    StatusError,
    ToolContext,
    ToolFailedError,
    ToolRequest,
    ToolResume,
    approve,
    deny,
    interrupt,
    scripted,
    status_of,
    tool_approval,
)
from interlock.journal import InMemoryJournal


def test_types_defined_inside_a_function_resolve() -> None:
    """Annotations are strings here; types local to this test are found all the same,
    for the decorator and for `define_*`."""

    class In(BaseModel):
        amount: float

    class Out(BaseModel):
        done: bool

    class Reply(BaseModel):
        approved: bool

    ai = Interlock()

    @ai.tool(name="plain", description="")
    def plain(inp: In) -> Out:
        return Out(done=inp.amount > 0)

    def ask(inp: In, res: Reply | None) -> Out:
        if res is None:
            return interrupt({"amount": inp.amount})
        return Out(done=res.approved)

    gated = ai.define_interruptible_tool("ask", "", ask)
    assert (plain.input_type, plain.output_type) == (In, Out)
    assert (gated.input_type, gated.output_type, gated.resume_type) == (In, Out, Reply)
    schema = plain.definition().input_schema
    assert schema is not None
    assert schema["properties"] == {"amount": {"title": "Amount", "type": "number"}}


def test_an_annotation_that_names_nothing_is_a_clear_error() -> None:
    ai = Interlock()

    def broken(inp: NoSuchType) -> dict[str, Any]:  # type: ignore[name-defined]  # noqa: F821
        return {}

    with pytest.raises(StatusError) as info:
        ai.define_tool("broken", "", broken)
    assert info.value.status is Status.INVALID_ARGUMENT
    assert "tool 'broken': cannot resolve the annotation 'NoSuchType'" in info.value.message


def _one(inp: int) -> int:
    return inp


def _two(inp: int, res: dict[str, Any] | None) -> int:
    return inp


def _with_ctx(inp: int, ctx: ToolContext) -> int:
    return inp


def _none() -> int:
    return 1


@pytest.mark.parametrize(
    ("interruptible", "fn", "said"),
    [
        (True, _one, "takes (input, resume)"),
        (True, _none, "takes (input, resume)"),
        (False, _two, "takes (input)"),
        (False, _none, "takes (input)"),
    ],
)
def test_a_function_of_the_wrong_shape_is_refused_when_the_tool_is_defined(
    interruptible: bool, fn: Any, said: str
) -> None:
    """Not at the model's first call, as a failed turn: the tool is never defined."""
    ai = Interlock()
    define = ai.define_interruptible_tool if interruptible else ai.define_tool
    with pytest.raises(StatusError) as info:
        define("t", "", fn)
    assert info.value.status is Status.INVALID_ARGUMENT
    assert info.value.message.startswith("tool 't': the function of "), info.value.message
    assert said in info.value.message and "ToolContext" in info.value.message
    assert "t" not in ai.tools


def test_functions_of_the_right_shape_are_defined() -> None:
    ai = Interlock()
    ai.define_tool("one", "", _one)
    ai.define_tool("ctx", "", _with_ctx)
    ai.define_interruptible_tool("two", "", _two)
    assert {"one", "ctx", "two"} <= set(ai.tools)


class Receipt(BaseModel):
    txn: str
    amount: float


def _agent(ai: Interlock, calls: list[Part], tools: list[Any], **kw: Any) -> Any:
    """An agent whose model makes `calls`, then repeats the tool responses it got."""

    def model(request: ModelRequest) -> Message:
        last = request.messages[-1]
        if last.role == "user":
            return Message(role="model", content=calls)
        outputs = [p.tool_response.output for p in last.content if p.tool_response]
        return scripted.text(json.dumps(outputs))

    scripted.define(ai, "m", model)
    return ai.define_agent("a", model="scripted/m", tools=tools, store=InMemorySessionStore(), **kw)


def test_a_tool_output_that_does_not_fit_out_fails_the_turn() -> None:
    ai = Interlock()

    @ai.tool(name="pay", description="")
    def pay(inp: dict[str, Any]) -> Receipt:
        return {"nonsense": 1}  # type: ignore[return-value]

    agent = _agent(ai, [Part(tool_request=ToolRequest(name="pay", input={}))], [pay])
    with pytest.raises(ToolFailedError) as info:
        agent.run_text("go")
    assert info.value.tool_name == "pay"
    assert status_of(info.value) is Status.INVALID_ARGUMENT
    assert "invalid output for tool 'pay'" in str(info.value.__cause__)


def test_a_tool_output_is_kept_as_out_gives_it() -> None:
    ai = Interlock()

    @ai.tool(name="pay", description="")
    def pay(inp: dict[str, Any]) -> Receipt:
        return {"txn": "t-1", "amount": "5"}  # type: ignore[return-value]

    agent = _agent(ai, [Part(tool_request=ToolRequest(name="pay", input={}))], [pay])
    out = agent.run_text("go")
    assert json.loads(out.message.text) == [{"txn": "t-1", "amount": 5.0}]


class Camel(BaseModel):
    model_config = ConfigDict(populate_by_name=True)
    to_account: str = Field(alias="toAccount")


def test_a_model_functions_objects_become_json_in_the_part() -> None:
    """A model function may put a pydantic object as a call's input: the part holds its
    JSON form (aliases), so it stores, compares and restarts like any other input."""
    ai = Interlock()

    @ai.interruptible_tool(name="move", description="")
    def move(inp: Camel, res: dict[str, Any] | None) -> dict[str, Any]:
        if res is None:
            interrupt({"to": inp.to_account})
        return {"moved_to": inp.to_account}

    call = Part(tool_request=ToolRequest(name="move", ref="c1", input=Camel(to_account="s")))
    agent = _agent(ai, [call], [move])
    paused = agent.run_text("go")
    [ask] = paused.interrupts
    assert ask.tool_request is not None
    assert ask.tool_request.input == {"toAccount": "s"}
    stored = agent.store.get_snapshot(paused.snapshot_id)
    assert stored.messages[-1].content[0].tool_request.input == {"toAccount": "s"}
    done = agent.run(
        AgentInput(resume=ToolResume(restart=[move.resume(ask, {"ok": True})])),
        session_id=paused.session_id,
    )
    assert json.loads(done.message.text) == [{"moved_to": "s"}]


def test_calls_sharing_a_ref_get_refs_of_their_own() -> None:
    """Answers are matched to calls by ref: two calls that came with the same ref get
    different ones, so approving one call never runs the other."""
    ai = Interlock()
    ran: list[dict[str, Any]] = []

    @ai.tool(name="transfer", description="")
    def transfer(inp: dict[str, Any]) -> dict[str, Any]:
        ran.append(inp)
        return {"ok": True}

    calls = [
        Part(tool_request=ToolRequest(name="transfer", ref="call_0", input={"to": "x", "n": 5000})),
        Part(tool_request=ToolRequest(name="transfer", ref="call_0", input={"to": "mom", "n": 5})),
    ]
    agent = _agent(ai, calls, [transfer], middleware=[tool_approval(allowed=[])])
    paused = agent.run_text("go")
    first, second = paused.interrupts
    assert first.tool_request is not None and second.tool_request is not None
    assert first.tool_request.ref == "call_0", "the first keeps the model's ref"
    assert second.tool_request.ref not in (None, "call_0")
    resume = ToolResume(restart=[approve(second)])
    with pytest.raises(StatusError, match="every pending interrupt"):
        agent.run(AgentInput(resume=resume), session_id=paused.session_id)
    both = ToolResume(restart=[approve(second)], respond=[deny(first, "no")])
    agent.run(AgentInput(resume=both), session_id=paused.session_id)
    assert ran == [{"to": "mom", "n": 5}], "only the approved call ran"


def test_a_ref_reused_in_a_later_message_gets_a_new_one() -> None:
    """A model that numbers its calls afresh in each message (`call_0` again): the second
    call gets a ref of its own, so its outcome, its journal entry and its idempotency key
    are not the first call's."""
    ai = Interlock()
    keys: list[str] = []

    @ai.tool(name="count", description="")
    def count(inp: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        keys.append(ctx.idempotency_key)
        return {"n": inp["n"]}

    def model(request: ModelRequest) -> Message:
        calls = sum(1 for m in request.messages if m.role == "tool")
        if calls < 2:
            req = ToolRequest(name="count", ref="call_0", input={"n": calls + 1})
            return Message(role="model", content=[Part(tool_request=req)])
        outputs = [
            p.tool_response.output
            for m in request.messages
            if m.role == "tool"
            for p in m.content
            if p.tool_response
        ]
        return scripted.text(json.dumps(outputs))

    scripted.define(ai, "m", model)
    store = InMemorySessionStore()
    agent = ai.define_agent("a", model="scripted/m", tools=[count], store=store)
    journal = InMemoryJournal()
    out = agent.run_text("go", journal=journal, turn_id="t-1")
    assert out.message is not None and out.session_id is not None
    assert json.loads(out.message.text) == [{"n": 1}, {"n": 2}]
    assert len(set(keys)) == 2, keys
    saved = store.get_snapshot(out.snapshot_id or "")
    assert saved is not None
    refs = [
        p.tool_request.ref
        for m in saved.messages
        if m.role == "model"
        for p in m.content
        if p.tool_request
    ]
    assert refs[0] == "call_0" and refs[1] not in (None, "call_0")
    entries = journal.load(out.session_id, "t-1")
    assert {f"tool:{r}" for r in refs} <= set(entries)


def test_a_tool_input_with_no_json_form_fails_the_turn_clearly() -> None:
    class Odd:
        pass

    ai = Interlock()

    @ai.tool(name="t", description="")
    def t(inp: dict[str, Any]) -> dict[str, Any]:
        return {}

    agent = _agent(ai, [Part(tool_request=ToolRequest(name="t", input={"x": Odd()}))], [t])
    with pytest.raises(StatusError) as info:
        agent.run_text("go")
    assert info.value.status is Status.INVALID_ARGUMENT
    assert "model 'scripted/m' gave a tool call an input with no JSON form" in info.value.message
    assert info.value.snapshot_id is not None, "the failed turn is kept for inspection"


def test_decorators_take_a_name_and_description_by_position() -> None:
    """`@ai.tool("name", "description")`, as Genkit's `DefineTool(g, name, description,
    fn)` orders them; the keyword and bare forms name the tool the same way."""

    class In(BaseModel):
        account: str

    class Out(BaseModel):
        balance: float

    ai = Interlock()

    @ai.tool("getBalance", "The account's balance.")
    def get_balance(inp: In) -> Out:
        return Out(balance=10.0)

    @ai.interruptible_tool("closeAccount")
    def close_account(inp: In, res: dict[str, Any] | None) -> Out:
        """Close an account, once approved."""
        return Out(balance=0.0)

    @ai.tool
    def open_account(inp: In) -> Out:
        """Open an account."""
        return Out(balance=0.0)

    assert (get_balance.name, get_balance.description) == ("getBalance", "The account's balance.")
    assert (close_account.name, close_account.description) == (
        "closeAccount",
        "Close an account, once approved.",
    )
    assert (open_account.name, open_account.description) == ("open_account", "Open an account.")
    assert set(ai.tools) == {"getBalance", "closeAccount", "open_account"}


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (lambda ai: ai.tool("a", name="b"), "either by position or by keyword"),
        (lambda ai: ai.interruptible_tool("a", description="d"), "either by position"),
        (lambda ai: ai.tool(42), "takes a function, or a name and a description; got int"),
        (lambda ai: ai.tool(print, "d"), "a description by position follows a name"),
    ],
)
def test_a_decorator_called_both_ways_is_invalid_argument(call: Any, words: str) -> None:
    with pytest.raises(StatusError) as info:
        call(Interlock())
    assert info.value.status is Status.INVALID_ARGUMENT
    assert words in info.value.message
