"""Tools (§2), how a failing tool fails the turn, and the error tree (§8)."""

import asyncio
import dataclasses
import json
import pickle
from collections.abc import Callable
from typing import Any, cast

import pytest
from pydantic import BaseModel, ValidationError

from examples.banking import (
    ApprovalAsk,
    ApprovalReply,
    TransferOutput,
    bankingAgent,
    transferMoney,
)
from interlock import (
    AgentInput,
    FinishReason,
    InMemorySessionStore,
    Interlock,
    InterlockError,
    InterruptDataError,
    InterruptibleTool,
    Message,
    ModelRequest,
    Part,
    ResumeSnapshotNotFoundError,
    ResumeValidationError,
    SnapshotNotFoundError,
    SnapshotStatus,
    Status,
    StatusError,
    Tool,
    ToolContext,
    ToolFailedError,
    ToolInterrupt,
    ToolNotFoundError,
    ToolRequest,
    ToolResponse,
    ToolResume,
    error_from_info,
    interrupt,
    interrupt_as,
    respond,
    restart,
    scripted,
    status_of,
)
from schemas import ErrorInfo, TurnFailed


class Num(BaseModel):
    n: int


class Result(BaseModel):
    value: int


def one_call(ai: Interlock, tool: Tool[Any, Any], input: Any, name: str = "t") -> Any:
    """An agent whose model calls `tool` with `input`, then says what it got."""

    def model(request: ModelRequest) -> Message:
        last = request.messages[-1]
        if last.role == "user":
            return scripted.reply(scripted.tool_call(tool.name, input, ref="r"))
        outputs = [p.tool_response.output for p in last.content if p.tool_response]
        return scripted.text(json.dumps(outputs))

    scripted.define(ai, name, model)
    return ai.define_agent(
        name, model=f"scripted/{name}", tools=[tool], store=InMemorySessionStore()
    )


# -- a tool that raises fails the turn ---------------------------------------------------------


def test_banking_negative_amount_fails_the_turn() -> None:
    store = bankingAgent.store
    assert store is not None
    good = bankingAgent.run_text("hello")
    assert good.finish_reason is FinishReason.STOP
    with pytest.raises(ToolFailedError) as info:
        bankingAgent.run_text("Transfer $-5 to savings", session_id=good.session_id)
    err = info.value
    assert err.status is Status.INTERNAL
    assert err.tool_name == "transferMoney"
    assert isinstance(err.__cause__, StatusError)
    assert err.__cause__.status is Status.INVALID_ARGUMENT
    assert err.__cause__.message == "transfer amount must be positive, got $-5.00"
    assert "transfer amount must be positive, got $-5.00" in err.message
    assert status_of(err) is Status.INVALID_ARGUMENT
    assert isinstance(err, InterlockError)

    [failed] = store.list_snapshots(session_id=good.session_id, status=SnapshotStatus.FAILED)
    assert failed.finish_reason is FinishReason.FAILED
    assert failed.parent_id == good.snapshot_id
    assert err.snapshot_id == failed.snapshot_id  # the error points at what was kept
    assert failed.error is not None and failed.error.status is Status.INTERNAL
    assert "must be positive" in failed.error.message
    assert failed.messages[-1].tool_requests[0].tool_request is not None  # kept as it stood
    # the session continues from the last good snapshot
    [latest_good] = store.list_snapshots(
        session_id=good.session_id, status=SnapshotStatus.COMPLETED, limit=1
    )
    assert latest_good.snapshot_id == good.snapshot_id
    nxt = bankingAgent.run_text("Transfer $5 to savings", session_id=good.session_id)
    assert nxt.finish_reason is FinishReason.INTERRUPTED
    snap = store.get_snapshot(nxt.snapshot_id or "")
    assert snap is not None and snap.parent_id == good.snapshot_id
    assert [m.text for m in snap.messages if m.role == "user"] == [
        "hello",
        "Transfer $5 to savings",
    ]


def test_ordinary_exception_fails_the_turn() -> None:
    ai = Interlock()

    @ai.tool(name="boom", description="")
    def boom(inp: Num) -> Result:
        raise ValueError("kaput")

    agent = one_call(ai, boom, {"n": 1})
    with pytest.raises(ToolFailedError) as info:
        agent.run_text("go")
    assert info.value.tool_name == "boom"
    assert isinstance(info.value.__cause__, ValueError)
    # no StatusError below the ToolFailedError: its own status is the innermost
    assert status_of(info.value) is Status.INTERNAL
    assert status_of(info.value.__cause__) is Status.UNKNOWN
    assert info.value.message == "tool 'boom' failed: kaput"


def test_every_call_of_the_message_runs_before_the_first_failure_fails_the_turn() -> None:
    """§3: all tool calls of one model message are executed. A call that fails does not
    keep the others from running (Genkit starts them all); the first failure, in the
    message's order, fails the turn, even beside a call that interrupted."""
    ai = Interlock()
    ran: list[str] = []

    @ai.tool(name="boom", description="")
    def boom(inp: Num) -> Result:
        ran.append(f"boom{inp.n}")
        raise ValueError(f"kaput {inp.n}")

    @ai.tool(name="note", description="")
    def note(inp: Num) -> Result:
        ran.append(f"note{inp.n}")
        return Result(value=inp.n)

    @ai.interruptible_tool(name="ask", description="")
    def ask(inp: Num, res: Result | None) -> Result:
        ran.append(f"ask{inp.n}")
        interrupt({"n": inp.n})
        return Result(value=0)

    calls = [
        scripted.tool_call("note", {"n": 1}),
        scripted.tool_call("boom", {"n": 2}),
        scripted.tool_call("ask", {"n": 3}),
        scripted.tool_call("ghost", {}),
        scripted.tool_call("boom", {"n": 4}),
        scripted.tool_call("note", {"n": 5}),
    ]
    scripted.define(ai, "m", [scripted.reply(*calls)])
    store = InMemorySessionStore()
    agent = ai.define_agent("x", model="scripted/m", tools=[boom, note, ask], store=store)
    with pytest.raises(ToolFailedError) as info:
        agent.run_text("go")
    assert ran == ["note1", "boom2", "ask3", "boom4", "note5"]
    assert info.value.tool_name == "boom"
    assert info.value.message == "tool 'boom' failed: kaput 2"
    [failed] = store.list_snapshots(status=SnapshotStatus.FAILED)
    assert failed.finish_reason is FinishReason.FAILED
    assert store.list_snapshots(finish_reason=FinishReason.INTERRUPTED) == []


def test_every_restart_of_a_resume_runs_before_the_first_failure_fails_the_turn() -> None:
    ai = Interlock()
    ran: list[str] = []

    @ai.interruptible_tool(name="ask", description="")
    def ask(inp: Num, res: Result | None) -> Result:
        if res is None:
            interrupt({"n": inp.n})
        ran.append(f"ask{inp.n}")
        if inp.n == 1:
            raise RuntimeError("no")
        return Result(value=inp.n)

    calls = [scripted.tool_call("ask", {"n": 1}), scripted.tool_call("ask", {"n": 2})]
    scripted.define(ai, "m", [scripted.reply(*calls), scripted.text("done")])
    store = InMemorySessionStore()
    agent = ai.define_agent("x", model="scripted/m", tools=[ask], store=store)
    paused = agent.run_text("go")
    assert paused.finish_reason is FinishReason.INTERRUPTED
    restarts = [ask.restart(p, Result(value=0)) for p in paused.interrupts]
    with pytest.raises(ToolFailedError, match="tool 'ask' failed: no"):
        agent.run(AgentInput(resume=ToolResume(restart=restarts)), session_id=paused.session_id)
    assert ran == ["ask1", "ask2"]
    # §4 rule 9: the claim is released, the pause can be answered again
    open_pauses = store.list_snapshots(finish_reason=FinishReason.INTERRUPTED, claimed=False)
    assert [s.snapshot_id for s in open_pauses] == [paused.snapshot_id]


def test_invalid_tool_input_from_the_model() -> None:
    ai = Interlock()

    @ai.tool(name="strict", description="")
    def strict(inp: Num) -> Result:
        return Result(value=inp.n)

    agent = one_call(ai, strict, {"n": "many"})
    with pytest.raises(ToolFailedError) as info:
        agent.run_text("go")
    assert status_of(info.value) is Status.INVALID_ARGUMENT
    assert "invalid input for tool 'strict'" in info.value.message
    assert "not JSON" not in info.value.message


def test_tool_input_that_was_not_json_is_quoted() -> None:
    """A model's arguments that did not parse are kept raw; the error shows them
    (the first 200 characters)."""
    ai = Interlock()

    @ai.tool(name="strict", description="")
    def strict(inp: Num) -> Result:
        return Result(value=inp.n)

    raw = '{"n": 1' + " " * 300 + "tail"
    with pytest.raises(ToolFailedError) as info:
        one_call(ai, strict, raw).run_text("go")
    assert status_of(info.value) is Status.INVALID_ARGUMENT
    assert "the model sent arguments that are not JSON: " + repr(raw[:200] + "...") in (
        info.value.message
    )
    assert "tail" not in info.value.message


def test_model_calls_an_unknown_tool() -> None:
    ai = Interlock()
    scripted.define(ai, "m", [scripted.reply(scripted.tool_call("ghost", {}))])
    agent = ai.define_agent("x", model="scripted/m", store=InMemorySessionStore())
    with pytest.raises(ToolNotFoundError) as info:
        agent.run_text("go")
    assert info.value.status is Status.NOT_FOUND
    assert "tool 'ghost', which agent 'x' does not have" in info.value.message


def test_store_less_failure_raises_too() -> None:
    ai = Interlock(secret="s")

    @ai.tool(name="boom", description="")
    def boom(inp: Num) -> Result:
        raise RuntimeError("no")

    scripted.define(ai, "m", [scripted.reply(scripted.tool_call("boom", {"n": 1}))])
    agent = ai.define_agent("x", model="scripted/m", tools=[boom])
    with pytest.raises(ToolFailedError, match="tool 'boom' failed: no"):
        agent.run_text("go")


# -- interrupt() ---------------------------------------------------------------------------------


@pytest.mark.parametrize("data", ["please approve", ["a", "b"], 42, None, True])
def test_interrupt_with_non_object_data_fails_the_tool(data: Any) -> None:
    ai = Interlock()

    @ai.interruptible_tool(name="odd", description="")
    def odd(inp: Num, res: dict[str, Any] | None) -> Result:
        interrupt(data)
        return Result(value=0)

    agent = one_call(ai, odd, {"n": 1})
    with pytest.raises(ToolFailedError) as info:
        agent.run_text("go")
    assert info.value.tool_name == "odd"
    assert status_of(info.value) is Status.INVALID_ARGUMENT
    assert info.value.status is Status.INVALID_ARGUMENT, "the tool failed with it"
    assert "interrupt data must serialize to a JSON object" in info.value.message


def _swallowing(
    ai: Interlock, data: Any, asynchronous: bool, caught: list[Exception]
) -> Tool[Any, Any]:
    """A tool that misuses interrupt() and catches what it raises (into `caught`), as a
    tool's own `except Exception` would, then returns an output as if all went well."""

    def body() -> Result:
        try:
            interrupt(data)
        except Exception as exc:
            caught.append(exc)
        return Result(value=1)

    if asynchronous:

        async def odd_async(inp: Num, res: dict[str, Any] | None) -> Result:
            return body()

        return ai.define_interruptible_tool("odd", "", odd_async)

    def odd(inp: Num, res: dict[str, Any] | None) -> Result:
        return body()

    return ai.define_interruptible_tool("odd", "", odd)


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_a_misused_interrupt_fails_the_tool_even_when_the_tool_catches_it(
    asynchronous: bool,
) -> None:
    ai = Interlock()
    caught: list[Exception] = []
    agent = one_call(ai, _swallowing(ai, "please approve", asynchronous, caught), {"n": 1})
    with pytest.raises(ToolFailedError) as info:
        agent.run_text("go")
    assert len(caught) == 1 and isinstance(caught[0], InterruptDataError), "the tool caught it"
    assert isinstance(caught[0], StatusError) and caught[0].status is Status.INVALID_ARGUMENT
    assert info.value.tool_name == "odd"
    assert info.value.status is Status.INVALID_ARGUMENT
    assert "interrupt data must serialize to a JSON object" in info.value.message
    failed = agent.store.list_snapshots(status=SnapshotStatus.FAILED)
    assert len(failed) == 1, "the failure is kept"
    assert agent.store.list_snapshots(status=SnapshotStatus.COMPLETED) == [], "nothing completed"


def test_a_misused_interrupt_in_an_async_tool_fails_it_under_a_running_loop() -> None:
    """Run from async code (a loop is running), an async tool runs in a thread of its
    own: the misuse is still seen there."""
    ai = Interlock()
    caught: list[Exception] = []
    agent = one_call(ai, _swallowing(ai, 42, True, caught), {"n": 1})

    async def main() -> BaseException | None:
        try:
            agent.run_text("go")
        except ToolFailedError as exc:
            return exc
        return None

    failed = asyncio.run(main())
    assert len(caught) == 1, "the tool caught it"
    assert isinstance(failed, ToolFailedError)
    assert failed.status is Status.INVALID_ARGUMENT


def test_a_well_formed_interrupt_after_a_caught_misuse_still_fails_the_tool() -> None:
    ai = Interlock()

    @ai.interruptible_tool(name="odd", description="")
    def odd(inp: Num, res: dict[str, Any] | None) -> Result:
        try:
            interrupt(["not", "an", "object"])
        except StatusError:
            interrupt({"step": "approve"})
        return Result(value=0)

    agent = one_call(ai, odd, {"n": 1})
    with pytest.raises(ToolFailedError) as info:
        agent.run_text("go")
    assert info.value.status is Status.INVALID_ARGUMENT
    assert agent.store.list_snapshots(finish_reason=FinishReason.INTERRUPTED) == []


class _NoJson:
    pass


@pytest.mark.parametrize("data", [{"o": _NoJson()}, _NoJson()], ids=["field", "object"])
def test_interrupt_with_data_that_has_no_json_form_fails_the_tool(data: Any) -> None:
    ai = Interlock()

    @ai.interruptible_tool(name="odd", description="")
    def odd(inp: Num, res: dict[str, Any] | None) -> Result:
        interrupt(data)
        return Result(value=0)

    with pytest.raises(ToolFailedError) as info:
        one_call(ai, odd, {"n": 1}).run_text("go")
    assert info.value.status is Status.INVALID_ARGUMENT
    assert status_of(info.value) is Status.INVALID_ARGUMENT
    assert "interrupt data must serialize to a JSON object" in info.value.message


def test_interrupt_with_a_dataclass() -> None:
    @dataclasses.dataclass
    class Ask:
        amount: float
        to: str

    with pytest.raises(ToolInterrupt) as info:
        interrupt(Ask(amount=5, to="savings"))
    assert info.value.data == {"amount": 5, "to": "savings"}


def test_interrupt_outside_a_tool() -> None:
    with pytest.raises(StatusError, match="interrupt data must serialize to a JSON object"):
        interrupt("x")
    with pytest.raises(ToolInterrupt) as info:
        interrupt(ApprovalAsk(action="a", details="d"))
    assert info.value.data == {"action": "a", "details": "d"}
    assert not isinstance(info.value, Exception)


def test_interrupt_is_not_swallowed_by_except_exception() -> None:
    ai = Interlock()
    swallowed: list[BaseException] = []

    @ai.interruptible_tool(name="careful", description="")
    def careful(inp: Num, res: dict[str, Any] | None) -> Result:
        try:
            if res is None:
                interrupt({"step": "approve"})
        except Exception as exc:  # a tool's own error handling
            swallowed.append(exc)
            return Result(value=-1)
        return Result(value=inp.n)

    agent = one_call(ai, careful, {"n": 9})
    out = agent.run_text("go")
    assert out.finish_reason is FinishReason.INTERRUPTED
    assert out.interrupts[0].meta("interrupt") == {"step": "approve"}
    assert swallowed == []


def test_any_tool_may_interrupt() -> None:
    ai = Interlock()

    @ai.tool(name="plain", description="")
    def plain(inp: Num, ctx: ToolContext) -> Result:
        if ctx.resumed is None:
            interrupt({"need": "ok"})
        assert ctx.restarted
        return Result(value=inp.n)

    agent = one_call(ai, plain, {"n": 2})
    out = agent.run_text("go")
    assert out.interrupts[0].meta("interrupt") == {"need": "ok"}
    final = agent.run(
        ToolResume(restart=[restart(out.interrupts[0], {"x": 1})]),
        session_id=out.session_id,
    )
    assert final.text == '[{"value": 2}]'


def test_interrupt_payload_is_json_and_ctx_is_delivered() -> None:
    ai = Interlock()
    contexts: list[ToolContext] = []

    @ai.interruptible_tool(name="ctx", description="")
    def with_ctx(inp: Num, res: ApprovalReply | None, ctx: ToolContext) -> Result:
        contexts.append(ctx)
        if res is None:
            interrupt(ApprovalAsk(action="x", details="y"))
        return Result(value=1)

    agent = one_call(ai, with_ctx, {"n": 1})
    out = agent.run_text("go")
    payload = out.interrupts[0].meta("interrupt")
    assert payload == {"action": "x", "details": "y"} and type(payload) is dict
    ctx = contexts[0]
    assert (ctx.name, ctx.ref, ctx.input, ctx.agent) == ("ctx", "r", {"n": 1}, "t")
    assert ctx.session_id == out.session_id and ctx.resumed is None and not ctx.restarted
    assert len(ctx.idempotency_key) == 32
    final = agent.run(
        ToolResume(restart=[with_ctx.resume(out.interrupts[0], ApprovalReply(approved=True))]),
        session_id=out.session_id,
    )
    assert final.finish_reason is FinishReason.STOP
    assert contexts[1].resumed == {"approved": True, "feedback": None}
    assert contexts[1].restarted
    assert contexts[1].idempotency_key == ctx.idempotency_key


# -- interrupt_as ------------------------------------------------------------------------------


def interrupt_part(name: str = "transferMoney", payload: Any = None) -> Part:
    return Part(
        tool_request=ToolRequest(name=name, ref="1", input={}),
        metadata={
            "interrupt": payload
            if payload is not None
            else {"action": "transferMoney", "details": "Transfer $5.00 to a"}
        },
    )


def test_interrupt_as_typed_payload() -> None:
    part = interrupt_part()
    assert interrupt_as(part, ApprovalAsk) == ApprovalAsk(
        action="transferMoney", details="Transfer $5.00 to a"
    )
    assert interrupt_as(part, dict) == {"action": "transferMoney", "details": "Transfer $5.00 to a"}


def test_interrupt_as_none_for_wrong_type_or_non_interrupt() -> None:
    part = interrupt_part()
    assert interrupt_as(part, ApprovalReply) is None  # payload does not validate
    assert interrupt_as(part, Num) is None
    plain = Part(tool_request=ToolRequest(name="transferMoney", ref="1", input={}))
    assert interrupt_as(plain, ApprovalAsk) is None
    resolved = Part(
        tool_request=ToolRequest(name="transferMoney", ref="1", input={}),
        metadata={"resolvedInterrupt": {"action": "a", "details": "b"}},
    )
    assert interrupt_as(resolved, ApprovalAsk) is None
    assert interrupt_as(Part(text="hello"), ApprovalAsk) is None


def test_tool_interrupt_as_checks_the_tool_name() -> None:
    assert transferMoney.interrupt_as(interrupt_part(), ApprovalAsk) == ApprovalAsk(
        action="transferMoney", details="Transfer $5.00 to a"
    )
    assert transferMoney.interrupt_as(interrupt_part()) == {
        "action": "transferMoney",
        "details": "Transfer $5.00 to a",
    }
    assert transferMoney.interrupt_as(interrupt_part(name="other"), ApprovalAsk) is None
    assert transferMoney.interrupt_as(Part(text="x"), ApprovalAsk) is None


# -- respond / resume builders -------------------------------------------------------------------


def test_respond_builds_a_marked_tool_response() -> None:
    part = interrupt_part()
    answer = transferMoney.respond(
        part, TransferOutput(success=True, transaction_id="t"), metadata={"by": "alice"}
    )
    assert answer.tool_response == ToolResponse(
        name="transferMoney", ref="1", output={"success": True, "transactionId": "t"}
    )
    # as Genkit's RespondOptions.Metadata: the value of the marker
    assert answer.metadata == {"interruptResponse": {"by": "alice"}}
    assert transferMoney.respond(part, TransferOutput(success=False)).metadata == {
        "interruptResponse": True
    }
    with pytest.raises(StatusError, match="respond metadata must be a JSON object"):
        respond(part, {}, cast(Any, ["not", "an", "object"]))
    # JSON as it stands
    assert answer.model_dump(mode="json")["toolResponse"]["output"]["transactionId"] == "t"


def test_respond_validates_output_against_out() -> None:
    part = interrupt_part()
    with pytest.raises(StatusError) as info:
        transferMoney.respond(part, {"transactionId": "t"})  # success missing
    assert info.value.status is Status.INVALID_ARGUMENT
    assert "invalid output for tool 'transferMoney'" in info.value.message
    assert "success" in info.value.message
    with pytest.raises(StatusError, match="invalid output"):
        transferMoney.respond(part, {"success": "definitely"})
    # a dict of the right shape is accepted and normalized to the wire form
    ok = transferMoney.respond(part, {"success": True, "transaction_id": "x"})
    assert ok.tool_response is not None
    assert ok.tool_response.output == {"success": True, "transactionId": "x"}


def test_resume_validates_resume_data() -> None:
    part = interrupt_part()
    with pytest.raises(StatusError) as info:
        transferMoney.resume(part, {"approved": "maybe-ish"})
    assert info.value.status is Status.INVALID_ARGUMENT
    assert "invalid resume data for tool 'transferMoney'" in info.value.message
    good = transferMoney.resume(part, ApprovalReply(approved=True))
    assert good.tool_request == ToolRequest(name="transferMoney", ref="1", input={})
    assert good.metadata == {"resumed": {"approved": True, "feedback": None}}
    assert transferMoney.resume(part).metadata == {"resumed": True}


def test_builders_check_the_part_belongs_to_the_tool() -> None:
    other = interrupt_part(name="other")
    builds: tuple[Callable[[], Part], ...] = (
        lambda: transferMoney.respond(other, TransferOutput(success=True)),
        lambda: transferMoney.resume(other, ApprovalReply(approved=True)),
    )
    for build in builds:
        with pytest.raises(StatusError) as info:
            build()
        assert info.value.status is Status.INVALID_ARGUMENT
        assert "part belongs to 'other', not to tool 'transferMoney'" in info.value.message
    with pytest.raises(StatusError, match="answers an interrupt by its tool-request part"):
        transferMoney.respond(Part(text="x"), TransferOutput(success=True))


def test_module_builders_need_a_tool_request() -> None:
    with pytest.raises(StatusError, match="respond needs the interrupted tool-request part"):
        respond(Part(text="x"), {})
    with pytest.raises(StatusError, match="resume data must serialize to a JSON object"):
        restart(interrupt_part(), [1, 2])


def test_resume_data_that_is_no_object_is_refused_not_dropped() -> None:
    """`true` on the wire means "restart with no resume data": resume data `True` (or
    `False`) given in Python would reach the tool as None, or be lost, so it is refused
    when the part is built, as every other value that is no JSON object."""
    ai = Interlock()

    @ai.interruptible_tool(name="flag", description="d")
    def flag(inp: dict[str, Any], res: bool | None) -> dict[str, Any]:
        return {"res": res}

    part = interrupt_part(name="flag")
    for value in (True, False, 1, "yes"):
        for build in (flag.resume, restart):
            with pytest.raises(StatusError) as info:
                build(part, value)
            assert info.value.status is Status.INVALID_ARGUMENT
            assert info.value.message.startswith("resume data must serialize to a JSON object")
    assert restart(part).metadata == {"resumed": True}  # no data: the marker alone
    assert flag.resume(part).metadata == {"resumed": True}


def test_answers_with_no_json_form_are_invalid_argument() -> None:
    """An output or resume data that cannot become JSON (an arbitrary object) is
    INVALID_ARGUMENT naming what was wrong, from every builder, not a serializer's error."""
    ai = Interlock()

    @ai.tool(name="anything", description="")
    def anything(inp: dict[str, Any]) -> Any:
        return inp

    part = interrupt_part(name="anything")
    builds: dict[str, Callable[[], Part]] = {
        "output of tool 'anything' has no JSON form": lambda: anything.respond(part, object()),
        "respond output has no JSON form": lambda: respond(part, object()),
        "resume data has no JSON form": lambda: restart(part, {"at": object()}),
    }
    for expected, build in builds.items():
        with pytest.raises(StatusError) as info:
            build()
        assert info.value.status is Status.INVALID_ARGUMENT
        assert expected in info.value.message
    with pytest.raises(StatusError, match="resume data has no JSON form"):
        transferMoney.resume(interrupt_part(), {"approved": object()})


def test_a_tool_output_with_no_json_form_fails_the_turn() -> None:
    ai = Interlock()

    @ai.tool(name="opaque", description="")
    def opaque(inp: Num) -> Any:
        return object()

    with pytest.raises(ToolFailedError) as info:
        one_call(ai, opaque, {"n": 1}).run_text("go")
    assert status_of(info.value) is Status.INVALID_ARGUMENT
    assert "output of tool 'opaque' has no JSON form" in info.value.message


# -- tool definitions ----------------------------------------------------------------------------


def test_tool_types_come_from_annotations() -> None:
    ai = Interlock()

    @ai.interruptible_tool
    def annotated(inp: Num, res: ApprovalReply | None) -> Result:
        """Docstring description."""
        return Result(value=inp.n)

    assert isinstance(annotated, InterruptibleTool)
    assert annotated.name == "annotated" and annotated.description == "Docstring description."
    assert annotated.input_type is Num and annotated.output_type is Result
    assert annotated.resume_type is ApprovalReply
    definition = annotated.definition()
    assert definition.input_schema is not None and definition.input_schema["required"] == ["n"]
    assert ai.lookup_tool("annotated") is annotated

    def plain(inp: Num) -> Result:
        return Result(value=inp.n)

    tool = ai.define_tool("plain", "a plain tool", plain)
    assert isinstance(tool, Tool) and not isinstance(tool, InterruptibleTool)
    assert tool(Num(n=3)) == Result(value=3)


def test_duplicate_and_unknown_tools() -> None:
    ai = Interlock()
    ai.define_tool("x", "", lambda inp: inp)
    with pytest.raises(StatusError) as info:
        ai.define_tool("x", "", lambda inp: inp)
    assert info.value.status is Status.ALREADY_EXISTS
    with pytest.raises(ToolNotFoundError, match="tool 'nope' is not defined"):
        ai.lookup_tool("nope")
    with pytest.raises(ToolNotFoundError):
        ai.define_agent("a", model="x/y", tools=["nope"])
    agent = ai.define_agent("a", model="x/y", tools=["x"])
    assert [t.name for t in agent.tools] == ["x"]


def test_sync_and_async_tools_side_by_side() -> None:
    ai = Interlock()

    @ai.tool(name="sync_tool", description="")
    def sync_tool(inp: Num) -> Result:
        return Result(value=inp.n * 2)

    @ai.tool(name="async_tool", description="")
    async def async_tool(inp: Num) -> Result:
        return Result(value=inp.n * 3)

    scripted.define(
        ai,
        "m",
        [
            scripted.reply(
                scripted.tool_call("sync_tool", {"n": 2}),
                scripted.tool_call("async_tool", {"n": 2}),
            ),
            lambda request: json.dumps(
                [p.tool_response.output for p in request.messages[-1].content if p.tool_response]
            ),
        ],
    )
    agent = ai.define_agent(
        "x", model="scripted/m", tools=[sync_tool, async_tool], store=InMemorySessionStore()
    )
    assert agent.run_text("go").text == '[{"value": 4}, {"value": 6}]'
    assert async_tool(Num(n=1)) == Result(value=3)


# -- the error tree ------------------------------------------------------------------------------


def all_errors() -> list[StatusError]:
    failed = ToolFailedError("transferMoney", "tool 'transferMoney' failed: x")
    return [
        StatusError(Status.INVALID_ARGUMENT, "bad amount"),
        failed,
        ResumeValidationError(Status.FAILED_PRECONDITION, "already resumed"),
        SnapshotNotFoundError("snapshot s not found"),
        ResumeSnapshotNotFoundError("snapshot s not found"),
        ToolNotFoundError("tool t is not defined"),
    ]


@pytest.mark.parametrize("err", all_errors(), ids=lambda e: type(e).__name__)
def test_errors_pickle_roundtrip(err: StatusError) -> None:
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is type(err)
    assert back.status is err.status
    assert back.message == err.message
    assert str(back) == str(err)
    assert getattr(back, "tool_name", None) == getattr(err, "tool_name", None)
    err.snapshot_id = "kept-1"
    assert pickle.loads(pickle.dumps(err)).snapshot_id == "kept-1"


@pytest.mark.parametrize("err", all_errors(), ids=lambda e: type(e).__name__)
def test_errors_json_roundtrip(err: StatusError) -> None:
    data = err.to_json()
    assert data == {"status": err.status.value, "message": err.message}
    assert json.loads(json.dumps(data)) == data
    back = type(err).from_json(data)
    assert type(back) is type(err)
    assert (back.status, back.message) == (err.status, err.message)
    if isinstance(err, ToolFailedError):
        assert cast(ToolFailedError, back).tool_name == ""  # not carried by {"status", "message"}
    generic = error_from_info(data)
    assert (generic.status, generic.message) == (err.status, err.message)
    info = err.to_info()
    assert isinstance(info, ErrorInfo)
    assert error_from_info(info).to_json() == data


def test_an_unknown_status_from_a_newer_sender_reads_as_unknown() -> None:
    """A status this version does not know is UNKNOWN, message kept (gRPC's rule), from
    `from_json`, `error_from_info` and an event alike; what is no error's JSON is still
    refused."""
    data = {"status": "QUOTA_OVERDRAWN", "message": "try tomorrow"}
    for err in (StatusError.from_json(data), error_from_info(data)):
        assert (err.status, err.message) == (Status.UNKNOWN, "try tomorrow")
    failed = TurnFailed.model_validate(
        {
            "event_id": "e1",
            "agent": "a",
            "session_id": "s",
            "turn_id": "t",
            "error": data,
        }
    )
    assert failed.error.status is Status.UNKNOWN
    for bad in ({"status": 5, "message": "m"}, {"message": "m"}, {"status": "NOT_FOUND"}):
        with pytest.raises(ValidationError):
            error_from_info(bad)


def test_error_defaults_and_tree() -> None:
    assert ToolFailedError("t").status is Status.INTERNAL
    assert ToolFailedError("t").message == "tool 't' failed"
    assert ResumeValidationError().status is Status.INVALID_ARGUMENT
    assert SnapshotNotFoundError().status is Status.NOT_FOUND
    assert ToolNotFoundError().status is Status.NOT_FOUND
    assert StatusError().status is Status.UNKNOWN
    assert str(StatusError(Status.ABORTED, "stop")) == "ABORTED: stop"
    assert StatusError("NOT_FOUND").status is Status.NOT_FOUND
    for cls in (StatusError, ToolFailedError, ResumeValidationError, SnapshotNotFoundError):
        assert issubclass(cls, InterlockError)
    assert issubclass(ToolNotFoundError, StatusError)
    assert issubclass(InterlockError, Exception)
    assert issubclass(ResumeSnapshotNotFoundError, SnapshotNotFoundError)
    assert issubclass(ResumeSnapshotNotFoundError, ResumeValidationError)
    assert ResumeSnapshotNotFoundError().status is Status.NOT_FOUND


@pytest.mark.parametrize("cls", [SnapshotNotFoundError, ToolNotFoundError])
def test_not_found_errors_take_a_message_or_the_status_form(
    cls: type[SnapshotNotFoundError] | type[ToolNotFoundError],
) -> None:
    """NOT_FOUND errors are built from a message, or like StatusError(status, message)."""
    plain = cls("x is missing")
    assert (plain.status, plain.message) == (Status.NOT_FOUND, "x is missing")
    styled = cls(Status.NOT_FOUND, "x is missing")
    assert (styled.status, styled.message) == (Status.NOT_FOUND, "x is missing")
    assert str(styled) == str(plain) == "NOT_FOUND: x is missing"
    assert cls(Status.NOT_FOUND).message == cls().message != ""


def test_every_error_takes_a_message_alone_or_the_status_form() -> None:
    """`ResumeValidationError("...")` has its class's status (it raised ValueError: not a
    Status); `ToolFailedError(status, message)`, StatusError's order, does not take the
    status for the tool's name."""
    plain = ResumeValidationError("refs do not match")
    assert (plain.status, plain.message) == (Status.INVALID_ARGUMENT, "refs do not match")
    styled = ResumeValidationError(Status.FAILED_PRECONDITION, "already resumed")
    assert (styled.status, styled.message) == (Status.FAILED_PRECONDITION, "already resumed")
    assert (StatusError("boom").status, StatusError("boom").message) == (Status.UNKNOWN, "boom")
    assert StatusError("ABORTED").message == "", "a status name alone is the status"
    failed = ToolFailedError(Status.INTERNAL, "the bank is down")
    assert (failed.tool_name, failed.status, failed.message) == (
        "",
        Status.INTERNAL,
        "the bank is down",
    )
    named = ToolFailedError("transferMoney", "the bank is down", Status.UNAVAILABLE)
    assert (named.tool_name, named.status) == ("transferMoney", Status.UNAVAILABLE)
    for err in (plain, failed, named):
        again = pickle.loads(pickle.dumps(err))
        assert (type(again), again.status, again.message) == (type(err), err.status, err.message)


def test_a_tool_failure_keeps_the_status_of_its_cause_across_processes() -> None:
    """`status_of` still names the tool's own status once the error was pickled (a
    process pool, a result backend); a cause with no status is left behind."""
    ai = Interlock()

    @ai.tool(name="pay", description="")
    def pay(inp: Num) -> Result:
        raise StatusError(Status.INVALID_ARGUMENT, "amount <= 0")

    with pytest.raises(ToolFailedError) as info:
        one_call(ai, pay, {"n": -5}).run_text("go")
    back = pickle.loads(pickle.dumps(info.value))
    assert (type(back), back.status, back.tool_name) == (ToolFailedError, Status.INTERNAL, "pay")
    assert status_of(back) is Status.INVALID_ARGUMENT
    assert isinstance(back.__cause__, StatusError)
    assert back.__cause__.message == "amount <= 0"

    wrapped = ValueError("wrapped")
    wrapped.__cause__ = StatusError(Status.PERMISSION_DENIED, "no")
    outer = ToolFailedError("t")
    outer.__cause__ = wrapped
    again = pickle.loads(pickle.dumps(outer))
    assert status_of(again) is Status.PERMISSION_DENIED
    assert str(again.__cause__) == "PERMISSION_DENIED: ValueError: wrapped"

    plain = ToolFailedError("t")
    plain.__cause__ = ValueError("boom")
    alone = pickle.loads(pickle.dumps(plain))
    assert alone.__cause__ is None
    assert status_of(alone) is Status.INTERNAL


def test_status_of_walks_the_cause_chain() -> None:
    inner = StatusError(Status.PERMISSION_DENIED, "no")
    middle = ValueError("wrapped")
    middle.__cause__ = inner
    outer = ToolFailedError("t")
    outer.__cause__ = middle
    assert status_of(outer) is Status.PERMISSION_DENIED
    assert status_of(ToolFailedError("t")) is Status.INTERNAL
    assert status_of(ValueError("x")) is Status.UNKNOWN
    assert status_of(None) is Status.UNKNOWN
    # a cycle does not hang
    a = ValueError("a")
    b = StatusError(Status.DATA_LOSS, "b")
    a.__cause__ = b
    b.__cause__ = a
    assert status_of(a) is Status.DATA_LOSS


def test_an_error_no_status_names_is_kept_as_internal_with_its_type() -> None:
    """What raises out of a turn without a StatusError in it (here the caller's own
    chunk listener) is re-raised as it is, and the failed snapshot kept for inspection
    says INTERNAL with the error's type, as the worker's log and `turn.failed` do."""
    ai = Interlock(secret="t")
    scripted.define(ai, "hello", lambda request: scripted.text("hello"))
    store = InMemorySessionStore()
    agent = ai.define_agent("greeter", model="scripted/hello", store=store)

    def listener(chunk: Any) -> None:
        raise ValueError("listener broke")

    with pytest.raises(ValueError, match="listener broke"):
        agent.run_text("hi", on_chunk=listener)
    [failed] = store.list_snapshots(status=SnapshotStatus.FAILED)
    assert failed.error is not None
    assert (failed.error.status, failed.error.message) == (
        Status.INTERNAL,
        "ValueError: listener broke",
    )
