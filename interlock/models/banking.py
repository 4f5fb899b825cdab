"""`scripted/banking`: the scripted model of the banking example, built into every
registry (no network, deterministic).

"Transfer $N to ACCOUNT" becomes a call of the agent's transfer tool (`transferMoney`,
else the first tool whose name holds "transfer"); "... and $M to OTHER" calls it twice
at once, "... then $M to OTHER" calls it again once the first is answered. A tool result
becomes a final answer that names the transaction id, or says the transfer was
declined. The call's input uses the tool's own field names (`toAccount` or
`to_account`, read from its input schema), so any `TransferInput` shaped like the
example's fits.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

from schemas import Message, ModelRequest, Part, ToolDefinition, ToolRequest

__all__ = ["NAME", "banking_model"]

NAME = "banking"
"""The model's name under the `scripted` provider: `scripted/banking`."""

_TRANSFER = re.compile(
    r"\$?\s*(-?\d[\d,]*(?:\.\d+)?)\s+to\s+(?:my\s+|the\s+)?(.+?)(?:\s+account)?[.!]?\s*$",
    re.IGNORECASE,
)
_ACCOUNT_KEYS = ("toaccount", "account", "to", "destination", "target")


def banking_model(request: ModelRequest) -> Message:
    """Turns "Transfer $N to ACCOUNT" into transfer calls, and results into an answer."""
    messages = request.messages
    users = [i for i, m in enumerate(messages) if m.role == "user"]
    steps = _steps(messages[users[-1]].text) if users else ()
    if not steps:
        return _text("I am a banking assistant: ask me to 'Transfer $AMOUNT to ACCOUNT'.")
    tool = _transfer_tool(request.tools)
    if tool is None:
        return _text("I cannot move money: no transfer tool is available to me.")
    after = messages[users[-1] + 1 :]
    done = [m for m in after if m.role == "tool"]
    if len(done) < len(steps):
        amount, account = _field(tool, ("amount",), "amount"), _field(tool, _ACCOUNT_KEYS)
        calls = [
            Part(tool_request=ToolRequest(name=tool.name, input={amount: a, account: to}))
            for a, to in steps[len(done)]
        ]
        return Message(role="model", content=calls)
    calls_by_ref = {
        p.tool_request.ref: p.tool_request.input
        for m in after
        for p in m.content
        if p.tool_request is not None
    }
    results = [
        (calls_by_ref.get(p.tool_response.ref), p.tool_response.output)
        for m in done
        for p in m.content
        if p.tool_response is not None
    ]
    return _text(_answer(results))


def _text(value: str) -> Message:
    return Message(role="model", content=[Part(text=value)])


@lru_cache(maxsize=256)
def _steps(text: str) -> tuple[tuple[tuple[float, str], ...], ...]:
    """'Transfer $1 to a and $2 to b then $3 to c' -> (((1, a), (2, b)), ((3, c),)).
    Parsed once per text: the model reads the same request at every call of a turn."""
    body = re.sub(r"^\s*(please\s+)?transfer\s+", "", text.strip(), flags=re.IGNORECASE)
    steps = []
    for group in re.split(r",?\s+then\s+", body, flags=re.IGNORECASE):
        calls = []
        for piece in re.split(r"\s+and\s+", group, flags=re.IGNORECASE):
            match = _TRANSFER.search(piece.strip())
            if match:
                calls.append((float(match.group(1).replace(",", "")), match.group(2).strip()))
        if calls:
            steps.append(tuple(calls))
    return tuple(steps)


def _transfer_tool(tools: list[ToolDefinition]) -> ToolDefinition | None:
    named = [t for t in tools if t.name == "transferMoney"]
    found = named or [t for t in tools if "transfer" in t.name.lower()]
    return found[0] if found else None


def _squash(key: str) -> str:
    return key.replace("_", "").replace("-", "").lower()


def _field(tool: ToolDefinition, wanted: tuple[str, ...], default: str = "toAccount") -> str:
    """The tool's input property whose name is one of `wanted` (case, `_` and `-`
    ignored), in that order of preference; `default` when the schema names none."""
    properties = (tool.input_schema or {}).get("properties")
    names = [str(k) for k in properties] if isinstance(properties, dict) else []
    for key in wanted:
        for name in names:
            if _squash(name) == key:
                return name
    return default


def _lookup(fields: Any, *keys: str) -> Any:
    """`fields[key]` for the first key present, its case and `_` ignored."""
    if not isinstance(fields, dict):
        return None
    squashed = {_squash(str(k)): v for k, v in fields.items()}
    return next((squashed[k] for k in keys if k in squashed), None)


def _answer(results: list[tuple[Any, Any]]) -> str:
    lines = []
    for call, output in results:
        amount, account = _lookup(call, "amount"), _lookup(call, *_ACCOUNT_KEYS)
        what = f"${float(amount or 0):.2f} to {account or '?'}"
        if _lookup(output, "success"):
            txn = _lookup(output, "transactionid")
            lines.append(f"Done: transferred {what}, transaction {txn}.")
        elif _lookup(output, "denied"):
            lines.append(f"The transfer of {what} was declined: {_lookup(output, 'message')}.")
        else:
            lines.append(f"The transfer of {what} was declined.")
    return " ".join(lines)
