"""The decision `decide` sends, built from the store and checked as the resume consumer
would check it, before anything is sent: every refusal says "nothing was sent"."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from .base import error_line, no_tables, not_in, read_store, store_read, store_tables
from .waiter import repeated_flags

if TYPE_CHECKING:
    from interlock import Part, Snapshot
    from schemas import Decision

    from ..settings import Settings

__all__ = ["NOTHING_SENT", "draft_decision", "nothing_sent"]

NOTHING_SENT = "nothing was sent"


@contextmanager
def nothing_sent() -> Iterator[None]:
    """An error raised inside that the command line says in one line (`error_line`: an
    Interlock error, a store or broker not reached), said with "; nothing was sent"
    added (once): a script that reads the line knows the decision did not go out."""
    from interlock import StatusError

    try:
        yield
    except Exception as exc:
        said = error_line(exc)
        if said is None:  # a bug: its traceback is shown
            raise
        status, message = said
        if NOTHING_SENT in message:
            raise
        raise StatusError(status, f"{message}; {NOTHING_SENT}") from exc


def draft_decision(
    settings: Settings,
    snapshot_id: str,
    resume_token: str,
    *,
    verdict: str,
    output: Any,
    refs: tuple[str, ...],
    feedback: str | None,
    reviewer: str | None,
) -> tuple[Decision, list[str]]:
    """The decision on `snapshot_id` and the refs it answers: `output` responds to each
    (when `verdict` is "respond"), else each is restarted with `{"approved": ...}` (a
    call that `tool_approval` holds: approved or denied). What the consumer would refuse
    is refused here, in its order, with "; nothing was sent"."""
    with nothing_sent():
        snap = _read_snapshot(settings, snapshot_id)
        _check_token(settings, snap, resume_token)
        wanted, pending = _answered(snap, refs)
        decision = _build(snap, resume_token, wanted, pending, verdict, output, feedback, reviewer)
        if settings.app:  # every check of the consumer but the claim
            _check_with_app(settings.app, decision, snap)
    return decision, wanted


def _read_snapshot(settings: Settings, snapshot_id: str) -> Snapshot:
    from interlock import Status, StatusError

    sql = read_store(settings.store_url, settings.server_timeout)

    def read() -> tuple[str | None, Snapshot | None]:
        empty = no_tables(store_tables(sql), settings.store_url)
        return empty, sql.get_snapshot(snapshot_id) if empty is None else None

    try:
        empty, snap = store_read(read, settings.server_timeout)
    finally:
        sql.dispose()
    if snap is None:
        raise StatusError(
            Status.NOT_FOUND, f"snapshot {snapshot_id} not found{not_in(settings.store_url, empty)}"
        )
    return snap


def _check_token(settings: Settings, snap: Snapshot, resume_token: str) -> None:
    """Rule 3 (the token), then, for a wrong one, whether a new token can be issued: a
    pause still open gets the hint to announce it again, with the flags to pass."""
    from interlock import StatusError
    from interlock.resume import check_resumable

    from ..decisions import WRONG_TOKEN, check_token

    try:
        check_token(snap, resume_token)
    except StatusError as exc:
        said = (
            WRONG_TOKEN.format(snapshot_id=snap.snapshot_id)
            if resume_token
            else f"--token is empty: snapshot {snap.snapshot_id} needs its resume_token"
        )
        try:
            check_resumable(snap)
        except StatusError:  # answered or expired: no new token can be issued either
            raise StatusError(exc.status, said) from None
        flags, hidden = repeated_flags(settings, ("--broker", "--store"))
        note = " (put the password back where *** stands)" if hidden else ""
        raise StatusError(
            exc.status,
            f"{said}; {NOTHING_SENT}. Use the resume_token of its latest "
            "turn.interrupted event, or announce the pause again with a new one: "
            f"`interlock resend {snap.snapshot_id}{flags}`{note}",
        ) from None


def _answered(
    snap: Snapshot, refs: tuple[str, ...]
) -> tuple[list[str], dict[str, tuple[str, Part]]]:
    """Rule 4 (the pause's state), then the refs: those asked for (all pending ones
    when none are), each once, each pending, and none left out. Returns them, and each
    pending ref's tool name and part."""
    from interlock import Status, StatusError
    from interlock.resume import check_resumable, pending_interrupts

    check_resumable(snap)
    pending = {
        p.tool_request.ref: p
        for p in pending_interrupts(snap.messages)
        if p.tool_request is not None and p.tool_request.ref is not None
    }
    names = {ref: p.tool_request.name for ref, p in pending.items() if p.tool_request}
    wanted = list(refs) or list(names)
    twice = next((ref for i, ref in enumerate(wanted) if ref in wanted[:i]), None)
    if twice is not None:  # the consumer would refuse it: an interrupt is answered once
        raise StatusError(Status.INVALID_ARGUMENT, f"--ref {twice} is given twice")
    if not wanted:
        raise StatusError(
            Status.FAILED_PRECONDITION, f"snapshot {snap.snapshot_id} has no pending interrupt"
        )
    unknown = [ref for ref in wanted if ref not in names]
    if unknown:
        raise StatusError(
            Status.INVALID_ARGUMENT,
            f"--ref {unknown[0]} is no pending interrupt of snapshot {snap.snapshot_id} "
            f"(pending: {', '.join(names)})",
        )
    left = [ref for ref in names if ref not in wanted]
    if left:  # the consumer would refuse it: a decision answers them all at once
        raise StatusError(
            Status.INVALID_ARGUMENT,
            "a decision answers every pending interrupt at once: add "
            + ", ".join(f"--ref {ref} ({names[ref]})" for ref in left)
            + " or leave --ref out; to answer them differently, publish a decision's JSON "
            "(docs/queues.md)",
        )
    return wanted, {ref: (names[ref], part) for ref, part in pending.items()}


def _build(
    snap: Snapshot,
    resume_token: str,
    wanted: list[str],
    pending: dict[str, tuple[str, Part]],
    verdict: str,
    output: Any,
    feedback: str | None,
    reviewer: str | None,
) -> Decision:
    from interlock import approve as approve_call
    from interlock import deny as deny_call
    from interlock import is_approval_gate
    from schemas import Decision, RespondEntry, RestartEntry

    respond_entries: list[RespondEntry | Part] = []
    restart_entries: list[RestartEntry | Part] = []
    for ref in wanted:  # every one pending (checked before)
        name, part = pending[ref]
        if verdict == "respond":
            respond_entries.append(RespondEntry(name=name, ref=ref, output=output))
        elif is_approval_gate(part):
            # a call `tool_approval` holds: approve runs it, deny tells the model why not
            if verdict == "approve":
                restart_entries.append(approve_call(part))
            else:
                respond_entries.append(deny_call(part, feedback or "denied by reviewer"))
        else:
            resumed: dict[str, Any] = {"approved": verdict == "approve"}
            if feedback:
                resumed["feedback"] = feedback
            restart_entries.append(RestartEntry(name=name, ref=ref, resumed=resumed))
    return Decision(
        decision_id=str(uuid.uuid4()),
        snapshot_id=snap.snapshot_id,
        resume_token=resume_token,
        reviewer=reviewer or None,
        respond=respond_entries,
        restart=restart_entries,
    )


def _check_with_app(app: str, decision: Decision, snap: Snapshot) -> None:
    from interlock import StatusError

    from ..decisions import check_decision
    from ..loader import load_registry

    try:
        registry = load_registry(app)
    except StatusError as exc:
        raise StatusError(
            exc.status,
            f"{exc.message}; {NOTHING_SENT} (decide needs no app: without --app and "
            "INTERLOCK_APP, the resume consumer alone checks the decision)",
        ) from None
    check_decision(registry, decision, snap)
