"""Resume validation: every rule is checked before anything runs or is written."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from schemas import (
    FinishReason,
    Message,
    Part,
    Snapshot,
    SnapshotStatus,
    Status,
    ToolResume,
    utcnow,
    wire_time,
)

from ._json import same_json
from .errors import ResumeValidationError, StatusError
from .middleware import Middleware
from .tools import Tool

__all__ = [
    "Answer",
    "already_resumed",
    "check_resumable",
    "passed_deadline",
    "pending_interrupts",
    "plan_resume",
]


@dataclass(frozen=True)
class Answer:
    """How one pending interrupt is answered."""

    kind: Literal["respond", "restart"]
    name: str
    ref: str
    part: Part
    resumed: dict[str, Any] | None = None


def _describe(part: Part) -> str:
    req = part.tool_request
    assert req is not None
    return f"{req.name} (ref {req.ref})"


def pending_interrupts(messages: Sequence[Message]) -> list[Part]:
    """The interrupts still waiting in the latest model message."""
    for message in reversed(messages):
        if message.role == "model":
            return message.interrupts
    return []


def passed_deadline(snapshot: Snapshot) -> datetime | None:
    """The deadline of the snapshot's pause, when it had one and it has passed."""
    deadline = snapshot.expires_at
    return deadline if deadline is not None and deadline <= utcnow() else None


def check_resumable(
    snapshot: Snapshot, claimed_by: str | None = None, *, interrupted: bool = True
) -> None:
    """Rule 6: only a completed, unexpired, unclaimed snapshot can be resumed. With
    `interrupted` (the resume consumer's order of checks), one that did not end
    interrupted is refused here too (FAILED_PRECONDITION); without it, the parts are
    left to refuse it (nothing is pending: INVALID_ARGUMENT, rule 1)."""
    sid = snapshot.snapshot_id
    if snapshot.status != SnapshotStatus.COMPLETED:
        status = getattr(snapshot.status, "value", snapshot.status)  # a store's own type
        raise ResumeValidationError(
            Status.FAILED_PRECONDITION,
            f"snapshot {sid} is {status} and cannot be resumed; it is kept for inspection "
            f"(session {snapshot.session_id} goes on from its latest completed snapshot)",
        )
    if interrupted and snapshot.finish_reason != FinishReason.INTERRUPTED:
        raise ResumeValidationError(
            Status.FAILED_PRECONDITION, f"snapshot {sid} is not interrupted: nothing to resume"
        )
    claimed_in_time = snapshot.resumed_by is not None and snapshot.resumed_by == claimed_by
    if (deadline := passed_deadline(snapshot)) is not None and not claimed_in_time:
        # A claim is only made before the deadline, and a claimed snapshot is never
        # expired: the answer it holds was in time, however late its turn runs.
        raise ResumeValidationError(
            Status.FAILED_PRECONDITION,
            f"snapshot {sid} expired at {wire_time(deadline)} and cannot be resumed",
        )
    if snapshot.resumed_by is not None and snapshot.resumed_by != claimed_by:
        raise already_resumed(snapshot)


def already_resumed(snapshot: Snapshot) -> ResumeValidationError:
    """Rule 6's refusal of a pause that another answer claimed."""
    return ResumeValidationError(
        Status.FAILED_PRECONDITION,
        f"snapshot {snapshot.snapshot_id} was already resumed (session {snapshot.session_id} "
        "goes on from its latest snapshot)",
    )


def _invalid(message: str) -> ResumeValidationError:
    return ResumeValidationError(Status.INVALID_ARGUMENT, message)


def _known_refs(messages: Sequence[Message]) -> set[str]:
    refs: set[str] = set()
    for message in messages:
        for part in message.content:
            for ref in (
                part.tool_request.ref if part.tool_request else None,
                part.tool_response.ref if part.tool_response else None,
            ):
                if ref is not None:
                    refs.add(ref)
    return refs


def plan_resume(
    messages: Sequence[Message],
    resume: ToolResume,
    tools: Mapping[str, Tool[Any, Any]],
    middleware: Sequence[Middleware] = (),
) -> dict[str, Answer]:
    """Rules 1-5: match every entry to a pending interrupt. Returns the answers by ref."""
    if not resume.respond and not resume.restart:
        raise _invalid("resume answers nothing: give respond or restart parts")
    pending = {p.tool_request.ref: p for p in pending_interrupts(messages) if p.tool_request}
    known = _known_refs(messages)
    latest = next((m for m in reversed(messages) if m.role == "model"), None)
    ran = _known_refs([latest]) - set(pending) if latest is not None else set()
    answered = {  # answered in a resume whose turn paused again: kept, no longer pending
        p.tool_request.ref
        for p in (latest.content if latest is not None else ())
        if p.tool_request is not None and p.meta("resolvedInterrupt") is not None
    }

    def match(kind: str, part: Part, name: str, ref: str | None) -> Part:
        if ref is not None and ref in pending:
            original = pending[ref]
            assert original.tool_request is not None
            if original.tool_request.name != name:
                raise _invalid(
                    f"{kind} for ref {ref} names tool {name!r}, but the pending interrupt "
                    f"is for {original.tool_request.name!r}"
                )
            return original
        if ref is not None and ref in answered:
            raise _invalid(
                f"{kind} for tool {name!r} ref {ref} was answered already, in the resume "
                "this pause came from (its answer is kept): it is no longer pending"
            )
        if ref is not None and ref in ran:
            raise _invalid(
                f"{kind} for tool {name!r} ref {ref} is a call of the latest model message "
                "that completed without pausing (its output is kept): it is no longer pending"
            )
        if ref is not None and ref in known:
            raise _invalid(
                f"{kind} for tool {name!r} ref {ref} is from an earlier turn which is no "
                "longer pending"
            )
        raise _invalid(f"{kind} for tool {name!r} ref {ref} not found in session history")

    answers: dict[str, Answer] = {}
    for part in resume.respond:
        res = part.tool_response
        marker = part.meta("interruptResponse")  # True, or Genkit's metadata object
        if res is None and part.tool_request is not None and part.meta("resumed") is not None:
            raise _invalid(
                f"respond lists a restart part (ref {part.tool_request.ref}, built with "
                "resume()/restart()): put it in restart"
            )
        if res is None or not (marker is True or isinstance(marker, dict)):
            raise _invalid(
                "respond entries must be tool-response parts built with respond() from the "
                "interrupt part; a hand-rolled part is rejected"
            )
        match("respond", part, res.name, res.ref)
        assert res.ref is not None
        if res.ref in answers:
            raise _invalid(f"respond lists ref {res.ref} twice")
        _check_output(tools.get(res.name), res.output)
        answers[res.ref] = Answer("respond", res.name, res.ref, part)

    restarted: set[str] = set()
    for part in resume.restart:
        req = part.tool_request
        answer, marker = part.tool_response, part.meta("interruptResponse")
        if req is None and answer is not None and (marker is True or isinstance(marker, dict)):
            raise _invalid(
                f"restart lists a respond part (ref {answer.ref}, built with respond()): "
                "put it in respond"
            )
        if req is None or part.meta("resumed") is None:
            raise _invalid(
                "restart entries must be tool-request parts built with resume()/restart() "
                "from the interrupt part; a hand-rolled part is rejected"
            )
        original = match("restart", part, req.name, req.ref)
        assert req.ref is not None and original.tool_request is not None
        if req.ref in restarted:
            raise _invalid(f"restart lists ref {req.ref} twice")
        restarted.add(req.ref)
        try:
            same = same_json(req.input, original.tool_request.input)
        except (ValueError, RecursionError):  # nested deeper than JSON tools can take
            same = False
        if not same:  # a forged input is refused even where respond wins (rule 5)
            raise _invalid(
                f"restart of tool {req.name!r} ref {req.ref} changed its input; a restart "
                "must keep the original input"
            )
        if req.ref in answers:  # respond wins over restart for the same ref: not used
            continue
        resumed = part.meta("resumed")
        data = resumed if isinstance(resumed, dict) else None
        if resumed is not True and data is None:
            raise _invalid(f"restart of ref {req.ref}: resume data must be a JSON object")
        _check_resumed(tools.get(req.name), data, middleware)
        answers[req.ref] = Answer("restart", req.name, req.ref, part, data)

    missing = [_describe(p) for ref, p in pending.items() if ref not in answers]
    if missing:
        raise _invalid(
            "resume must answer every pending interrupt at once; not answered: "
            + ", ".join(missing)
        )
    return answers


def _check_output(tool: Tool[Any, Any] | None, output: Any) -> None:
    if tool is None or (isinstance(output, dict) and output.get("denied") is True):
        return
    try:
        tool.check_output(output)
    except StatusError as exc:
        raise _invalid(exc.message) from exc


def _check_resumed(
    tool: Tool[Any, Any] | None, data: dict[str, Any] | None, middleware: Sequence[Middleware]
) -> None:
    if tool is None or not tool.interruptible or data is None:
        return
    seen = data
    for mw in middleware:
        seen = mw.strip_resumed(seen)
    if not seen and seen != data:
        return  # all of it was the middleware's (an approval): the tool gets None
    try:
        tool.parse_resumed(seen)
    except StatusError as exc:
        raise _invalid(exc.message) from exc
