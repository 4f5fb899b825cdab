"""`run_turn`, the body of the `interlock.run_turn` task, on a SQLite store: a turn
refused before it ran has had its answer, and a second delivery does not run it."""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select, text

from events.outbox import outbox_table
from events.tokens import hash_token, new_token
from examples.banking import ApprovalReply, ai, transferMoney
from interlock import (
    AgentInput,
    Message,
    Part,
    SqlSessionStore,
    Status,
    StatusError,
    ToolResume,
)
from interlock.stores.sql_journal import SqlTurnJournal, TurnStartKind
from schemas import Decision, DecisionAccepted, FinishReason, RestartEntry, SnapshotStatus
from workers.decisions import evaluate, resume_request, resume_turn_id
from workers.runtime import Runtime
from workers.settings import Settings
from workers.turns import new_turn_request, run_task, run_turn


@pytest.fixture
def rt(tmp_path: Path, redis_url: str) -> Iterator[Runtime]:
    settings = Settings(broker_url=redis_url, store_url=f"sqlite:///{tmp_path}/turns.db")
    runtime = Runtime(settings, ai)
    try:
        yield runtime
    finally:
        runtime.close()


def _message(text: str, session_id: str) -> dict[str, Any]:
    said = AgentInput(message=Message(role="user", content=[Part(text=text)]))
    return new_turn_request("bankingAgent", said, session_id=session_id).model_dump(mode="json")


def _failed_events(rt: Runtime, turn_id: str) -> int:
    with rt.store.engine.connect() as conn:
        count = conn.execute(
            select(func.count())
            .select_from(outbox_table)
            .where(outbox_table.c.routing_key == "turn.failed")
            .where(outbox_table.c.body.contains(turn_id))
        ).scalar_one()
    return int(count)


def _snapshots_of_turn(rt: Runtime, session_id: str, turn_id: str) -> list[str]:
    return [s.snapshot_id for s in rt.store.list_snapshots(session_id) if s.turn_id == turn_id]


def test_a_refused_turn_is_not_run_by_a_later_delivery(rt: Runtime) -> None:
    """A message sent while the session waits on a reviewer is refused (turn.failed).
    The same turn delivered again once the pause is answered (a redelivery, a client
    resending it with its turn_id) is over: it runs nothing and publishes nothing."""
    paused = run_turn(rt, _message("Transfer $5 to savings", "s-refused"))
    assert paused["finish_reason"] == "interrupted", paused

    impatient = _message("Transfer $6 to checking", "s-refused")
    turn_id = impatient["turn_id"]
    refused = run_turn(rt, impatient)
    assert refused["error"]["status"] == "FAILED_PRECONDITION", refused
    assert "answer the pending interrupts first" in refused["error"]["message"]
    assert _failed_events(rt, turn_id) == 1
    assert rt.journal.holder(turn_id) is None, "a refused turn leaves no lease behind"

    agent = rt.agent("bankingAgent")
    waiting = agent.store.get_snapshot(paused["snapshot_id"])  # type: ignore[union-attr]
    assert waiting is not None
    [ask] = [p for p in waiting.messages[-1].content if p.is_interrupt()]
    approve = transferMoney.resume(ask, ApprovalReply(approved=True))
    done = agent.run(AgentInput(resume=ToolResume(restart=[approve])), session_id="s-refused")
    assert done.finish_reason.value == "stop"

    again = run_turn(rt, impatient)
    assert again == {"turn_id": turn_id, "snapshot_id": None, "duplicate": True}
    assert _snapshots_of_turn(rt, "s-refused", turn_id) == [], "the refused turn never ran"
    assert _failed_events(rt, turn_id) == 1, "its answer was not published a second time"
    latest = rt.store.get_latest_snapshot("s-refused")
    assert latest is not None and latest.snapshot_id == done.snapshot_id
    assert latest.status is SnapshotStatus.COMPLETED


def test_the_audit_shows_a_refused_turn(rt: Runtime) -> None:
    """A turn refused before it ran has no snapshot: the audit shows it from the
    journal, in its place between the pause and the answer."""
    from events.decision_log import DecisionLog
    from workers.audit import session_history

    paused = run_turn(rt, _message("Transfer $5 to savings", "s-audit"))
    impatient = _message("Transfer $6 to checking", "s-audit")
    run_turn(rt, impatient)
    entries = session_history(rt.store, DecisionLog(rt.store), "s-audit")
    assert [e["kind"] for e in entries] == ["interrupted", "refused"], entries
    refused = entries[1]
    assert refused["turn_id"] == impatient["turn_id"]
    assert refused["error"]["status"] == "FAILED_PRECONDITION"
    assert "answer the pending interrupts first" in refused["error"]["message"]
    assert entries[0]["snapshot_id"] == paused["snapshot_id"]
    # Every entry's time in one form, UTC as the events write it (a "Z", microseconds
    # always), so that a dashboard sorts them as strings.
    for entry in entries:
        at = datetime.fromisoformat(entry["at"])
        assert at.utcoffset() == timedelta(0), entry
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", entry["at"]), entry
    assert session_history(rt.store, DecisionLog(rt.store), "s-other") == []


def test_a_refusal_ends_the_turn_for_the_journal(rt: Runtime) -> None:
    """An unknown snapshot: refused, and `begin` then answers ENDED with no snapshot."""
    said = AgentInput(message=Message(role="user", content=[Part(text="hi")]))
    request = new_turn_request("bankingAgent", said, snapshot_id="no-such-snapshot")
    refused = run_turn(rt, request.model_dump(mode="json"))
    assert refused["error"]["status"] == "NOT_FOUND", refused
    journal: SqlTurnJournal = rt.journal
    start = journal.begin(request.turn_id, "another-worker", 30.0)
    assert (start.kind, start.snapshot_id, start.status) == (TurnStartKind.ENDED, None, "refused")
    assert journal.holder(request.turn_id) is None, "the refusal left no lease row behind"
    assert _failed_events(rt, request.turn_id) == 1


@pytest.mark.parametrize("session_id", [None, "s-named"])
def test_a_turn_refused_for_an_unknown_snapshot_names_no_last_snapshot(
    rt: Runtime, session_id: str | None
) -> None:
    """turn.failed's last_snapshot_id is the snapshot the session continues from: an
    unknown snapshot the request named is none, whether or not it named a session."""
    said = AgentInput(message=Message(role="user", content=[Part(text="hi")]))
    request = new_turn_request(
        "bankingAgent", said, session_id=session_id, snapshot_id="no-such-snapshot"
    )
    assert run_turn(rt, request.model_dump(mode="json"))["error"]["status"] == "NOT_FOUND"
    [failed] = [b for b in _failed_bodies(rt) if b["turn_id"] == request.turn_id]
    assert failed["last_snapshot_id"] is None, failed
    assert failed["session_id"] == session_id


def _message_task(agent: str, text: str, session: str, turn_id: str) -> dict[str, Any]:
    """The task body of a user message `text` to `agent`, on `session`, as `turn_id`."""
    said = AgentInput(message=Message(role="user", content=[Part(text=text)]))
    request = new_turn_request(agent, said, session_id=session, turn_id=turn_id)
    return request.model_dump(mode="json")


def _failed_bodies(rt: Runtime) -> list[dict[str, Any]]:
    with rt.store.engine.connect() as conn:
        rows = conn.execute(
            select(outbox_table.c.body).where(outbox_table.c.routing_key == "turn.failed")
        ).all()
    return [json.loads(r[0]) for r in rows]


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (
            {"schema_version": 2, "turn_id": "t-v2", "agent": "bankingAgent", "input": {}},
            "invalid run_turn request: schema_version: Input should be 1",
        ),
        (
            {"turn_id": "t-bad", "agent": "bankingAgent", "session_id": "s-bad",
             "input": {"message": {"role": "user", "content": "not a list"}}},
            "invalid run_turn request: input.message.content: Input should be a valid list",
        ),
        (
            {"turn_id": "t-empty", "agent": "bankingAgent", "input": {}},
            "invalid run_turn request: input: Value error, an agent input holds exactly one of "
            "message and resume",
        ),
        (
            {"turn_id": "t-both", "agent": "bankingAgent", "session_id": "s-both",
             "input": {"message": {"role": "user", "content": [{"text": "x"}]},
                       "resume": {"restart": []}}},
            "invalid run_turn request: input: Value error, an agent input holds exactly one",
        ),
    ],
    ids=["unknown-version", "bad-message", "neither-message-nor-resume", "both"],
)  # fmt: skip
def test_a_task_message_written_by_hand_wrong_is_answered(
    rt: Runtime, payload: dict[str, Any], message: str
) -> None:
    """A client that writes the task message itself and gets it wrong hears so: one
    turn.failed (INVALID_ARGUMENT) with the ids it gave, and a second delivery of the
    same message adds nothing."""
    first = run_turn(rt, payload)
    assert first["error"]["status"] == "INVALID_ARGUMENT", first
    assert first["error"]["message"].startswith(message), first
    again = run_turn(rt, payload)
    assert again["turn_id"] == payload["turn_id"]
    [event] = _failed_bodies(rt)
    assert event["turn_id"] == payload["turn_id"]
    assert event["agent"] == "bankingAgent"
    assert event["session_id"] == payload.get("session_id")
    assert event["error"] == first["error"]


def test_a_task_argument_that_is_no_object_is_answered(rt: Runtime) -> None:
    result = run_turn(rt, ["not", "an", "object"])  # type: ignore[arg-type]
    assert result["turn_id"] is None
    assert result["error"]["status"] == "INVALID_ARGUMENT"
    [event] = _failed_bodies(rt)
    assert (event["turn_id"], event["agent"]) == (None, None)
    assert event["error"]["message"].startswith("invalid run_turn request: ")


@pytest.mark.parametrize(
    ("args", "kwargs", "got"),
    [
        ((), {}, "got 0 positional arguments"),
        (("x", "y"), {}, "got 2 positional arguments"),
        (("x",), {"extra": 1}, "got 1 positional argument and keyword arguments ['extra']"),
        ((), {"request": {}, "other": 2}, "keyword arguments ['other', 'request']"),
    ],
    ids=["none", "two", "extra-keyword", "request-and-more"],
)
def test_a_task_with_other_arguments_than_one_request_is_answered(
    rt: Runtime, args: tuple[Any, ...], kwargs: dict[str, Any], got: str
) -> None:
    """Celery would fail such a task with a TypeError and drop it; it is answered
    instead, with one turn.failed (INVALID_ARGUMENT) saying what it was given."""
    result = run_task(rt, args, kwargs)
    assert result["error"]["status"] == "INVALID_ARGUMENT", result
    message = result["error"]["message"]
    assert message.startswith("invalid run_turn request: the task takes one argument"), message
    assert got in message, message
    [event] = _failed_bodies(rt)
    assert event["error"] == result["error"]


def test_a_task_names_its_request_positionally_or_by_keyword(rt: Runtime) -> None:
    forms: dict[str, Callable[[dict[str, Any]], tuple[tuple[Any, ...], dict[str, Any]]]] = {
        "positional": lambda request: ((request,), {}),
        "keyword": lambda request: ((), {"request": request}),
        "fields": lambda request: ((), dict(request)),  # send_task(..., kwargs=request)
    }
    for call, form in forms.items():
        request = _message("Transfer $4 to either-way", str(uuid.uuid4()))
        args, kwargs = form(request)
        result = run_task(rt, args, kwargs)
        assert result["finish_reason"] == "interrupted", (call, result)
        assert result["turn_id"] == request["turn_id"]
    assert _failed_bodies(rt) == []


def test_a_request_given_as_keyword_arguments_is_checked_as_one(rt: Runtime) -> None:
    """The fields as keyword arguments, one missing: the request is invalid (naming the
    field), not the shape of the task."""
    result = run_task(rt, (), {"turn_id": "t-kw-missing", "agent": "bankingAgent"})
    assert result["error"]["status"] == "INVALID_ARGUMENT", result
    assert result["error"]["message"].startswith("invalid run_turn request: "), result
    assert "input" in result["error"]["message"], result
    assert "takes one argument" not in result["error"]["message"], result
    [event] = _failed_bodies(rt)
    assert (event["turn_id"], event["agent"]) == ("t-kw-missing", "bankingAgent")


def test_two_arguments_carry_the_first_ones_ids_into_turn_failed(rt: Runtime) -> None:
    request = _message("Transfer $5 to two-args", "s-two-args")
    result = run_task(rt, (request, "extra"), {})
    assert result["turn_id"] == request["turn_id"]
    [event] = _failed_bodies(rt)
    assert (event["turn_id"], event["session_id"]) == (request["turn_id"], "s-two-args")


def test_a_pause_made_without_the_outbox_still_needs_a_token(
    tmp_path: Path, redis_url: str
) -> None:
    """A Python backend pausing a turn in-process on the store the consumer reads issues
    no token: a decision for that pause is PERMISSION_DENIED whatever it carries; the
    "never paused" exemption from the token check covers only snapshots that cannot be
    resumed at all."""
    url = f"sqlite:///{tmp_path}/shared.db"
    backend = SqlSessionStore(url)
    try:
        agent = ai.lookup_agent("bankingAgent").with_store(backend)
        paused = agent.run_text("Transfer $3 to in-process")
        done_elsewhere = agent.run_text("hello", session_id=str(uuid.uuid4()))
    finally:
        backend.dispose()
    runtime = Runtime(Settings(broker_url=redis_url, store_url=url), ai)
    try:
        snapshot = runtime.store.get_snapshot(paused.snapshot_id or "")
        assert snapshot is not None and snapshot.resume_token_hash is None
        [ask] = paused.interrupts
        assert ask.tool_request is not None
        entry = {
            "name": "transferMoney",
            "ref": ask.tool_request.ref,
            "resumed": {"approved": True},
        }
        for token in ("guess", ""):
            wanted = Decision.model_validate(
                {"decision_id": str(uuid.uuid4()), "snapshot_id": snapshot.snapshot_id,
                 "resume_token": token, "restart": [entry]}
            )  # fmt: skip
            with pytest.raises(StatusError) as info:
                evaluate(runtime, wanted, snapshot)
            assert info.value.status is Status.PERMISSION_DENIED
        finished = runtime.store.get_snapshot(done_elsewhere.snapshot_id or "")
        assert finished is not None
        late = Decision.model_validate(
            {"decision_id": str(uuid.uuid4()), "snapshot_id": finished.snapshot_id,
             "resume_token": "guess", "restart": [entry]}
        )  # fmt: skip
        with pytest.raises(StatusError) as info:
            evaluate(runtime, late, finished)
        assert info.value.status is Status.FAILED_PRECONDITION
        assert "is not interrupted" in info.value.message
    finally:
        runtime.close()


def test_an_expired_pause_still_asks_for_its_token(rt: Runtime) -> None:
    """Only the token's holder learns that a pause expired: to anyone else a decision
    for it is PERMISSION_DENIED, as for any pause."""
    agent = ai.lookup_agent("bankingAgent").with_store(rt.store)
    paused = agent.run_text("Transfer $4 to too-late")
    stored = rt.store.get_snapshot(paused.snapshot_id or "")
    assert stored is not None
    token = new_token()
    expired = stored.model_copy(
        update={
            "status": SnapshotStatus.EXPIRED,
            "finish_reason": FinishReason.EXPIRED,
            "resume_token_hash": hash_token(token),
        }
    )
    [ask] = paused.interrupts
    assert ask.tool_request is not None
    entry = {"name": "transferMoney", "ref": ask.tool_request.ref, "resumed": {"approved": True}}
    for given, status in (("guess", Status.PERMISSION_DENIED), (token, Status.FAILED_PRECONDITION)):
        late = Decision.model_validate(
            {"decision_id": str(uuid.uuid4()), "snapshot_id": expired.snapshot_id,
             "resume_token": given, "restart": [entry]}
        )  # fmt: skip
        with pytest.raises(StatusError) as info:
            evaluate(rt, late, expired)
        assert info.value.status is status, info.value


def test_a_turn_refused_as_unreadable_is_not_run_when_sent_again_correctly(rt: Runtime) -> None:
    """The refusal of a task message that could not be read ends its turn (no lease was
    ever taken): the same turn_id sent again, this time valid, is not run."""
    good = _message("Transfer $4 to later", "s-unreadable")
    bad = {**good, "schema_version": 2}
    refused = run_turn(rt, bad)
    assert refused["error"]["status"] == "INVALID_ARGUMENT"
    again = run_turn(rt, good)
    assert again == {"turn_id": good["turn_id"], "snapshot_id": None, "duplicate": True}
    assert _snapshots_of_turn(rt, "s-unreadable", good["turn_id"]) == []
    assert len(_failed_bodies(rt)) == 1


def test_an_unreadable_copy_of_an_ended_turn_announces_nothing(rt: Runtime) -> None:
    good = _message("Transfer $6 to done", "s-copy")
    ran = run_turn(rt, good)
    assert ran["finish_reason"] == "interrupted"
    copy = run_turn(rt, {**good, "input": {}})
    assert copy.get("duplicate") is True, copy
    assert _failed_bodies(rt) == [], "the turn had ended: no contradictory turn.failed"


def test_ids_no_database_can_keep_are_refused_once_not_retried(rt: Runtime) -> None:
    """A NUL in an id fails every write of it (PostgreSQL): the task is answered with
    turn.failed at once (the ids it cannot keep left out) instead of retrying."""
    payload = {**_message("Transfer $1 to nul", "s-nul"), "turn_id": "t-\x00-1"}
    refused = run_turn(rt, payload)
    assert refused["error"] == {
        "status": "INVALID_ARGUMENT",
        "message": "run_turn request contains a NUL character (\\u0000)",
    }
    [event] = _failed_bodies(rt)
    assert (event["turn_id"], event["session_id"]) == (None, "s-nul")


def _accepted(
    rt: Runtime,
    session_id: str,
    decision_id: str,
    agent: str = "bankingAgent",
    *,
    json_form: bool = False,
) -> tuple[str, dict[str, Any]]:
    """A paused transfer whose approval the resume consumer accepted, as it does: the
    decision recorded as accepted and the pause claimed with its id, in one
    transaction. Returns the snapshot id and the resume task the consumer enqueues (for
    `agent`: the one the snapshot names, or another for a worker that lacks it). The
    decision holds the parts `tool.resume` built, or with `json_form` the JSON entry a
    dashboard sends, without the call's input."""
    sid, resume = _paused(rt, session_id)
    assert resume.resume is not None
    [part] = resume.resume.restart
    assert part.tool_request is not None
    entry = RestartEntry(
        name=part.tool_request.name, ref=part.tool_request.ref, resumed={"approved": True}
    )
    decision = Decision(
        decision_id=decision_id,
        snapshot_id=sid,
        resume_token="tok",
        reviewer="alice",
        restart=[entry if json_form else part],
    )
    accepted = DecisionAccepted(
        decision_id=decision_id,
        agent=agent,
        session_id=session_id,
        snapshot_id=sid,
        turn_id=resume_turn_id(decision_id),
    )
    with rt.decisions.begin() as conn:
        assert rt.store.claim_in(conn, sid, decision_id)
        rt.decisions.record(
            decision_id=decision_id,
            body=decision.model_dump_json(),
            event=accepted,
            reviewer="alice",
            session_id=session_id,
            conn=conn,
        )
    snapshot = rt.store.get_snapshot(sid)
    assert snapshot is not None
    payload = resume_request(decision, snapshot).model_dump(mode="json")
    return sid, {**payload, "agent": agent}


def _paused(rt: Runtime, session_id: str) -> tuple[str, AgentInput]:
    """A paused transfer, unclaimed, and the resume that approves it."""
    paused = run_turn(rt, _message("Transfer $7 to claimed", session_id))
    sid = paused["snapshot_id"]
    snapshot = rt.store.get_snapshot(sid)
    assert snapshot is not None
    [ask] = [p for p in snapshot.messages[-1].content if p.is_interrupt()]
    resume = AgentInput(
        resume=ToolResume(restart=[transferMoney.resume(ask, ApprovalReply(approved=True))])
    )
    return sid, resume


def _resume_task(
    turn_id: str, resume: AgentInput, sid: str, agent: str = "bankingAgent", **ids: str
) -> dict[str, Any]:
    """A resume's run_turn argument as a client would write it, past the consumer."""
    return {
        "turn_id": turn_id,
        "agent": agent,
        "input": resume.to_json(),
        "snapshot_id": sid,
        **ids,
    }


def _claim_of(rt: Runtime, sid: str) -> str | None:
    snapshot = rt.store.get_snapshot(sid)
    assert snapshot is not None
    return snapshot.resumed_by


def test_a_claimed_resume_the_worker_refuses_gives_the_claim_back(rt: Runtime) -> None:
    """The consumer claimed the pause; the worker cannot run the resume (its registry
    has no such agent, say, in a rolling deploy): the claim comes back, and the pause
    can be answered again."""
    sid, payload = _accepted(rt, "s-refused-resume", "d-1", agent="noSuchAgent")
    refused = run_turn(rt, payload)
    assert refused["error"]["status"] == "NOT_FOUND", refused
    assert _claim_of(rt, sid) is None
    assert rt.store.claim(sid, "d-2"), "a second decision can take it"


def test_a_redelivered_unanswered_resume_gives_a_kept_claim_back(rt: Runtime) -> None:
    """A resume turn ended without an answer (refused), but its worker died before
    giving the claim back: the next delivery does."""
    sid, payload = _accepted(rt, "s-kept-claim", "d-3")
    journal: SqlTurnJournal = rt.journal
    with rt.store.writer().begin() as conn:
        journal.refuse_in(conn, "s-kept-claim", payload["turn_id"], {"status": "UNAVAILABLE"})
    again = run_turn(rt, payload)
    assert again.get("duplicate") is True
    assert _claim_of(rt, sid) is None


@pytest.mark.parametrize(
    ("ids", "said"),
    [
        ({}, "is not claimed by this resume (it names no claim)"),
        (
            {"claimed_by": "forged", "decision_id": "forged"},
            "is not claimed by 'forged': no decision of that id was accepted",
        ),
    ],
    ids=["no-claim", "forged-claim"],
)
def test_a_resume_task_sent_past_the_resume_consumer_is_refused(
    rt: Runtime, ids: dict[str, str], said: str
) -> None:
    """Only the resume consumer, which checks a decision's resume_token, claims a pause.
    A resume task sent straight to interlock.turns (no claim, or a claim id made up) is
    refused with turn.failed PERMISSION_DENIED: knowing a snapshot id is not enough to
    approve a transfer. Nothing runs, and the pause can still be answered."""
    session = f"s-past-consumer-{len(ids)}"
    sid, resume = _paused(rt, session)
    refused = run_turn(rt, _resume_task(f"t-past-{len(ids)}", resume, sid, **ids))
    assert refused["error"]["status"] == "PERMISSION_DENIED", refused
    message = refused["error"]["message"]
    assert f"snapshot {sid} {said}" in message, message
    assert "sent to interlock.decisions with its resume_token" in message, message
    [event] = [e for e in _failed_bodies(rt) if e["session_id"] == session]
    assert event["error"] == refused["error"]
    assert event["last_snapshot_id"] == sid
    assert _claim_of(rt, sid) is None, "the pause is still to be answered"
    latest = rt.store.get_latest_snapshot(session)
    assert latest is not None and latest.snapshot_id == sid, "no turn ran"


@pytest.mark.parametrize(
    "ids",
    [{}, {"claimed_by": "forged", "decision_id": "forged"}],
    ids=["no-claim", "forged-claim"],
)
def test_a_resume_task_for_an_unknown_snapshot_is_not_found(
    rt: Runtime, ids: dict[str, str]
) -> None:
    """A resume task sent straight to interlock.turns that names a snapshot no store
    holds is NOT_FOUND before any question of permission, in the resume consumer's
    order (the snapshot exists, then the token): turn.failed says which snapshot, no
    session or snapshot is made, and nothing is left claimed."""
    sid, resume = _paused(rt, f"s-unknown-target-{len(ids)}")
    before = len(rt.store.list_snapshots(limit=1000))
    unknown = "no-such-snapshot"
    refused = run_turn(rt, _resume_task(f"t-unknown-{len(ids)}", resume, unknown, **ids))
    assert refused["error"]["status"] == "NOT_FOUND", refused
    assert refused["error"]["message"] == f"snapshot {unknown} not found", refused
    [event] = [e for e in _failed_bodies(rt) if e["turn_id"] == f"t-unknown-{len(ids)}"]
    assert event["error"] == refused["error"]
    assert event["last_snapshot_id"] is None, event
    assert len(rt.store.list_snapshots(limit=1000)) == before, "no snapshot was written"
    assert _claim_of(rt, sid) is None, "the real pause is untouched"


@pytest.mark.parametrize(
    ("turn_id", "target", "status"),
    [
        ("session:forged", None, "PERMISSION_DENIED"),
        ("resume:forged", None, "PERMISSION_DENIED"),
        ("session:forged-2", "no-such-snapshot", "NOT_FOUND"),
    ],
)
def test_a_refused_task_under_a_reserved_turn_id_is_named_in_its_refusal(
    rt: Runtime, turn_id: str, target: str | None, status: str
) -> None:
    """A task under a turn id Interlock keeps for its own is answered with turn.failed
    without the turn's ids (that turn, if it is a real one, has not had its answer), so
    the message names the turn id the task gave: its sender can still tell which task
    the refusal answers."""
    sid, resume = _paused(rt, f"s-reserved-{turn_id}")
    refused = run_turn(rt, _resume_task(turn_id, resume, target or sid))
    assert refused["error"]["status"] == status, refused
    [event] = [e for e in _failed_bodies(rt) if repr(turn_id) in e["error"]["message"]]
    assert event["error"]["status"] == status, event
    assert (event["turn_id"], event["session_id"], event["last_snapshot_id"]) == (None,) * 3
    assert event["error"]["message"].endswith(f"(the task's turn_id: {turn_id!r})"), event
    assert _claim_of(rt, sid) is None, "the pause is still to be answered"


def _completed_children(rt: Runtime, session_id: str, sid: str) -> list[str]:
    return [
        s.snapshot_id
        for s in rt.store.list_snapshots(session_id)
        if s.parent_id == sid and s.status == SnapshotStatus.COMPLETED
    ]


def test_a_resume_task_copying_an_accepted_decisions_claim_is_refused(rt: Runtime) -> None:
    """decision.accepted names the decision id the pause is claimed with, so anyone who
    reads the events knows it. A task that names that claim but is not the decision's
    own resume (another answer, another turn id, another snapshot or agent) is refused
    with PERMISSION_DENIED: it runs nothing, the claim stays (the pause is not opened
    again), and the turn it names is not ended, so the real resume still runs, once."""
    session = "s-copied-claim"
    sid, payload = _accepted(rt, session, "d-copied")
    assert payload["turn_id"] == resume_turn_id("d-copied")
    snapshot = rt.store.get_snapshot(sid)
    assert snapshot is not None
    [ask] = [p for p in snapshot.messages[-1].content if p.is_interrupt()]
    declined = AgentInput(
        resume=ToolResume(respond=[transferMoney.respond(ask, {"success": False})])
    )
    other_answer = {**payload, "input": declined.to_json()}
    forgeries = {
        "another answer": other_answer,
        "another answer, its own turn id": {**other_answer, "turn_id": "t-forged"},
        "its own turn id": {**payload, "turn_id": "t-forged-2"},
        "another agent": {**payload, "agent": "guardedBankingAgent"},
        "another decision_id": {**payload, "decision_id": "d-other"},
        "a message": {**payload, "input": _message("Transfer $9 to x", session)["input"]},
    }
    for what, forged in forgeries.items():
        refused = run_turn(rt, forged)
        assert refused["error"]["status"] == "PERMISSION_DENIED", (what, refused)
        assert refused["error"]["message"].startswith(
            f"snapshot {sid} is claimed by decision 'd-copied', but this task is not the "
            "resume the resume consumer enqueued for it"
        ), (what, refused)
        assert _claim_of(rt, sid) == "d-copied", what
        assert _completed_children(rt, session, sid) == [], what
    failed = _failed_bodies(rt)
    assert len(failed) == len(forgeries), "each is answered with turn.failed"
    # Whoever waits on the real resume's turn (decide --wait) reads no answer yet.
    assert payload["turn_id"] not in {f["turn_id"] for f in failed}, failed
    copied = [f for f in failed if f["turn_id"] is None]
    assert len(copied) == 4, "the four that copy its turn id are announced without it"
    assert {f["session_id"] for f in copied} == {None}, copied
    assert all(repr("d-copied") in f["error"]["message"] for f in copied), copied
    done = run_turn(rt, payload)
    assert done.get("finish_reason") == "stop", done
    [child] = _completed_children(rt, session, sid)
    final = rt.store.get_snapshot(child)
    assert final is not None and "transferred $7.00" in (final.messages[-1].text or "")
    # After the answer: a copy of the claim with any answer still runs nothing, and the
    # pause stays answered (its claim is not given back).
    for forged in forgeries.values():
        assert run_turn(rt, forged)["error"]["status"] == "PERMISSION_DENIED"
    assert run_turn(rt, payload).get("duplicate") is True
    assert _claim_of(rt, sid) == "d-copied"
    assert _completed_children(rt, session, sid) == [child]


def test_a_restart_input_the_decision_left_out_cannot_be_changed_in_the_task(
    rt: Runtime,
) -> None:
    """A dashboard's restart entry may leave out the call's input: the consumer copies
    the stored one into the task. A task with another input there is not the
    consumer's: refused (PERMISSION_DENIED) before the resume's own checks, so it
    neither ends the real resume's turn nor gives back its claim."""
    session = "s-restart-input"
    sid, payload = _accepted(rt, session, "d-input", json_form=True)
    [part] = payload["input"]["resume"]["restart"]
    assert part["toolRequest"]["input"] == {"amount": 7, "toAccount": "claimed"}, part
    changed = {**part, "toolRequest": {**part["toolRequest"], "input": {"amount": 9e6}}}
    forged = {**payload, "input": {"resume": {"restart": [changed]}}}
    refused = run_turn(rt, forged)
    assert refused["error"]["status"] == "PERMISSION_DENIED", refused
    assert _claim_of(rt, sid) == "d-input"
    assert _completed_children(rt, session, sid) == []
    assert run_turn(rt, payload).get("finish_reason") == "stop"
    assert len(_completed_children(rt, session, sid)) == 1


def test_an_unreadable_copy_of_an_answered_resume_keeps_its_claim(rt: Runtime) -> None:
    """The resume ran and answered the pause under the decision's claim; a garbled copy
    of its task is refused without a word, and the claim (the pause's answer) stays."""
    sid, payload = _accepted(rt, "s-answered", "d-9")
    assert run_turn(rt, payload).get("finish_reason") == "stop"
    copy = run_turn(rt, {**payload, "schema_version": 2})
    assert copy.get("duplicate") is True, copy
    assert _claim_of(rt, sid) == "d-9"
    assert _failed_bodies(rt) == []


def test_an_unreadable_task_naming_a_claim_does_not_give_it_back(rt: Runtime) -> None:
    """A task no worker can read, naming a pause and the claim decision.accepted made
    public: it is refused (INVALID_ARGUMENT), and the claim stays: which task is the
    consumer's cannot be told from an unreadable one."""
    sid, payload = _accepted(rt, "s-unreadable-claim", "d-10")
    garbled = {**payload, "turn_id": "t-garbled", "schema_version": 2}
    refused = run_turn(rt, garbled)
    assert refused["error"]["status"] == "INVALID_ARGUMENT", refused
    assert _claim_of(rt, sid) == "d-10"
    assert run_turn(rt, payload).get("finish_reason") == "stop"


def test_a_plain_task_gives_back_no_claim_whatever_its_turn_id(rt: Runtime) -> None:
    """A refused task that names no claim releases none, whatever its turn id says: a
    decision whose id looks like a turn's own claim (`turn:T`) keeps the pause it
    claimed when a task with turn id T, garbled or refused, names that pause."""
    sid, payload = _accepted(rt, "s-turn-claim", "turn:t-plain")
    garbled = {**_message("hi", "s-turn-claim"), "turn_id": "t-plain", "snapshot_id": sid}
    refused = run_turn(rt, {**garbled, "schema_version": 2})
    assert refused["error"]["status"] == "INVALID_ARGUMENT", refused
    assert _claim_of(rt, sid) == "turn:t-plain"
    paused = run_turn(rt, {**garbled, "turn_id": "t-plain-2"})  # a message to the pause
    assert paused["error"]["status"] == "FAILED_PRECONDITION", paused
    assert _claim_of(rt, sid) == "turn:t-plain"
    assert run_turn(rt, payload).get("finish_reason") == "stop"


def test_a_bug_before_the_turn_is_answered_and_frees_the_pause(
    tmp_path: Path, redis_url: str
) -> None:
    """A plugin that raises an ordinary exception (a bug; retrying cannot help) while a
    claimed resume is checked: the turn is answered with turn.failed (INTERNAL) and the
    decision's claim comes back, instead of a task failure that leaves both hanging."""
    from interlock import Interlock, Middleware, interrupt, restart, scripted

    class Buggy(Middleware):
        def strip_resumed(self, resumed: dict[str, Any]) -> dict[str, Any]:
            raise TypeError("strip_resumed is broken")

    registry = Interlock(secret="t")

    @registry.interruptible_tool(name="ask", description="asks")
    def ask(inp: dict[str, Any], res: dict[str, Any] | None) -> dict[str, Any]:
        if res is None:
            interrupt({"q": 1})
        return {"ok": True}

    scripted.define(registry, "m", [scripted.reply(scripted.tool_call("ask", {}))])
    registry.define_agent("buggy", model="scripted/m", tools=[ask], middleware=[Buggy()])
    settings = Settings(broker_url=redis_url, store_url=f"sqlite:///{tmp_path}/b.db")
    runtime = Runtime(settings, registry)
    try:
        said = AgentInput(message=Message(role="user", content=[Part(text="go")]))
        paused = run_turn(
            runtime, new_turn_request("buggy", said, session_id="s-bug").model_dump(mode="json")
        )
        sid = paused["snapshot_id"]
        snapshot = runtime.store.get_snapshot(sid)
        assert snapshot is not None
        [question] = [p for p in snapshot.messages[-1].content if p.is_interrupt()]
        decision = Decision(
            decision_id="d-bug",
            snapshot_id=sid,
            resume_token="tok",
            restart=[restart(question, {"x": 1})],
        )
        accepted = DecisionAccepted(decision_id="d-bug", agent="buggy", snapshot_id=sid)
        with runtime.decisions.begin() as conn:
            assert runtime.store.claim_in(conn, sid, "d-bug")
            runtime.decisions.record(
                decision_id="d-bug",
                body=decision.model_dump_json(),
                event=accepted,
                reviewer=None,
                session_id="s-bug",
                conn=conn,
            )
        task = resume_request(decision, snapshot)
        answered = run_turn(runtime, task.model_dump(mode="json"))
        assert answered["error"] == {
            "status": "INTERNAL",
            "message": "TypeError: strip_resumed is broken",
        }
        assert _claim_of(runtime, sid) is None
        [event] = _failed_bodies(runtime)
        assert event["turn_id"] == task.turn_id and event["error"]["status"] == "INTERNAL"
    finally:
        runtime.close()


def test_store_and_broker_errors_are_retried_but_those_the_turn_causes_are_answers() -> None:
    """What `interlock.run_turn` leaves to a retry of its task (never dropping the turn)
    and what is the turn's answer (`turn.failed`)."""
    from kombu.exceptions import OperationalError as BrokerDown
    from sqlalchemy import exc as db

    from interlock.agent import _store_unavailable
    from workers.turns import retried

    def wrapped(kind: type[db.DBAPIError]) -> db.DBAPIError:
        return kind("SELECT 1", {}, Exception("from the driver"))

    for store_trouble in (db.OperationalError, db.DatabaseError, db.ProgrammingError):
        assert retried(wrapped(store_trouble)), store_trouble
        # The agent agrees: it keeps no failed snapshot for these, the retry goes on.
        assert _store_unavailable(wrapped(store_trouble)), store_trouble
    assert not _store_unavailable(wrapped(db.IntegrityError))
    assert retried(db.TimeoutError("QueuePool limit reached"))
    assert retried(BrokerDown("connection refused"))
    for caused_by_the_turn in (db.DataError, db.IntegrityError):
        assert not retried(wrapped(caused_by_the_turn)), caused_by_the_turn
    assert not retried(ValueError("a bug"))


def test_an_outage_is_one_warning_line_and_a_bug_an_error_with_its_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """What a worker logs when publishing events or renewing leases fails: a store that
    went away is a WARNING line naming the error (it is retried); anything else is a
    bug, logged at ERROR with its traceback."""
    from sqlalchemy.exc import OperationalError

    from workers.turns import log, log_failure

    lost = OperationalError("SELECT 1", {}, Exception("server closed the connection"))
    with caplog.at_level(logging.WARNING, logger="interlock.worker"):
        try:
            raise lost
        except OperationalError as exc:
            log_failure(log, exc, "renewing turn leases failed")
        try:
            raise KeyError("holder")
        except KeyError as exc:
            log_failure(log, exc, "renewing turn leases failed")
    said = [r for r in caplog.records if r.name == "interlock.worker"]
    assert [(r.levelno, r.exc_info is not None) for r in said] == [
        (logging.WARNING, False),
        (logging.ERROR, True),
    ]
    assert said[0].getMessage() == (
        "renewing turn leases failed (OperationalError: server closed the connection)"
    )
    assert said[1].getMessage() == "renewing turn leases failed"


def test_turns_of_one_session_run_one_at_a_time(tmp_path: Path, redis_url: str) -> None:
    """Two messages to the same session delivered together (a batch, two workers): the
    second waits (SessionBusy: retried) while the first runs, then goes on from the
    first's snapshot. Run side by side, both would go on from the same snapshot and
    fork the session, one message missing from the other's history."""
    import threading

    from interlock import Interlock, ModelRequest
    from workers.turns import SessionBusy

    registry = Interlock(secret="test")
    entered, go_on = threading.Event(), threading.Event()

    def echo(request: ModelRequest) -> Message:
        said = request.messages[-1].text
        if said == "slow":
            entered.set()
            go_on.wait(30)
        return Message(role="model", content=[Part(text=f"echo {said}")])

    registry.define_model("test/echo", echo)
    registry.define_agent("echo", model="test/echo")
    settings = Settings(broker_url=redis_url, store_url=f"sqlite:///{tmp_path}/s.db")
    runtime = Runtime(settings, registry)

    def message(text: str) -> dict[str, Any]:
        said = AgentInput(message=Message(role="user", content=[Part(text=text)]))
        return new_turn_request("echo", said, session_id="s-one").model_dump(mode="json")

    try:
        first: list[dict[str, Any]] = []
        running = threading.Thread(target=lambda: first.append(run_turn(runtime, message("slow"))))
        running.start()
        assert entered.wait(30)
        second = message("fast")
        with pytest.raises(SessionBusy, match="session s-one is running another turn"):
            run_turn(runtime, second)
        go_on.set()
        running.join(30)
        [ended] = first
        again = run_turn(runtime, second)  # the retry, once the first has ended
        assert again["finish_reason"] == "stop", again
        latest = runtime.store.get_snapshot(again["snapshot_id"])
        assert latest is not None and latest.parent_id == ended["snapshot_id"]
        assert [m.text for m in latest.messages] == ["slow", "echo slow", "fast", "echo fast"]
        with runtime.store.engine.connect() as conn:  # no lease is left behind
            leases = conn.execute(text("SELECT turn_id FROM interlock_turn_lease")).all()
        assert leases == []
    finally:
        go_on.set()
        runtime.close()


def test_no_other_task_can_take_an_accepted_resumes_turn_id(rt: Runtime) -> None:
    """decision.accepted carries the turn id its resume runs as. Tasks sent with that id
    before the resume runs (garbled, a new message, an unknown agent, an exact copy
    with another session_id) are refused without ending that turn or giving back the
    claim: the reviewer's resume then runs, once, and the pause stays answered."""
    session = "s-squatted"
    sid, payload = _accepted(rt, session, "d-squat")
    turn = payload["turn_id"]
    assert turn == "resume:d-squat"
    squatters = {
        "garbled": {"schema_version": 2, "turn_id": turn, "agent": "x", "input": {}},
        "bad input": {"turn_id": turn, "agent": "bankingAgent", "input": {"junk": 1}},
        "a message": {**_message("Transfer $3 to x", "s-other"), "turn_id": turn},
        "a message to the pause": {**_message("hi", session), "turn_id": turn},
        "unknown agent": {**_message("hi", "s-other-2"), "turn_id": turn, "agent": "nope"},
        "another session_id": {**payload, "session_id": "other"},
    }
    for what, task in squatters.items():
        refused = run_turn(rt, task)
        assert "error" in refused, (what, refused)
        assert _claim_of(rt, sid) == "d-squat", what
    assert run_task(rt, ({"turn_id": turn}, "extra"), {}).get("error") is not None
    assert _claim_of(rt, sid) == "d-squat"
    done = run_turn(rt, payload)
    assert done.get("finish_reason") == "stop", done
    assert len(_completed_children(rt, session, sid)) == 1
    assert run_turn(rt, {**_message("hi", "s-late"), "turn_id": turn}).get("error")
    assert _claim_of(rt, sid) == "d-squat", "the answered pause stays answered"


@pytest.mark.parametrize("turn_id", ["resume:made-up", "session:s-lease"])
def test_a_turn_id_interlock_keeps_for_its_own_is_refused(rt: Runtime, turn_id: str) -> None:
    """Resume turn ids and session lease keys share the turn leases' table with turn
    ids: a task that takes one (to end a resume before it runs, or free a running
    turn's session) is refused, INVALID_ARGUMENT, and ends nothing."""
    refused = run_turn(rt, {**_message("Transfer $2 to x", "s-lease"), "turn_id": turn_id})
    assert refused["error"]["status"] == "INVALID_ARGUMENT", refused
    assert refused["error"]["message"].startswith(f"turn_id {turn_id!r} is reserved: "), refused
    [event] = _failed_bodies(rt)
    assert event["error"] == refused["error"], event
    assert event["turn_id"] is None, "no answer for a turn Interlock has still to run"
    with rt.store.writer().begin() as conn:
        assert not rt.journal.ended_in(conn, turn_id)
    assert (
        run_turn(rt, _message("Transfer $2 to x", "s-lease")).get("finish_reason") == "interrupted"
    )


def test_a_garbled_copy_of_a_running_turn_neither_ends_nor_answers_it(rt: Runtime) -> None:
    """A turn id is public once its task is sent. A garbled task carrying the id of a
    turn another worker is running (it holds the turn's lease) is not that turn's
    answer: it ends nothing and announces nothing, and the running turn ends as it
    would have."""
    message = _message("Transfer $4 to savings", "s-running")
    turn = message["turn_id"]
    start = rt.journal.begin(turn, "elsewhere:1", 30.0)
    assert start.kind is TurnStartKind.NEW, start
    garbled = run_turn(rt, {"schema_version": 2, "turn_id": turn, "agent": "x", "input": {}})
    assert garbled.get("duplicate") is True, garbled
    assert _failed_bodies(rt) == []
    with rt.store.writer().begin() as conn:
        assert not rt.journal.ended_in(conn, turn)
    assert rt.journal.holder(turn) is not None, "the running turn keeps its lease"
    rt.journal.end(turn, "elsewhere:1", snapshot_saved=False)
    done = run_turn(rt, message)
    assert done.get("finish_reason") == "interrupted", done


def test_a_forged_resume_under_a_running_turns_id_announces_nothing(rt: Runtime) -> None:
    """A resume task past the consumer that carries the id of a turn another worker is
    running is refused (PERMISSION_DENIED) without a turn.failed for that turn: whoever
    waits on it reads the answer the running turn gives. One under a new turn id is
    announced, and that turn is ended: a copy of it is not announced again."""
    sid, resume = _paused(rt, "s-forged-running")
    running = _message("Transfer $3 to savings", "s-other-running")["turn_id"]
    assert rt.journal.begin(running, "elsewhere:1", 30.0).kind is TurnStartKind.NEW
    refused = run_turn(rt, _resume_task(running, resume, sid, claimed_by="forged"))
    assert refused["error"]["status"] == "PERMISSION_DENIED", refused
    assert refused.get("duplicate") is True, refused
    assert _failed_bodies(rt) == []
    assert rt.journal.holder(running) is not None, "the running turn keeps its lease"
    task = _resume_task("t-forged-new", resume, sid, claimed_by="forged")
    assert run_turn(rt, task)["error"]["status"] == "PERMISSION_DENIED"
    [event] = _failed_bodies(rt)
    assert event["turn_id"] == "t-forged-new", event
    assert run_turn(rt, task).get("duplicate") is True
    assert len(_failed_bodies(rt)) == 1
    assert _claim_of(rt, sid) is None, "the pause is still to be answered"


def test_a_message_to_a_sessions_snapshot_waits_for_its_running_turn(rt: Runtime) -> None:
    """A new message addressed by `snapshot_id` (any snapshot id an event carried) goes
    on in that snapshot's session: it takes the session's lease like one sent with
    `session_id` (SessionBusy while another turn of the session runs), and is refused
    while the session is paused, so that no second pause opens beside the first."""
    from interlock.stores.sql_journal import session_lease
    from workers.turns import SessionBusy

    _, payload = _accepted(rt, "s-by-snapshot", "d-by-snapshot")
    done = run_turn(rt, payload)
    assert done.get("finish_reason") == "stop", done
    branch = {**_message("Transfer $8 to y", "s-by-snapshot"), "session_id": None}
    branch["snapshot_id"] = done["snapshot_id"]
    assert rt.journal.acquire(session_lease("s-by-snapshot"), "elsewhere:1", ttl=30)
    with pytest.raises(SessionBusy, match="session s-by-snapshot is running another turn"):
        run_turn(rt, branch)
    rt.journal.expire(session_lease("s-by-snapshot"), "elsewhere:1")
    paused = run_turn(rt, _message("Transfer $9 to z", "s-by-snapshot"))
    assert paused.get("finish_reason") == "interrupted", paused
    refused = run_turn(rt, branch)
    assert refused["error"]["status"] == "FAILED_PRECONDITION", refused
    assert "is paused: answer the pending interrupts first" in refused["error"]["message"]
    pauses = [
        s
        for s in rt.store.list_snapshots("s-by-snapshot", finish_reason=FinishReason.INTERRUPTED)
        if s.resumed_by is None
    ]
    assert [s.snapshot_id for s in pauses] == [paused["snapshot_id"]], "one pause open"


def test_a_message_to_a_snapshot_reads_one_history(rt: Runtime) -> None:
    """A new message addressed by `snapshot_id` reads one history, that of the snapshot
    it goes on from: the session whose lease it takes, and whether a pause stands beside
    it, are read without one (snapshot heads)."""
    from sqlalchemy import event

    _, payload = _accepted(rt, "s-one-read", "d-one-read")
    done = run_turn(rt, payload)
    assert done.get("finish_reason") == "stop", done
    branch = {**_message("Transfer $8 to y", "s-one-read"), "session_id": None}
    branch["snapshot_id"] = done["snapshot_id"]
    histories: list[str] = []

    def seen(_c: Any, _cur: Any, statement: str, *_args: Any) -> None:
        if "interlock_chain" in statement:  # the store's walk up a history's chain
            histories.append(statement)

    event.listen(rt.store.engine, "before_cursor_execute", seen)
    try:
        paused = run_turn(rt, branch)
    finally:
        event.remove(rt.store.engine, "before_cursor_execute", seen)
    assert paused.get("finish_reason") == "interrupted", paused
    assert paused.get("session_id") == "s-one-read", paused
    assert len(histories) == 1, f"{len(histories)} histories read"


class _Crash(BaseException):
    """Stands for the worker process dying mid-turn."""


def test_a_task_reusing_a_turn_id_neither_replays_nor_ends_that_turn(
    tmp_path: Path, redis_url: str
) -> None:
    """A turn id names the request that first started it. A task sent with the id of a
    turn whose run died mid-turn (its lease run out, its journal kept), but another
    session and message, is not that turn: refused with ALREADY_EXISTS and a
    turn.failed without the turn's ids. It neither replays that turn's journaled model
    answer and tool outcomes into its own session nor ends the turn, whose redelivery
    then goes on from its journal (the completed tool call not run again)."""
    from interlock import Interlock, ModelRequest, scripted

    registry = Interlock(secret="t")
    crash = {"on": True}
    ran: list[str] = []

    @registry.tool(name="charge", description="a side effect")
    def charge(inp: dict[str, Any]) -> dict[str, Any]:
        ran.append(inp["note"])
        return {"charged": f"card-of({inp['note']})"}

    @registry.tool(name="flaky", description="the worker dies here")
    def flaky(inp: dict[str, Any]) -> dict[str, Any]:
        if crash["on"]:
            raise _Crash
        return {"ok": True}

    def model(request: ModelRequest) -> Message:
        last = request.messages[-1]
        if last.role == "user":
            said = last.text
            return scripted.reply(f"noted: {said}", scripted.tool_call("charge", {"note": said}))
        if sum(m.role == "tool" for m in request.messages) == 1:
            return scripted.reply(scripted.tool_call("flaky", {"note": "x"}))
        return scripted.text("done")

    scripted.define(registry, "hijack", model)
    registry.define_agent("a", model="scripted/hijack", tools=[charge, flaky])
    settings = Settings(broker_url=redis_url, store_url=f"sqlite:///{tmp_path}/j.db")
    runtime = Runtime(settings, registry)

    def message(text: str, session: str) -> dict[str, Any]:
        return _message_task("a", text, session, "t-victim")

    try:
        victim = message("my PIN is 4321", "s-victim")
        with pytest.raises(_Crash):
            run_turn(runtime, victim)
        crash["on"] = False
        assert ran == ["my PIN is 4321"]
        holder = runtime.journal.holder("t-victim")
        assert holder is not None, "the run that died left its lease, run out, and journal"

        forged = run_turn(runtime, message("hello", "s-attacker"))
        assert forged["error"]["status"] == "ALREADY_EXISTS", forged
        assert forged["error"]["message"].startswith("turn_id 't-victim' names another turn")
        [event] = _failed_bodies(runtime)
        assert (event["turn_id"], event["session_id"]) == (None, None), event
        assert runtime.store.get_latest_snapshot("s-attacker") is None, "nothing ran"
        assert ran == ["my PIN is 4321"]

        done = run_turn(runtime, victim)  # the victim's redelivery
        assert done.get("finish_reason") == "stop", done
        assert ran == ["my PIN is 4321"], "the journaled call did not run again"
        final = runtime.store.get_snapshot(done["snapshot_id"])
        assert final is not None and final.session_id == "s-victim"
        assert final.messages[0].text == "my PIN is 4321"
        assert len(_failed_bodies(runtime)) == 1
    finally:
        runtime.close()


def test_a_task_reusing_the_id_of_a_running_turn_is_refused_at_once(
    tmp_path: Path, redis_url: str
) -> None:
    """While a turn runs, a task with its turn id and another request (another session
    and message) is refused with ALREADY_EXISTS at once: it does not wait for the
    running turn and then pass for a duplicate of it, unanswered. The running turn
    goes on and ends as its own."""
    import threading

    from interlock import Interlock, ModelRequest, scripted

    registry = Interlock(secret="t")
    inside, go_on = threading.Event(), threading.Event()

    @registry.tool(name="slow", description="holds the turn")
    def slow(inp: dict[str, Any]) -> dict[str, Any]:
        inside.set()
        assert go_on.wait(30)
        return {"ok": True}

    def model(request: ModelRequest) -> Message:
        if request.messages[-1].role == "user":
            return scripted.reply(scripted.tool_call("slow", {}))
        return scripted.text("done")

    scripted.define(registry, "slowly", model)
    registry.define_agent("a", model="scripted/slowly", tools=[slow])
    settings = Settings(broker_url=redis_url, store_url=f"sqlite:///{tmp_path}/busy.db")
    runtime = Runtime(settings, registry)

    def message(text: str, session: str) -> dict[str, Any]:
        return _message_task("a", text, session, "t-running")

    results: list[dict[str, Any]] = []
    first = threading.Thread(target=lambda: results.append(run_turn(runtime, message("a", "s-a"))))
    try:
        first.start()
        assert inside.wait(30), "the first turn's tool runs"
        other = run_turn(runtime, message("b", "s-b"))
        assert other["error"]["status"] == "ALREADY_EXISTS", other
        assert other["error"]["message"].startswith("turn_id 't-running' names another turn")
        [event] = _failed_bodies(runtime)
        assert (event["turn_id"], event["session_id"]) == (None, None), event
        assert runtime.store.get_latest_snapshot("s-b") is None, "nothing ran"
    finally:
        go_on.set()
        first.join(30)
        runtime.close()
    [done] = results
    assert done.get("finish_reason") == "stop", done
    final = runtime.store.get_snapshot(done["snapshot_id"])
    assert final is not None and final.session_id == "s-a"


def test_a_garbled_copy_does_not_end_a_turn_waiting_for_its_session(rt: Runtime) -> None:
    """A turn that met its session busy gave its lease back while it waits for its
    retry; its request started it, though. A garbled task carrying its turn id is not
    its answer: it ends nothing and announces nothing, and the retry runs the turn."""
    from interlock.stores.sql_journal import session_lease
    from workers.turns import SessionBusy

    victim = _message("Transfer $4 to savings", "s-wait")
    turn = victim["turn_id"]
    assert rt.journal.acquire(session_lease("s-wait"), "elsewhere:1", ttl=30)
    with pytest.raises(SessionBusy):
        run_turn(rt, victim)
    assert rt.journal.holder(turn) is None, "the waiting turn holds no lease"
    garbled = {"schema_version": 2, "turn_id": turn, "session_id": "s-wait", "input": {}}
    assert run_turn(rt, garbled).get("duplicate") is True
    assert _failed_bodies(rt) == []
    rt.journal.expire(session_lease("s-wait"), "elsewhere:1")
    retry = run_turn(rt, victim)
    assert retry.get("finish_reason") == "interrupted", retry


def test_a_refused_resume_delivered_again_is_not_run_again(rt: Runtime) -> None:
    """The consumer's resume task, refused by the worker (its agent unknown here), ends
    its turn: delivered again (a worker lost before its ack), it is a duplicate,
    announced once."""
    sid, payload = _accepted(rt, "s-rerun", "d-rerun", agent="noSuchAgent")
    first = run_turn(rt, payload)
    assert first["error"]["status"] == "NOT_FOUND", first
    assert _claim_of(rt, sid) is None, "the pause can be answered again"
    again = run_turn(rt, payload)
    assert again.get("duplicate") is True, again
    mine = [e for e in _failed_bodies(rt) if e["turn_id"] == payload["turn_id"]]
    assert len(mine) == 1, mine


@pytest.mark.parametrize("db", ["sqlite", "postgresql"])
def test_a_refusal_racing_a_turns_first_start_leaves_it_one_ending(
    db: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    redis_url: str,
) -> None:
    """A garbled copy of a turn, refused (it took no lease) in a transaction still open
    while the real task's first start comes: the start waits for it and finds the
    turn ended (a refused turn is over), rather than running beside a refusal that
    would end it too. The turn has one ending: one turn.failed, and no snapshot."""
    import threading
    import time

    url = f"sqlite:///{tmp_path}/race.db" if db == "sqlite" else request.getfixturevalue("pg_url")
    runtime = Runtime(Settings(broker_url=redis_url, store_url=url), ai)
    victim = _message("Transfer $4 to savings", "s-race")
    turn = victim["turn_id"]
    outbox = runtime.outbox
    add, in_refusal, go_on = outbox.add, threading.Event(), threading.Event()

    def paused_add(conn: Any, event: Any) -> None:
        if event.turn_id == turn and threading.current_thread().name == "garbled":
            in_refusal.set()
            go_on.wait(30)
        add(conn, event)

    outbox.add = paused_add  # type: ignore[method-assign]
    garbled = {"schema_version": 2, "turn_id": turn, "session_id": "s-race", "input": {}}
    results: dict[str, dict[str, Any]] = {}

    def run(name: str, task: dict[str, Any]) -> None:
        results[name] = run_turn(runtime, task)

    threads = [
        threading.Thread(target=run, args=(name, task), name=name)
        for name, task in (("garbled", garbled), ("victim", victim))
    ]
    try:
        threads[0].start()
        assert in_refusal.wait(30)
        threads[1].start()
        time.sleep(0.3)  # the victim's start reaches the database meanwhile
        go_on.set()
        for thread in threads:
            thread.join(60)
        assert results["garbled"]["error"]["status"] == "INVALID_ARGUMENT", results
        assert results["victim"].get("duplicate") is True, results
        assert _failed_events(runtime, turn) == 1
        assert _snapshots_of_turn(runtime, "s-race", turn) == []
        assert runtime.journal.holder(turn) is None, "no lease is left behind"
    finally:
        go_on.set()
        runtime.close()


def _reads_of(rt: Runtime, sid: str, run: Any) -> tuple[Any, int]:
    """`run()`'s result, and how many statements load snapshot `sid` (its status and
    claim: the reads a run's checks go by)."""
    from sqlalchemy import event

    reads: list[str] = []

    def seen(_c: Any, _cur: Any, statement: str, params: Any, *_args: Any) -> None:
        values = params.values() if isinstance(params, dict) else params
        selected = statement.partition(" FROM ")[0]
        if selected.startswith("SELECT") and "resumed_by" in selected and sid in values:
            reads.append(statement)

    event.listen(rt.store.engine, "before_cursor_execute", seen)
    try:
        return run(), len(reads)
    finally:
        event.remove(rt.store.engine, "before_cursor_execute", seen)


def test_a_resume_reads_its_pause_once_unless_an_earlier_run_held_it(rt: Runtime) -> None:
    """A resume's first delivery runs on the pause its check read (no run of it can have
    given its claim back yet). A delivery that takes over a run's lease reads the pause
    again, as it stands now. Both complete the turn once."""
    sid, payload = _accepted(rt, "s-read-once", "d-read-once")
    done, reads = _reads_of(rt, sid, lambda: run_turn(rt, payload))
    assert done["finish_reason"] == "stop", done
    assert reads == 1, f"the pause was read {reads} times"

    sid2, payload2 = _accepted(rt, "s-read-twice", "d-read-twice")
    journal: SqlTurnJournal = rt.journal
    assert journal.begin(payload2["turn_id"], "dead-run", ttl=0.01).kind is TurnStartKind.NEW
    time.sleep(0.05)  # that run's lease runs out: the next delivery takes it over
    done2, reads2 = _reads_of(rt, sid2, lambda: run_turn(rt, payload2))
    assert done2["finish_reason"] == "stop", done2
    assert reads2 == 2, f"the pause was read {reads2} times"
    assert len(_completed_children(rt, "s-read-twice", sid2)) == 1
