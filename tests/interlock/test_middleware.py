"""ToolApproval middleware (docs/concepts.md) and tool middleware in general."""

import json
from typing import Any

import pytest
from pydantic import BaseModel

from examples.banking import (
    ApprovalAsk,
    ApprovalReply,
    TransferOutput,
    transferMoney,
)
from interlock import (
    FinishReason,
    InMemorySessionStore,
    Interlock,
    Message,
    Middleware,
    ModelRequest,
    ResumeValidationError,
    Status,
    Tool,
    ToolApproval,
    ToolContext,
    ToolResume,
    approve,
    deny,
    interrupt_as,
    is_approval_gate,
    restart,
    scripted,
    tool_approval,
)


class Num(BaseModel):
    n: int


class Result(BaseModel):
    value: int


class Gate:
    """A registry with two ordinary counting tools, `lookup` and `delete`."""

    def __init__(self) -> None:
        self.ai = Interlock()
        self.calls: list[tuple[str, int]] = []

        @self.ai.tool(name="lookup", description="harmless")
        def lookup(inp: Num) -> Result:
            self.calls.append(("lookup", inp.n))
            return Result(value=inp.n)

        @self.ai.tool(name="delete", description="dangerous")
        def delete(inp: Num) -> Result:
            self.calls.append(("delete", inp.n))
            return Result(value=-inp.n)

        self.tools: list[Tool[Any, Any]] = [lookup, delete]

    def agent(self, *calls: tuple[str, int], middleware: Any = ()) -> Any:
        parts = [scripted.tool_call(name, {"n": n}, ref=f"{name}-{n}") for name, n in calls]

        def model(request: ModelRequest) -> Message:
            last = request.messages[-1]
            if last.role == "user":
                return scripted.reply(*parts)
            outputs = [p.tool_response.output for p in last.content if p.tool_response]
            return scripted.text(json.dumps(outputs))

        scripted.define(self.ai, "gate", model)
        return self.ai.define_agent(
            "gate",
            model="scripted/gate",
            tools=self.tools,
            middleware=middleware,
            store=InMemorySessionStore(),
        )


def test_allowed_tools_pass_others_interrupt() -> None:
    gate = Gate()
    agent = gate.agent(("lookup", 1), ("delete", 2), middleware=[tool_approval(["lookup"])])
    out = agent.run_text("go")
    assert out.finish_reason is FinishReason.INTERRUPTED
    assert gate.calls == [("lookup", 1)]  # the allowed tool ran, the other did not
    [part] = out.interrupts
    assert part.meta("interrupt") == {
        "message": "Tool not in approved list: delete",
        "tool": "delete",
        "input": {"n": 2},
    }
    lookup_part = out.message.content[0]
    assert lookup_part.meta("pendingOutput") == {"value": 1}


def test_approve_runs_the_tool() -> None:
    gate = Gate()
    agent = gate.agent(("lookup", 1), ("delete", 2), middleware=[tool_approval(["lookup"])])
    out = agent.run_text("go")
    approval = approve(out.interrupts[0])
    assert approval.meta("resumed") == {"toolApproved": True}
    final = agent.run(ToolResume(restart=[approval]), session_id=out.session_id)
    assert final.finish_reason is FinishReason.STOP
    assert final.text == '[{"value": 1}, {"value": -2}]'
    assert gate.calls == [("lookup", 1), ("delete", 2)]  # each ran exactly once


def test_deny_reaches_the_model_and_skips_the_tool() -> None:
    gate = Gate()
    agent = gate.agent(("delete", 5), middleware=[tool_approval(["lookup"])])
    out = agent.run_text("go")
    refusal = deny(out.interrupts[0], "not on a Friday")
    assert refusal.meta("interruptResponse") is True
    final = agent.run(ToolResume(respond=[refusal]), session_id=out.session_id)
    # exempt from the Out type ({"value": int}); the model reads it as it is
    assert json.loads(final.text) == [{"denied": True, "message": "not on a Friday"}]
    assert gate.calls == []


def test_deny_default_reason() -> None:
    gate = Gate()
    agent = gate.agent(("delete", 5), middleware=[tool_approval()])
    out = agent.run_text("go")
    final = agent.run(ToolResume(respond=[deny(out.interrupts[0])]), session_id=out.session_id)
    assert json.loads(final.text) == [{"denied": True, "message": "denied by reviewer"}]


def test_empty_allow_list_gates_every_tool() -> None:
    gate = Gate()
    agent = gate.agent(("lookup", 1), ("delete", 2), middleware=[tool_approval([])])
    out = agent.run_text("go")
    assert [p.meta("interrupt")["tool"] for p in out.interrupts] == ["lookup", "delete"]
    assert gate.calls == []
    assert isinstance(tool_approval(), ToolApproval) and tool_approval().allowed == frozenset()
    # approve one, deny the other
    final = agent.run(
        ToolResume(restart=[approve(out.interrupts[0])], respond=[deny(out.interrupts[1], "no")]),
        session_id=out.session_id,
    )
    assert json.loads(final.text) == [{"value": 1}, {"denied": True, "message": "no"}]
    assert gate.calls == [("lookup", 1)]


def test_gated_call_needs_an_approval_to_run() -> None:
    """A restart without the approval re-asks: the gate holds."""
    gate = Gate()
    agent = gate.agent(("delete", 3), middleware=[tool_approval()])
    out = agent.run_text("go")
    again = agent.run(ToolResume(restart=[restart(out.interrupts[0])]), session_id=out.session_id)
    assert again.finish_reason is FinishReason.INTERRUPTED
    assert again.interrupts[0].meta("interrupt")["tool"] == "delete"
    assert gate.calls == []


# -- an interruptible tool behind the approval ------------------------------------------------


def banking_behind_approval(allowed: tuple[str, ...] = ("getBalance",)) -> tuple[Any, Any]:
    ai = Interlock()
    tool = ai.define_interruptible_tool("transferMoney", "transfer", transferMoney.fn)
    agent = ai.define_agent(
        "bank",
        model="scripted/banking",
        tools=[tool],
        middleware=[tool_approval(allowed)],
        store=InMemorySessionStore(),
    )
    return agent, tool


def test_interruptible_tool_behind_approval_two_steps() -> None:
    agent, tool = banking_behind_approval()
    out = agent.run_text("Transfer $500 to savings.")
    [gated] = out.interrupts
    assert gated.meta("interrupt") == {
        "message": "Tool not in approved list: transferMoney",
        "tool": "transferMoney",
        "input": {"amount": 500.0, "toAccount": "savings"},
    }
    assert interrupt_as(gated, ApprovalAsk) is None

    # step 1: the approval; the tool runs and its own interrupt fires
    second = agent.run(ToolResume(restart=[approve(gated)]), session_id=out.session_id)
    assert second.finish_reason is FinishReason.INTERRUPTED
    [own] = second.interrupts
    assert own.tool_request is not None and gated.tool_request is not None
    assert own.tool_request.ref == gated.tool_request.ref
    assert tool.interrupt_as(own, ApprovalAsk) == ApprovalAsk(
        action="transferMoney", details="Transfer $500.00 to savings"
    )

    # step 2: answer the tool's own interrupt without repeating toolApproved
    reply = tool.resume(own, ApprovalReply(approved=True))
    assert "toolApproved" not in reply.meta("resumed")
    final = agent.run(ToolResume(restart=[reply]), session_id=out.session_id)
    assert final.finish_reason is FinishReason.STOP
    assert final.text.startswith("Done: transferred $500.00 to savings, transaction txn-")


def test_interruptible_tool_behind_approval_respond_to_second_step() -> None:
    agent, tool = banking_behind_approval()
    out = agent.run_text("Transfer $5 to bob")
    second = agent.run(ToolResume(restart=[approve(out.interrupts[0])]), session_id=out.session_id)
    answer = tool.respond(second.interrupts[0], TransferOutput(success=True, transaction_id="t9"))
    final = agent.run(ToolResume(respond=[answer]), session_id=out.session_id)
    assert final.text == "Done: transferred $5.00 to bob, transaction t9."


def test_approval_with_resume_data_in_one_step() -> None:
    """The rest of the resumed data goes to the tool as `res`."""
    agent, _tool = banking_behind_approval()
    out = agent.run_text("Transfer $5 to bob")
    both = restart(out.interrupts[0], {"toolApproved": True, "approved": False})
    final = agent.run(ToolResume(restart=[both]), session_id=out.session_id)
    assert final.finish_reason is FinishReason.STOP
    assert final.text == "The transfer of $5.00 to bob was declined."


def test_approval_resume_data_is_validated_without_the_marker() -> None:
    agent, _tool = banking_behind_approval()
    out = agent.run_text("Transfer $5 to bob")
    bad = restart(out.interrupts[0], {"toolApproved": True, "approved": "perhaps"})
    with pytest.raises(ResumeValidationError) as info:
        agent.run(ToolResume(restart=[bad]), session_id=out.session_id)
    assert info.value.status is Status.INVALID_ARGUMENT
    assert "invalid resume data for tool 'transferMoney'" in info.value.message


# -- middleware in general --------------------------------------------------------------------


class Recorder(Middleware):
    def __init__(self, label: str, log: list[str]) -> None:
        self.label = label
        self.log = log

    def wrap_tool(self, ctx: ToolContext, tool: Tool[Any, Any], call_next: Any) -> Any:
        self.log.append(f"{self.label}>{tool.name}")
        result = call_next(ctx)
        self.log.append(f"{self.label}<{tool.name}")
        return result


def test_middleware_wraps_calls_in_order() -> None:
    gate = Gate()
    log: list[str] = []
    agent = gate.agent(("lookup", 1), middleware=[Recorder("outer", log), Recorder("inner", log)])
    out = agent.run_text("go")
    assert out.text == '[{"value": 1}]'
    assert log == ["outer>lookup", "inner>lookup", "inner<lookup", "outer<lookup"]


def test_middleware_metadata_persists_on_the_interrupted_part() -> None:
    class Stamp(Middleware):
        def wrap_tool(self, ctx: ToolContext, tool: Tool[Any, Any], call_next: Any) -> Any:
            ctx.metadata["seenBy"] = "stamp"
            return call_next(ctx)

    gate = Gate()
    agent = gate.agent(("delete", 1), middleware=[Stamp(), tool_approval()])
    out = agent.run_text("go")
    assert out.interrupts[0].meta("seenBy") == "stamp"


def test_approve_on_an_allowed_tools_own_interrupt_is_no_resume_data() -> None:
    """`approve` carries only the approval marker. Checked up front and at run time the
    same way for an allowed tool as for a gated one: the marker is not the tool's own
    resume data, so the tool runs again with `res=None` and asks again."""
    agent, tool = banking_behind_approval(allowed=("transferMoney",))
    out = agent.run_text("Transfer $5 to bob")
    [own] = out.interrupts
    assert tool.interrupt_as(own, ApprovalAsk) is not None, "allowed: the tool's own ask"
    resume = ToolResume(restart=[approve(own)])
    agent.validate_resume(resume, session_id=out.session_id)
    again = agent.run(resume, session_id=out.session_id)
    assert again.finish_reason is FinishReason.INTERRUPTED
    [asked] = again.interrupts
    assert tool.interrupt_as(asked, ApprovalAsk) == ApprovalAsk(
        action="transferMoney", details="Transfer $5.00 to bob"
    )
    final = agent.run(
        ToolResume(restart=[tool.resume(asked, ApprovalReply(approved=True))]),
        session_id=out.session_id,
    )
    assert final.text.startswith("Done: transferred $5.00 to bob, transaction txn-")


def test_is_approval_gate_tells_the_gate_from_the_tools_own_interrupt() -> None:
    agent, tool = banking_behind_approval()
    out = agent.run_text("Transfer $5 to bob")
    [gated] = out.interrupts
    assert is_approval_gate(gated)
    second = agent.run(ToolResume(restart=[approve(gated)]), session_id=out.session_id)
    [own] = second.interrupts
    assert not is_approval_gate(own)
    assert not is_approval_gate(tool.respond(own, TransferOutput(success=True)))
