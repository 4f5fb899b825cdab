"""The banking agent of Genkit's agent-interrupts example: a money transfer that pauses
for a human's approval.

    from examples.banking import ApprovalReply, bankingAgent, transferMoney
    from interlock import ToolResume
    out = bankingAgent.run_text("Transfer $500 to savings.")
    part = out.interrupts[0]
    reply = transferMoney.resume(part, ApprovalReply(approved=True))
    out = bankingAgent.run(ToolResume(restart=[reply]), session_id=out.session_id)

Its model is `scripted/banking`, built into every registry (`interlock.models.banking`):
"Transfer $N to ACCOUNT" becomes a `transferMoney` call ("... and $M to OTHER" calls
twice at once, "... then $M to OTHER" calls again after the first one is answered); a
tool result becomes a final answer that names the transaction id, or says the transfer
was declined.

On a real model: set `INTERLOCK_BANKING_MODEL=openai/gpt-4o-mini` (any `provider/model`)
before this module is imported (a worker's environment), or wrap a run in
`with using_model("anthropic/claude-haiku-4-5") as agent: ...` (what
`interlock demo --model` does).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

from interlock import (
    Agent,
    InMemorySessionStore,
    Interlock,
    Status,
    StatusError,
    ToolContext,
    interrupt,
    tool_approval,
)

__all__ = [
    "ApprovalAsk",
    "ApprovalReply",
    "TransferInput",
    "TransferOutput",
    "ai",
    "bankingAgent",
    "guardedBankingAgent",
    "transferMoney",
    "using_model",
]

MODEL_ENV = "INTERLOCK_BANKING_MODEL"


class _Wire(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)


class ApprovalAsk(_Wire):
    action: str
    details: str


class ApprovalReply(_Wire):
    approved: bool
    feedback: str | None = None


class TransferInput(_Wire):
    amount: float
    to_account: str


class TransferOutput(_Wire):
    success: bool
    transaction_id: str = ""


ai = Interlock()


@ai.interruptible_tool(
    name="transferMoney",
    description="Transfer money to a specified account, pausing for user approval.",
)
def transferMoney(
    inp: TransferInput, res: ApprovalReply | None, ctx: ToolContext
) -> TransferOutput:
    if inp.amount <= 0:
        raise StatusError(
            Status.INVALID_ARGUMENT, f"transfer amount must be positive, got ${inp.amount:.2f}"
        )
    if res is None:
        interrupt(
            ApprovalAsk(
                action="transferMoney",
                details=f"Transfer ${inp.amount:.2f} to {inp.to_account}",
            )
        )
    assert res is not None
    if not res.approved:
        return TransferOutput(success=False)
    return TransferOutput(success=True, transaction_id=f"txn-{ctx.idempotency_key[:12]}")


bankingAgent = ai.define_agent(
    "bankingAgent",
    model=os.environ.get(MODEL_ENV) or "scripted/banking",
    system="You are a banking assistant. Use transferMoney to move funds; "
    "it will pause for user approval.",
    tools=[transferMoney],
    store=InMemorySessionStore(),
)

guardedBankingAgent = ai.define_agent(
    "guardedBankingAgent",
    model=os.environ.get(MODEL_ENV) or "scripted/banking",
    system=bankingAgent.system,
    tools=[transferMoney],
    middleware=[tool_approval()],  # every tool call waits for `approve` first
    store=InMemorySessionStore(),
)
"""The same agent behind `tool_approval`: a transfer pauses twice, for the call itself
(answer with `approve` / `deny`), then for the tool's own confirmation."""


@contextmanager
def using_model(model: str | None) -> Iterator[Agent]:
    """`bankingAgent` on `model` (`provider/model`) while the block runs. The registry's
    entry is swapped, so a worker sharing `ai` in this process uses it too. The model is
    looked up first, so a missing API key fails here, before anything runs. `None`
    keeps the agent as it is, on its own model, which is looked up first too: a bad
    `INTERLOCK_BANKING_MODEL` fails here, naming the variable."""
    current = ai.lookup_agent("bankingAgent")
    if model is None:
        try:
            ai.lookup_model(current.model)
        except StatusError as exc:
            if os.environ.get(MODEL_ENV) != current.model:
                raise
            raise StatusError(exc.status, f"{MODEL_ENV}={current.model}: {exc.message}") from exc
        yield current
        return
    ai.lookup_model(model)
    agent = replace(current, model=model)
    ai.agents[agent.name] = agent
    try:
        yield agent
    finally:
        ai.agents[agent.name] = current
