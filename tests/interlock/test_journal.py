"""The turn journal: a turn run again under the same turn_id replays what its first
run completed (model answers, tool outcomes) instead of doing it again."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy import event as sqla_event
from sqlalchemy.exc import OperationalError

from interlock import (
    FinishReason,
    InMemorySessionStore,
    Interlock,
    Message,
    ModelRequest,
    SnapshotStatus,
    SqlSessionStore,
    ToolContext,
    ToolResume,
    interrupt,
    scripted,
)
from interlock.journal import InMemoryJournal, TurnJournal, session_for_turn
from interlock.stores.sql_journal import SqlTurnJournal, TurnEnding, TurnStartKind, ended_turns


class Crash(BaseException):
    """Stands for the process dying: nothing catches it."""


class Amount(BaseModel):
    n: int


class Rig:
    """A model that calls `charge` and `ask` at once, then summarizes. `charge` can be
    made to crash the process right after it has run."""

    def __init__(self) -> None:
        self.ai = Interlock(secret="t")
        self.model_calls = 0
        self.charges: list[str] = []
        self.crash_after_charge = False

        @self.ai.tool(name="charge", description="charges, once")
        def charge(inp: Amount, ctx: ToolContext) -> dict[str, Any]:
            self.charges.append(ctx.idempotency_key)
            return {"charged": inp.n}

        @self.ai.tool(name="crash", description="the process dies here")
        def crash(inp: Amount) -> dict[str, Any]:
            if self.crash_after_charge:
                raise Crash
            return {"ok": True}

        @self.ai.interruptible_tool(name="ask", description="asks a human")
        def ask(inp: Amount, res: dict[str, Any] | None) -> dict[str, Any]:
            if res is None:
                interrupt({"question": inp.n})
            return {"answer": res}

        def model(request: ModelRequest) -> Message:
            self.model_calls += 1
            if request.messages[-1].role == "user":
                return scripted.reply(
                    scripted.tool_call("charge", {"n": 5}),
                    scripted.tool_call("crash", {"n": 0}),
                    scripted.tool_call("ask", {"n": 1}),
                )
            return scripted.text("done")

        scripted.define(self.ai, "rig", model)
        self.store = InMemorySessionStore()
        self.agent = self.ai.define_agent(
            "rig", model="scripted/rig", tools=[charge, crash, ask], store=self.store
        )


@pytest.fixture(params=["memory", "sqlite"])
def journal(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TurnJournal]:
    if request.param == "memory":
        yield InMemoryJournal()
        return
    store = SqlSessionStore(f"sqlite:///{tmp_path}/j.db")
    try:
        yield SqlTurnJournal(store)
    finally:
        store.dispose()


def test_redelivered_turn_replays_model_and_completed_tools(journal: TurnJournal) -> None:
    rig = Rig()
    rig.crash_after_charge = True
    with pytest.raises(Crash):
        rig.agent.run_text("go", session_id="s1", turn_id="turn-1", journal=journal)
    assert rig.model_calls == 1
    assert len(rig.charges) == 1
    entries = journal.load("s1", "turn-1")
    assert "model:0" in entries
    assert [k for k in entries if k.startswith("tool:")] and len(entries) == 2

    rig.crash_after_charge = False  # the worker comes back
    out = rig.agent.run_text("go", session_id="s1", turn_id="turn-1", journal=journal)
    assert out.finish_reason is FinishReason.INTERRUPTED
    assert rig.model_calls == 1, "the model's first answer was replayed, not asked again"
    assert len(rig.charges) == 1, "the completed tool did not run again"
    [pending] = out.interrupts
    assert pending.tool_request is not None and pending.tool_request.name == "ask"
    assert out.message is not None
    charge_part = next(
        p for p in out.message.content if p.tool_request and p.tool_request.name == "charge"
    )
    assert charge_part.meta("pendingOutput") == {"charged": 5}


def test_a_turn_that_names_no_session_runs_again_in_the_same_one(journal: TurnJournal) -> None:
    """A first message with no session named (a queued turn a client sent without one)
    runs again after a crash in the session its first run began: its journal replays,
    and a call that did not finish keeps its `ctx.idempotency_key`, so the outside
    system sees the same request again, not a new one."""
    ai = Interlock(secret="t")
    keys: list[str] = []
    dies = [True]

    @ai.tool(name="pay", description="pays; the process dies inside the first time")
    def pay(inp: Amount, ctx: ToolContext) -> dict[str, Any]:
        keys.append(ctx.idempotency_key)
        if dies and dies.pop():
            raise Crash
        return {"paid": inp.n}

    calls: list[int] = []

    def model(request: ModelRequest) -> Message:
        calls.append(1)
        if request.messages[-1].role == "user":
            return scripted.reply(scripted.tool_call("pay", {"n": 3}))
        return scripted.text("paid")

    scripted.define(ai, "pay-once", model)
    store = InMemorySessionStore()
    agent = ai.define_agent("pay", model="scripted/pay-once", tools=[pay], store=store)
    with pytest.raises(Crash):
        agent.run_text("go", turn_id="t-no-session", journal=journal)
    out = agent.run_text("go", turn_id="t-no-session", journal=journal)
    assert out.text == "paid"
    assert len(keys) == 2 and keys[0] == keys[1], "the retried call kept its key"
    assert len(calls) == 2, "the model's first answer was replayed, not asked again"
    assert out.session_id == session_for_turn("t-no-session")
    other = agent.run_text("go", turn_id="t-other", journal=journal)
    assert other.session_id not in (None, out.session_id), "another turn, another session"
    no_journal = agent.run_text("go", turn_id="t-no-session")
    assert no_journal.session_id != out.session_id, "a run without a journal runs once"


def test_without_a_journal_the_tool_runs_again() -> None:
    rig = Rig()
    rig.crash_after_charge = True
    with pytest.raises(Crash):
        rig.agent.run_text("go", session_id="s1", turn_id="turn-1")
    rig.crash_after_charge = False
    rig.agent.run_text("go", session_id="s1", turn_id="turn-1")
    assert len(rig.charges) == 2
    assert rig.charges[0] != rig.charges[1], "new refs: the outside system sees a new call"


def test_idempotency_key_is_stable_across_replays_and_restarts(journal: TurnJournal) -> None:
    ai = Interlock(secret="t")
    keys: list[str] = []

    @ai.interruptible_tool(name="pay", description="pays after approval")
    def pay(inp: Amount, res: dict[str, Any] | None, ctx: ToolContext) -> dict[str, Any]:
        keys.append(ctx.idempotency_key)
        if res is None:
            interrupt({"pay": inp.n})
        return {"paid": inp.n}

    def model(request: ModelRequest) -> Message:
        if request.messages[-1].role == "user":
            return scripted.reply(scripted.tool_call("pay", {"n": 3}))
        return scripted.text("paid")

    scripted.define(ai, "pay", model)
    agent = ai.define_agent("pay", model="scripted/pay", tools=[pay], store=InMemorySessionStore())
    out = agent.run_text("go", turn_id="t1", journal=journal)
    part = out.interrupts[0]
    done = agent.run(
        ToolResume(restart=[pay.resume(part, {"ok": True})]),
        session_id=out.session_id,
        turn_id="t2",
        journal=journal,
    )
    assert done.text == "paid"
    assert len(keys) == 2
    assert keys[0] == keys[1], "the same call keeps its key when it is restarted"
    assert part.tool_request is not None and out.session_id is not None
    entry = journal.load(out.session_id, "t2")[f"tool:{part.tool_request.ref}"]
    assert entry["output"] == {"paid": 3}
    assert entry["metadata"]["resolvedInterrupt"] == {"pay": 3}


def test_model_answer_no_tool_acts_on_is_not_journaled(journal: TurnJournal) -> None:
    """The snapshot supersedes a final answer: only what tools act on is kept."""
    ai = Interlock(secret="t")
    scripted.define(ai, "talk", lambda request: scripted.text("hello"))
    agent = ai.define_agent("talk", model="scripted/talk", store=InMemorySessionStore())
    out = agent.run_text("hi", turn_id="t1", journal=journal)
    assert out.text == "hello" and out.session_id is not None
    assert journal.load(out.session_id, "t1") == {}

    rig = Rig()  # an answer with tool calls is kept before the first tool runs
    out = rig.agent.run_text("go", session_id="s2", turn_id="t2", journal=journal)
    assert out.finish_reason is FinishReason.INTERRUPTED
    assert "model:0" in journal.load("s2", "t2")


def test_first_value_wins(journal: TurnJournal) -> None:
    journal.record("s", "t", "k", {"v": 1})
    journal.record("s", "t", "k", {"v": 2})
    assert journal.load("s", "t") == {"k": {"v": 1}}
    assert journal.load("s", "other") == {}


# -- leases ---------------------------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgresql"])
def sql_journal(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SqlTurnJournal]:
    url = (
        f"sqlite:///{tmp_path}/lease.db"
        if request.param == "sqlite"
        else request.getfixturevalue("pg_url")
    )
    store = SqlSessionStore(url)
    try:
        yield SqlTurnJournal(store)
    finally:
        store.dispose()


def test_lease_is_held_by_one_owner(sql_journal: SqlTurnJournal) -> None:
    assert sql_journal.acquire("turn", "w1", ttl=30)
    assert not sql_journal.acquire("turn", "w2", ttl=30), "a live lease is not shared"
    assert sql_journal.acquire("turn", "w1", ttl=30), "the holder renews it"
    holder = sql_journal.holder("turn")
    assert holder is not None and holder[0] == "w1"
    sql_journal.release("turn", "w2")  # not the holder: no effect
    assert not sql_journal.acquire("turn", "w2", ttl=30)
    sql_journal.release("turn", "w1")
    assert sql_journal.acquire("turn", "w2", ttl=30)


def test_expired_lease_is_taken_over(sql_journal: SqlTurnJournal) -> None:
    assert sql_journal.acquire("turn", "dead-worker", ttl=0.001)
    time.sleep(0.05)
    assert sql_journal.acquire("turn", "w2", ttl=30)
    holder = sql_journal.holder("turn")
    assert holder is not None and holder[0] == "w2"


def _save_turn_end(store: SqlSessionStore, turn_id: str) -> str:
    from schemas import Snapshot, SnapshotStatus, utcnow

    now = utcnow()
    snapshot = Snapshot(
        snapshot_id=f"snap-{turn_id}",
        session_id="s",
        agent="a",
        status=SnapshotStatus.COMPLETED,
        messages=[],
        created_at=now,
        updated_at=now,
        turn_id=turn_id,
    )
    store.save_snapshot(snapshot)
    return snapshot.snapshot_id


def test_begin_takes_the_lease_once_per_turn(sql_journal: SqlTurnJournal) -> None:
    first = sql_journal.begin("turn", "w1", ttl=30)
    assert first.kind is TurnStartKind.NEW, "nobody ran it: nothing to replay"
    assert sql_journal.held() == {"turn": "w1"}
    assert sql_journal.begin("turn", "w2", ttl=30).kind is TurnStartKind.BUSY
    holder = sql_journal.holder("turn")
    assert holder is not None and holder[0] == "w1"


@pytest.mark.parametrize("portable", [False, True], ids=["on_conflict", "portable"])
def test_a_session_runs_one_turn_at_a_time(sql_journal: SqlTurnJournal, portable: bool) -> None:
    """`begin(session=...)` takes the session's lease with the turn's, in one
    transaction. A second turn of the session is SESSION_BUSY and keeps no lease of its
    own; once the first has ended (with no snapshot here, then by a dead holder's lease
    taken over), the session is free again. The same answers without `ON CONFLICT`
    (there every start counts as a take-over)."""
    from interlock.stores.sql_journal import session_lease

    started = TurnStartKind.NEW
    if portable:
        sql_journal._insert_if_new = sql_journal._take_session = None
        started = TurnStartKind.TAKEN_OVER
    key = session_lease("s1")
    assert sql_journal.begin("t1", "w1", ttl=30, session="s1").kind is started
    assert sql_journal.held() == {"t1": "w1", key: "w1"}
    busy = sql_journal.begin("t2", "w2", ttl=30, session="s1")
    assert busy.kind is TurnStartKind.SESSION_BUSY
    assert sql_journal.holder("t2") is None, "the second turn's lease was given back"
    assert sql_journal.begin("t3", "w3", ttl=30, session="s2").kind is started
    assert sql_journal.begin("t4", "w4", ttl=30).kind is started, "no session"

    sql_journal.end("t1", "w1", snapshot_saved=False)
    assert sql_journal.holder(key) is None, "ended: the session's lease is given up"
    assert "t1" not in sql_journal.held() and key not in sql_journal.held()
    assert sql_journal.begin("t2", "w2", ttl=30, session="s1").kind is started

    # w2 dies holding both: a taker from the dead gets both, another one neither
    assert not sql_journal.take_from("t1", "w2", "w5", 30, session="s1"), "t1 is w1's"
    assert sql_journal.take_from("t2", "w2", "w5", 30, session="s1")
    held = sql_journal.holder(key)
    assert held is not None and held[0] == "w5"
    assert sql_journal.begin("t6", "w6", ttl=30, session="s1").kind is TurnStartKind.SESSION_BUSY


def test_a_first_delivery_costs_two_statements(sql_journal: SqlTurnJournal) -> None:
    """The usual start, a turn never run: "has it ended?" and "take its lease" are one
    INSERT (on PostgreSQL, "ended?" is asked once more after it: see the next test),
    and keeping the request's fingerprint another; the other answers are found only
    when it took nothing. (A refused turn keeps its lease row, so the INSERT takes
    nothing for it.)"""
    statements: list[str] = []

    def record(_c: Any, _cur: Any, statement: str, *_args: Any) -> None:
        statements.append(statement.split()[0])

    engine = sql_journal.store.engine
    sqla_event.listen(engine, "before_cursor_execute", record)
    try:
        assert sql_journal.begin("turn", "w1", ttl=30, request="r").kind is TurnStartKind.NEW
        postgresql = sql_journal.store.engine.dialect.name == "postgresql"
        assert statements == (["INSERT", "SELECT", "INSERT"] if postgresql else ["INSERT"] * 2)
        statements.clear()
        assert sql_journal.begin("turn", "w2", ttl=30).kind is TurnStartKind.BUSY
        # took nothing: ended (a snapshot, or a refusal)? then the lease as found
        # (locked, to give back as it was), and take it over if it has run out
        assert statements == ["INSERT", "SELECT", "SELECT", "UPDATE"]
    finally:
        sqla_event.remove(engine, "before_cursor_execute", record)
    _save_turn_end(sql_journal.store, "ended-turn")
    ended = sql_journal.begin("ended-turn", "w1", ttl=30)
    assert (ended.kind, ended.snapshot_id) == (TurnStartKind.ENDED, "snap-ended-turn")
    assert sql_journal.holder("ended-turn") is None, "an ended turn takes no lease"


def test_a_delivery_during_the_ending_save_finds_the_turn_ended(
    sql_journal: SqlTurnJournal,
) -> None:
    """A second delivery that starts while the first run's ending snapshot commits (its
    lease deleted, the snapshot not yet visible) waits for that commit, then finds the
    turn ended: it neither runs it again nor keeps a lease."""
    store = sql_journal.store
    assert sql_journal.begin("turn", "first", ttl=30).kind is TurnStartKind.NEW
    saving = threading.Event()

    def slow(_conn: Any, _snapshot: Any, _created: bool) -> None:
        saving.set()  # after the journal's hook deleted the lease, before the row
        time.sleep(0.5)

    store.add_save_hook(slow)
    saver = threading.Thread(target=_save_turn_end, args=(store, "turn"))
    saver.start()
    assert saving.wait(10)
    time.sleep(0.1)
    second = sql_journal.begin("turn", "second", ttl=30)
    saver.join()
    assert (second.kind, second.snapshot_id) == (TurnStartKind.ENDED, "snap-turn")
    assert sql_journal.holder("turn") is None


def test_the_snapshot_ending_a_turn_gives_up_its_lease_and_journal(
    sql_journal: SqlTurnJournal,
) -> None:
    assert sql_journal.begin("turn", "w1", ttl=30).kind is TurnStartKind.NEW
    sql_journal.record("s", "turn", "tool:x", {"output": 1})
    sql_journal.record("s", "other", "tool:y", {"output": 2})
    snapshot_id = _save_turn_end(sql_journal.store, "turn")
    assert sql_journal.holder("turn") is None, "deleted in the snapshot's transaction"
    assert sql_journal.load("s", "turn") == {}
    assert sql_journal.load("s", "other") == {"tool:y": {"output": 2}}, "other turns kept"
    sql_journal.end("turn", "w1", snapshot_saved=True)
    assert sql_journal.held() == {}
    again = sql_journal.begin("turn", "w2", ttl=30)
    assert (again.kind, again.snapshot_id, again.status) == (
        TurnStartKind.ENDED,
        snapshot_id,
        "completed",
    )
    assert sql_journal.held() == {}, "an ended turn holds no lease"
    assert again.ended_as() == f"completed, snapshot {snapshot_id}"


def test_a_run_that_ends_without_a_snapshot_leaves_its_journal_to_the_next(
    sql_journal: SqlTurnJournal,
) -> None:
    assert sql_journal.begin("turn", "w1", ttl=30).kind is TurnStartKind.NEW
    sql_journal.record("s", "turn", "tool:x", {"output": 1})
    sql_journal.end("turn", "w1", snapshot_saved=False)  # the run raised
    assert sql_journal.held() == {}
    holder = sql_journal.holder("turn")
    assert holder is not None and holder[0] == "w1", "expired, not deleted"
    taken = sql_journal.begin("turn", "w2", ttl=30)
    assert taken.kind is TurnStartKind.TAKEN_OVER, "the next run replays the journal"
    assert sql_journal.load("s", "turn") == {"tool:x": {"output": 1}}


def test_a_dead_runs_expired_lease_is_taken_over(sql_journal: SqlTurnJournal) -> None:
    assert sql_journal.begin("turn", "dead", ttl=0.001).kind is TurnStartKind.NEW
    time.sleep(0.05)
    assert sql_journal.begin("turn", "w2", ttl=30).kind is TurnStartKind.TAKEN_OVER
    holder = sql_journal.holder("turn")
    assert holder is not None and holder[0] == "w2"


def test_renew_held_extends_every_lease_held_here(sql_journal: SqlTurnJournal) -> None:
    assert sql_journal.renew_held(30) == 0
    sql_journal.begin("a", "w1", ttl=0.2)
    sql_journal.begin("b", "w1", ttl=0.2)
    assert sql_journal.renew_held(30) == 2
    time.sleep(0.3)
    assert sql_journal.begin("a", "w2", ttl=30).kind is TurnStartKind.BUSY, "renewed: still held"
    sql_journal.end("b", "w1", snapshot_saved=False)
    assert sql_journal.renew_held(30) == 1
    assert sql_journal.begin("b", "w2", ttl=30).kind is TurnStartKind.TAKEN_OVER


def test_what_must_survive_the_machine_waits_for_the_disk(sql_journal: SqlTurnJournal) -> None:
    """Model responses (they fix the calls' refs and idempotency keys) commit durably;
    leases and tool outcomes need only survive the process (relaxed writes). Each entry
    of a turn held here is written with the check that its lease is still this run's
    (an UPDATE of its row), in the entry's own transaction."""
    from sqlalchemy import event

    seen: list[tuple[str, bool]] = []

    def on_execute(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        words = statement.split()
        table = {"INSERT": 2, "UPDATE": 1, "DELETE": 2}.get(words[0])
        if table is not None:
            relaxed = bool(conn.get_execution_options().get("interlock_relaxed"))
            seen.append((words[table], relaxed))

    engine = sql_journal.store.engine
    event.listen(engine, "before_cursor_execute", on_execute)
    try:
        sql_journal.begin("turn", "w1", ttl=30)
        sql_journal.record("s", "turn", "model:0", {"message": {}})
        sql_journal.record("s", "turn", "tool:r1", {"output": 1})
        sql_journal.renew_held(30)
        sql_journal.end("turn", "w1", snapshot_saved=False)
    finally:
        event.remove(engine, "before_cursor_execute", on_execute)
    assert seen == [
        ("interlock_turn_lease", True),
        ("interlock_turn_lease", False),
        ("interlock_journal", False),
        ("interlock_turn_lease", True),
        ("interlock_journal", True),
        ("interlock_turn_lease", True),
        ("interlock_turn_lease", True),
    ]


def test_begin_without_on_conflict_takes_more_transactions_same_answers(
    sql_journal: SqlTurnJournal,
) -> None:
    """A database without `ON CONFLICT` gets the portable path: every start counts as a
    take-over (the journal is always read), and the answers are the same."""
    sql_journal._insert_if_new = None
    assert sql_journal.begin("turn", "w1", ttl=30).kind is TurnStartKind.TAKEN_OVER
    assert sql_journal.held() == {"turn": "w1"}
    assert sql_journal.begin("turn", "w2", ttl=30).kind is TurnStartKind.BUSY
    snapshot_id = _save_turn_end(sql_journal.store, "turn")
    ended = sql_journal.begin("turn", "w2", ttl=30)
    assert (ended.kind, ended.snapshot_id, ended.status) == (
        TurnStartKind.ENDED,
        snapshot_id,
        "completed",
    )


@pytest.mark.parametrize("portable", [False, True], ids=["on_conflict", "portable"])
def test_a_refused_turn_is_ended(sql_journal: SqlTurnJournal, portable: bool) -> None:
    """`refuse_in` ends a turn that no snapshot carries (it was refused before it ran):
    once its transaction commits, every later `begin` answers ENDED, with no snapshot."""
    if portable:
        sql_journal._insert_if_new = None
    assert sql_journal.begin("turn", "w1", ttl=30).kind in (
        TurnStartKind.NEW,
        TurnStartKind.TAKEN_OVER,
    )
    with sql_journal.store.writer().begin() as conn:
        refusal = {"status": "NOT_FOUND", "message": "gone"}
        assert not sql_journal.refuse_in(conn, None, "turn", refusal, owner="w2"), (
            "a run that does not hold the lease cannot end the turn"
        )
        assert sql_journal.refuse_in(conn, None, "turn", refusal, owner="w1")
    sql_journal.end("turn", "w1", snapshot_saved=False)
    for owner in ("w1", "w2"):
        start = sql_journal.begin("turn", owner, ttl=30)
        assert (start.kind, start.snapshot_id, start.status) == (
            TurnStartKind.ENDED,
            None,
            "refused",
        )
    assert sql_journal.held() == {}, "an ended turn's lease is not taken"
    assert sql_journal.load("", "turn") == {"refused": {"status": "NOT_FOUND", "message": "gone"}}


def test_a_refusal_without_a_lease_ends_the_turn(sql_journal: SqlTurnJournal) -> None:
    """A turn refused before any run leased it (its task message could not be read):
    the first `begin` takes no lease and answers ENDED; a refusal of a turn that had
    ended already writes nothing."""
    with sql_journal.store.writer().begin() as conn:
        assert sql_journal.refuse_in(conn, None, "unread", {"status": "INVALID_ARGUMENT"})
    start = sql_journal.begin("unread", "w1", ttl=30)
    assert (start.kind, start.snapshot_id, start.status) == (TurnStartKind.ENDED, None, "refused")
    assert start.ended_as() == "refused"
    assert sql_journal.holder("unread") is None and sql_journal.held() == {}
    snapshot_id = _save_turn_end(sql_journal.store, "finished")
    with sql_journal.store.writer().begin() as conn:
        assert not sql_journal.refuse_in(conn, None, "finished", {"status": "INVALID_ARGUMENT"})
        assert not sql_journal.refuse_in(conn, None, "unread", {"status": "INVALID_ARGUMENT"})
    ended = sql_journal.begin("finished", "w1", ttl=30)
    assert (ended.kind, ended.snapshot_id) == (TurnStartKind.ENDED, snapshot_id)


@pytest.mark.parametrize("portable", [False, True], ids=["on_conflict", "portable"])
def test_a_turn_id_names_the_request_that_first_started_it(
    sql_journal: SqlTurnJournal, portable: bool
) -> None:
    """The first start of a turn keeps its request's fingerprint. A start under the same
    turn id with another request is FOREIGN, whether the turn's lease ran out (a run
    that raised), was given back (its session busy) or belongs to a dead holder: it
    takes no lease and reads no journal, and a refusal that took no lease cannot end a
    turn so started. The turn's own request goes on from its journal."""
    from interlock.stores.sql_journal import session_lease

    started = TurnStartKind.NEW
    if portable:
        sql_journal._insert_if_new = sql_journal._take_session = None
        sql_journal._keep_request = None
        started = TurnStartKind.TAKEN_OVER
    assert sql_journal.begin("turn", "w1", ttl=30, request="a").kind is started
    sql_journal.record("s1", "turn", "tool:r1", {"ok": 1})
    sql_journal.end("turn", "w1", snapshot_saved=False)  # the run raised
    assert sql_journal.begin("turn", "w2", ttl=30, request="b").kind is TurnStartKind.FOREIGN
    assert sql_journal.held() == {}
    with sql_journal.store.writer().begin() as conn:
        assert not sql_journal.refuse_in(conn, None, "turn", {"status": "INVALID_ARGUMENT"})
    assert sql_journal.begin("turn", "w3", ttl=30, request="a").kind is TurnStartKind.TAKEN_OVER
    assert sql_journal.load("s1", "turn") == {"tool:r1": {"ok": 1}}, "a fingerprint is no entry"
    # w3 dies holding it: a taker from the dead with another request gets nothing
    assert not sql_journal.take_from("turn", "w3", "w4", 30, request="b")
    assert sql_journal.held()["turn"] == "w3", "w4 holds nothing"
    assert sql_journal.begin("turn", "w5", ttl=30, request="a").kind is TurnStartKind.TAKEN_OVER

    assert sql_journal.acquire(session_lease("s2"), "other", ttl=30)
    waiting = sql_journal.begin("t-wait", "w1", ttl=30, session="s2", request="x")
    assert waiting.kind is TurnStartKind.SESSION_BUSY
    with sql_journal.store.writer().begin() as conn:
        assert not sql_journal.refuse_in(conn, "s2", "t-wait", {"status": "INVALID_ARGUMENT"})
    foreign = sql_journal.begin("t-wait", "w2", ttl=30, session="s2", request="y")
    assert foreign.kind is TurnStartKind.FOREIGN
    sql_journal.release(session_lease("s2"), "other")
    assert sql_journal.begin("t-wait", "w3", ttl=30, session="s2", request="x").kind in (
        TurnStartKind.NEW,
        TurnStartKind.TAKEN_OVER,
    )


@pytest.mark.parametrize("portable", [False, True], ids=["on_conflict", "portable"])
def test_another_request_under_a_running_turns_id_is_foreign_at_once(
    sql_journal: SqlTurnJournal, portable: bool
) -> None:
    """While a run holds the turn's lease, a start with the same request waits (BUSY: a
    redelivery of that turn), and one with another request is FOREIGN at once, not left
    to wait for a turn that is not its own (and to be taken, once it ends, for a
    duplicate of it). Neither touches the running turn's lease or journal."""
    if portable:
        sql_journal._insert_if_new = sql_journal._take_session = None
        sql_journal._keep_request = None
    assert sql_journal.begin("t-run", "w1", ttl=30, session="s1", request="a").kind in (
        TurnStartKind.NEW,
        TurnStartKind.TAKEN_OVER,
    )
    sql_journal.record("s1", "t-run", "tool:r1", {"ok": 1})
    assert sql_journal.begin("t-run", "w2", ttl=30, request="a").kind is TurnStartKind.BUSY
    other = sql_journal.begin("t-run", "w2", ttl=30, session="s2", request="b")
    assert other.kind is TurnStartKind.FOREIGN
    assert sql_journal.begin("t-run", "w2", ttl=30).kind is TurnStartKind.BUSY, "no request"
    assert (sql_journal.holder("t-run") or ("",))[0] == "w1"
    assert sql_journal.load("s1", "t-run") == {"tool:r1": {"ok": 1}}


class _FlakyJournal(InMemoryJournal):
    """A journal whose store drops the connection at the first write."""

    def __init__(self) -> None:
        super().__init__()
        self.failures = 1

    def record(self, session_id: str, turn_id: str, key: str, value: Any) -> None:
        if self.failures:
            self.failures -= 1
            raise OperationalError(
                "INSERT ...", {}, ConnectionError("server closed the connection")
            )
        super().record(session_id, turn_id, key, value)


def test_a_store_connection_lost_mid_turn_is_not_the_turns_answer() -> None:
    """The journal's store fails mid-turn (a lost connection): the error propagates for
    the caller to retry, and the turn is not ended as failed; the retry of the same turn
    replays what was kept and goes on."""
    rig = Rig()
    flaky = _FlakyJournal()
    with pytest.raises(OperationalError):
        rig.agent.run_text("go", session_id="s-flaky", journal=flaky, turn_id="t-flaky")
    assert rig.store.list_snapshots(session_id="s-flaky") == [], "no failed snapshot"
    out = rig.agent.run_text("go", session_id="s-flaky", journal=flaky, turn_id="t-flaky")
    assert out.finish_reason is FinishReason.INTERRUPTED
    assert [s.status for s in rig.store.list_snapshots(session_id="s-flaky")] == [
        SnapshotStatus.COMPLETED
    ]


def test_a_journal_write_waits_out_a_dropped_connection(
    pg_url: str, pg_admin: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The server dropped the store's connections a moment after a tool ran (too recent
    for the pool to ping them): writing the tool's outcome tries again on a new
    connection, rather than failing the run, which would then run the tool again."""
    import logging

    from sqlalchemy import make_url

    from tests.sql_helpers import terminate_backends

    store = SqlSessionStore(pg_url)
    try:
        journal = SqlTurnJournal(store)
        journal.record("s-drop", "t-drop", "model:0", {"step": 0})  # a pooled connection
        terminate_backends(pg_admin, make_url(pg_url).database)
        with caplog.at_level(logging.WARNING, logger="interlock.journal"):
            journal.record("s-drop", "t-drop", "tool:ref-1", {"output": 42})
        assert journal.load("s-drop", "t-drop") == {
            "model:0": {"step": 0},
            "tool:ref-1": {"output": 42},
        }
        [said] = [r.getMessage() for r in caplog.records if r.name == "interlock.journal"]
        assert said.startswith("journaling tool:ref-1 of turn t-drop failed ("), said
    finally:
        store.dispose()


def test_ended_turns_says_how_each_of_many_turns_ended(sql_journal: SqlTurnJournal) -> None:
    """`ended_turns` answers for many turn ids at once (more than one statement's
    worth), what `begin` answers for one: the first snapshot carrying the id, with its
    status, finish reason and error, else the turn's refusal; nothing for the rest."""
    from schemas import ErrorInfo, Snapshot, Status, utcnow

    store = sql_journal.store
    now = utcnow()
    failure = ErrorInfo(status=Status.INTERNAL, message="tool transferMoney failed")

    def save(sid: str, turn: str, status: SnapshotStatus, **more: Any) -> None:
        store.save_snapshot(
            Snapshot(snapshot_id=sid, session_id=f"s-{turn}", agent="a", status=status,
                     messages=[], created_at=now, updated_at=now, turn_id=turn, **more)
        )  # fmt: skip

    save("p", "paused", SnapshotStatus.COMPLETED, finish_reason=FinishReason.INTERRUPTED)
    save("p2", "paused", SnapshotStatus.COMPLETED, finish_reason=FinishReason.STOP)
    save("f", "failed", SnapshotStatus.FAILED, error=failure)
    refusal = {"status": "FAILED_PRECONDITION", "message": "answer the pending interrupts first"}
    with store.writer().begin() as conn:
        assert sql_journal.refuse_in(conn, "s-r", "refused", refusal)
    many = [f"t-{i}" for i in range(1200)]
    for turn in many[::400]:
        _save_turn_end(store, turn)
    asked = ["paused", "failed", "refused", "never", "paused", *many]
    found = ended_turns(store, asked)
    assert set(found) == {"paused", "failed", "refused", "t-0", "t-400", "t-800"}
    assert found["paused"] == TurnEnding("p", "completed", "interrupted", None), "its first"
    assert found["failed"] == TurnEnding(
        "f", "failed", None, {"status": "INTERNAL", "message": "tool transferMoney failed"}
    )
    assert found["refused"] == TurnEnding(None, "refused", None, refusal)
    assert found["t-800"] == TurnEnding("snap-t-800", "completed", None, None)
    assert ended_turns(store, []) == {}


@pytest.mark.parametrize("lacking", ["table", "column"])
def test_a_journal_write_to_a_table_that_is_not_there_fails_at_once(
    lacking: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A journal table dropped since, or made by another program without a column the
    journal needs: no wait mends that. The write fails at once with the database's
    error, and an ERROR line says why it was not tried again, where it used to be tried
    again for about 30 s (a WARNING line each try)."""
    import logging

    from sqlalchemy import text

    from interlock.stores.failures import is_schema_error

    store = SqlSessionStore(f"sqlite:///{tmp_path}/store.db")
    try:
        if lacking == "column":  # theirs, made before the journal looked: kept as it is
            with store.engine.begin() as conn:
                conn.execute(text("CREATE TABLE interlock_journal (turn_id TEXT, key TEXT)"))
        journal = SqlTurnJournal(store)
        if lacking == "table":
            with store.engine.begin() as conn:
                conn.execute(text("DROP TABLE interlock_journal"))
        with (
            caplog.at_level(logging.WARNING, logger="interlock.journal"),
            pytest.raises(OperationalError) as info,
        ):
            journal.record("s-gone", "t-gone", "tool:ref-1", {"output": 42})
    finally:
        store.dispose()
    assert is_schema_error(info.value), info.value
    said = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "interlock.journal"]
    assert len(said) == 1, f"tried once, no wait: {said}"
    level, line = said[0]
    assert level == "ERROR", said
    assert line.startswith("journaling tool:ref-1 of turn t-gone failed ("), line
    assert "no wait mends, so it is not tried again; `interlock migrate`" in line, line


class _Fenced(InMemoryJournal):
    """A journal that refuses every write once `lost` is set, as the SQL journal refuses
    those of a run whose lease another run took over (`LeaseLost`)."""

    lost = False

    def record(self, session_id: str, turn_id: str, key: str, value: Any) -> None:
        if self.lost:
            raise Crash(f"lease lost: {key} not written")
        super().record(session_id, turn_id, key, value)


@pytest.mark.parametrize("resume", [False, True], ids=["message", "restarts"])
def test_a_failed_call_is_journaled_before_the_next_call_of_its_message_runs(
    resume: bool,
) -> None:
    """Every call of a model message runs even when one fails (and every restart of a
    resume), each after the journal took the one before: a run the journal refuses
    (one that stalled past its lease) stops at the failure, before the next call."""
    ai = Interlock(secret="t")
    journal = _Fenced()
    ran: list[str] = []

    @ai.interruptible_tool(name="boom", description="")
    def boom(inp: Amount, res: dict[str, Any] | None) -> dict[str, Any]:
        if resume and res is None:
            interrupt({"n": inp.n})
        ran.append("boom")
        journal.lost = True  # the run stalls here; another takes its lease over
        raise RuntimeError("kaput")

    @ai.interruptible_tool(name="note", description="")
    def note(inp: Amount, res: dict[str, Any] | None) -> dict[str, Any]:
        if resume and res is None:
            interrupt({"n": inp.n})
        ran.append("note")
        return {"n": inp.n}

    calls = [scripted.tool_call("boom", {"n": 1}), scripted.tool_call("note", {"n": 2})]
    scripted.define(ai, "m", [scripted.reply(*calls), scripted.text("done")])
    store = InMemorySessionStore()
    agent = ai.define_agent("x", model="scripted/m", tools=[boom, note], store=store)
    if resume:
        paused = agent.run_text("go")
        assert paused.finish_reason is FinishReason.INTERRUPTED
        restarts = [boom.restart(paused.interrupts[0], {}), note.restart(paused.interrupts[1], {})]
        go: Any = ToolResume(restart=restarts)
        kw: dict[str, Any] = {"session_id": paused.session_id}
    else:
        go, kw = "go", {}
    with pytest.raises(Crash, match="failed:"):
        agent.run(go, turn_id="t-1", journal=journal, **kw)
    assert ran == ["boom"], "the call after the failure did not run"
