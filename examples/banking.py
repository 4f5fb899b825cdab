"""The banking agent of Genkit's agent-interrupts example: a money transfer that pauses
for a human's approval.

    from examples.banking import ai, bankingAgent, transferMoney
    out = bankingAgent.run_text("Transfer $500 to savings.")
    part = out.interrupts[0]
    reply = transferMoney.resume(part, ApprovalReply(approved=True))
    out = bankingAgent.run(ToolResume(restart=[reply]), session_id=out.session_id)

Its model is scripted (`scripted/banking`): "Transfer $N to ACCOUNT" becomes a
`transferMoney` call ("... and $M to OTHER" calls twice at once, "... then $M to OTHER"
calls again after the first one is answered); a tool result becomes a final answer that
names the transaction id, or says the transfer was declined.

On a real model: set `INTERLOCK_BANKING_MODEL=openai/gpt-4o-mini` (any `provider/model`)
before this module is imported (a worker's environment), or wrap a run in
`with using_model("anthropic/claude-haiku-4-5") as agent: ...` (what
`interlock demo --model` does).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

from interlock import (
    Agent,
    InMemorySessionStore,
    Interlock,
    Message,
    ModelRequest,
    Status,
    StatusError,
    ToolContext,
    interrupt,
    scripted,
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


# -- the scripted model ---------------------------------------------------------------

_TRANSFER = re.compile(
    r"\$?\s*(-?\d[\d,]*(?:\.\d+)?)\s+to\s+(?:my\s+|the\s+)?(.+?)(?:\s+account)?[.!]?\s*$",
    re.IGNORECASE,
)


def _steps(text: str) -> list[list[dict[str, Any]]]:
    """'Transfer $1 to a and $2 to b then $3 to c' -> [[a, b], [c]]."""
    body = re.sub(r"^\s*(please\s+)?transfer\s+", "", text.strip(), flags=re.IGNORECASE)
    steps = []
    for group in re.split(r",?\s+then\s+", body, flags=re.IGNORECASE):
        calls = []
        for piece in re.split(r"\s+and\s+", group, flags=re.IGNORECASE):
            match = _TRANSFER.search(piece.strip())
            if match:
                amount = float(match.group(1).replace(",", ""))
                calls.append({"amount": amount, "toAccount": match.group(2).strip()})
        if calls:
            steps.append(calls)
    return steps


def _answer(results: list[tuple[dict[str, Any], Any]]) -> str:
    lines = []
    for call, output in results:
        what = f"${float(call.get('amount', 0)):.2f} to {call.get('toAccount', '?')}"
        if isinstance(output, dict) and output.get("success"):
            lines.append(f"Done: transferred {what}, transaction {output['transactionId']}.")
        elif isinstance(output, dict) and output.get("denied"):
            lines.append(f"The transfer of {what} was declined: {output.get('message', '')}.")
        else:
            lines.append(f"The transfer of {what} was declined.")
    return " ".join(lines)


def banking_model(request: ModelRequest) -> Message:
    """Turns "Transfer $N to ACCOUNT" into transferMoney calls, and results into an answer."""
    messages = request.messages
    last_user = max(i for i, m in enumerate(messages) if m.role == "user")
    steps = _steps(messages[last_user].text)
    if not steps:
        return scripted.text("I am a banking assistant: ask me to 'Transfer $AMOUNT to ACCOUNT'.")
    done = [m for m in messages[last_user + 1 :] if m.role == "tool"]
    if len(done) < len(steps):
        return scripted.reply(
            *(scripted.tool_call("transferMoney", call) for call in steps[len(done)])
        )
    calls = {
        p.tool_request.ref: p.tool_request.input
        for m in messages[last_user + 1 :]
        for p in m.content
        if p.tool_request is not None
    }
    results = [
        (calls.get(p.tool_response.ref, {}), p.tool_response.output)
        for m in done
        for p in m.content
        if p.tool_response is not None
    ]
    return scripted.text(_answer(results))


scripted.define(ai, "banking", banking_model)

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
    keeps the agent as it is."""
    current = ai.lookup_agent("bankingAgent")
    if model is None:
        yield current
        return
    ai.lookup_model(model)
    agent = replace(current, model=model)
    ai.agents[agent.name] = agent
    try:
        yield agent
    finally:
        ai.agents[agent.name] = current
