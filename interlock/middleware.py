"""Tool middleware, and `tool_approval`: gate any tool behind a human approval."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from schemas import Part

from .context import ToolContext
from .interrupts import interrupt, respond, restart

if TYPE_CHECKING:
    from .tools import Tool

__all__ = ["Middleware", "ToolApproval", "approve", "deny", "is_approval_gate", "tool_approval"]

APPROVED_KEY = "toolApproved"

CallNext = Callable[[ToolContext], Any]


class Middleware:
    """Wraps every tool call of an agent. Subclasses override what they need."""

    def wrap_tool(self, ctx: ToolContext, tool: Tool[Any, Any], call_next: CallNext) -> Any:
        return call_next(ctx)

    def strip_resumed(self, resumed: dict[str, Any]) -> dict[str, Any]:
        """The resume data the tool itself will see (for validating it up front)."""
        return resumed


class ToolApproval(Middleware):
    """Every call to a tool outside `allowed` interrupts until a human approves it."""

    def __init__(self, allowed: Iterable[str] = ()) -> None:
        self.allowed = frozenset(allowed)

    def wrap_tool(self, ctx: ToolContext, tool: Tool[Any, Any], call_next: CallNext) -> Any:
        if isinstance(ctx.resumed, dict) and ctx.resumed.get(APPROVED_KEY) is True:
            # An approval is never resume data of the tool's own (an allowed tool's
            # interrupt may be answered with `approve` too: the tool runs again).
            ctx.metadata[APPROVED_KEY] = True
            ctx.resumed = self.strip_resumed(ctx.resumed) or None
        if tool.name in self.allowed:
            return call_next(ctx)
        if ctx.metadata.get(APPROVED_KEY) is not True:
            interrupt(
                {
                    "message": f"Tool not in approved list: {tool.name}",
                    "tool": tool.name,
                    "input": ctx.input,
                }
            )
        return call_next(ctx)

    def strip_resumed(self, resumed: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in resumed.items() if k != APPROVED_KEY}


def tool_approval(allowed: Iterable[str] = ()) -> ToolApproval:
    """Middleware that turns every call of a tool not in `allowed` into an interrupt.
    An empty list gates every tool."""
    return ToolApproval(allowed)


def is_approval_gate(part: Part) -> bool:
    """True for an interrupt that `tool_approval` raised (not the tool's own): answer it
    with `approve` or `deny`."""
    payload = part.meta("interrupt") if part.is_interrupt() else None
    req = part.tool_request
    return (
        isinstance(payload, dict)
        and req is not None
        and set(payload) == {"message", "tool", "input"}
        and payload["tool"] == req.name
        and payload["message"] == f"Tool not in approved list: {req.name}"
    )


def approve(part: Part) -> Part:
    """A restart that approves the gated call; the tool then runs."""
    return restart(part, {APPROVED_KEY: True})


def deny(part: Part, reason: str = "denied by reviewer") -> Part:
    """A respond that refuses the call; the model reads `{"denied": true, "message"}`."""
    return respond(part, {"denied": True, "message": reason})
