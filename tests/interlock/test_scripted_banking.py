"""`scripted/banking` is built into every registry: the example of the contract runs as
written, on a fresh `Interlock()`, whatever the field names of its models."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from interlock import (
    FinishReason,
    InMemorySessionStore,
    Interlock,
    Message,
    ModelRequest,
    Status,
    StatusError,
    ToolResume,
    interrupt,
    interrupt_as,
    scripted,
)


class TransferInput(BaseModel):  # snake_case on the wire: no alias generator
    amount: float
    to_account: str


class TransferOutput(BaseModel):
    success: bool
    transaction_id: str = ""


class ApprovalAsk(BaseModel):
    action: str
    details: str


class ApprovalReply(BaseModel):
    approved: bool


def banking(ai: Interlock, **agent: Any) -> tuple[Any, Any]:
    @ai.interruptible_tool(
        name="transferMoney", description="Transfer money, pausing for user approval."
    )
    def transfer_money(inp: TransferInput, res: ApprovalReply | None) -> TransferOutput:
        if res is None:
            interrupt(
                ApprovalAsk(
                    action="transferMoney",
                    details=f"Transfer ${inp.amount:.2f} to {inp.to_account}",
                )
            )
        assert res is not None
        return TransferOutput(success=res.approved, transaction_id="txn-9")

    agent.setdefault("store", InMemorySessionStore())
    return ai.define_agent(
        "bankingAgent",
        model="scripted/banking",
        system="You are a banking assistant...",
        tools=[transfer_money],
        **agent,
    ), transfer_money


def test_the_example_runs_on_a_fresh_registry() -> None:
    agent, tool = banking(Interlock())
    out = agent.run_text("Transfer $500 to savings.")
    assert out.finish_reason is FinishReason.INTERRUPTED
    [part] = out.interrupts
    assert part.tool_request is not None
    assert part.tool_request.input == {"amount": 500.0, "to_account": "savings"}
    ask = interrupt_as(part, ApprovalAsk)
    assert ask == ApprovalAsk(action="transferMoney", details="Transfer $500.00 to savings")

    reply = tool.respond(part, TransferOutput(success=True, transaction_id="txn-approved"))
    out = agent.run(ToolResume(respond=[reply]), session_id=out.session_id)
    assert out.finish_reason is FinishReason.STOP
    assert out.text == "Done: transferred $500.00 to savings, transaction txn-approved."


def test_restart_and_denial_on_client_managed_state() -> None:
    agent, tool = banking(Interlock(secret="s"), store=None)
    out = agent.run_text("Transfer $20 to Bob and $30 to Carol")
    assert [p.tool_request.input for p in out.interrupts if p.tool_request] == [
        {"amount": 20.0, "to_account": "Bob"},
        {"amount": 30.0, "to_account": "Carol"},
    ]
    first, second = out.interrupts
    answers = ToolResume(
        restart=[tool.resume(first, ApprovalReply(approved=True))],
        respond=[tool.respond(second, TransferOutput(success=False))],
    )
    out = agent.run(answers, state=out.state)
    assert out.text == (
        "Done: transferred $20.00 to Bob, transaction txn-9. "
        "The transfer of $30.00 to Carol was declined."
    )


def test_the_model_names_the_tools_own_fields() -> None:
    """camelCase models (the example's) get camelCase input; without a transfer tool the
    model says so instead of calling one that is not there."""
    from examples.banking import bankingAgent

    out = bankingAgent.run_text("Transfer $5 to savings")
    assert [p.tool_request.input for p in out.interrupts if p.tool_request] == [
        {"amount": 5.0, "toAccount": "savings"}
    ]
    bare = Interlock().define_agent("bare", model="scripted/banking")
    assert bare.run_text("Transfer $5 to savings").text == (
        "I cannot move money: no transfer tool is available to me."
    )
    assert bare.run_text("hello").text.startswith("I am a banking assistant")


def test_other_scripted_names_are_not_found_and_ones_own_win() -> None:
    ai = Interlock()
    with pytest.raises(StatusError) as info:
        ai.lookup_model("scripted/nowhere")
    assert info.value.status is Status.NOT_FOUND
    assert info.value.message == (
        "model 'scripted/nowhere' is not defined: define it with "
        "scripted.define(ai, 'nowhere', ...) (built in: scripted/banking)"
    )

    def mine(request: ModelRequest) -> Message:
        return scripted.text("my own banking model")

    scripted.define(ai, "banking", mine)
    agent = ai.define_agent("a", model="scripted/banking")
    assert agent.run_text("Transfer $5 to savings").text == "my own banking model"


@pytest.mark.parametrize(
    "reply",
    [
        "hello there",
        scripted.text("hello there"),
        scripted.reply(scripted.text("hello there").content[0]),
        scripted.text("hello there").content[0],
    ],
    ids=["string", "message", "response", "part"],
)
def test_one_reply_alone_is_a_script_of_one(reply: Any) -> None:
    """A reply given alone, not in a list, is one reply: a string is not read as a list
    of its characters, nor a message as a list of its fields."""
    ai = Interlock(secret="test")
    scripted.define(ai, "once", reply)
    agent = ai.define_agent("a", model="scripted/once")
    assert agent.run_text("hi").text == "hello there"
    with pytest.raises(StatusError) as info:
        agent.run_text("again")
    assert info.value.status is Status.OUT_OF_RANGE
    assert info.value.message == "scripted model 'scripted/once' has no reply left (it had 1)"
