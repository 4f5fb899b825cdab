"""The flows of Genkit's agent interrupts (docs/concepts.md): pause, answer, resume, re-pause."""

import asyncio
import json
import uuid
from typing import Any, NamedTuple

import pytest
from pydantic import BaseModel

from examples.banking import (
    ApprovalAsk,
    ApprovalReply,
    TransferInput,
    TransferOutput,
    bankingAgent,
    transferMoney,
)
from interlock import (
    Agent,
    AgentInput,
    AgentOutput,
    FinishReason,
    InMemorySessionStore,
    Interlock,
    InterruptibleTool,
    Message,
    ModelChunk,
    ModelRequest,
    ModelResponse,
    Part,
    SnapshotStatus,
    Status,
    StatusError,
    ToolResume,
    interrupt,
    interrupt_as,
    respond,
    restart,
    scripted,
)

# -- a small counting toolkit ----------------------------------------------------------


class Ask(BaseModel):
    question: str


class Answer(BaseModel):
    ok: bool
    note: str = ""


class Num(BaseModel):
    n: int


class Result(BaseModel):
    value: int


def summarize(request: ModelRequest) -> str:
    """The outputs of the newest tool message, as JSON (what a test model answers)."""
    last = request.messages[-1]
    outputs = [p.tool_response.output for p in last.content if p.tool_response is not None]
    return "results: " + json.dumps(outputs, sort_keys=True)


def calls_then_summary(*calls: Part) -> Any:
    """A model that calls `calls` at once on a user message, then summarizes."""

    def model(request: ModelRequest) -> Message:
        if request.messages[-1].role == "user":
            return scripted.reply(*calls)
        return scripted.text(summarize(request))

    return model


class Kit:
    """A registry with a counting interruptible tool `approve` and a counting tool `add`."""

    def __init__(self) -> None:
        self.ai = Interlock(secret="test")
        self.calls: dict[str, list[Any]] = {"approve": [], "add": []}

        @self.ai.interruptible_tool(name="approve", description="asks first")
        def approve_tool(inp: Num, res: Answer | None) -> Result:
            self.calls["approve"].append(res)
            if res is None:
                interrupt(Ask(question=f"may I use {inp.n}?"))
            assert res is not None
            return Result(value=inp.n if res.ok else -1)

        @self.ai.tool(name="add", description="adds one")
        def add_tool(inp: Num) -> Result:
            self.calls["add"].append(inp.n)
            return Result(value=inp.n + 1)

        self.approve = approve_tool
        self.add = add_tool

    def agent(self, model: Any, *, store: Any = "memory", name: str = "a", **kw: Any) -> Any:
        model_name = scripted.define(self.ai, name, model)
        return self.ai.define_agent(
            name,
            model=model_name,
            tools=[self.approve, self.add],
            store=InMemorySessionStore() if store == "memory" else store,
            **kw,
        )


# -- connect and stream (Genkit's example's first flow) -----------------------------------------


def test_connect_stream_respond_and_resume() -> None:
    with bankingAgent.connect() as conn:
        conn.send_text("Transfer $500 to my savings account.")
        interrupt_part: Part | None = None
        ends = []
        for chunk in conn.receive():
            if chunk.model_chunk is not None:
                for p in chunk.model_chunk.content:
                    if p.is_tool_request():
                        interrupt_part = p
            if chunk.turn_end is not None:
                ends.append(chunk.turn_end)
                break  # Genkit's example stops at the turn end
        assert [e.finish_reason for e in ends] == [FinishReason.INTERRUPTED]
        assert interrupt_part is not None and interrupt_part.is_interrupt()
        ask = interrupt_as(interrupt_part, ApprovalAsk)
        assert ask == ApprovalAsk(action="transferMoney", details="Transfer $500.00 to savings")
        assert transferMoney.interrupt_as(interrupt_part, ApprovalAsk) == ask

        reply = transferMoney.respond(
            interrupt_part, TransferOutput(success=True, transaction_id="txn-approved")
        )
        conn.send_resume(ToolResume(respond=[reply]))
        text = ""
        finish = None
        for chunk in conn.receive():
            if chunk.model_chunk is not None:
                text += chunk.model_chunk.text
            if chunk.turn_end is not None:
                finish = chunk.turn_end.finish_reason
                break
        assert finish is FinishReason.STOP
        assert text == "Done: transferred $500.00 to savings, transaction txn-approved."
        out = conn.output()
        assert out.finish_reason is FinishReason.STOP
        assert out.text == text
        assert out.snapshot_id is not None and out.state is None
        assert conn.output() == out  # idempotent


# -- single-turn run ----------------------------------------------------------------------


def test_single_turn_run_and_resume_with_session_id() -> None:
    out = bankingAgent.run_text("Transfer $500 to savings.")
    assert out.finish_reason is FinishReason.INTERRUPTED
    assert out.session_id is not None and out.snapshot_id is not None and out.state is None
    part = next(p for p in out.message.content if interrupt_as(p, ApprovalAsk) is not None)  # type: ignore[union-attr]
    reply = transferMoney.respond(part, TransferOutput(success=True, transaction_id="txn-1"))
    final = bankingAgent.run(
        AgentInput(resume=ToolResume(respond=[reply])), session_id=out.session_id
    )
    assert final.finish_reason is FinishReason.STOP
    assert final.session_id == out.session_id
    assert "txn-1" in final.text
    assert final.text == "Done: transferred $500.00 to savings, transaction txn-1."


def test_interrupt_part_found_among_text_and_other_calls() -> None:
    kit = Kit()
    agent = kit.agent(
        calls_then_summary(
            Part(text="Let me check."),
            scripted.tool_call("add", {"n": 1}, ref="add-1"),
            scripted.tool_call("approve", {"n": 7}, ref="ap-1"),
            scripted.tool_call("add", {"n": 2}, ref="add-2"),
        )
    )
    out = agent.run_text("go")
    assert out.finish_reason is FinishReason.INTERRUPTED
    assert out.text == "Let me check."  # text beside the calls stays in the message
    assert len(out.message.content) == 4
    found = [p for p in out.message.content if interrupt_as(p, Ask) is not None]
    assert len(found) == 1 and found[0].tool_request is not None
    assert found[0].tool_request.ref == "ap-1"
    assert out.interrupts == found
    assert interrupt_as(found[0], Ask) == Ask(question="may I use 7?")


# -- respond vs restart --------------------------------------------------------------------


def test_respond_does_not_run_the_tool() -> None:
    kit = Kit()
    agent = kit.agent(calls_then_summary(scripted.tool_call("approve", {"n": 3})))
    out = agent.run_text("go")
    assert len(kit.calls["approve"]) == 1
    part = out.interrupts[0]
    final = agent.run(
        ToolResume(respond=[kit.approve.respond(part, Result(value=99))]), session_id=out.session_id
    )
    assert final.text == 'results: [{"value": 99}]'
    assert kit.calls["approve"] == [None]  # not run again


def test_restart_reruns_the_tool_with_res() -> None:
    kit = Kit()
    agent = kit.agent(calls_then_summary(scripted.tool_call("approve", {"n": 3})))
    out = agent.run_text("go")
    part = out.interrupts[0]
    final = agent.run(
        ToolResume(restart=[kit.approve.resume(part, Answer(ok=True, note="fine"))]),
        session_id=out.session_id,
    )
    assert final.finish_reason is FinishReason.STOP
    assert final.text == 'results: [{"value": 3}]'
    assert kit.calls["approve"] == [None, Answer(ok=True, note="fine")]
    # the restart alias builds the same part
    assert kit.approve.restart(part, Answer(ok=True)) == kit.approve.resume(part, Answer(ok=True))


def test_banking_restart_completes_with_a_transaction() -> None:
    out = bankingAgent.run_text("Transfer $500 to savings.")
    part = out.interrupts[0]
    reply = transferMoney.resume(part, ApprovalReply(approved=True, feedback="ok"))
    assert reply.meta("resumed") == {"approved": True, "feedback": "ok"}
    final = bankingAgent.run(ToolResume(restart=[reply]), session_id=out.session_id)
    assert final.finish_reason is FinishReason.STOP
    assert final.text.startswith("Done: transferred $500.00 to savings, transaction txn-")


def test_banking_restart_declined() -> None:
    out = bankingAgent.run_text("Transfer $500 to savings.")
    reply = transferMoney.resume(out.interrupts[0], ApprovalReply(approved=False))
    final = bankingAgent.run(ToolResume(restart=[reply]), session_id=out.session_id)
    assert final.text == "The transfer of $500.00 to savings was declined."


def test_several_interrupts_answered_at_once_mixing_lists() -> None:
    out = bankingAgent.run_text("Transfer $1 to alice and $2 to bob")
    assert out.finish_reason is FinishReason.INTERRUPTED
    asks = [interrupt_as(p, ApprovalAsk) for p in out.interrupts]
    assert [a.details for a in asks if a] == ["Transfer $1.00 to alice", "Transfer $2.00 to bob"]
    a, b = out.interrupts
    final = bankingAgent.run(
        ToolResume(
            respond=[transferMoney.respond(a, TransferOutput(success=True, transaction_id="t-a"))],
            restart=[transferMoney.resume(b, ApprovalReply(approved=False))],
        ),
        session_id=out.session_id,
    )
    assert final.finish_reason is FinishReason.STOP
    assert final.text == (
        "Done: transferred $1.00 to alice, transaction t-a. "
        "The transfer of $2.00 to bob was declined."
    )


def test_mixed_lists_count_calls() -> None:
    kit = Kit()
    agent = kit.agent(
        calls_then_summary(
            scripted.tool_call("approve", {"n": 1}, ref="r1"),
            scripted.tool_call("approve", {"n": 2}, ref="r2"),
            scripted.tool_call("approve", {"n": 3}, ref="r3"),
        )
    )
    out = agent.run_text("go")
    assert len(out.interrupts) == 3 and len(kit.calls["approve"]) == 3
    p1, p2, p3 = out.interrupts
    final = agent.run(
        ToolResume(
            respond=[kit.approve.respond(p2, {"value": 20})],
            restart=[
                kit.approve.resume(p1, Answer(ok=True)),
                kit.approve.resume(p3, {"ok": False}),
            ],
        ),
        session_id=out.session_id,
    )
    # responses in the order of the calls
    assert final.text == 'results: [{"value": 1}, {"value": 20}, {"value": -1}]'
    assert kit.calls["approve"][3:] == [Answer(ok=True), Answer(ok=False)]


# -- re-pausing ------------------------------------------------------------------------------


def test_repause_with_then() -> None:
    out = bankingAgent.run_text("Transfer $1 to a then $2 to b")
    assert [interrupt_as(p, ApprovalAsk) for p in out.interrupts] == [
        ApprovalAsk(action="transferMoney", details="Transfer $1.00 to a")
    ]
    first = transferMoney.respond(
        out.interrupts[0], TransferOutput(success=True, transaction_id="t1")
    )
    second = bankingAgent.run(ToolResume(respond=[first]), session_id=out.session_id)
    assert second.finish_reason is FinishReason.INTERRUPTED
    assert second.snapshot_id != out.snapshot_id
    assert [interrupt_as(p, ApprovalAsk) for p in second.interrupts] == [
        ApprovalAsk(action="transferMoney", details="Transfer $2.00 to b")
    ]
    reply = transferMoney.respond(
        second.interrupts[0], TransferOutput(success=True, transaction_id="t2")
    )
    final = bankingAgent.run(ToolResume(respond=[reply]), session_id=out.session_id)
    assert final.finish_reason is FinishReason.STOP
    assert final.text == (
        "Done: transferred $1.00 to a, transaction t1. "
        "Done: transferred $2.00 to b, transaction t2."
    )


def test_loop_until_not_interrupted() -> None:
    out = bankingAgent.run_text("Transfer $1 to a then $2 to b then $3 to c")
    rounds = 0
    while out.finish_reason is FinishReason.INTERRUPTED:
        rounds += 1
        replies = [transferMoney.resume(p, ApprovalReply(approved=True)) for p in out.interrupts]
        out = bankingAgent.run(ToolResume(restart=replies), session_id=out.session_id)
    assert rounds == 3
    assert out.text.count("Done: transferred") == 3


class Step(BaseModel):
    step: int


class TwoStepReply(BaseModel):
    step: int
    ok: bool


class TwoStep(NamedTuple):
    agent: Agent
    tool: InterruptibleTool[Num, Result, TwoStepReply | None]
    store: InMemorySessionStore
    runs: list[TwoStepReply | None]


def _two_step() -> TwoStep:
    """An agent whose one call ("only") asks twice: step 1, then step 2 once restarted."""
    ai = Interlock()
    runs: list[TwoStepReply | None] = []

    @ai.interruptible_tool(name="twoStep", description="two approvals")
    def two_step(inp: Num, res: TwoStepReply | None) -> Result:
        runs.append(res)
        if res is None:
            interrupt(Step(step=1))
        assert res is not None
        if res.step == 1:
            interrupt(Step(step=2))
        return Result(value=inp.n * 10)

    model = scripted.define(
        ai, "two", calls_then_summary(scripted.tool_call("twoStep", {"n": 4}, ref="only"))
    )
    store = InMemorySessionStore()
    agent = ai.define_agent("two", model=model, tools=[two_step], store=store)
    return TwoStep(agent, two_step, store, runs)


def test_restarted_tool_interrupts_again_keeping_its_ref() -> None:
    agent, two_step, store, runs = _two_step()
    out = agent.run_text("go")
    first = out.interrupts[0]
    assert interrupt_as(first, Step) == Step(step=1)

    again = agent.run(
        ToolResume(restart=[two_step.resume(first, TwoStepReply(step=1, ok=True))]),
        session_id=out.session_id,
    )
    assert again.finish_reason is FinishReason.INTERRUPTED
    assert len(again.interrupts) == 1
    second = again.interrupts[0]
    assert second.tool_request is not None and second.tool_request.ref == "only"
    assert second.meta("interrupt") == {"step": 2}
    assert second.meta("resolvedInterrupt") == {"step": 1}
    snap = store.get_snapshot(again.snapshot_id or "")
    assert snap is not None
    assert (snap.status, snap.finish_reason) == (SnapshotStatus.COMPLETED, FinishReason.INTERRUPTED)
    assert snap.parent_id == out.snapshot_id

    final = agent.run(
        ToolResume(restart=[two_step.resume(second, TwoStepReply(step=2, ok=True))]),
        session_id=out.session_id,
    )
    assert final.finish_reason is FinishReason.STOP
    assert final.text == 'results: [{"value": 40}]'
    assert runs == [None, TwoStepReply(step=1, ok=True), TwoStepReply(step=2, ok=True)]
    history = store.get_snapshot(final.snapshot_id or "")
    assert history is not None
    [call] = [p for m in history.messages for p in m.content if p.tool_request is not None]
    assert call.meta("resolvedInterrupt") == {"step": 2} and "interrupt" not in (
        call.metadata or {}
    )


def test_a_second_answer_to_a_pause_addressed_by_its_snapshot_is_already_resumed() -> None:
    """docs/concepts.md: `session_id=` answers what is pending now, `snapshot_id=` the
    pause the answer was made for. A second reviewer answering the first pause after a
    restart paused again at the same ref: by snapshot it is refused "already resumed"
    and nothing runs; by session it meets the new pause (same ref). Once the turn has
    ended, a late answer by session is from an earlier turn."""
    agent, two_step, store, runs = _two_step()
    out = agent.run_text("go")
    first = out.interrupts[0]
    again = agent.run(
        ToolResume(restart=[two_step.resume(first, TwoStepReply(step=1, ok=True))]),
        snapshot_id=out.snapshot_id,
    )
    assert again.interrupts[0].meta("interrupt") == {"step": 2}
    late = ToolResume(respond=[two_step.respond(first, Result(value=0))])
    before = len(store.list_snapshots(session_id=out.session_id))
    with pytest.raises(StatusError) as refused:
        agent.run(late, snapshot_id=out.snapshot_id)
    assert refused.value.status is Status.FAILED_PRECONDITION
    assert "already resumed" in refused.value.message
    assert len(store.list_snapshots(session_id=out.session_id)) == before, "nothing written"
    assert len(runs) == 2, "nothing ran"

    by_session = agent.run(late, session_id=out.session_id)  # the pause pending now
    assert by_session.finish_reason is FinishReason.STOP
    assert by_session.text == 'results: [{"value": 0}]'
    with pytest.raises(StatusError) as ended:
        agent.run(late, session_id=out.session_id)
    assert ended.value.status is Status.INVALID_ARGUMENT
    assert "from an earlier turn which is no longer pending" in ended.value.message


def _x_then_y(runs: list[tuple[int, Any]]) -> tuple[Agent, InterruptibleTool[Any, Any, Any]]:
    """An agent whose model calls `twoStep` twice (refs x, n=1 and y, n=2): each call
    interrupts; restarted at step 1, y interrupts again (step 2), x runs to its output."""
    ai = Interlock()

    @ai.interruptible_tool(name="twoStep", description="two approvals")
    def two_step(inp: Num, res: TwoStepReply | None) -> Result:
        runs.append((inp.n, res))
        if res is None or (inp.n == 2 and res.step == 1):
            interrupt(Step(step=1 if res is None else 2))
        return Result(value=inp.n)

    model = scripted.define(
        ai,
        "two",
        calls_then_summary(
            scripted.tool_call("twoStep", {"n": 1}, ref="x"),
            scripted.tool_call("twoStep", {"n": 2}, ref="y"),
        ),
    )
    agent = ai.define_agent("two", model=model, tools=[two_step], store=InMemorySessionStore())
    return agent, two_step


def test_repause_keeps_other_answers() -> None:
    """An answer given beside a restart that re-pauses is kept, not asked again."""
    runs: list[tuple[int, Any]] = []
    agent, two_step = _x_then_y(runs)
    out = agent.run_text("go")
    x, y = out.interrupts
    again = agent.run(
        ToolResume(
            respond=[two_step.respond(x, Result(value=100))],
            restart=[two_step.resume(y, TwoStepReply(step=1, ok=True))],
        ),
        session_id=out.session_id,
    )
    assert [p.tool_request.ref for p in again.interrupts if p.tool_request] == ["y"]
    final = agent.run(
        ToolResume(restart=[two_step.resume(again.interrupts[0], TwoStepReply(step=2, ok=True))]),
        session_id=out.session_id,
    )
    assert final.text == 'results: [{"value": 100}, {"value": 2}]'
    assert len(runs) == 4
    # §3: what waited in the message as pendingOutput comes back as source "pending";
    # x's answer, given before the re-pause, keeps its respond mark beside it. y's output
    # came from its restart in this turn.
    snap = agent.store.get_snapshot(final.snapshot_id or "") if agent.store else None
    assert snap is not None
    tool = [m for m in snap.messages if m.role == "tool"][-1]
    marks = [(p.tool_response.ref, p.metadata) for p in tool.content if p.tool_response]
    assert marks == [
        ("x", {"interruptResponse": True, "source": "pending"}),
        ("y", {"source": "restart"}),
    ]
    requests = [p for m in snap.messages if m.role == "model" for p in m.content if p.tool_request]
    assert not any({"pendingOutput", "pendingMetadata"} & set(p.metadata or {}) for p in requests)


def test_a_restart_that_completed_beside_a_repause_comes_back_pending() -> None:
    """A restarted call that ran to its output in a resume that paused again (another
    call re-paused) waits as pendingOutput; the next resume gives it back with
    `source: "pending"` (§3), and it does not run again."""
    runs: list[tuple[int, Any]] = []
    agent, two_step = _x_then_y(runs)
    out = agent.run_text("go")
    x, y = out.interrupts
    reply = TwoStepReply(step=1, ok=True)
    again = agent.run(
        ToolResume(restart=[two_step.resume(x, reply), two_step.resume(y, reply)]),
        session_id=out.session_id,
    )
    assert [p.tool_request.ref for p in again.interrupts if p.tool_request] == ["y"]
    final = agent.run(
        ToolResume(restart=[two_step.resume(again.interrupts[0], TwoStepReply(step=2, ok=True))]),
        session_id=out.session_id,
    )
    assert final.text == 'results: [{"value": 1}, {"value": 2}]'
    assert [n for n, _ in runs] == [1, 2, 1, 2, 2], "x ran once after its restart"
    snap = agent.store.get_snapshot(final.snapshot_id or "") if agent.store else None
    assert snap is not None
    tool = [m for m in snap.messages if m.role == "tool"][-1]
    marks = [(p.tool_response.ref, p.metadata) for p in tool.content if p.tool_response]
    assert marks == [("x", {"source": "pending"}), ("y", {"source": "restart"})]


# -- completed calls beside an interrupt run once --------------------------------------------


def test_completed_calls_beside_an_interrupt_run_exactly_once() -> None:
    kit = Kit()
    store = InMemorySessionStore()
    agent = kit.agent(
        calls_then_summary(
            scripted.tool_call("add", {"n": 1}, ref="add-1"),
            scripted.tool_call("approve", {"n": 5}, ref="ap"),
        ),
        store=store,
    )
    out = agent.run_text("go")
    assert kit.calls["add"] == [1]
    add_part = next(
        p for p in out.message.content if p.tool_request and p.tool_request.ref == "add-1"
    )
    assert add_part.meta("pendingOutput") == {"value": 2}
    assert not add_part.is_interrupt()

    final = agent.run(
        ToolResume(restart=[kit.approve.resume(out.interrupts[0], Answer(ok=True))]),
        session_id=out.session_id,
    )
    assert final.text == 'results: [{"value": 2}, {"value": 5}]'
    assert kit.calls["add"] == [1]  # not run again
    snap = store.get_snapshot(final.snapshot_id or "")
    assert snap is not None
    responses = [p for m in snap.messages if m.role == "tool" for p in m.content]
    assert [(p.tool_response.ref, p.meta("source")) for p in responses if p.tool_response] == [
        ("add-1", "pending"),
        ("ap", "restart"),
    ]
    requests = [p for m in snap.messages if m.role == "model" for p in m.content if p.tool_request]
    assert all("pendingOutput" not in (p.metadata or {}) for p in requests)
    assert [p.meta("resolvedInterrupt") for p in requests] == [None, {"question": "may I use 5?"}]


def test_every_tool_request_gets_a_ref() -> None:
    kit = Kit()

    def model(request: ModelRequest) -> Message:
        if request.messages[-1].role == "user":
            return Message(
                role="model",
                content=[
                    Part.model_validate({"toolRequest": {"name": "approve", "input": {"n": 1}}})
                ],
            )
        return scripted.text(summarize(request))

    agent = kit.agent(model)
    chunks: list[Any] = []
    out = agent.run_text("go", on_chunk=chunks.append)
    ref = out.interrupts[0].tool_request.ref
    assert isinstance(ref, str) and str(uuid.UUID(ref)) == ref  # a UUID, in its usual form
    # the streamed model chunk already carries the ref, so it can be answered directly
    streamed = chunks[0].model_chunk.content[0]
    assert streamed.tool_request.ref == ref
    final = agent.run(
        ToolResume(respond=[kit.approve.respond(streamed, {"value": 0})]),
        session_id=out.session_id,
    )
    assert final.text == 'results: [{"value": 0}]'


# -- client-managed state ------------------------------------------------------------------


def test_client_managed_state_flow() -> None:
    ai = Interlock(secret="test")  # a store-less twin of the banking agent
    tool = ai.define_interruptible_tool("transferMoney", "transfer", transferMoney.fn)
    agent = ai.define_agent("bank", model="scripted/banking", tools=[tool], store=None)
    out = agent.run_text("Transfer $500 to savings.")
    assert out.finish_reason is FinishReason.INTERRUPTED
    assert out.state is not None and out.state.startswith("v1.")
    assert out.snapshot_id is None
    reply = tool.respond(out.interrupts[0], TransferOutput(success=True, transaction_id="txn-1"))
    final = agent.run(AgentInput(resume=ToolResume(respond=[reply])), state=out.state)
    assert final.finish_reason is FinishReason.STOP
    assert final.text == "Done: transferred $500.00 to savings, transaction txn-1."
    assert final.session_id == out.session_id
    assert final.state is not None and final.state != out.state and final.snapshot_id is None
    # the conversation goes on from the new state
    nxt = agent.run_text("Transfer $2 to bob", state=final.state)
    assert [interrupt_as(p, ApprovalAsk) for p in nxt.interrupts] == [
        ApprovalAsk(action="transferMoney", details="Transfer $2.00 to bob")
    ]


# -- sync / async / streaming ---------------------------------------------------------------


def test_async_tool_and_async_model() -> None:
    ai = Interlock()
    seen: list[Any] = []

    @ai.interruptible_tool(name="slow", description="async")
    async def slow(inp: Num, res: Answer | None) -> Result:
        await asyncio.sleep(0)
        seen.append(res)
        if res is None:
            interrupt({"why": "async"})
        return Result(value=inp.n + 100)

    @ai.tool(name="plain", description="async ordinary")
    async def plain(inp: Num) -> Result:
        await asyncio.sleep(0)
        return Result(value=-inp.n)

    async def model(request: ModelRequest) -> ModelResponse:
        await asyncio.sleep(0)
        if request.messages[-1].role == "user":
            return ModelResponse(
                message=scripted.reply(
                    scripted.tool_call("plain", {"n": 1}), scripted.tool_call("slow", {"n": 2})
                )
            )
        return ModelResponse(message=scripted.text(summarize(request)))

    ai.define_model("mine/async", model)
    agent = ai.define_agent(
        "x", model="mine/async", tools=[slow, plain], store=InMemorySessionStore()
    )
    out = agent.run_text("go")
    assert out.finish_reason is FinishReason.INTERRUPTED
    assert out.interrupts[0].meta("interrupt") == {"why": "async"}
    final = agent.run(
        ToolResume(restart=[slow.resume(out.interrupts[0], Answer(ok=True))]),
        session_id=out.session_id,
    )
    assert final.text == 'results: [{"value": -1}, {"value": 102}]'
    assert seen == [None, Answer(ok=True)]


def test_async_scripted_function() -> None:
    ai = Interlock()

    async def model(request: ModelRequest) -> str:
        return "async hello"

    name = scripted.define(ai, "async", model)
    agent = ai.define_agent("x", model=name, store=InMemorySessionStore())
    assert agent.run_text("hi").text == "async hello"


def test_streaming_model_chunks_reach_receive() -> None:
    ai = Interlock()

    def model(request: ModelRequest, on_chunk: Any) -> Message:
        for piece in ["Hel", "lo ", "there"]:
            on_chunk(ModelChunk(content=[Part(text=piece)]))
        return scripted.text("Hello there")

    ai.define_model("mine/stream", model)
    agent = ai.define_agent("s", model="mine/stream", store=InMemorySessionStore())
    with agent.connect() as conn:
        conn.send_text("hi")
        chunks = list(conn.receive())
    texts = [c.model_chunk.text for c in chunks if c.model_chunk is not None]
    assert texts == ["Hel", "lo ", "there"]  # streamed, not repeated as a whole
    assert chunks[-1].turn_end is not None
    assert chunks[-1].turn_end.finish_reason is FinishReason.STOP
    assert conn.output().text == "Hello there"


def test_async_streaming_model() -> None:
    ai = Interlock()

    async def model(request: ModelRequest, on_chunk: Any) -> Message:
        on_chunk(ModelChunk(content=[Part(text="a")]))
        await asyncio.sleep(0)
        on_chunk(ModelChunk(content=[Part(text="b")]))
        return scripted.text("ab")

    ai.define_model("mine/astream", model)
    agent = ai.define_agent("s", model="mine/astream", store=None)
    got: list[Any] = []
    out = agent.run_text("hi", on_chunk=got.append)
    assert [c.model_chunk.text for c in got if c.model_chunk] == ["a", "b"]
    assert out.text == "ab"


def test_a_model_with_keyword_only_options_is_not_a_streaming_one() -> None:
    """A second parameter makes a streaming model only where it is taken by position."""
    ai = Interlock()
    seen: list[float] = []

    def model(request: ModelRequest, *, temperature: float = 0.5) -> Message:
        seen.append(temperature)
        return scripted.text("plain")

    def defaulted(request: ModelRequest, on_chunk: Any = None) -> Message:
        on_chunk(ModelChunk(content=[Part(text="streamed")]))
        return scripted.text("streamed")

    ai.define_model("mine/plain", model)
    ai.define_model("mine/defaulted", defaulted)
    got: list[Any] = []
    plain = ai.define_agent("p", model="mine/plain", store=None).run_text("hi", on_chunk=got.append)
    assert (plain.text, seen) == ("plain", [0.5])
    assert [c.model_chunk.text for c in got if c.model_chunk] == ["plain"]  # one whole chunk
    got.clear()
    agent = ai.define_agent("d", model="mine/defaulted", store=None)
    assert agent.run_text("hi", on_chunk=got.append).text == "streamed"
    assert [c.model_chunk.text for c in got if c.model_chunk] == ["streamed"]


# -- max_turns -------------------------------------------------------------------------------


def test_max_turns_aborts_and_keeps_an_aborted_snapshot() -> None:
    kit = Kit()
    store = InMemorySessionStore()
    agent = kit.agent(
        lambda request: scripted.reply(scripted.tool_call("add", {"n": 1})),
        store=store,
        max_turns=3,
    )
    with pytest.raises(StatusError) as info:
        agent.run_text("loop forever")
    assert info.value.status is Status.ABORTED
    assert "max_turns=3" in info.value.message
    assert len(kit.calls["add"]) == 3
    [aborted] = store.list_snapshots(status=SnapshotStatus.ABORTED)
    assert info.value.snapshot_id == aborted.snapshot_id
    assert aborted.finish_reason is FinishReason.ABORTED
    assert aborted.error is not None and aborted.error.status is Status.ABORTED
    assert store.list_snapshots(status=SnapshotStatus.COMPLETED) == []


@pytest.mark.parametrize(
    ("status", "kept"),
    [(Status.ABORTED, SnapshotStatus.ABORTED), (Status.UNAVAILABLE, SnapshotStatus.FAILED)],
)
def test_a_failed_model_call_keeps_a_snapshot_named_by_its_status(
    status: Status, kept: SnapshotStatus
) -> None:
    """A model error whose status is ABORTED (a provider's HTTP 409) keeps an `aborted`
    snapshot, as `max_turns` does; any other keeps a `failed` one."""

    def failing(request: Any) -> Any:
        raise StatusError(status, "the provider said no")

    kit = Kit()
    store = InMemorySessionStore()
    agent = kit.agent(failing, store=store)
    with pytest.raises(StatusError) as info:
        agent.run_text("hi")
    assert info.value.status is status
    [snapshot] = store.list_snapshots(status=kept)
    assert info.value.snapshot_id == snapshot.snapshot_id
    assert snapshot.finish_reason is not None and snapshot.finish_reason.value == kept.value
    assert snapshot.error is not None and snapshot.error.status is status


def test_max_turns_default_is_ten() -> None:
    kit = Kit()
    agent = kit.agent(lambda request: scripted.reply(scripted.tool_call("add", {"n": 1})))
    assert agent.max_turns == 10
    with pytest.raises(StatusError, match="max_turns=10"):
        agent.run_text("go")
    assert len(kit.calls["add"]) == 10
    with pytest.raises(StatusError, match="max_turns must be at least 1") as info:
        kit.ai.define_agent("bad", model="scripted/a", max_turns=0)
    assert info.value.status is Status.INVALID_ARGUMENT


# -- models ----------------------------------------------------------------------------------


def test_unknown_model_is_not_found() -> None:
    ai = Interlock()
    # (googleai/, openai/, ollama/ and anthropic/ are built-in providers:
    # tests/interlock/test_models_*)
    agent = ai.define_agent("x", model="nowhere/gemini-flash-latest", store=InMemorySessionStore())
    with pytest.raises(StatusError) as info:
        agent.run_text("hi")
    assert info.value.status is Status.NOT_FOUND
    assert "model 'nowhere/gemini-flash-latest' is not defined" in info.value.message
    assert "define it with ai.define_model" in info.value.message
    with pytest.raises(StatusError) as bad:
        ai.define_model(" ", lambda request: scripted.text("x"))
    assert bad.value.status is Status.INVALID_ARGUMENT
    assert "is empty" in bad.value.message


def test_a_model_defined_without_a_provider_is_named_as_defined() -> None:
    ai = Interlock()
    ai.define_model("echo", lambda request: scripted.text(f"echo: {request.messages[-1].text}"))
    agent = ai.define_agent("e", model="echo", store=InMemorySessionStore())
    assert agent.run_text("hi").text == "echo: hi"
    with pytest.raises(StatusError) as info:
        ai.define_agent("g", model="gpt-4o-mini", store=None).run_text("hi")
    assert info.value.status is Status.NOT_FOUND
    assert (
        "define it with ai.define_model under that name, or name a provider's model as "
        "provider/model" in info.value.message
    )
    with pytest.raises(StatusError) as other:
        ai.define_agent("x", model="ech0", store=None).run_text("hi")
    assert "openai/ech0" not in other.value.message, "no provider is guessed for a typo"


def test_unknown_model_on_resume_does_not_leave_a_claim() -> None:
    kit = Kit()
    store = InMemorySessionStore()
    agent = kit.agent(calls_then_summary(scripted.tool_call("approve", {"n": 1})), store=store)
    out = agent.run_text("go")
    broken = kit.ai.define_agent("a", model="nowhere/model", tools=[kit.approve], store=store)
    reply = kit.approve.respond(out.interrupts[0], {"value": 1})
    with pytest.raises(StatusError) as info:
        broken.run(ToolResume(respond=[reply]), snapshot_id=out.snapshot_id)
    assert info.value.status is Status.NOT_FOUND
    snap = store.get_snapshot(out.snapshot_id or "")
    assert snap is not None and snap.resumed_by is None
    assert agent.run(ToolResume(respond=[reply]), snapshot_id=out.snapshot_id).text == (
        'results: [{"value": 1}]'
    )


def test_define_model_message_means_stop_and_providers() -> None:
    ai = Interlock()
    requests: list[ModelRequest] = []

    def fn(request: ModelRequest) -> Message:
        requests.append(request)
        return Message(role="model", content=[Part(text="plain")])

    ai.define_model("mine/plain", fn)
    ai.register_provider("fake", lambda name: ai.define_model(f"fake/{name}", fn))
    for model in ("mine/plain", "fake/anything"):
        agent = ai.define_agent("x", model=model, system="be brief", store=InMemorySessionStore())
        out = agent.run_text("hi")
        assert out.finish_reason is FinishReason.STOP and out.text == "plain"
    assert [m.role for m in requests[0].messages] == ["system", "user"]
    assert requests[0].messages[0].text == "be brief"


def test_model_finish_reason_passes_through() -> None:
    ai = Interlock()
    ai.define_model(
        "mine/len",
        lambda request: ModelResponse(
            message=scripted.text("cut"), finish_reason=FinishReason.LENGTH
        ),
    )
    agent = ai.define_agent("x", model="mine/len", store=InMemorySessionStore())
    assert agent.run_text("hi").finish_reason is FinishReason.LENGTH


def test_a_message_from_a_model_function_is_the_models() -> None:
    """A model function may return a bare Message: it is the model's message (role
    `model`, finish reason `stop`), whatever role it was built with."""
    ai = Interlock()
    ai.define_model(
        "mine/plain", lambda request: Message(role="user", content=[Part(text="hello")])
    )
    store = InMemorySessionStore()
    agent = ai.define_agent("x", model="mine/plain", store=store)
    out = agent.run_text("hi")
    assert out.finish_reason is FinishReason.STOP
    assert out.message is not None and out.message.role == "model"
    assert out.snapshot_id is not None
    saved = store.get_snapshot(out.snapshot_id)
    assert saved is not None
    assert [m.role for m in saved.messages] == ["user", "model"]


def test_model_returning_garbage_fails() -> None:
    ai = Interlock()
    ai.define_model("mine/bad", lambda request: 42)
    agent = ai.define_agent("x", model="mine/bad", store=InMemorySessionStore())
    with pytest.raises(StatusError) as info:
        agent.run_text("hi")
    assert info.value.status is Status.INTERNAL
    assert "returned int; expected ModelResponse or Message" in info.value.message


def test_model_sees_tool_definitions() -> None:
    kit = Kit()
    seen: list[ModelRequest] = []

    def model(request: ModelRequest) -> Message:
        seen.append(request)
        return scripted.text("ok")

    agent = kit.agent(model)
    agent.run_text("hi")
    tools = {t.name: t for t in seen[0].tools}
    assert set(tools) == {"approve", "add"}
    assert tools["add"].description == "adds one"
    assert tools["add"].input_schema is not None
    assert tools["add"].input_schema["properties"] == {"n": {"title": "N", "type": "integer"}}


def test_module_level_respond_and_restart_without_the_tool() -> None:
    kit = Kit()
    agent = kit.agent(
        calls_then_summary(
            scripted.tool_call("approve", {"n": 1}, ref="r1"),
            scripted.tool_call("approve", {"n": 2}, ref="r2"),
        )
    )
    out = agent.run_text("go")
    p1, p2 = out.interrupts
    final = agent.run(
        ToolResume(respond=[respond(p1, {"value": 11})], restart=[restart(p2, {"ok": True})]),
        session_id=out.session_id,
    )
    assert final.text == 'results: [{"value": 11}, {"value": 2}]'


def test_transfer_input_uses_wire_names() -> None:
    out = bankingAgent.run_text("Transfer $12.50 to the checking account")
    req = out.interrupts[0].tool_request
    assert req is not None
    assert req.input == {"amount": 12.5, "toAccount": "checking"}
    assert TransferInput.model_validate(req.input) == TransferInput(
        amount=12.5, to_account="checking"
    )


def test_unknown_session_id_starts_a_session_under_it() -> None:
    out = bankingAgent.run_text("hello", session_id="caller-chosen-id")
    assert out.session_id == "caller-chosen-id"
    assert out.finish_reason is FinishReason.STOP
    nxt = bankingAgent.run_text("Transfer $1 to a", session_id="caller-chosen-id")
    store = bankingAgent.store
    assert store is not None
    snap = store.get_snapshot(nxt.snapshot_id or "")
    assert snap is not None and snap.parent_id == out.snapshot_id


def test_run_from_inside_an_event_loop() -> None:
    kit = Kit()

    async def model(request: ModelRequest) -> Message:
        await asyncio.sleep(0)
        if request.messages[-1].role == "user":
            return scripted.reply(scripted.tool_call("approve", {"n": 6}))
        return scripted.text(summarize(request))

    agent = kit.agent(model)

    async def main() -> str:
        out = agent.run_text("go")
        reply = kit.approve.resume(out.interrupts[0], Answer(ok=True))
        return str(agent.run(ToolResume(restart=[reply]), session_id=out.session_id).text)

    assert asyncio.run(main()) == 'results: [{"value": 6}]'


def test_messages_to_one_session_run_one_at_a_time() -> None:
    """Two threads send to the same session at once: the second turn waits for the
    first and goes on from its snapshot. Side by side, both would go on from the same
    snapshot, and one message would be missing from the other's history."""
    import threading

    ai = Interlock()
    entered, go_on = threading.Event(), threading.Event()

    def echo(request: ModelRequest) -> Message:
        said = request.messages[-1].text
        if said == "slow":
            entered.set()
            go_on.wait(30)
        return Message(role="model", content=[Part(text=f"echo {said}")])

    ai.define_model("test/echo", echo)
    agent = ai.define_agent("echo", model="test/echo", store=InMemorySessionStore())
    outs: dict[str, AgentOutput] = {}

    def send(text: str) -> None:
        outs[text] = agent.run_text(text, session_id="s-one")

    first = threading.Thread(target=send, args=("slow",))
    first.start()
    assert entered.wait(30)
    second = threading.Thread(target=send, args=("fast",))
    second.start()
    second.join(0.5)
    assert second.is_alive(), "the second turn waits while the first runs"
    go_on.set()
    first.join(30)
    second.join(30)
    assert agent.store is not None
    latest = agent.store.get_latest_snapshot("s-one")
    assert latest is not None and latest.snapshot_id == outs["fast"].snapshot_id
    assert latest.parent_id == outs["slow"].snapshot_id
    assert [m.text for m in latest.messages] == ["slow", "echo slow", "fast", "echo fast"]
