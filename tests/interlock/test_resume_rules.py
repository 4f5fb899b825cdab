"""Every rejection of a resume (docs/concepts.md, "Resume rules") and the addressing
rules, with its status."""

import json
from typing import Any, cast

import pytest
from pydantic import BaseModel

from examples.banking import ApprovalReply, TransferOutput, bankingAgent, transferMoney
from interlock import (
    AgentInput,
    AgentOutput,
    FinishReason,
    InMemorySessionStore,
    Interlock,
    LatestSnapshotId,
    Message,
    ModelRequest,
    Part,
    ResumeValidationError,
    Snapshot,
    SnapshotNotFoundError,
    SnapshotStatus,
    Status,
    StatusError,
    ToolFailedError,
    ToolRequest,
    ToolResponse,
    ToolResume,
    interrupt,
    respond,
    restart,
    scripted,
)


class Num(BaseModel):
    n: int


class Answer(BaseModel):
    ok: bool


class Result(BaseModel):
    value: int


def summarize(request: ModelRequest) -> Message:
    last = request.messages[-1]
    outputs = [p.tool_response.output for p in last.content if p.tool_response is not None]
    return scripted.text("results: " + json.dumps(outputs))


class Rig:
    """An agent whose model calls `gate` once per given input, all at once."""

    def __init__(self, *inputs: dict[str, Any], store: Any = "memory") -> None:
        self.ai = Interlock(secret="test")
        self.runs: list[Answer | None] = []
        self.fail_next_restart = False

        @self.ai.interruptible_tool(name="gate", description="asks first")
        def gate(inp: Num, res: Answer | None) -> Result:
            self.runs.append(res)
            if res is None:
                interrupt({"n": inp.n})
            if self.fail_next_restart:
                self.fail_next_restart = False
                raise RuntimeError("downstream is down")
            return Result(value=inp.n)

        self.gate = gate
        calls = [scripted.tool_call("gate", i, ref=f"ref-{k}") for k, i in enumerate(inputs)]

        def model(request: ModelRequest) -> Message:
            if request.messages[-1].role == "user":
                return scripted.reply(*calls)
            return summarize(request)

        scripted.define(self.ai, "rig", model)
        self.store = InMemorySessionStore() if store == "memory" else store
        self.agent = self.ai.define_agent(
            "rig", model="scripted/rig", tools=[gate], store=self.store
        )

    def paused(self) -> AgentOutput:
        out = self.agent.run_text("go")
        assert out.finish_reason is FinishReason.INTERRUPTED
        return out

    def snapshot_count(self) -> int:
        return len(self.store.list_snapshots()) if self.store is not None else 0


def rejects(
    status: Status,
    fragment: str,
    fn: Any,
    *args: Any,
    error: type[StatusError] = StatusError,
    **kwargs: Any,
) -> StatusError:
    with pytest.raises(error) as info:
        fn(*args, **kwargs)
    assert info.value.status is status, info.value
    assert fragment in info.value.message, info.value.message
    return info.value


# -- rule 1: name and ref ---------------------------------------------------------------------


def test_wrong_ref_not_found_in_history() -> None:
    rig = Rig({"n": 1})
    out = rig.paused()
    part = out.interrupts[0]
    assert part.tool_request is not None
    forged = part.model_copy(
        update={"tool_request": part.tool_request.model_copy(update={"ref": "nope"})}
    )
    err = rejects(
        Status.INVALID_ARGUMENT,
        "respond for tool 'gate' ref nope not found in session history",
        rig.agent.run,
        ToolResume(respond=[rig.gate.respond(forged, {"value": 1})]),
        session_id=out.session_id,
        error=ResumeValidationError,
    )
    assert isinstance(err, ResumeValidationError)
    rejects(
        Status.INVALID_ARGUMENT,
        "restart for tool 'gate' ref nope not found in session history",
        rig.agent.run,
        ToolResume(restart=[rig.gate.resume(forged, Answer(ok=True))]),
        session_id=out.session_id,
        error=ResumeValidationError,
    )
    assert rig.runs == [None]


def test_ref_of_another_tool_name() -> None:
    rig = Rig({"n": 1})
    out = rig.paused()
    part = out.interrupts[0]
    assert part.tool_request is not None
    renamed = part.model_copy(
        update={"tool_request": part.tool_request.model_copy(update={"name": "other"})}
    )
    rejects(
        Status.INVALID_ARGUMENT,
        "names tool 'other', but the pending interrupt is for 'gate'",
        rig.agent.run,
        ToolResume(respond=[respond(renamed, {"value": 1})]),
        session_id=out.session_id,
        error=ResumeValidationError,
    )


def test_stale_ref_from_an_earlier_turn() -> None:
    first = bankingAgent.run_text("Transfer $1 to alice")
    old = first.interrupts[0]
    done = bankingAgent.run(
        ToolResume(respond=[transferMoney.respond(old, TransferOutput(success=True))]),
        session_id=first.session_id,
    )
    assert done.finish_reason is FinishReason.STOP
    second = bankingAgent.run_text("Transfer $2 to bob", session_id=first.session_id)
    assert second.finish_reason is FinishReason.INTERRUPTED
    rejects(
        Status.INVALID_ARGUMENT,
        "from an earlier turn which is no longer pending",
        bankingAgent.run,
        ToolResume(respond=[transferMoney.respond(old, TransferOutput(success=True))]),
        session_id=first.session_id,
        error=ResumeValidationError,
    )


def test_ref_of_a_call_that_completed_beside_the_interrupt() -> None:
    """A call of the latest model message that ran to its end (its output kept as
    pendingOutput) is not pending, and the message says so: it is not from an earlier
    turn, nor unknown."""
    ai = Interlock()

    @ai.tool(name="lookup", description="d")
    def lookup(inp: dict[str, Any]) -> dict[str, Any]:
        return {"found": True}

    @ai.interruptible_tool(name="ask", description="d")
    def ask(inp: dict[str, Any], res: dict[str, Any] | None) -> dict[str, Any]:
        if res is None:
            interrupt({"q": 1})
        return res or {}

    def model(request: ModelRequest) -> Message:
        if request.messages[-1].role == "user":
            return scripted.reply(
                scripted.tool_call("lookup", {}, ref="r1"), scripted.tool_call("ask", {}, ref="r2")
            )
        return scripted.text("done")

    scripted.define(ai, "m", model)
    agent = ai.define_agent(
        "a", model="scripted/m", tools=[lookup, ask], store=InMemorySessionStore()
    )
    out = agent.run_text("go")
    [paused] = out.interrupts
    assert out.message is not None
    ran = next(p for p in out.message.content if p.tool_request and p.tool_request.ref == "r1")
    error = rejects(
        Status.INVALID_ARGUMENT,
        "respond for tool 'lookup' ref r1 is a call of the latest model message that "
        "completed without pausing (its output is kept): it is no longer pending",
        agent.run,
        ToolResume(respond=[respond(ran, {"found": False}), ask.respond(paused, {})]),
        session_id=out.session_id,
        error=ResumeValidationError,
    )
    assert "earlier turn" not in error.message
    final = agent.run(ToolResume(respond=[ask.respond(paused, {})]), session_id=out.session_id)
    assert final.text == "done"


def test_ref_answered_in_the_resume_that_paused_again() -> None:
    """Two interrupts: one answered by respond, the other restarted and pausing again.
    The answered one is no longer pending, and the message says it was answered (not
    that it completed without pausing); the new pause is then answered alone."""
    ai = Interlock()

    @ai.interruptible_tool(name="ask", description="d")
    def ask(inp: dict[str, Any], res: dict[str, Any] | None) -> dict[str, Any]:
        if res is None:
            interrupt({"q": 1})
        return res or {}

    @ai.interruptible_tool(name="twice", description="d")
    def twice(inp: dict[str, Any], res: dict[str, Any] | None) -> dict[str, Any]:
        if res is None or res.get("step") == 1:
            interrupt({"step": 1 if res is None else 2})
        return res or {}

    def model(request: ModelRequest) -> Message:
        if request.messages[-1].role == "user":
            return scripted.reply(
                scripted.tool_call("ask", {}, ref="a"), scripted.tool_call("twice", {}, ref="b")
            )
        return summarize(request)

    scripted.define(ai, "m2", model)
    agent = ai.define_agent(
        "a2", model="scripted/m2", tools=[ask, twice], store=InMemorySessionStore()
    )
    out = agent.run_text("go")
    first, second = out.interrupts
    again = agent.run(
        ToolResume(
            respond=[ask.respond(first, {"ok": 1})], restart=[twice.resume(second, {"step": 1})]
        ),
        session_id=out.session_id,
    )
    assert again.finish_reason is FinishReason.INTERRUPTED
    [repaused] = again.interrupts
    count = len(agent.store.list_snapshots()) if agent.store is not None else 0
    error = rejects(
        Status.INVALID_ARGUMENT,
        "respond for tool 'ask' ref a was answered already, in the resume this pause came "
        "from (its answer is kept): it is no longer pending",
        agent.run,
        ToolResume(
            respond=[ask.respond(first, {"ok": 2})], restart=[twice.resume(repaused, {"step": 2})]
        ),
        session_id=out.session_id,
        error=ResumeValidationError,
    )
    assert "completed without pausing" not in error.message
    assert agent.store is not None and len(agent.store.list_snapshots()) == count
    final = agent.run(
        ToolResume(restart=[twice.resume(repaused, {"step": 2})]), session_id=out.session_id
    )
    assert final.finish_reason is FinishReason.STOP
    assert final.text == 'results: [{"ok": 1}, {"step": 2}]'


def test_stale_ref_after_repause() -> None:
    out = bankingAgent.run_text("Transfer $1 to a then $2 to b")
    old = out.interrupts[0]
    again = bankingAgent.run(
        ToolResume(restart=[transferMoney.resume(old, ApprovalReply(approved=True))]),
        session_id=out.session_id,
    )
    assert again.finish_reason is FinishReason.INTERRUPTED
    rejects(
        Status.INVALID_ARGUMENT,
        "no longer pending",
        bankingAgent.run,
        ToolResume(restart=[transferMoney.resume(old, ApprovalReply(approved=True))]),
        snapshot_id=again.snapshot_id,
    )


# -- rule 2: restart input unchanged ------------------------------------------------------------


def test_modified_restart_input_is_rejected() -> None:
    out = bankingAgent.run_text("Transfer $500 to savings.")
    reply = transferMoney.resume(out.interrupts[0], ApprovalReply(approved=True))
    assert reply.tool_request is not None
    tampered = reply.model_copy(
        update={
            "tool_request": reply.tool_request.model_copy(
                update={"input": {"amount": 50000, "toAccount": "savings"}}
            )
        }
    )
    rejects(
        Status.INVALID_ARGUMENT,
        "changed its input; a restart must keep the original input",
        bankingAgent.run,
        ToolResume(restart=[tampered]),
        session_id=out.session_id,
        error=ResumeValidationError,
    )
    # nothing was claimed: the right answer still goes through
    final = bankingAgent.run(ToolResume(restart=[reply]), session_id=out.session_id)
    assert final.finish_reason is FinishReason.STOP


def test_restart_input_compared_as_normalized_json() -> None:
    rig = Rig({"n": 5})
    out = rig.paused()
    reply = rig.gate.resume(out.interrupts[0], Answer(ok=True))
    assert reply.tool_request is not None
    as_float = reply.model_copy(
        update={"tool_request": reply.tool_request.model_copy(update={"input": {"n": 5.0}})}
    )
    final = rig.agent.run(ToolResume(restart=[as_float]), session_id=out.session_id)
    assert final.text == 'results: [{"value": 5}]'


def test_restart_input_keeps_large_integers_exact() -> None:
    """5 == 5.0, but two integers a float cannot tell apart are still two inputs."""
    rig = Rig({"n": 2**53 + 1})
    out = rig.paused()
    reply = rig.gate.resume(out.interrupts[0], Answer(ok=True))
    assert reply.tool_request is not None
    off_by_one = reply.model_copy(
        update={"tool_request": reply.tool_request.model_copy(update={"input": {"n": 2**53}})}
    )
    rejects(
        Status.INVALID_ARGUMENT,
        "changed its input",
        rig.agent.run,
        ToolResume(restart=[off_by_one]),
        session_id=out.session_id,
        error=ResumeValidationError,
    )
    final = rig.agent.run(ToolResume(restart=[reply]), session_id=out.session_id)
    assert final.finish_reason is FinishReason.STOP


def test_restart_input_true_is_not_one() -> None:
    ai = Interlock()

    @ai.interruptible_tool(name="flag", description="")
    def flag(inp: dict[str, Any], res: dict[str, Any] | None) -> dict[str, Any]:
        if res is None:
            interrupt({"why": "x"})
        return {"ok": True}

    scripted.define(
        ai,
        "m",
        [scripted.reply(scripted.tool_call("flag", {"on": True, "a": {"b": 1}})), "done"],
    )
    agent = ai.define_agent("f", model="scripted/m", tools=[flag], store=InMemorySessionStore())
    out = agent.run_text("go")
    reply = flag.resume(out.interrupts[0], {"go": 1})
    assert reply.tool_request is not None

    def with_input(value: Any) -> Part:
        assert reply.tool_request is not None
        return reply.model_copy(
            update={"tool_request": reply.tool_request.model_copy(update={"input": value})}
        )

    rejects(
        Status.INVALID_ARGUMENT,
        "changed its input",
        agent.run,
        ToolResume(restart=[with_input({"on": 1, "a": {"b": 1}})]),
        session_id=out.session_id,
    )
    # key order does not matter
    final = agent.run(
        ToolResume(restart=[with_input({"a": {"b": 1.0}, "on": True})]),
        session_id=out.session_id,
    )
    assert final.text == "done"


# -- rule 3: partial answers --------------------------------------------------------------------


def test_partial_answer_is_rejected_and_changes_nothing() -> None:
    rig = Rig({"n": 1}, {"n": 2})
    out = rig.paused()
    a, b = out.interrupts
    before = rig.snapshot_count()
    err = rejects(
        Status.INVALID_ARGUMENT,
        "resume must answer every pending interrupt at once; not answered: gate (ref ref-1)",
        rig.agent.run,
        ToolResume(restart=[rig.gate.resume(a, Answer(ok=True))]),
        snapshot_id=out.snapshot_id,
        error=ResumeValidationError,
    )
    assert isinstance(err, ResumeValidationError)
    assert rig.runs == [None, None]  # nothing ran
    assert rig.snapshot_count() == before  # nothing was written
    snap = rig.store.get_snapshot(out.snapshot_id or "")
    assert snap is not None and snap.resumed_by is None  # nothing was claimed
    final = rig.agent.run(
        ToolResume(
            restart=[rig.gate.resume(a, Answer(ok=True))],
            respond=[rig.gate.respond(b, {"value": 20})],
        ),
        snapshot_id=out.snapshot_id,
    )
    assert final.text == 'results: [{"value": 1}, {"value": 20}]'


# -- rule 4: hand-rolled parts ------------------------------------------------------------------


def test_hand_rolled_respond_part_is_rejected() -> None:
    out = bankingAgent.run_text("Transfer $500 to savings.")
    req = out.interrupts[0].tool_request
    assert req is not None
    hand_rolled = Part(
        tool_response=ToolResponse(
            name=req.name, ref=req.ref, output={"success": True, "transactionId": "forged"}
        )
    )
    rejects(
        Status.INVALID_ARGUMENT,
        "a hand-rolled part is rejected",
        bankingAgent.run,
        ToolResume(respond=[hand_rolled]),
        session_id=out.session_id,
        error=ResumeValidationError,
    )


@pytest.mark.parametrize("marker", [False, None, 0, ""])
def test_a_respond_part_whose_marker_is_false_is_hand_rolled(marker: Any) -> None:
    out = bankingAgent.run_text("Transfer $500 to savings.")
    req = out.interrupts[0].tool_request
    assert req is not None
    unmarked = Part(
        tool_response=ToolResponse(
            name=req.name, ref=req.ref, output={"success": True, "transactionId": "forged"}
        ),
        metadata={"interruptResponse": marker},
    )
    rejects(
        Status.INVALID_ARGUMENT,
        "a hand-rolled part is rejected",
        bankingAgent.run,
        ToolResume(respond=[unmarked]),
        session_id=out.session_id,
        error=ResumeValidationError,
    )


def test_hand_rolled_restart_part_is_rejected() -> None:
    out = bankingAgent.run_text("Transfer $500 to savings.")
    req = out.interrupts[0].tool_request
    assert req is not None
    hand_rolled = Part(tool_request=ToolRequest(name=req.name, ref=req.ref, input=req.input))
    rejects(
        Status.INVALID_ARGUMENT,
        "built with resume()/restart() from the interrupt part; a hand-rolled part is rejected",
        bankingAgent.run,
        ToolResume(restart=[hand_rolled]),
        session_id=out.session_id,
    )
    # a respond part put in the restart list is no restart either, and the other way
    # round: each is told where it goes
    answer = transferMoney.respond(out.interrupts[0], TransferOutput(success=True))
    rejects(
        Status.INVALID_ARGUMENT,
        f"restart lists a respond part (ref {req.ref}, built with respond()): put it in respond",
        bankingAgent.run,
        ToolResume(restart=[answer]),
        session_id=out.session_id,
    )
    again = transferMoney.resume(out.interrupts[0], ApprovalReply(approved=True))
    rejects(
        Status.INVALID_ARGUMENT,
        f"respond lists a restart part (ref {req.ref}, built with resume()/restart()): put it "
        "in restart",
        bankingAgent.run,
        ToolResume(respond=[again]),
        session_id=out.session_id,
    )
    store = bankingAgent.store
    latest = store.get_latest_snapshot(str(out.session_id)) if store is not None else None
    assert latest is not None and latest.snapshot_id == out.snapshot_id, "nothing written"


def test_respond_output_checked_against_out_type() -> None:
    rig = Rig({"n": 1})
    out = rig.paused()
    wrong = respond(out.interrupts[0], {"value": "not a number"})
    rejects(
        Status.INVALID_ARGUMENT,
        "invalid output for tool 'gate'",
        rig.agent.run,
        ToolResume(respond=[wrong]),
        session_id=out.session_id,
        error=ResumeValidationError,
    )


@pytest.mark.parametrize("data", [{"ok": "perhaps"}, {}], ids=["wrong", "empty"])
def test_restart_resume_data_checked_against_resume_type(data: dict[str, Any]) -> None:
    """Checked before anything runs, an empty object too: the tool would be handed `{}`
    and fail the turn where the resume could have been refused."""
    rig = Rig({"n": 1})
    out = rig.paused()
    wrong = restart(out.interrupts[0], data)
    rejects(
        Status.INVALID_ARGUMENT,
        "invalid resume data for tool 'gate'",
        rig.agent.run,
        ToolResume(restart=[wrong]),
        session_id=out.session_id,
        error=ResumeValidationError,
    )
    assert rig.runs == [None]


# -- rule 5: duplicates, empty, both lists ------------------------------------------------------


def test_same_ref_twice_in_one_list() -> None:
    rig = Rig({"n": 1})
    out = rig.paused()
    part = out.interrupts[0]
    rejects(
        Status.INVALID_ARGUMENT,
        "respond lists ref ref-0 twice",
        rig.agent.run,
        ToolResume(respond=[rig.gate.respond(part, {"value": 1})] * 2),
        session_id=out.session_id,
    )
    rejects(
        Status.INVALID_ARGUMENT,
        "restart lists ref ref-0 twice",
        rig.agent.run,
        ToolResume(
            restart=[
                rig.gate.resume(part, Answer(ok=True)),
                rig.gate.resume(part, Answer(ok=False)),
            ]
        ),
        session_id=out.session_id,
    )
    assert rig.runs == [None]


def test_empty_resume_is_rejected() -> None:
    rig = Rig({"n": 1})
    out = rig.paused()
    rejects(
        Status.INVALID_ARGUMENT,
        "resume answers nothing",
        rig.agent.run,
        ToolResume(),
        session_id=out.session_id,
        error=ResumeValidationError,
    )


def test_same_ref_in_both_lists_respond_wins() -> None:
    rig = Rig({"n": 1})
    out = rig.paused()
    part = out.interrupts[0]
    final = rig.agent.run(
        ToolResume(
            respond=[rig.gate.respond(part, {"value": 42})],
            restart=[rig.gate.resume(part, Answer(ok=True))],
        ),
        session_id=out.session_id,
    )
    assert final.text == 'results: [{"value": 42}]'
    assert rig.runs == [None]  # the restart did not run


def test_same_ref_in_both_lists_a_forged_restart_input_is_still_refused() -> None:
    """Respond wins, but a restart whose input was changed is a forgery whatever else the
    resume holds: refused, and nothing runs."""
    rig = Rig({"n": 1})
    out = rig.paused()
    part = out.interrupts[0]
    restart = rig.gate.resume(part, Answer(ok=True))
    assert restart.tool_request is not None
    changed = restart.model_copy(
        update={"tool_request": restart.tool_request.model_copy(update={"input": {"n": 2}})}
    )
    rejects(
        Status.INVALID_ARGUMENT,
        "changed its input",
        rig.agent.run,
        ToolResume(respond=[rig.gate.respond(part, {"value": 7})], restart=[changed]),
        session_id=out.session_id,
        error=ResumeValidationError,
    )
    assert rig.runs == [None]
    final = rig.agent.run(  # the pause is still there to answer
        ToolResume(respond=[rig.gate.respond(part, {"value": 7})]), session_id=out.session_id
    )
    assert final.text == 'results: [{"value": 7}]'


def test_same_ref_in_both_lists_the_restart_data_is_set_aside() -> None:
    """Respond wins: the restart's resume data is not used, so it is not checked either."""
    rig = Rig({"n": 1})
    out = rig.paused()
    part = out.interrupts[0]
    restart = rig.gate.resume(part, Answer(ok=True)).model_copy(deep=True)
    restart.metadata = {**(restart.metadata or {}), "resumed": {"ok": "not a bool"}}
    final = rig.agent.run(
        ToolResume(respond=[rig.gate.respond(part, {"value": 7})], restart=[restart]),
        session_id=out.session_id,
    )
    assert final.text == 'results: [{"value": 7}]'
    assert rig.runs == [None]


# -- rule 6: snapshot status, resumed once ------------------------------------------------------


@pytest.mark.parametrize(
    "status",
    [SnapshotStatus.PENDING, SnapshotStatus.FAILED, SnapshotStatus.ABORTED, SnapshotStatus.EXPIRED],
)
@pytest.mark.parametrize("as_text", [False, True], ids=["enum", "text"])
def test_only_completed_snapshots_resume(status: SnapshotStatus, as_text: bool) -> None:
    """Also with the status given as its text: `model_copy(update=...)` does not
    validate it, and the store's copy must still refuse the same way."""
    rig = Rig({"n": 1})
    out = rig.paused()
    snap = rig.store.get_snapshot(out.snapshot_id or "")
    assert snap is not None
    given = status.value if as_text else status
    rig.store.save_snapshot(snap.model_copy(update={"snapshot_id": "by-hand", "status": given}))
    rejects(
        Status.FAILED_PRECONDITION,
        f"snapshot by-hand is {status.value} and cannot be resumed; it is kept for inspection "
        f"(session {out.session_id} goes on from its latest completed snapshot)",
        rig.agent.run,
        ToolResume(respond=[rig.gate.respond(out.interrupts[0], {"value": 1})]),
        snapshot_id="by-hand",
        error=ResumeValidationError,
    )
    # status is checked before the parts
    rejects(
        Status.FAILED_PRECONDITION,
        "cannot be resumed",
        rig.agent.run,
        ToolResume(),
        snapshot_id="by-hand",
    )
    # nor does a new message continue it
    count = rig.snapshot_count()
    rejects(
        Status.FAILED_PRECONDITION,
        f"snapshot by-hand is {status.value} and cannot be continued",
        rig.agent.run_text,
        "start over",
        snapshot_id="by-hand",
        error=ResumeValidationError,
    )
    assert rig.runs == [None]
    assert rig.snapshot_count() == count


def test_second_resume_of_the_same_snapshot_is_refused() -> None:
    rig = Rig({"n": 1})
    out = rig.paused()
    reply = rig.gate.respond(out.interrupts[0], {"value": 7})
    first = rig.agent.run(ToolResume(respond=[reply]), snapshot_id=out.snapshot_id)
    assert first.finish_reason is FinishReason.STOP
    count = rig.snapshot_count()
    rejects(
        Status.FAILED_PRECONDITION,
        f"snapshot {out.snapshot_id} was already resumed (session {out.session_id} goes on "
        "from its latest snapshot)",
        rig.agent.run,
        ToolResume(respond=[reply]),
        snapshot_id=out.snapshot_id,
        error=ResumeValidationError,
    )
    # already-resumed is checked before the parts
    rejects(
        Status.FAILED_PRECONDITION,
        "already resumed",
        rig.agent.run,
        ToolResume(),
        snapshot_id=out.snapshot_id,
    )
    assert rig.snapshot_count() == count
    # by session id, the session has moved on: nothing is pending any more, so the
    # answer's ref is one from an earlier turn (rule 1)
    rejects(
        Status.INVALID_ARGUMENT,
        f"respond for tool 'gate' ref {reply.tool_response.ref} is from an earlier turn "  # type: ignore[union-attr]
        "which is no longer pending",
        rig.agent.run,
        ToolResume(respond=[reply]),
        session_id=out.session_id,
        error=ResumeValidationError,
    )
    unknown = Part(
        tool_response=ToolResponse(name="gate", ref="never-seen", output={"value": 7}),
        metadata={"interruptResponse": True},
    )
    rejects(
        Status.INVALID_ARGUMENT,
        "ref never-seen not found in session history",
        rig.agent.run,
        ToolResume(respond=[unknown]),
        session_id=out.session_id,
    )
    assert rig.snapshot_count() == count


def test_claimed_snapshot_refuses_another_resume() -> None:
    rig = Rig({"n": 1})
    out = rig.paused()
    assert rig.store.claim(out.snapshot_id or "", "reviewer-1")
    reply = rig.gate.respond(out.interrupts[0], {"value": 7})
    rejects(
        Status.FAILED_PRECONDITION,
        "already resumed",
        rig.agent.run,
        ToolResume(respond=[reply]),
        snapshot_id=out.snapshot_id,
    )
    # the holder of the claim runs it (the queue path)
    rig.agent.validate_resume(
        ToolResume(respond=[reply]), snapshot_id=out.snapshot_id, claimed_by="reviewer-1"
    )
    final = rig.agent.run(
        ToolResume(respond=[reply]), snapshot_id=out.snapshot_id, claimed_by="reviewer-1"
    )
    assert final.text == 'results: [{"value": 7}]'


def test_answers_in_any_mapping_are_their_json_form() -> None:
    """`respond` and `resume` take a mapping that is no dict (a read-only view, a
    UserDict) as the JSON form, as their types say, where one had "no JSON form"."""
    from collections import UserDict
    from types import MappingProxyType

    rig = Rig({"n": 1}, {"n": 2})
    out = rig.paused()
    first, second = out.interrupts
    reply = rig.gate.respond(first, MappingProxyType({"value": 7}))
    again = rig.gate.resume(second, UserDict({"ok": True}))
    done = rig.agent.run(ToolResume(respond=[reply], restart=[again]), session_id=out.session_id)
    assert done.finish_reason is FinishReason.STOP
    assert rig.runs[-1] == Answer(ok=True)


def test_claim_required_runs_a_resume_only_under_a_claim_made_before_it() -> None:
    """`claim_required=True` (the queue's worker): the run claims nothing itself; a pause
    not claimed by `claimed_by` is PERMISSION_DENIED and stays to be answered."""
    rig = Rig({"n": 1})
    out = rig.paused()
    sid = out.snapshot_id or ""
    reply = ToolResume(respond=[rig.gate.respond(out.interrupts[0], {"value": 7})])
    count = rig.snapshot_count()
    rejects(
        Status.PERMISSION_DENIED,
        f"snapshot {sid} is not claimed by this resume (it names no claim)",
        rig.agent.run,
        reply,
        snapshot_id=sid,
        claim_required=True,
    )
    rejects(
        Status.PERMISSION_DENIED,
        f"snapshot {sid} is not claimed by 'made-up'",
        rig.agent.run,
        reply,
        snapshot_id=sid,
        claimed_by="made-up",
        claim_required=True,
    )
    snapshot = rig.store.get_snapshot(sid)
    assert snapshot is not None and snapshot.resumed_by is None
    assert rig.snapshot_count() == count
    assert rig.store.claim(sid, "decision-1")
    final = rig.agent.run(reply, snapshot_id=sid, claimed_by="decision-1", claim_required=True)
    assert final.text == 'results: [{"value": 7}]'


def test_validate_resume_writes_nothing() -> None:
    rig = Rig({"n": 1})
    out = rig.paused()
    reply = rig.gate.resume(out.interrupts[0], Answer(ok=True))
    count = rig.snapshot_count()
    # typed as returning nothing: the cast lets the test check that it really returns None
    validated = cast(
        object,
        rig.agent.validate_resume(ToolResume(restart=[reply]), snapshot_id=out.snapshot_id),
    )
    assert validated is None
    assert rig.snapshot_count() == count and rig.runs == [None]
    snap = rig.store.get_snapshot(out.snapshot_id or "")
    assert snap is not None and snap.resumed_by is None
    rejects(
        Status.INVALID_ARGUMENT,
        "input is not a resume",
        rig.agent.validate_resume,
        Message(role="user", content=[Part(text="hi")]),
        snapshot_id=out.snapshot_id,
    )
    rejects(
        Status.INVALID_ARGUMENT,
        "resume answers nothing",
        rig.agent.validate_resume,
        ToolResume(),
        snapshot_id=out.snapshot_id,
    )


def test_unknown_snapshot_id() -> None:
    rig = Rig({"n": 1})
    err = rejects(
        Status.NOT_FOUND,
        "snapshot missing not found",
        rig.agent.run,
        ToolResume(),
        snapshot_id="missing",
    )
    assert isinstance(err, SnapshotNotFoundError)
    assert isinstance(err, ResumeValidationError)  # a resume refused before it ran
    with pytest.raises(ResumeValidationError, match="snapshot missing not found"):
        rig.agent.validate_resume(AgentInput(resume=ToolResume()), snapshot_id="missing")
    # A new message addressed to an unknown snapshot is no resume: plain NOT_FOUND.
    with pytest.raises(SnapshotNotFoundError) as plain:
        rig.agent.run_text("hello", snapshot_id="missing")
    assert not isinstance(plain.value, ResumeValidationError)


def test_resume_on_a_fresh_session_has_nothing_to_resume() -> None:
    """An unknown session id starts a new session, whose history holds no call: an
    answer names a ref "not found in session history" (rule 1), as in Genkit."""
    rig = Rig({"n": 1})
    rejects(
        Status.INVALID_ARGUMENT,
        "resume answers nothing: give respond or restart parts (session fresh has no paused turn)",
        rig.agent.run,
        ToolResume(),
        session_id="fresh",
    )
    elsewhere = rig.agent.run_text("go")
    [part] = elsewhere.interrupts
    assert part.tool_request is not None
    rejects(
        Status.INVALID_ARGUMENT,
        f"ref {part.tool_request.ref} not found in session history (session fresh has no "
        "paused turn)",
        rig.agent.run,
        ToolResume(respond=[respond(part, {"n": 2})]),
        session_id="fresh",
    )
    assert rig.store.get_latest_snapshot("fresh") is None, "nothing written"


def test_a_resume_that_names_no_session_says_so() -> None:
    """With a store, a resume given neither session_id= nor snapshot_id= goes to a new
    session: its answers are "not found in session history", and the message says
    why, not the new session's random id."""
    rig = Rig({"n": 1})
    out = rig.paused()
    [part] = out.interrupts
    assert part.tool_request is not None
    before = rig.store.list_snapshots()
    rejects(
        Status.INVALID_ARGUMENT,
        f"ref {part.tool_request.ref} not found in session history (no session_id or "
        "snapshot_id was given, so it went to a new session, which has no paused turn: "
        "pass those of the interrupted output)",
        rig.agent.run,
        ToolResume(respond=[respond(part, {"n": 2})]),
    )
    assert rig.store.list_snapshots() == before, "nothing written"


def test_claimed_by_goes_with_a_resume_only() -> None:
    """A new message run with claimed_by= is refused: a claim is on a pause, and a
    message answers none (nor would it run one at a time in its session)."""
    rig = Rig({"n": 1})
    out = rig.paused()
    before = rig.store.list_snapshots()
    places: list[dict[str, Any]] = [
        {"session_id": out.session_id},
        {"snapshot_id": out.snapshot_id},
        {},
    ]
    for where in places:
        rejects(
            Status.INVALID_ARGUMENT,
            "claimed_by goes with a resume, which runs under the claim on its pause; a new "
            "message claims nothing",
            rig.agent.run,
            Message.model_validate({"role": "user", "content": [{"text": "more"}]}),
            claimed_by="reviewer-1",
            **where,
        )
    assert rig.store.list_snapshots() == before, "nothing run, nothing written"


def test_snapshot_of_another_session_or_agent() -> None:
    rig = Rig({"n": 1})
    out = rig.paused()
    rejects(
        Status.INVALID_ARGUMENT,
        "belongs to another session",
        rig.agent.run,
        ToolResume(),
        snapshot_id=out.snapshot_id,
        session_id="other",
        error=ResumeValidationError,
    )
    stranger = rig.ai.define_agent("stranger", model="scripted/rig", store=rig.store)
    rejects(
        Status.INVALID_ARGUMENT,
        "belongs to agent 'rig', not 'stranger'",
        stranger.run,
        ToolResume(),
        snapshot_id=out.snapshot_id,
        error=ResumeValidationError,
    )


def test_session_of_another_agent() -> None:
    """A session is its agent's, however it is addressed: by `session_id=` as by
    `snapshot_id=` (and by `state=`). Nothing is written for the stranger."""
    rig = Rig({"n": 1})
    out = rig.paused()
    stranger = rig.ai.define_agent("stranger", model="scripted/rig", store=rig.store)
    before = rig.store.list_snapshots(session_id=out.session_id, limit=100)
    rejects(
        Status.INVALID_ARGUMENT,
        f"session {out.session_id} belongs to agent 'rig', not 'stranger'",
        stranger.run,
        ToolResume(),
        session_id=out.session_id,
        error=ResumeValidationError,
    )
    rejects(
        Status.INVALID_ARGUMENT,
        "belongs to agent 'rig', not 'stranger'",
        stranger.run_text,
        "hello",
        session_id=out.session_id,
    )
    assert rig.store.list_snapshots(session_id=out.session_id, limit=100) == before


def test_a_session_another_agent_left_no_good_snapshot_in_is_still_its() -> None:
    """A session whose only snapshot is its agent's failed first turn has nothing to go
    on from; another agent sharing the store is refused it all the same, and the session
    stays its agent's."""
    rig = Rig({"n": 1})
    rig.fail_next_restart = True
    out = rig.paused()
    with pytest.raises(ToolFailedError):
        rig.agent.run(
            ToolResume(restart=[rig.gate.resume(out.interrupts[0], {"ok": True})]),
            session_id=out.session_id,
        )
    rig.store.save_snapshot(  # as if the first turn itself had failed: no good snapshot
        rig.store.get_snapshot(out.snapshot_id or "").model_copy(  # type: ignore[union-attr]
            update={"status": SnapshotStatus.FAILED, "finish_reason": FinishReason.FAILED}
        )
    )
    stranger = rig.ai.define_agent("stranger", model="scripted/rig", store=rig.store)
    before = rig.store.list_snapshots(session_id=out.session_id)
    rejects(
        Status.INVALID_ARGUMENT,
        f"session {out.session_id} belongs to agent 'rig', not 'stranger'",
        stranger.run_text,
        "hello",
        session_id=out.session_id,
    )
    assert rig.store.list_snapshots(session_id=out.session_id) == before
    again = rig.agent.run_text("go", session_id=out.session_id)  # its own agent goes on
    assert again.finish_reason is FinishReason.INTERRUPTED


def test_claim_required_without_a_store_refuses_the_resume() -> None:
    """No store, no claim: a resume that must run under one cannot run."""
    rig = Rig({"n": 1}, store=None)
    out = rig.paused()
    rejects(
        Status.PERMISSION_DENIED,
        "agent 'rig' has no session store, so no pause of it can be claimed",
        rig.agent.run,
        ToolResume(respond=[rig.gate.respond(out.interrupts[0], {"value": 1})]),
        state=out.state,
        claim_required=True,
        error=ResumeValidationError,
    )
    assert rig.runs == [None], "the tool did not run again"


# -- rule 7: addressing is checked first --------------------------------------------------------


def test_state_passed_to_a_store_backed_agent() -> None:
    rig = Rig({"n": 1})
    out = rig.paused()
    rejects(
        Status.FAILED_PRECONDITION,
        "keeps its sessions in a store: pass session_id or snapshot_id, not state",
        rig.agent.run,
        ToolResume(),  # addressing is checked before the (empty) parts
        state="v1.x.y",
        error=ResumeValidationError,  # a resume's first check (rule 7)
    )
    rejects(
        Status.FAILED_PRECONDITION,
        "not state",
        rig.agent.run_text,
        "hello",
        state="v1.x.y",
    )
    assert out.snapshot_id is not None


def test_session_id_passed_to_a_store_less_agent() -> None:
    rig = Rig({"n": 1}, store=None)
    out = rig.paused()
    assert out.state is not None
    for kwargs in ({"session_id": out.session_id}, {"snapshot_id": "x"}):
        rejects(
            Status.FAILED_PRECONDITION,
            "has no session store: pass the state of the last output",
            rig.agent.run,
            ToolResume(),
            error=ResumeValidationError,
            **kwargs,
        )
        with pytest.raises(ResumeValidationError):
            rig.agent.validate_resume(ToolResume(), **kwargs)
    rejects(
        Status.FAILED_PRECONDITION,
        "a resume needs the paused turn: pass the state",
        rig.agent.run,
        ToolResume(respond=[rig.gate.respond(out.interrupts[0], {"value": 1})]),
    )


# -- rule 8: a new message while paused ---------------------------------------------------------


def test_new_message_while_paused_names_the_pending_interrupts() -> None:
    rig = Rig({"n": 1}, {"n": 2})
    out = rig.paused()
    count = rig.snapshot_count()
    err = rejects(
        Status.FAILED_PRECONDITION,
        "is paused: answer the pending interrupts first (gate (ref ref-0), gate (ref ref-1))",
        rig.agent.run_text,
        "never mind",
        session_id=out.session_id,
    )
    assert cast(str, out.session_id) in err.message
    # Refused by the resume rules (rule 7: a ResumeValidationError), still a StatusError.
    assert isinstance(err, ResumeValidationError)
    assert rig.snapshot_count() == count
    rejects(
        Status.FAILED_PRECONDITION,
        "answer the pending interrupts first",
        rig.agent.run_text,
        "never mind",
        snapshot_id=out.snapshot_id,
    )


class _PlainStore:
    """A store of a user's own: the `SessionStore` protocol and nothing more (no
    `latest_snapshot_id`), over the memory store."""

    def __init__(self) -> None:
        self.inner = InMemorySessionStore()
        self.get_snapshot = self.inner.get_snapshot
        self.get_latest_snapshot = self.inner.get_latest_snapshot
        self.save_snapshot = self.inner.save_snapshot
        self.claim = self.inner.claim
        self.release = self.inner.release
        self.list_snapshots = self.inner.list_snapshots


@pytest.mark.parametrize("kind", ["memory", "plain"])
def test_new_message_to_an_earlier_snapshot_while_paused_is_refused(kind: str) -> None:
    """`snapshot_id=` may continue an earlier snapshot (a branch), but not while the
    session is paused: the pause would stay open beside the branch's own turn. The
    same with a store that cannot tell a session's newest snapshot id alone."""
    rig = Rig({"n": 1}, store="memory" if kind == "memory" else _PlainStore())
    assert isinstance(rig.store, LatestSnapshotId) is (kind == "memory")
    first = rig.paused()
    done = rig.agent.run(
        ToolResume(respond=[rig.gate.respond(first.interrupts[0], {"value": 1})]),
        session_id=first.session_id,
    )
    assert done.finish_reason is FinishReason.STOP
    paused = rig.agent.run_text("again", session_id=first.session_id)
    assert paused.finish_reason is FinishReason.INTERRUPTED
    count = rig.snapshot_count()
    rejects(
        Status.FAILED_PRECONDITION,
        f"session {first.session_id} is paused: answer the pending interrupts first (gate",
        rig.agent.run_text,
        "branch",
        snapshot_id=done.snapshot_id,
    )
    assert rig.snapshot_count() == count, "nothing ran"
    rig.agent.run(
        ToolResume(respond=[rig.gate.respond(paused.interrupts[0], {"value": 1})]),
        session_id=first.session_id,
    )
    branch = rig.agent.run_text("branch", snapshot_id=done.snapshot_id)
    assert branch.finish_reason is FinishReason.INTERRUPTED, "once answered, a branch may go on"
    snapshot = rig.store.get_snapshot(cast(str, branch.snapshot_id))
    assert snapshot is not None and snapshot.parent_id == done.snapshot_id


class _CountingStore(InMemorySessionStore):
    """Counts the reads that parse a history: of a snapshot by id, of a session's
    newest, of a listing (heads, read without their histories, are not counted)."""

    def __init__(self) -> None:
        super().__init__()
        self.latest_reads = 0
        self.whole_reads = 0

    def get_snapshot(self, snapshot_id: str) -> Snapshot | None:
        self.whole_reads += 1
        return super().get_snapshot(snapshot_id)

    def get_latest_snapshot(self, session_id: str) -> Snapshot | None:
        self.latest_reads += 1  # a whole read too: the memory store lists the newest
        return super().get_latest_snapshot(session_id)

    def list_snapshots(self, *args: Any, **kwargs: Any) -> list[Snapshot]:
        self.whole_reads += 1
        return super().list_snapshots(*args, **kwargs)


def test_a_connection_going_on_from_the_newest_snapshot_reads_its_history_once() -> None:
    """A connection continues from its last snapshot (`snapshot_id=`). While that is
    the session's newest, the check that no pause stands beside it asks the store for
    the newest id only: each turn reads the history once (the snapshot it goes on
    from), not twice, which on a long session is most of a turn's time. A snapshot that
    is no longer the newest is not read again either: the session's newest is asked for
    without its history, and only a pause found there is read whole, for the refusal
    to name what it waits for."""
    rig = Rig({"n": 1}, store=_CountingStore())
    store = cast(_CountingStore, rig.store)
    with rig.agent.connect() as conn:
        for text in ("hello", "again", "and again"):
            if text == "again":  # the first turn named the new session only: no snapshot
                store.latest_reads = store.whole_reads = 0
            conn.send_text(text)
            [*_] = conn.receive()
            assert conn.output().finish_reason is FinishReason.INTERRUPTED
            conn.send_resume(
                ToolResume(respond=[rig.gate.respond(conn.output().interrupts[0], {"value": 1})])
            )
            [*_] = conn.receive()
            assert conn.output().finish_reason is FinishReason.STOP
        assert store.latest_reads == 0, "no history read to find the newest snapshot"
        assert store.whole_reads == 4, "one read of a history per turn"
        done = conn.output()
    paused = rig.agent.run_text("elsewhere", session_id=done.session_id)
    assert paused.finish_reason is FinishReason.INTERRUPTED
    store.latest_reads = store.whole_reads = 0
    rejects(
        Status.FAILED_PRECONDITION,
        "answer the pending interrupts first",
        rig.agent.run_text,
        "branch",
        snapshot_id=done.snapshot_id,
    )
    assert store.latest_reads == 0, "the newest is asked for without its history"
    assert store.whole_reads == 2, "the snapshot named, then the pause beside it"


def test_new_message_while_paused_with_state() -> None:
    rig = Rig({"n": 1}, store=None)
    out = rig.paused()
    rejects(
        Status.FAILED_PRECONDITION,
        "answer the pending interrupts first (gate (ref ref-0))",
        rig.agent.run_text,
        "never mind",
        state=out.state,
    )


# -- rule 9: a failed resume releases the claim -------------------------------------------------


def test_failed_resume_releases_the_claim() -> None:
    rig = Rig({"n": 3})
    out = rig.paused()
    reply = rig.gate.resume(out.interrupts[0], Answer(ok=True))
    rig.fail_next_restart = True
    with pytest.raises(ToolFailedError) as info:
        rig.agent.run(ToolResume(restart=[reply]), session_id=out.session_id)
    assert info.value.tool_name == "gate"
    assert "downstream is down" in info.value.message
    snap = rig.store.get_snapshot(out.snapshot_id or "")
    assert snap is not None and snap.resumed_by is None  # released
    [failed] = rig.store.list_snapshots(session_id=out.session_id, status=SnapshotStatus.FAILED)
    assert failed.parent_id == out.snapshot_id
    assert failed.finish_reason is FinishReason.FAILED
    assert failed.error is not None and "downstream is down" in failed.error.message
    # the same snapshot is answered again, by session and by id
    retried = rig.agent.run(ToolResume(restart=[reply]), session_id=out.session_id)
    assert retried.finish_reason is FinishReason.STOP
    assert retried.text == 'results: [{"value": 3}]'
    assert rig.runs == [None, Answer(ok=True), Answer(ok=True)]
    latest = rig.store.list_snapshots(session_id=out.session_id, status=SnapshotStatus.COMPLETED)
    assert latest[0].snapshot_id == retried.snapshot_id
    assert latest[0].parent_id == out.snapshot_id


def test_failed_resume_via_model_releases_the_claim() -> None:
    ai = Interlock()

    @ai.interruptible_tool(name="gate", description="")
    def gate(inp: Num, res: Answer | None) -> Result:
        if res is None:
            interrupt({"n": inp.n})
        return Result(value=inp.n)

    # one reply only: the model has nothing left to say after the resume
    scripted.define(ai, "short", [scripted.reply(scripted.tool_call("gate", {"n": 1}))])
    store = InMemorySessionStore()
    agent = ai.define_agent("g", model="scripted/short", tools=[gate], store=store)
    out = agent.run_text("go")
    reply = gate.respond(out.interrupts[0], {"value": 1})
    with pytest.raises(StatusError) as info:
        agent.run(ToolResume(respond=[reply]), snapshot_id=out.snapshot_id)
    assert info.value.status is Status.OUT_OF_RANGE
    snap = store.get_snapshot(out.snapshot_id or "")
    assert snap is not None and snap.resumed_by is None
    agent.validate_resume(ToolResume(respond=[reply]), snapshot_id=out.snapshot_id)


def test_new_message_while_a_resume_is_under_way_is_refused() -> None:
    rig = Rig({"n": 1})
    out = rig.paused()
    assert out.snapshot_id is not None
    assert rig.store.claim(out.snapshot_id, "someone-else")
    before = rig.snapshot_count()
    err = rejects(
        Status.FAILED_PRECONDITION,
        "is being resumed",
        rig.agent.run_text,
        "something else",
        session_id=out.session_id,
        error=ResumeValidationError,
    )
    assert out.snapshot_id in err.message
    assert rig.snapshot_count() == before
    assert rig.runs == [None]


def test_new_message_on_a_pause_answered_since_names_where_to_go_on() -> None:
    """Addressed by snapshot_id= after its resume ended, the pause is no longer "being
    resumed": the message says it was, and how to continue."""
    rig = Rig({"n": 1})
    out = rig.paused()
    done = rig.agent.run(
        ToolResume(respond=[rig.gate.respond(out.interrupts[0], {"value": 1})]),
        session_id=out.session_id,
    )
    assert done.finish_reason is FinishReason.STOP
    before = rig.snapshot_count()
    rejects(
        Status.FAILED_PRECONDITION,
        f"snapshot {out.snapshot_id} was already resumed: continue the session from its "
        f"latest snapshot (session_id={out.session_id})",
        rig.agent.run_text,
        "something else",
        snapshot_id=out.snapshot_id,
        error=ResumeValidationError,
    )
    assert rig.snapshot_count() == before
    again = rig.agent.run_text("something else", session_id=out.session_id)  # goes on
    assert again.snapshot_id not in (out.snapshot_id, done.snapshot_id)


# -- the claim once the turn is over, or cut short ---------------------------------------------


def test_a_callback_failing_at_the_turn_end_keeps_the_claim() -> None:
    """The resumed turn's snapshot is saved before the caller's callback hears of the
    turn's end: the claim stays, and the pause cannot be answered a second time."""
    rig = Rig({"n": 1})
    out = rig.paused()
    reply = rig.gate.respond(out.interrupts[0], {"value": 7})

    def on_chunk(chunk: Any) -> None:
        if chunk.turn_end is not None:
            raise RuntimeError("the client went away")

    with pytest.raises(RuntimeError, match="the client went away"):
        rig.agent.run(ToolResume(respond=[reply]), snapshot_id=out.snapshot_id, on_chunk=on_chunk)
    children = [s for s in rig.store.list_snapshots() if s.parent_id == out.snapshot_id]
    assert [c.finish_reason for c in children] == [FinishReason.STOP]
    rejects(
        Status.FAILED_PRECONDITION,
        "already resumed",
        rig.agent.run,
        ToolResume(respond=[reply]),
        snapshot_id=out.snapshot_id,
    )


def test_a_resume_cut_short_releases_the_claim() -> None:
    """A `BaseException` (cancelled, interrupted, exiting) inside the resumed turn keeps
    no snapshot and holds no claim: the pause can be answered again."""
    rig = Rig({"n": 1})
    out = rig.paused()

    class Cancelled(BaseException):
        pass

    original = rig.gate.fn

    def cut_short(inp: Num, res: Answer | None) -> Result:
        raise Cancelled()

    rig.gate.fn = cut_short
    count = rig.snapshot_count()
    with pytest.raises(Cancelled):
        rig.agent.run(
            ToolResume(restart=[rig.gate.resume(out.interrupts[0], Answer(ok=True))]),
            snapshot_id=out.snapshot_id,
        )
    assert rig.snapshot_count() == count
    stored = rig.store.get_snapshot(out.snapshot_id or "")
    assert stored is not None and stored.resumed_by is None
    rig.gate.fn = original
    done = rig.agent.run(
        ToolResume(restart=[rig.gate.resume(out.interrupts[0], Answer(ok=True))]),
        snapshot_id=out.snapshot_id,
    )
    assert done.finish_reason is FinishReason.STOP


def test_a_claimed_resume_refused_before_it_runs_gives_the_claim_back() -> None:
    """The resume consumer claims, the worker runs: when the run refuses before the turn
    starts (here its model cannot be found), the caller's claim is released, as for a
    resumed turn that fails, so the pause can be answered again. Someone else's claim
    is left alone."""
    import dataclasses

    rig = Rig({"n": 1})
    out = rig.paused()
    sid = out.snapshot_id or ""
    reply = ToolResume(respond=[rig.gate.respond(out.interrupts[0], {"value": 7})])
    broken = dataclasses.replace(rig.agent, model="scripted/nowhere")
    assert rig.store.claim(sid, "decision-1")
    with pytest.raises(StatusError) as info:
        broken.run(reply, snapshot_id=sid, claimed_by="decision-1")
    assert info.value.status is Status.NOT_FOUND
    stored = rig.store.get_snapshot(sid)
    assert stored is not None and stored.resumed_by is None, "the claim was given back"

    assert rig.store.claim(sid, "someone-else")
    rejects(
        Status.FAILED_PRECONDITION,
        "already resumed",
        broken.run,
        reply,
        snapshot_id=sid,
        claimed_by="decision-1",
    )
    stored = rig.store.get_snapshot(sid)
    assert stored is not None and stored.resumed_by == "someone-else"
    rig.store.release(sid, "someone-else")
    done = rig.agent.run(reply, snapshot_id=sid)
    assert done.finish_reason is FinishReason.STOP


def test_a_callers_claim_outlives_a_resume_cut_short() -> None:
    """A queued resume runs under the consumer's claim (`claimed_by`). Cut short (the
    worker shutting down mid-turn), it keeps the claim: no second decision can slip in
    before the task is delivered again and goes on under it."""
    rig = Rig({"n": 1})
    out = rig.paused()
    sid = out.snapshot_id or ""

    class Cancelled(BaseException):
        pass

    original = rig.gate.fn

    def cut_short(inp: Num, res: Answer | None) -> Result:
        raise Cancelled()

    assert rig.store.claim(sid, "decision-1")
    resume = ToolResume(restart=[rig.gate.resume(out.interrupts[0], Answer(ok=True))])
    rig.gate.fn = cut_short
    with pytest.raises(Cancelled):
        rig.agent.run(resume, snapshot_id=sid, claimed_by="decision-1")
    stored = rig.store.get_snapshot(sid)
    assert stored is not None and stored.resumed_by == "decision-1"
    assert not rig.store.claim(sid, "decision-2"), "a second decision is refused meanwhile"
    rig.gate.fn = original
    done = rig.agent.run(resume, snapshot_id=sid, claimed_by="decision-1")
    assert done.finish_reason is FinishReason.STOP


def _store_of(kind: str, tmp_path: Any) -> Any:
    if kind == "memory":
        return "memory"
    if kind == "plain":
        return _PlainStore()
    from interlock import SqlSessionStore

    return SqlSessionStore(f"sqlite:///{tmp_path / 'store.db'}")


@pytest.mark.parametrize("kind", ["memory", "plain", "sqlite"])
@pytest.mark.parametrize("end", ["completed", "paused again"])
def test_a_resume_run_again_under_its_claim_after_it_ended_is_already_resumed(
    kind: str, end: str, tmp_path: Any
) -> None:
    """A resume delivered twice to the holder of its claim (`claimed_by`, no journal):
    the first run ends (completed, or paused again on a second interrupt); the second
    is FAILED_PRECONDITION "already resumed", runs no tool, saves nothing, and keeps
    the claim, so no other decision can answer the pause either. `validate_resume`
    says the same. With a store that names only whole snapshots, alike."""
    rig = Rig({"n": 1}, store=_store_of(kind, tmp_path))
    out = rig.paused()
    sid = out.snapshot_id or ""
    assert rig.store.claim(sid, "decision-1")
    if end == "completed":
        reply = ToolResume(respond=[rig.gate.respond(out.interrupts[0], {"value": 7})])
    else:

        def asks_again(inp: Num, res: Answer | None) -> Result:
            rig.runs.append(res)
            interrupt({"again": inp.n})

        rig.gate.fn = asks_again
        reply = ToolResume(restart=[rig.gate.resume(out.interrupts[0], Answer(ok=True))])
    first = rig.agent.run(reply, snapshot_id=sid, claimed_by="decision-1")
    expected = FinishReason.STOP if end == "completed" else FinishReason.INTERRUPTED
    assert first.finish_reason is expected
    count, runs = rig.snapshot_count(), len(rig.runs)
    message = (
        f"snapshot {sid} was already resumed: its run under claim 'decision-1' has ended; "
        f"continue the session from its latest snapshot (session_id={out.session_id})"
    )
    for call in (rig.agent.run, rig.agent.validate_resume):
        error = rejects(
            Status.FAILED_PRECONDITION,
            message,
            call,
            reply,
            snapshot_id=sid,
            claimed_by="decision-1",
            error=ResumeValidationError,
        )
        assert error.message == message
    assert rig.snapshot_count() == count, "nothing saved"
    assert len(rig.runs) == runs, "no tool ran again"
    stored = rig.store.get_snapshot(sid)
    assert stored is not None and stored.resumed_by == "decision-1", "the claim is kept"
    assert not rig.store.claim(sid, "decision-2"), "no other answer slips in"
    latest = rig.store.get_latest_snapshot(out.session_id or "")
    assert latest is not None and latest.snapshot_id == first.snapshot_id
    assert latest.parent_id == sid


@pytest.mark.parametrize("kind", ["memory", "plain", "sqlite"])
def test_a_pause_claimed_again_after_a_failed_answer_runs_once_more(
    kind: str, tmp_path: Any
) -> None:
    """A resume under the caller's claim that fails gives the claim back and keeps its
    failed snapshot, newer than the pause. A claim made afterwards (the queue's order:
    claim first, then run), by another id or the same, runs: a failed snapshot is no
    run that ended the pause. Once that run has completed, running it again under its
    claim is "already resumed"."""
    rig = Rig({"n": 1}, store=_store_of(kind, tmp_path))
    out = rig.paused()
    sid = out.snapshot_id or ""
    reply = ToolResume(restart=[rig.gate.resume(out.interrupts[0], Answer(ok=True))])
    assert rig.store.claim(sid, "decision-1")
    rig.fail_next_restart = True
    with pytest.raises(ToolFailedError):
        rig.agent.run(reply, snapshot_id=sid, claimed_by="decision-1")
    latest = rig.store.get_latest_snapshot(out.session_id or "")
    assert latest is not None and latest.status is SnapshotStatus.FAILED
    stored = rig.store.get_snapshot(sid)
    assert stored is not None and stored.resumed_by is None, "the claim was given back"

    for claim in ("decision-2", "decision-1"):
        assert rig.store.claim(sid, claim)
        rig.agent.validate_resume(reply, snapshot_id=sid, claimed_by=claim)
        rejects(  # a new message meanwhile: the pause is being resumed, not resumed
            Status.FAILED_PRECONDITION,
            f"session {out.session_id} is being resumed (snapshot {sid})",
            rig.agent.run_text,
            "hi",
            session_id=out.session_id,
        )
        rig.fail_next_restart = claim == "decision-2"  # the second answer fails too
        if claim == "decision-2":
            with pytest.raises(ToolFailedError):
                rig.agent.run(reply, snapshot_id=sid, claimed_by=claim, claim_required=True)
            continue
        done = rig.agent.run(reply, snapshot_id=sid, claimed_by=claim, claim_required=True)
        assert done.finish_reason is FinishReason.STOP
    rejects(
        Status.FAILED_PRECONDITION,
        "already resumed: its run under claim 'decision-1' has ended",
        rig.agent.run,
        reply,
        snapshot_id=sid,
        claimed_by="decision-1",
    )
    stored = rig.store.get_snapshot(sid)
    assert stored is not None and stored.resumed_by == "decision-1"


def test_a_turn_id_given_twice_in_process_still_resumes_once() -> None:
    """In process, with no journal, a turn id says nothing about the claim: the second
    call with the same turn id is refused "already resumed" (the once-only claim)."""
    rig = Rig({"n": 1})
    out = rig.paused()
    reply = ToolResume(respond=[rig.gate.respond(out.interrupts[0], {"value": 7})])
    sid = out.snapshot_id or ""
    done = rig.agent.run(reply, snapshot_id=sid, turn_id="req-1")
    assert done.finish_reason is FinishReason.STOP
    rejects(
        Status.FAILED_PRECONDITION,
        "already resumed",
        rig.agent.run,
        reply,
        snapshot_id=sid,
        turn_id="req-1",
    )
