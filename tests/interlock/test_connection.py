"""Connections (docs/concepts.md): a session held across turns, streamed chunk by chunk."""

import json
from typing import Any

import pytest
from pydantic import BaseModel

from examples.banking import (
    ApprovalAsk,
    ApprovalReply,
    TransferOutput,
    bankingAgent,
    transferMoney,
)
from interlock import (
    AgentChunk,
    FinishReason,
    InMemorySessionStore,
    Interlock,
    Message,
    ModelRequest,
    SnapshotStatus,
    Status,
    StatusError,
    ToolFailedError,
    ToolResume,
    interrupt,
    interrupt_as,
    scripted,
)


class Num(BaseModel):
    n: int


class Result(BaseModel):
    value: int


def kinds(chunks: list[AgentChunk]) -> list[str]:
    """A chunk stream as `model:<role>:<part kinds>` / `end:<finish reason>`."""
    out = []
    for c in chunks:
        if c.model_chunk is not None:
            parts = ",".join(
                "interrupt"
                if p.is_interrupt()
                else "request"
                if p.tool_request
                else "response"
                if p.tool_response
                else "text"
                for p in c.model_chunk.content
            )
            out.append(f"model:{c.model_chunk.role}:{parts}")
        if c.turn_end is not None:
            out.append(f"end:{c.turn_end.finish_reason.value}")
    return out


def test_stream_of_an_interrupted_then_resumed_turn() -> None:
    with bankingAgent.connect() as conn:
        conn.send_text("Transfer $500 to savings.")
        chunks = list(conn.receive())
        assert kinds(chunks) == ["model:model:request", "model:tool:interrupt", "end:interrupted"]
        paused = conn.output()
        assert chunks[-1].turn_end is not None
        assert chunks[-1].turn_end.snapshot_id == paused.snapshot_id
        interrupt_part = chunks[1].model_chunk.content[0]  # type: ignore[union-attr]
        assert interrupt_part == paused.interrupts[0]

        reply = transferMoney.resume(interrupt_part, ApprovalReply(approved=True))
        conn.send_resume(ToolResume(restart=[reply]))
        chunks = list(conn.receive())
        assert kinds(chunks) == ["model:tool:response", "model:model:text", "end:stop"]
        response = chunks[0].model_chunk.content[0]  # type: ignore[union-attr]
        assert response.tool_response is not None and response.meta("source") == "restart"
        assert response.tool_response.output["success"] is True
        out = conn.output()
        assert out.finish_reason is FinishReason.STOP
        assert out.session_id == paused.session_id
        assert out.snapshot_id != paused.snapshot_id


def test_break_at_turn_end_then_send_again() -> None:
    with bankingAgent.connect() as conn:
        for text in ("hello", "Transfer $3 to alice"):
            conn.send_text(text)
            for chunk in conn.receive():
                if chunk.turn_end is not None:
                    break
        out = conn.output()
        assert out.finish_reason is FinishReason.INTERRUPTED
        assert interrupt_as(out.interrupts[0], ApprovalAsk) == ApprovalAsk(
            action="transferMoney", details="Transfer $3.00 to alice"
        )


def test_output_without_receive_and_idempotent() -> None:
    with bankingAgent.connect() as conn:
        conn.send_text("hello")
        first = conn.output()
        assert first.finish_reason is FinishReason.STOP
        assert first.text.startswith("I am a banking assistant")
        assert conn.output() == first
        assert list(conn.receive()) == []  # already drained


def test_output_before_any_turn() -> None:
    with bankingAgent.connect() as conn, pytest.raises(StatusError) as info:
        conn.output()
    assert info.value.status is Status.FAILED_PRECONDITION
    assert "no turn has been sent yet" in info.value.message


def test_send_before_the_turn_is_received() -> None:
    with bankingAgent.connect() as conn:
        conn.send_text("hello")
        with pytest.raises(StatusError) as info:
            conn.send_text("again")
        assert info.value.status is Status.FAILED_PRECONDITION
        assert "receive() it first" in info.value.message
        assert conn.output().finish_reason is FinishReason.STOP


def test_a_closed_connection_sends_nothing_and_keeps_its_last_output() -> None:
    with bankingAgent.connect() as conn:
        conn.send_text("hello")
        first = conn.output()
    with pytest.raises(StatusError) as info:
        conn.send_text("again")
    assert info.value.status is Status.FAILED_PRECONDITION
    assert info.value.message == (
        "this connection is closed: go on in its session with "
        f"agent.connect(session_id={first.session_id!r})"
    )
    assert conn.output() == first  # what the last turn gave stays readable
    assert bankingAgent.store is not None
    assert len(bankingAgent.store.list_snapshots(session_id=first.session_id)) == 1


def test_a_closed_connection_without_a_store_names_the_state_to_go_on_from() -> None:
    ai = Interlock(secret="test")
    agent = ai.define_agent("bank", model="scripted/banking")
    with agent.connect() as conn:
        conn.send_text("hello")
        state = conn.output().state
    with pytest.raises(StatusError) as info:
        conn.send_text("again")
    assert info.value.status is Status.FAILED_PRECONDITION
    assert info.value.message == (
        "this connection is closed: go on from its last turn with "
        "agent.connect(state=conn.output().state)"
    )
    assert state is not None and conn.output().state == state


def test_break_mid_turn_then_output() -> None:
    with bankingAgent.connect() as conn:
        conn.send_text("Transfer $1 to a")
        for _chunk in conn.receive():
            break  # stop at the first chunk
        out = conn.output()  # finishes the turn
        assert out.finish_reason is FinishReason.INTERRUPTED
        conn.send_resume(
            ToolResume(respond=[transferMoney.respond(out.interrupts[0], {"success": True})])
        )
        assert conn.output().finish_reason is FinishReason.STOP


def test_session_held_across_turns() -> None:
    store = bankingAgent.store
    assert store is not None
    with bankingAgent.connect() as conn:
        conn.send_text("hello")
        first = conn.output()
        conn.send_text("Transfer $9 to bob")
        second = conn.output()
        assert second.session_id == first.session_id
        snap = store.get_snapshot(second.snapshot_id or "")
        assert snap is not None and snap.parent_id == first.snapshot_id
        assert [m.role for m in snap.messages] == ["user", "model", "user", "model"]


def test_failed_turn_raises_from_receive_and_the_connection_goes_on() -> None:
    store = bankingAgent.store
    assert store is not None
    with bankingAgent.connect() as conn:
        conn.send_text("hello")
        good = conn.output()
        conn.send_text("Transfer $-5 to savings")
        seen: list[AgentChunk] = []

        def drain() -> None:
            for chunk in conn.receive():
                seen.append(chunk)

        with pytest.raises(ToolFailedError) as info:
            drain()
        assert info.value.tool_name == "transferMoney"
        assert kinds(seen) == ["model:model:request"]  # no turn_end for a failed turn
        with pytest.raises(ToolFailedError):
            conn.output()
        conn.send_text("Transfer $5 to savings")
        nxt = conn.output()
        assert nxt.finish_reason is FinishReason.INTERRUPTED
        snap = store.get_snapshot(nxt.snapshot_id or "")
        assert snap is not None and snap.parent_id == good.snapshot_id


def test_a_failed_first_turn_keeps_the_connection_session() -> None:
    store = bankingAgent.store
    assert store is not None
    with bankingAgent.connect() as conn:
        conn.send_text("Transfer $-1 to x")
        with pytest.raises(ToolFailedError) as info:
            conn.output()
        conn.send_text("hello")
        out = conn.output()
    failed = store.get_snapshot(info.value.snapshot_id or "")
    assert failed is not None and failed.status is SnapshotStatus.FAILED
    assert failed.session_id == out.session_id
    snap = store.get_snapshot(out.snapshot_id or "")
    assert snap is not None and snap.parent_id is None  # the failed turn is not continued
    assert [m.role for m in snap.messages] == ["user", "model"]


def test_new_message_while_paused_on_a_connection() -> None:
    with bankingAgent.connect() as conn:
        conn.send_text("Transfer $1 to a")
        paused = conn.output()
        conn.send_text("what now?")
        with pytest.raises(StatusError) as info:
            conn.output()
        assert info.value.status is Status.FAILED_PRECONDITION
        ref = paused.interrupts[0].tool_request.ref  # type: ignore[union-attr]
        assert f"answer the pending interrupts first (transferMoney (ref {ref}))" in (
            info.value.message
        )
        # the pause is still there to answer
        conn.send_resume(
            ToolResume(respond=[transferMoney.respond(paused.interrupts[0], {"success": True})])
        )
        assert conn.output().finish_reason is FinishReason.STOP


def test_connect_to_a_paused_session_by_id() -> None:
    out = bankingAgent.run_text("Transfer $7 to carol")
    reply = transferMoney.respond(
        out.interrupts[0], TransferOutput(success=True, transaction_id="c7")
    )
    with bankingAgent.connect(session_id=out.session_id) as conn:
        conn.send_resume(ToolResume(respond=[reply]))
        final = conn.output()
    assert final.session_id == out.session_id
    assert final.text == "Done: transferred $7.00 to carol, transaction c7."

    out2 = bankingAgent.run_text("Transfer $8 to dan")
    reply2 = transferMoney.respond(
        out2.interrupts[0], TransferOutput(success=True, transaction_id="d8")
    )
    with bankingAgent.connect(snapshot_id=out2.snapshot_id) as conn:
        conn.send_resume(ToolResume(respond=[reply2]))
        assert conn.output().text == "Done: transferred $8.00 to dan, transaction d8."


def test_connection_with_client_managed_state() -> None:
    ai = Interlock(secret="test")
    tool = ai.define_interruptible_tool("transferMoney", "transfer", transferMoney.fn)
    agent = ai.define_agent("bank", model="scripted/banking", tools=[tool])
    with agent.connect() as conn:
        conn.send_text("Transfer $500 to savings.")
        chunks = list(conn.receive())
        assert kinds(chunks)[-1] == "end:interrupted"
        assert chunks[-1].turn_end is not None and chunks[-1].turn_end.snapshot_id is None
        paused = conn.output()
        assert paused.state is not None and paused.snapshot_id is None
        conn.send_resume(
            ToolResume(
                respond=[
                    tool.respond(
                        paused.interrupts[0], TransferOutput(success=True, transaction_id="s1")
                    )
                ]
            )
        )
        final = conn.output()
        assert final.text == "Done: transferred $500.00 to savings, transaction s1."
        assert final.state is not None and final.state != paused.state
        assert final.session_id == paused.session_id


def test_connect_with_a_state() -> None:
    ai = Interlock(secret="test")
    tool = ai.define_interruptible_tool("transferMoney", "transfer", transferMoney.fn)
    agent = ai.define_agent("bank", model="scripted/banking", tools=[tool])
    out = agent.run_text("Transfer $2 to e")
    with agent.connect(state=out.state) as conn:
        conn.send_resume(ToolResume(respond=[tool.respond(out.interrupts[0], {"success": True})]))
        assert conn.output().finish_reason is FinishReason.STOP


def test_tool_responses_stream_as_tool_chunks() -> None:
    ai = Interlock()

    @ai.tool(name="add", description="")
    def add(inp: Num) -> Result:
        return Result(value=inp.n + 1)

    @ai.interruptible_tool(name="ask", description="")
    def ask(inp: Num, res: dict[str, Any] | None) -> Result:
        if res is None:
            interrupt({"n": inp.n})
        return Result(value=inp.n)

    def model(request: ModelRequest) -> Message:
        last = request.messages[-1]
        if last.role == "user":
            return scripted.reply(
                "working", scripted.tool_call("add", {"n": 1}), scripted.tool_call("ask", {"n": 2})
            )
        outputs = [p.tool_response.output for p in last.content if p.tool_response]
        return scripted.text(json.dumps(outputs))

    scripted.define(ai, "m", model)
    agent = ai.define_agent("x", model="scripted/m", tools=[add, ask], store=InMemorySessionStore())
    with agent.connect() as conn:
        conn.send_text("go")
        chunks = list(conn.receive())
        # the completed call is streamed as it ran; its output waits on its request part
        assert kinds(chunks) == [
            "model:model:text,request,request",
            "model:tool:response",
            "model:tool:interrupt",
            "end:interrupted",
        ]
        ran = chunks[1].model_chunk.content[0]  # type: ignore[union-attr]
        assert ran.tool_response is not None and ran.tool_response.name == "add"
        assert ran.tool_response.output == {"value": 2}
        paused = conn.output()
        assert paused.message is not None
        request = paused.message.content[1]
        assert (
            request.tool_request is not None and request.tool_request.ref == ran.tool_response.ref
        )
        assert request.meta("pendingOutput") == {"value": 2}
        conn.send_resume(ToolResume(respond=[ask.respond(paused.interrupts[0], {"value": 0})]))
        chunks = list(conn.receive())
        assert kinds(chunks) == ["model:tool:response,response", "model:model:text", "end:stop"]
        sources = [p.meta("source") for p in chunks[0].model_chunk.content]  # type: ignore[union-attr]
        assert sources == ["pending", None]
        assert conn.output().text == '[{"value": 2}, {"value": 0}]'


def test_a_restart_that_runs_beside_a_new_pause_is_streamed() -> None:
    """Two interrupts; the answer restarts one (it completes) and the other asks again:
    the re-paused turn streams the restarted call's response, then the new interrupt."""
    ai = Interlock()

    @ai.interruptible_tool(name="ask", description="")
    def ask(inp: Num, res: dict[str, Any] | None) -> Result:
        if res is None or (inp.n == 2 and "twice" not in res):
            interrupt({"n": inp.n})
        return Result(value=inp.n * 10)

    def model(request: ModelRequest) -> Message:
        if request.messages[-1].role == "user":
            return scripted.reply(
                scripted.tool_call("ask", {"n": 1}), scripted.tool_call("ask", {"n": 2})
            )
        return scripted.text("done")

    scripted.define(ai, "m", model)
    agent = ai.define_agent("x", model="scripted/m", tools=[ask], store=InMemorySessionStore())
    with agent.connect() as conn:
        conn.send_text("go")
        assert kinds(list(conn.receive())) == [
            "model:model:request,request",
            "model:tool:interrupt,interrupt",
            "end:interrupted",
        ]
        first, second = conn.output().interrupts
        conn.send_resume(ToolResume(restart=[ask.resume(first, {}), ask.resume(second, {})]))
        chunks = list(conn.receive())
        assert kinds(chunks) == ["model:tool:response", "model:tool:interrupt", "end:interrupted"]
        ran = chunks[0].model_chunk.content[0]  # type: ignore[union-attr]
        assert ran.tool_response is not None and ran.tool_response.output == {"value": 10}
        assert ran.meta("source") == "restart"
        again = conn.output().interrupts
        assert [p.tool_request.ref for p in again] == [second.tool_request.ref]  # type: ignore[union-attr]
        conn.send_resume(ToolResume(restart=[ask.resume(again[0], {"twice": True})]))
        chunks = list(conn.receive())
        assert kinds(chunks) == ["model:tool:response,response", "model:model:text", "end:stop"]
        outputs = [p.tool_response.output for p in chunks[0].model_chunk.content]  # type: ignore[union-attr]
        assert outputs == [{"value": 10}, {"value": 20}]
