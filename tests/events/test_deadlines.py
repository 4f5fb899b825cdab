"""Deadlines: an interrupt may expire; the sweeper marks it and announces turn.expired;
a later answer is refused with FAILED_PRECONDITION."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from pydantic import BaseModel, TypeAdapter

from events.decision_log import DecisionLog
from events.expiry import expire_overdue
from events.outbox import Outbox
from interlock import (
    FinishReason,
    InMemorySessionStore,
    Interlock,
    Message,
    ModelRequest,
    ResumeValidationError,
    SessionStore,
    SnapshotStatus,
    SqlSessionStore,
    Status,
    StatusError,
    ToolFailedError,
    ToolResume,
    interrupt,
    scripted,
)
from schemas import DecisionAccepted, DecisionRejected, ErrorInfo, wire_time
from tests.sql_helpers import database_url, query_plan
from workers.audit import session_history
from workers.cli import main


class Ask(BaseModel):
    n: int
    wait: float | None = None
    again: float | None = None
    """Pause a second time once answered (a restart without `last`), with this deadline."""


def make_agent(store: SessionStore, *, agent_default: float | None = None) -> Any:
    ai = Interlock(secret="t")

    @ai.interruptible_tool(name="ask", description="asks, with a deadline")
    def ask(inp: Ask, res: dict[str, Any] | None) -> dict[str, Any]:
        if res is None:
            interrupt({"n": inp.n}, expires_in=inp.wait)
        if inp.again is not None and "last" not in (res or {}):
            interrupt({"n": inp.n, "again": True}, expires_in=inp.again)
        return {"ok": True}

    def model(request: ModelRequest) -> Message:
        last = request.messages[-1]
        if last.role == "user":
            return scripted.reply(scripted.tool_call("ask", json.loads(last.text)))
        return scripted.text("answered")

    scripted.define(ai, "ask", model)
    agent = ai.define_agent(
        "asker",
        model="scripted/ask",
        tools=[ask],
        store=store,
        interrupt_expires_in=agent_default,
    )
    return agent, ask


@pytest.fixture
def sql_store(tmp_path: Path) -> Iterator[SqlSessionStore]:
    store = SqlSessionStore(f"sqlite:///{tmp_path}/d.db")
    try:
        yield store
    finally:
        store.dispose()


def test_tool_deadline_sets_expires_at() -> None:
    agent, _ = make_agent(InMemorySessionStore())
    out = agent.run_text(json.dumps({"n": 1, "wait": 120}))
    snap = agent.store.get_snapshot(out.snapshot_id)
    assert snap.expires_at is not None
    assert abs((snap.expires_at - snap.created_at) - timedelta(seconds=120)) < timedelta(seconds=1)


def test_agent_default_deadline_and_no_deadline() -> None:
    agent, _ = make_agent(InMemorySessionStore(), agent_default=30)
    out = agent.run_text(json.dumps({"n": 1}))
    snap = agent.store.get_snapshot(out.snapshot_id)
    assert snap.expires_at is not None
    assert abs((snap.expires_at - snap.created_at) - timedelta(seconds=30)) < timedelta(seconds=1)
    plain, _ = make_agent(InMemorySessionStore())
    out = plain.run_text(json.dumps({"n": 1}))
    assert plain.store.get_snapshot(out.snapshot_id).expires_at is None


@pytest.fixture(params=["memory", "sqlite"])
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SessionStore]:
    if request.param == "memory":
        yield InMemorySessionStore()
        return
    store = SqlSessionStore(f"sqlite:///{tmp_path}/x.db")
    try:
        yield store
    finally:
        store.dispose()


def test_answer_claimed_in_time_runs_after_the_deadline(any_store: SessionStore) -> None:
    """The consumer claimed the decision before the deadline; the worker that runs it
    after the deadline does not refuse it."""
    store = any_store
    agent, ask = make_agent(store)
    out = agent.run_text(json.dumps({"n": 1, "wait": 0.2}))
    resume = ToolResume(restart=[ask.resume(out.interrupts[0], {"x": 1})])
    agent.validate_resume(resume, snapshot_id=out.snapshot_id, claimed_by="decision-1")
    assert store.claim(out.snapshot_id, "decision-1")
    time.sleep(0.3)
    done = agent.run(resume, snapshot_id=out.snapshot_id, claimed_by="decision-1")
    assert done.finish_reason is FinishReason.STOP and done.text == "answered"
    with pytest.raises(ResumeValidationError) as info:  # anyone else is too late
        agent.run(resume, snapshot_id=out.snapshot_id, claimed_by="decision-2")
    assert info.value.status is Status.FAILED_PRECONDITION


def test_non_positive_deadline_fails_the_tool() -> None:
    agent, _ = make_agent(InMemorySessionStore())
    with pytest.raises(ToolFailedError) as info:
        agent.run_text(json.dumps({"n": 1, "wait": 0}))
    cause = info.value.__cause__
    assert isinstance(cause, StatusError)
    assert cause.status is Status.INVALID_ARGUMENT
    assert "expires_in must be positive" in cause.message


def test_answer_after_the_deadline_is_refused(any_store: SessionStore) -> None:
    store = any_store
    agent, ask = make_agent(store)
    out = agent.run_text(json.dumps({"n": 1, "wait": 0.2}))
    time.sleep(0.3)
    part = out.interrupts[0]
    with pytest.raises(ResumeValidationError) as info:
        agent.run(ToolResume(restart=[ask.resume(part, {"x": 1})]), snapshot_id=out.snapshot_id)
    assert info.value.status is Status.FAILED_PRECONDITION
    assert "expired" in info.value.message
    assert not store.claim(out.snapshot_id, "late"), "the claim refuses it too"


def test_sweeper_expires_and_announces(sql_store: SqlSessionStore) -> None:
    outbox = Outbox(sql_store)
    agent, ask = make_agent(sql_store)
    soon = agent.run_text(json.dumps({"n": 1, "wait": 0.2}))
    later = agent.run_text(json.dumps({"n": 2, "wait": 600}))
    claimed = agent.run_text(json.dumps({"n": 3, "wait": 0.2}))
    assert sql_store.claim(claimed.snapshot_id, "reviewer")  # answered in time
    time.sleep(0.3)
    expired = expire_overdue(sql_store, outbox)
    assert [e.snapshot_id for e in expired] == [soon.snapshot_id]
    assert expired[0].type == "turn.expired"
    assert expired[0].session_id == soon.session_id
    snap = sql_store.get_snapshot(soon.snapshot_id)
    assert snap is not None
    assert snap.status is SnapshotStatus.EXPIRED
    assert snap.finish_reason is FinishReason.EXPIRED
    assert sql_store.get_snapshot(later.snapshot_id).status is SnapshotStatus.COMPLETED  # type: ignore[union-attr]
    assert sql_store.get_snapshot(claimed.snapshot_id).status is SnapshotStatus.COMPLETED  # type: ignore[union-attr]
    rows = [(key, json.loads(body)) for _, key, body in outbox.unsent()]
    assert ("turn.expired", expired[0].model_dump(mode="json")) in rows
    [wire] = [body for key, body in rows if key == "turn.expired"]
    for field in ("expires_at", "occurred_at"):  # RFC 3339, with the offset
        assert datetime.fromisoformat(wire[field]).utcoffset() == timedelta(0), wire
    assert expire_overdue(sql_store, outbox) == [], "expired once"
    with pytest.raises(ResumeValidationError) as info:
        agent.run(
            ToolResume(restart=[ask.resume(soon.interrupts[0], {"x": 1})]),
            snapshot_id=soon.snapshot_id,
        )
    assert info.value.status is Status.FAILED_PRECONDITION


@pytest.fixture(params=["sqlite", "postgresql"])
def any_sql_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SqlSessionStore]:
    store = SqlSessionStore(database_url(request, tmp_path, "open.db"))
    try:
        yield store
    finally:
        store.dispose()


def test_the_sweep_reads_the_open_pauses_not_every_pause_answered(
    any_sql_store: SqlSessionStore,
) -> None:
    """The sweep for overdue pauses (every few seconds, in a write transaction: on
    SQLite every writer waits for it) looks the open pauses up by their deadline, in
    their own index: pauses answered long ago, which pile up with every turn run, are
    not read (it read all of them, a cost that grew with the store's history)."""
    from sqlalchemy import event, insert, text

    from interlock.stores.sql import metadata

    store = any_sql_store
    snaps = metadata.tables["interlock_snapshot"]
    outbox = Outbox(store)
    agent, _ask = make_agent(store)
    overdue = agent.run_text(json.dumps({"n": 1, "wait": 0.05}))
    now = datetime.now(UTC)
    answered = [  # answered pauses, most of them with a deadline long past
        {
            "snapshot_id": f"answered-{n}",
            "session_id": f"s-{n}",
            "agent": "asker",
            "status": SnapshotStatus.COMPLETED.value,
            "finish_reason": FinishReason.INTERRUPTED.value,
            "created_at": now - timedelta(days=1),
            "updated_at": now - timedelta(days=1),
            "resumed_by": f"decision-{n}",
            "expires_at": now - timedelta(hours=1) if n % 4 else None,
        }
        for n in range(4000)
    ]
    with store.engine.begin() as conn:
        conn.execute(insert(snaps), answered)
        conn.execute(text("ANALYZE"))  # the planner knows the table is no longer small
    time.sleep(0.1)
    ran: list[tuple[str, Any]] = []

    def keep(conn: Any, cursor: Any, statement: str, params: Any, *rest: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT") and "expires_at" in statement:
            ran.append((statement, params))

    event.listen(store.engine, "before_cursor_execute", keep)
    try:
        expired = expire_overdue(store, outbox)
    finally:
        event.remove(store.engine, "before_cursor_execute", keep)
        outbox.close()
    assert [e.snapshot_id for e in expired] == [overdue.snapshot_id]
    [(statement, params)] = ran
    postgresql = store.engine.dialect.name == "postgresql"
    shown = query_plan(store, statement, params)
    assert "ix_interlock_snapshot_open" in shown, shown
    assert "Seq Scan" not in shown and "SCAN interlock_snapshot" not in shown, shown
    defined = (  # partial: answered pauses, and those with no deadline, are not in it
        "SELECT indexdef FROM pg_indexes WHERE indexname = 'ix_interlock_snapshot_open'"
        if postgresql
        else "SELECT sql FROM sqlite_master WHERE name = 'ix_interlock_snapshot_open'"
    )
    with store.engine.connect() as conn:
        sql = conn.execute(text(defined)).scalar_one()
    assert re.search(r"WHERE \(*resumed_by IS NULL\)* AND \(*expires_at IS NOT NULL", sql), sql


def _expire(store: SessionStore, snapshot_id: str) -> None:
    """Mark a pause expired as the sweeper does (any store)."""
    snap = store.get_snapshot(snapshot_id)
    assert snap is not None
    store.save_snapshot(
        snap.model_copy(
            update={"status": SnapshotStatus.EXPIRED, "finish_reason": FinishReason.EXPIRED}
        )
    )


def _answered_turn(agent: Any, ask: Any, n: int, session_id: str | None = None) -> str:
    """One turn paused and answered: the session's last good snapshot."""
    out = agent.run_text(json.dumps({"n": n}), session_id=session_id)
    done = agent.run(
        ToolResume(restart=[ask.resume(out.interrupts[0], {"x": 1})]), session_id=out.session_id
    )
    assert done.finish_reason is FinishReason.STOP
    return str(done.session_id)


@pytest.mark.parametrize("swept", [True, False], ids=["marked", "deadline-passed"])
def test_resume_by_session_of_an_expired_pause_is_refused(
    any_store: SessionStore, swept: bool
) -> None:
    """Rule 6 by `session_id=` as by `snapshot_id=`: the answer names the expiry, and an
    earlier snapshot of the session is not taken instead (where its refs would be "not
    found in session history", INVALID_ARGUMENT)."""
    agent, ask = make_agent(any_store)
    session = _answered_turn(agent, ask, 1)
    paused = agent.run_text(json.dumps({"n": 2, "wait": 0.2}), session_id=session)
    time.sleep(0.3)
    if swept:
        _expire(any_store, str(paused.snapshot_id))
    answer = ToolResume(restart=[ask.resume(paused.interrupts[0], {"x": 1})])
    with pytest.raises(ResumeValidationError) as info:
        agent.run(answer, session_id=session)
    assert info.value.status is Status.FAILED_PRECONDITION
    deadline = any_store.get_snapshot(str(paused.snapshot_id))
    assert deadline is not None and deadline.expires_at is not None
    # the deadline as the events write it (RFC 3339, UTC, "Z"), as turn.interrupted gave it
    at = TypeAdapter(datetime).dump_python(deadline.expires_at.astimezone(UTC), mode="json")
    assert at.endswith("Z"), at
    expected = "is expired and cannot be resumed" if swept else f"expired at {at} and cannot"
    assert str(paused.snapshot_id) in info.value.message
    assert expected in info.value.message, info.value.message
    with pytest.raises(ResumeValidationError) as checked:  # the queue's check says the same
        agent.validate_resume(answer, session_id=session)
    assert checked.value.message == info.value.message
    latest = any_store.get_latest_snapshot(session)
    assert latest is not None and latest.snapshot_id == paused.snapshot_id, "nothing written"


@pytest.mark.parametrize("swept", [True, False], ids=["marked", "deadline-passed"])
@pytest.mark.parametrize("repaused", [False, True], ids=["one-pause", "re-paused"])
def test_a_new_message_after_an_expired_pause_goes_on_from_before_its_turn(
    any_store: SessionStore, swept: bool, repaused: bool
) -> None:
    """An expired pause ended its turn: a new message is not refused as "paused" (before
    the sweep) nor as "already resumed" (a re-paused turn), and goes on from the snapshot
    that turn started from, as after a failed turn; the expired pause is kept."""
    agent, ask = make_agent(any_store)
    session = _answered_turn(agent, ask, 1)
    good = any_store.get_latest_snapshot(session)
    assert good is not None
    if repaused:
        first = agent.run_text(json.dumps({"n": 2, "again": 0.2}), session_id=session)
        paused = agent.run(
            ToolResume(restart=[ask.resume(first.interrupts[0], {"x": 1})]), session_id=session
        )
    else:
        paused = agent.run_text(json.dumps({"n": 2, "wait": 0.2}), session_id=session)
    assert paused.finish_reason is FinishReason.INTERRUPTED
    time.sleep(0.3)
    if swept:
        _expire(any_store, str(paused.snapshot_id))
    out = agent.run_text(json.dumps({"n": 3}), session_id=session)
    assert out.finish_reason is FinishReason.INTERRUPTED and out.session_id == session
    snap = any_store.get_snapshot(str(out.snapshot_id))
    assert snap is not None and snap.parent_id == good.snapshot_id
    users = [m.text for m in snap.messages if m.role == "user"]
    assert users == [json.dumps({"n": 1}), json.dumps({"n": 3})], users
    kept = any_store.get_snapshot(str(paused.snapshot_id))
    assert kept is not None and kept.is_interrupted is not swept


@pytest.mark.parametrize("swept", [True, False], ids=["marked", "deadline-passed"])
def test_a_message_to_the_expired_pause_itself_is_refused_as_expired(
    any_store: SessionStore, swept: bool
) -> None:
    """Addressed by `snapshot_id=`, a new message to a pause past its deadline is refused
    as expired, before the sweep as after it, not as "paused: answer the pending
    interrupts first", which no answer could follow (each is refused as expired). A
    message branching from an earlier snapshot is not held by the lapsed pause."""
    agent, ask = make_agent(any_store)
    session = _answered_turn(agent, ask, 1)
    good = any_store.get_latest_snapshot(session)
    assert good is not None
    paused = agent.run_text(json.dumps({"n": 2, "wait": 0.2}), session_id=session)
    time.sleep(0.3)
    if swept:
        _expire(any_store, str(paused.snapshot_id))
    before = any_store.list_snapshots(session_id=session)
    with pytest.raises(ResumeValidationError) as info:
        agent.run_text(json.dumps({"n": 3}), snapshot_id=paused.snapshot_id)
    assert info.value.status is Status.FAILED_PRECONDITION
    said = info.value.message
    assert said.startswith(f"snapshot {paused.snapshot_id} "), said
    assert ("is expired and cannot be continued" if swept else "expired at ") in said, said
    assert "answer the pending interrupts" not in said, said
    assert any_store.list_snapshots(session_id=session) == before, "nothing written"
    branch = agent.run_text(json.dumps({"n": 4}), snapshot_id=good.snapshot_id)
    assert branch.finish_reason is FinishReason.INTERRUPTED
    snap = any_store.get_snapshot(str(branch.snapshot_id))
    assert snap is not None and snap.parent_id == good.snapshot_id


def test_a_message_to_an_expired_pause_by_state_is_refused_as_expired() -> None:
    """Without a store the state is the only way on: a pause past its deadline cannot
    be continued from it (its answers are refused as expired too)."""
    agent, _ = make_agent(None)  # type: ignore[arg-type]
    paused = agent.run_text(json.dumps({"n": 1, "wait": 0.2}))
    time.sleep(0.3)
    with pytest.raises(ResumeValidationError) as info:
        agent.run_text(json.dumps({"n": 2}), state=paused.state)
    assert info.value.status is Status.FAILED_PRECONDITION
    assert "expired at " in info.value.message and "cannot be continued" in info.value.message


def test_a_new_message_in_time_is_still_refused_while_paused(any_store: SessionStore) -> None:
    """Before its deadline a pause holds the session (rule 8), with or without one."""
    agent, _ = make_agent(any_store)
    paused = agent.run_text(json.dumps({"n": 1, "wait": 600}))
    with pytest.raises(StatusError) as info:
        agent.run_text(json.dumps({"n": 2}), session_id=paused.session_id)
    assert info.value.status is Status.FAILED_PRECONDITION
    assert "answer the pending interrupts first" in info.value.message


def test_audit_shows_what_an_expired_pause_asked(sql_store: SqlSessionStore) -> None:
    """An expired pause keeps its entry with what it asked, at the pause, then its
    expiry, at the deadline."""
    outbox = Outbox(sql_store)
    agent, _ = make_agent(sql_store)
    soon = agent.run_text(json.dumps({"n": 4, "wait": 0.2}))
    time.sleep(0.3)
    [expired] = expire_overdue(sql_store, outbox)
    entries = session_history(sql_store, DecisionLog(sql_store), soon.session_id)
    assert [e["kind"] for e in entries] == ["interrupted", "expired"], entries
    asked, ended = entries
    assert asked["interrupts"][0]["payload"] == {"n": 4}
    assert expired.expires_at is not None
    assert asked["expires_at"] == ended["at"] == wire_time(expired.expires_at, microseconds=True)
    assert asked["at"] < ended["at"]
    assert ended["snapshot_id"] == asked["snapshot_id"] == soon.snapshot_id


def test_audit_lists_interrupts_and_decisions(sql_store: SqlSessionStore) -> None:
    Outbox(sql_store)
    log = DecisionLog(sql_store)
    agent, ask = make_agent(sql_store)
    out = agent.run_text(json.dumps({"n": 7}))
    sid, snap_id = out.session_id, out.snapshot_id
    log.record(
        decision_id="d-bad",
        body='{"restart": [{"ref": "x"}]}',
        reviewer="mallory",
        session_id=sid,
        event=DecisionRejected(
            decision_id="d-bad",
            snapshot_id=snap_id,
            session_id=sid,
            error=ErrorInfo(status=Status.PERMISSION_DENIED, message="resume_token does not match"),
        ),
    )
    log.record(
        decision_id="d-ok",
        body='{"restart": [{"ref": "r"}]}',
        reviewer="alice",
        session_id=sid,
        event=DecisionAccepted(decision_id="d-ok", snapshot_id=snap_id, session_id=sid),
    )
    agent.run(ToolResume(restart=[ask.resume(out.interrupts[0], {"y": 1})]), session_id=sid)
    entries = session_history(sql_store, log, sid)
    kinds = [e["kind"] for e in entries]
    assert kinds == ["interrupted", "decision", "decision", "completed"]
    assert entries[0]["interrupts"][0]["payload"] == {"n": 7}
    assert (entries[1]["reviewer"], entries[1]["outcome"], entries[1]["status"]) == (
        "mallory",
        "rejected",
        "PERMISSION_DENIED",
    )
    assert (entries[2]["reviewer"], entries[2]["outcome"]) == ("alice", "accepted")
    assert entries[3]["text"] == "answered"

    url = str(sql_store.engine.url)
    result = CliRunner().invoke(main, ["audit", sid, "--store", url])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.output.splitlines()]
    assert [line["kind"] for line in lines] == kinds
    missing = CliRunner().invoke(main, ["audit", "no-such-session", "--store", url])
    assert missing.exit_code == 1
    assert "NOT_FOUND" in missing.output
