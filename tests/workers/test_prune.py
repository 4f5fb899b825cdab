"""`interlock prune`: sessions idle past a retention are deleted, those that wait are kept."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Table, func, insert, select, update

from events.decision_log import DecisionLog, decision_table
from examples.banking import TransferOutput, bankingAgent, transferMoney
from interlock import FinishReason, SqlSessionStore, ToolResume
from interlock.stores.sql import metadata as store_metadata
from interlock.stores.sql_journal import REFUSED, SqlTurnJournal, journal_metadata, session_lease
from schemas import utcnow, wire_time
from tests.queue_helpers import run_cli
from tests.sql_helpers import database_url
from workers.retention import Pruned, prune_sessions

SNAP: Table = store_metadata.tables["interlock_snapshot"]
MSG: Table = store_metadata.tables["interlock_message"]
JOURNAL: Table = journal_metadata.tables["interlock_journal"]
LEASE: Table = journal_metadata.tables["interlock_turn_lease"]

OLD = timedelta(days=40)
"""How long ago the sessions meant to be old were last written."""


class Store:
    """A store with sessions in every state a prune tells apart, all but one aged."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.sql = SqlSessionStore(url)
        DecisionLog(self.sql)
        SqlTurnJournal(self.sql)
        self.agent = bankingAgent.with_store(self.sql)
        self.done = self.completed("Transfer $5 to savings")
        self.pause = self.agent.run_text("Transfer $6 to savings")
        assert self.pause.session_id is not None
        self.paused = self.pause.session_id
        self.expired = self.agent.run_text("Transfer $7 to savings").session_id
        self.leased = self.completed("Transfer $8 to savings")
        self.running = self.completed("Transfer $9 to savings")
        self.refused = self.completed("Transfer $10 to savings")
        self.recent = self.completed("Transfer $11 to savings")
        now = utcnow()
        with self.sql.engine.begin() as conn:
            old = now - OLD
            aged = [s for s in self.sessions() if s != self.recent]
            conn.execute(update(SNAP).where(SNAP.c.session_id.in_(aged)).values(updated_at=old))
            conn.execute(
                update(SNAP).where(SNAP.c.session_id == self.expired).values(status="expired")
            )
            conn.execute(
                insert(LEASE).values(turn_id=session_lease(self.leased), owner="w1", expires_at=now)
            )
            journal = [
                (self.running, "t-running", "model:0", old),  # a run that died, to retry
                (self.refused, "t-refused", "request", old),
                (self.refused, "t-refused", REFUSED, old),
                ("", "t-unnamed-old", "request", old),
                ("", "t-unnamed-old", REFUSED, old),
                ("", "t-unnamed-new", REFUSED, now),
                ("s-never", "t-first", "request", old),  # refused before a first snapshot
                ("s-never", "t-first", REFUSED, old),
                ("s-never-new", "t-first-new", REFUSED, now),
            ]
            for session, turn, key, when in journal:
                row = {"turn_id": turn, "key": key, "session_id": session, "created_at": when}
                conn.execute(insert(JOURNAL).values(body="null", **row))
            decisions = [
                ("d-done", self.done, old),
                ("d-paused", self.paused, old),
                ("d-unnamed-old", None, old),
                ("d-unnamed-new", None, now),
                ("d-sessionless-old", "s-no-snapshot", old),
                ("d-sessionless-new", "s-no-snapshot", now),
            ]
            for decision_id, named, when in decisions:
                conn.execute(
                    insert(decision_table).values(
                        decision_id=decision_id,
                        session_id=named,
                        outcome="rejected",
                        body="{}",
                        event_type="decision.rejected",
                        event_body="{}",
                        received_at=when,
                    )
                )

    def completed(self, text: str) -> str:
        out = self.agent.run_text(text)
        [ask] = out.interrupts
        answer = transferMoney.respond(ask, TransferOutput(success=True, transaction_id="t"))
        done = self.agent.run(ToolResume(respond=[answer]), session_id=out.session_id)
        assert done.finish_reason is FinishReason.STOP
        assert done.session_id is not None
        return done.session_id

    def sessions(self) -> set[str]:
        with self.sql.engine.connect() as conn:
            return {str(r[0]) for r in conn.execute(select(SNAP.c.session_id).distinct())}

    def count(self, table: Table) -> int:
        with self.sql.engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(table)).scalar_one())

    def column(self, table: Table, name: str) -> set[Any]:
        with self.sql.engine.connect() as conn:
            return {r[0] for r in conn.execute(select(table.c[name]))}

    def state(self) -> dict[str, Any]:
        return {
            "sessions": self.sessions(),
            "snapshots": self.count(SNAP),
            "messages": self.count(MSG),
            "decisions": self.column(decision_table, "decision_id"),
            "journal": self.column(JOURNAL, "turn_id"),
            "leases": self.column(LEASE, "turn_id"),
        }


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    made = Store(database_url(request, tmp_path, "prune.db"))
    try:
        yield made
    finally:
        made.sql.dispose()


def test_prune_deletes_the_sessions_idle_past_the_retention_that_wait_for_nothing(
    store: Store,
) -> None:
    """Old sessions that completed, failed or expired go, with their messages, decision
    records and refused turns; an open pause, a session a turn runs on (its lease), a
    turn that died and may run again (its journal) and a recent session stay. A dry
    run counts the same and deletes nothing; a second run finds nothing."""
    before = store.state()
    with store.sql.engine.connect() as conn:
        gone = [store.done, store.expired, store.refused]
        own = select(SNAP.c.snapshot_id).where(SNAP.c.session_id.in_(gone))
        their_snapshots = int(
            conn.execute(select(func.count()).where(SNAP.c.session_id.in_(gone))).scalar_one()
        )
        their_messages = int(
            conn.execute(select(func.count()).where(MSG.c.snapshot_id.in_(own))).scalar_one()
        )
    expected = {
        "sessions": 3,
        "snapshots": their_snapshots,
        "messages": their_messages,
        "decisions": 3,  # the completed session's, and the old ones that name none or a
        # session with no snapshot
        "refusals": 3,  # a pruned session's, and the old ones of no session or none stored
    }
    assert their_messages > their_snapshots > 3

    dry = run_cli("prune", "--older-than", "30d", "--dry-run", "--store", store.url)
    assert dry.returncode == 0, dry.describe()
    [line] = dry.json_lines()
    assert {k: line[k] for k in expected} == expected, line
    assert line["dry_run"] is True
    assert line["kept_busy"] == 1, line  # the session a turn holds the lease of
    assert "would delete 3 sessions" in dry.stderr, dry.describe()
    assert "so far, and would keep 1 sessions a turn runs on" in dry.stderr, dry.describe()
    assert store.state() == before, "a dry run deletes nothing"

    ran = run_cli("prune", "--older-than", "30d", "--store", store.url)
    assert ran.returncode == 0, ran.describe()
    [line] = ran.json_lines()
    assert {k: line[k] for k in expected} == expected, line
    assert line["dry_run"] is False and line["cutoff"].endswith("Z")
    assert line["kept_busy"] == 1, line
    assert "so far, and kept 1 sessions a turn runs on" in ran.stderr, ran.describe()
    after = store.state()
    assert after["sessions"] == {
        store.paused,
        store.leased,
        store.running,
        store.recent,
    }
    assert after["snapshots"] == before["snapshots"] - their_snapshots
    assert after["messages"] == before["messages"] - their_messages
    assert after["decisions"] == {"d-paused", "d-unnamed-new", "d-sessionless-new"}
    assert after["journal"] == {"t-running", "t-unnamed-new", "t-first-new"}
    assert after["leases"] == {session_lease(store.leased)}, "its own leases are let go"
    with store.sql.engine.connect() as conn:
        orphans = select(func.count()).where(~MSG.c.snapshot_id.in_(select(SNAP.c.snapshot_id)))
        assert conn.execute(orphans).scalar_one() == 0

    # what is kept still works: the open pause is answered, and the pruned session's id
    # starts a session anew, with no history to miss
    [ask] = store.pause.interrupts
    answer = transferMoney.respond(ask, TransferOutput(success=True, transaction_id="t"))
    answered = store.agent.run(ToolResume(respond=[answer]), session_id=store.paused)
    assert answered.finish_reason is FinishReason.STOP
    fresh = store.agent.run_text("Transfer $13 to savings", session_id=store.done)
    latest = store.sql.get_latest_snapshot(store.done)
    assert fresh.finish_reason is FinishReason.INTERRUPTED and latest is not None
    assert [m.role for m in latest.messages] == ["user", "model"]

    again = run_cli("prune", "--older-than", "30d", "--store", store.url)
    assert again.returncode == 0, again.describe()
    assert {k: again.json_lines()[0][k] for k in expected} == dict.fromkeys(expected, 0)
    assert again.json_lines()[0]["kept_busy"] == 1, "a turn still runs on it"
    # what is pruned is forgotten: a copy of a pruned turn's task would run again
    # (docs/operations.md, "Retention")
    begun = SqlTurnJournal(store.sql).begin("t-refused", "w9", 60, request="r")
    assert begun.kind.value == "new", begun


def test_prune_in_batches_reports_its_progress(store: Store) -> None:
    """A batch per transaction: the same sessions go, and each batch says how far it got,
    the one of a session a turn runs on too: it deleted none, and kept that one."""
    progress: list[Pruned] = []
    done, cutoff = prune_sessions(
        store.sql, OLD.total_seconds() - 3600, batch=1, on_batch=lambda p: progress.append(p)
    )
    assert done.sessions == 3 and done.decisions == 3 and done.refusals == 3
    assert done.kept_busy == 1
    assert [p.sessions + p.kept_busy for p in progress][:4] == [1, 2, 3, 4]
    assert utcnow() - cutoff >= OLD - timedelta(hours=1, seconds=5)
    assert store.sessions() == {store.paused, store.leased, store.running, store.recent}
    ran = run_cli("prune", "--older-than", "1h", "--batch", "1", "--store", store.url)
    assert ran.returncode == 0, ran.describe()
    assert ran.json_lines()[0]["sessions"] == 0 and ran.json_lines()[0]["kept_busy"] == 1
    assert ran.stderr.splitlines() == [
        "prune: deleted 0 sessions (0 snapshots, 0 messages, 0 decisions, 0 refused turns) "
        "so far, and kept 1 sessions a turn runs on"
    ], ran.describe()


def test_a_batch_whose_sessions_a_turn_takes_as_it_is_deleted_says_it_kept_them(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Turns of new messages take the leases of every session a batch chose before it
    takes them: the batch deletes none of them, and says it kept them busy (with the one
    a turn held when the batch chose)."""
    from workers.retention import _Rules

    lease = _Rules._lease

    def taken_meanwhile(self: _Rules, conn: Any, ids: Any) -> list[str]:
        until = utcnow() + timedelta(minutes=1)
        rows = [{"turn_id": session_lease(s), "owner": "w3", "expires_at": until} for s in ids]
        conn.execute(insert(LEASE), rows)
        return lease(self, conn, ids)

    monkeypatch.setattr(_Rules, "_lease", taken_meanwhile)
    before = store.sessions()
    progress: list[Pruned] = []
    done, _ = prune_sessions(
        store.sql, OLD.total_seconds() - 3600, on_batch=lambda p: progress.append(p)
    )
    assert (done.sessions, done.snapshots, done.kept_busy) == (0, 0, 4), done
    assert [(p.sessions, p.kept_busy) for p in progress] == [(0, 4)]
    assert store.sessions() == before


def test_prune_takes_a_duration_and_says_what_it_cannot_read(tmp_path: Path) -> None:
    """--older-than takes seconds or a number and a unit; anything else, zero or less,
    is a usage error naming the value. A store nothing has run on has nothing to prune,
    and none is made."""
    store = f"sqlite:///{tmp_path / 'none.db'}"
    for wrong, says in (
        ("soon", "'soon' is not a duration"),
        ("30x", "'30x' is not a duration"),
        ("0", "'0' is no length of time"),
        ("-5", "'-5' is not a duration"),
        ("36501d", "'36501d' is too long: give at most 36500d"),
        ("99999999999", "'99999999999' is too long"),
    ):
        ran = run_cli("prune", "--older-than", wrong, "--store", store)
        assert ran.returncode == 2, ran.describe()
        assert says in ran.stderr, ran.describe()
    for batch in ("0", "10001"):  # a batch's ids are bound in one statement
        ran = run_cli("prune", "--older-than", "1d", "--batch", batch, "--store", store)
        assert ran.returncode == 2, ran.describe()
        assert "is not in the range 1<=x<=10000" in ran.stderr, ran.describe()
    missing = run_cli("prune", "--store", store)
    assert missing.returncode == 2 and "--older-than" in missing.stderr, missing.describe()
    for given in ("90", "90s", "1.5m", "2h", "30d", "2W"):
        ran = run_cli("prune", "--older-than", given, "--store", store)
        assert ran.returncode == 0, ran.describe()
        line = json.loads(ran.stdout)
        assert line["sessions"] == 0 and line["dry_run"] is False, line
        assert line["cutoff"].endswith("Z") and line["cutoff"] < wire_time(
            utcnow(), microseconds=True
        ), line
        assert "nothing to prune: no store at" in ran.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_duration_is_read_in_its_unit() -> None:
    from workers.cli.prune import Duration

    read = Duration()
    assert [read.convert(v, None, None) for v in ("90", "90s", "1.5m", "2h", "30d", "2w")] == [
        90.0,
        90.0,
        90.0,
        7200.0,
        2_592_000.0,
        1_209_600.0,
    ]


def test_a_turn_that_ends_between_the_choice_and_the_lease_keeps_its_session(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker's turn of a new message that ends (its snapshot saved, the session's lease
    let go) after a batch chose its sessions and before it took their leases: the session
    is no longer idle, and its new snapshot (here an open pause, a reviewer's to answer)
    stays. PostgreSQL reads each statement afresh (READ COMMITTED); SQLite's write
    transaction keeps the turn out until the batch ends."""
    from workers.retention import _Rules

    worker = SqlSessionStore(store.url)
    journal = SqlTurnJournal(worker)
    agent = bankingAgent.with_store(worker)
    lease = _Rules._lease
    ran: list[str] = []

    def turn_meanwhile(self: _Rules, conn: Any, ids: Any) -> list[str]:
        if not ran and store.sql.engine.dialect.name == "postgresql":
            ran.append("t-meanwhile")
            begun = journal.begin("t-meanwhile", "w2", 60, session=store.done, request="r")
            assert begun.kind.value == "new", begun
            out = agent.run_text(
                "Transfer $20 to savings",
                session_id=store.done,
                turn_id="t-meanwhile",
                journal=journal,
            )
            journal.end("t-meanwhile", "w2", snapshot_saved=True)
            assert out.finish_reason is FinishReason.INTERRUPTED
            ran.append(str(out.snapshot_id))
        return lease(self, conn, ids)

    monkeypatch.setattr(_Rules, "_lease", turn_meanwhile)
    try:
        done, _ = prune_sessions(store.sql, OLD.total_seconds() - 3600)
    finally:
        worker.dispose()
    if ran:
        assert store.done in store.sessions(), "a session a turn just went on in is kept"
        assert store.sql.get_snapshot(ran[1]) is not None, "its open pause is kept"
        assert done.sessions == 2 and done.kept_busy == 2, done  # it, and the one leased


def test_a_claimed_pause_whose_resume_has_not_ended_is_kept_however_old(store: Store) -> None:
    """A pause the resume consumer claimed is answered: its resume is queued or runs
    (a backlog, a long tool, workers down) and goes on from it. While no snapshot
    follows the pause, the session waits for that resume and is kept, however long ago
    the claim was written; once the resume's snapshot follows, it goes in time."""
    out = store.agent.run_text("Transfer $14 to savings")
    assert out.snapshot_id is not None and out.session_id is not None
    assert store.sql.claim(out.snapshot_id, "consumer")
    with store.sql.engine.begin() as conn:
        aged = SNAP.c.session_id == out.session_id
        conn.execute(update(SNAP).where(aged).values(updated_at=utcnow() - OLD))
    for dry_run in (True, False):
        done, _ = prune_sessions(store.sql, OLD.total_seconds() - 3600, dry_run=dry_run)
        assert done.sessions == 3, dry_run
    assert out.session_id in store.sessions()
    [ask] = out.interrupts
    answer = transferMoney.respond(ask, TransferOutput(success=True, transaction_id="t"))
    resumed = store.agent.run(
        ToolResume(respond=[answer]),
        snapshot_id=out.snapshot_id,
        claimed_by="consumer",
        claim_required=True,
    )
    assert resumed.finish_reason is FinishReason.STOP
    with store.sql.engine.begin() as conn:
        aged = SNAP.c.session_id == out.session_id
        conn.execute(update(SNAP).where(aged).values(updated_at=utcnow() - OLD))
    done, _ = prune_sessions(store.sql, OLD.total_seconds() - 3600)
    assert done.sessions == 1 and out.session_id not in store.sessions()


def test_the_choice_of_sessions_reads_the_journal_once_not_once_a_snapshot(
    tmp_path: Path,
) -> None:
    """The turns a session has not ended are found in one read of the journal a
    statement, not in one read for each snapshot row: a store not migrated since the
    journal's index on session_id came lacks it, and there SQLite ran that (a store of
    20,000 sessions with as many refused turns took minutes)."""
    from sqlalchemy import event

    from workers.retention import _Rules

    sql = SqlSessionStore(f"sqlite:///{tmp_path / 'plan.db'}")
    SqlTurnJournal(sql)
    ran: list[tuple[str, Any]] = []

    def keep(conn: Any, cursor: Any, statement: str, params: Any, *rest: Any) -> None:
        ran.append((statement, params))

    try:
        rules = _Rules(utcnow(), {SNAP.name, JOURNAL.name, LEASE.name})
        with sql.engine.connect() as conn:
            event.listen(conn, "before_cursor_execute", keep)
            rules.sessions(conn, "", 10)
            event.remove(conn, "before_cursor_execute", keep)
            [(statement, params)] = ran
            plan = conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", params).all()
    finally:
        sql.dispose()
    steps = {row[0]: (row[1], str(row[3])) for row in plan}
    scans = [parent for parent, detail in steps.values() if detail == "SCAN interlock_journal"]
    assert scans, plan
    for parent in scans:
        assert not steps[parent][1].startswith("CORRELATED"), plan


def test_a_batch_finds_its_sessions_journal_entries_by_their_index(store: Store) -> None:
    """The statements that count and delete a batch's refused turns and requests look
    the batch's sessions up in the journal's index on session_id, not in a read of the
    whole journal for each statement (a journal of many refused turns, a few per batch)."""
    from sqlalchemy import event, text

    from workers.retention import _Rules

    now = utcnow()
    others = [
        {"turn_id": f"t-other-{n}", "key": key, "session_id": f"s-other-{n}", "created_at": now}
        for n in range(2500)
        for key in ("request", REFUSED)
    ]
    with store.sql.engine.begin() as conn:
        conn.execute(insert(JOURNAL).values(body="null"), others)
        conn.execute(text("ANALYZE"))  # the planner knows the journal is no longer small
    tables = {SNAP.name, MSG.name, JOURNAL.name, LEASE.name, decision_table.name}
    rules = _Rules(now - OLD + timedelta(hours=1), tables)
    ran: list[tuple[str, Any]] = []

    def keep(conn: Any, cursor: Any, statement: str, params: Any, *rest: Any) -> None:
        if "interlock_journal.session_id IN" in statement:
            ran.append((statement, params))

    explain = "EXPLAIN" if store.sql.engine.dialect.name == "postgresql" else "EXPLAIN QUERY PLAN"
    with store.sql.writer().connect() as conn, conn.begin():
        event.listen(conn, "before_cursor_execute", keep)
        ids = [session for session, _ in rules.sessions(conn, "", 500)]
        assert store.refused in ids, ids
        rules.count(conn, ids)
        done = rules.delete(conn, ids)
        event.remove(conn, "before_cursor_execute", keep)
        assert done.refusals == 1
        assert len(ran) == 3, ran  # the count, the refusals, the requests
        for statement, params in ran:
            plan = conn.exec_driver_sql(f"{explain} {statement}", params).all()
            shown = "\n".join(str(row[-1]) for row in plan)
            assert "ix_interlock_journal_session" in shown, (statement, shown)
            assert "SCAN interlock_journal\n" not in f"{shown}\n", (statement, shown)
