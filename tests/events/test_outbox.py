"""The outbox on SQLite and PostgreSQL: own rows published from memory once committed,
marked sent in batches, leftovers of dead processes swept after the grace."""

from __future__ import annotations

import logging
import multiprocessing
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import pytest
from kombu.connection import Connection
from kombu.exceptions import OperationalError as BrokerError
from sqlalchemy import event, insert, text
from sqlalchemy.exc import IntegrityError

import events.publisher
from events.outbox import Outbox, OutboxRelay, outbox_table
from events.publisher import Publisher
from events.stream import EventStream
from interlock import SqlSessionStore
from schemas import (
    EventBase,
    FinishReason,
    Message,
    Snapshot,
    SnapshotStatus,
    TurnExpired,
    TurnInterrupted,
    utcnow,
)
from tests.services import eventually, free_port
from tests.sql_helpers import checked_at_commit, query_plan

WAIT = 10.0
"""Seconds any wait here may take before the test fails."""


def store_url(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    url: str = request.getfixturevalue("pg_url")
    return url


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return store_url(request.param, request, tmp_path)


@pytest.fixture
def store(url: str) -> Iterator[SqlSessionStore]:
    sql = SqlSessionStore(url)
    try:
        yield sql
    finally:
        sql.close()


@pytest.fixture
def outbox(store: SqlSessionStore) -> Iterator[Outbox]:
    box = Outbox(store)
    try:
        yield box
    finally:
        box.close()


@pytest.fixture
def broker(redis_url: str) -> Iterator[Connection]:
    """The tests' private Redis."""
    with Connection(redis_url) as conn:
        yield conn


@pytest.fixture
def events_seen(broker: Connection) -> Iterator[EventStream]:
    """Every event published from now on, on a queue of the test's own (deleted after)."""
    stream = EventStream.bind(broker, f"test.outbox.{uuid.uuid4()}", temporary=True)
    try:
        yield stream
    finally:
        stream.close(delete=True)


@pytest.fixture
def relay(outbox: Outbox, broker: Connection) -> Iterator[OutboxRelay]:
    publisher = Publisher(broker.clone())
    try:
        yield OutboxRelay(outbox, publisher)
    finally:
        publisher.close()
        publisher.connection.release()


def completed(session_id: str = "s1") -> Snapshot:
    """A new snapshot whose save writes a `turn.completed` row."""
    return Snapshot(
        snapshot_id=str(uuid.uuid4()),
        session_id=session_id,
        agent="a",
        status=SnapshotStatus.COMPLETED,
        finish_reason=FinishReason.STOP,
        messages=[Message.model_validate({"role": "user", "content": [{"text": "hi"}]})],
    )


def interrupted(token: str) -> TurnInterrupted:
    return TurnInterrupted(
        agent="a", session_id="s1", snapshot_id=str(uuid.uuid4()), interrupts=[], resume_token=token
    )


def read_until(stream: EventStream, relay: OutboxRelay) -> list[EventBase]:
    """Every event published so far: a sentinel goes out on the relay's own connection,
    so once it is read, whatever the relay published before it has been read too."""
    sentinel = TurnExpired(agent="sentinel")
    relay.publisher.publish_event(sentinel)
    seen: list[EventBase] = []
    while True:
        found = stream.next(WAIT)
        if found.event_id == sentinel.event_id:
            return seen
        seen.append(found)


def row(store: SqlSessionStore, event_id: str) -> Any:
    with store.engine.connect() as conn:
        return conn.execute(
            text("SELECT body, sent_at FROM interlock_outbox WHERE event_id = :e"),
            {"e": event_id},
        ).first()


def sent_row(store: SqlSessionStore, event_id: str) -> Any:
    """The row once marked sent (polled: marking happens a moment after publishing)."""

    def marked() -> Any:
        found = row(store, event_id)
        return found if found is not None and found.sent_at is not None else None

    return eventually(marked, f"outbox row {event_id} marked sent", WAIT)


def count_statements(store: SqlSessionStore) -> list[str]:
    """The statements this thread runs from now on (not the marking thread's)."""
    statements: list[str] = []
    here = threading.get_ident()

    def seen(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if threading.get_ident() == here:
            statements.append(statement)

    event.listen(store.engine, "before_cursor_execute", seen)
    return statements


# ------------------------------------------------------------------- own rows


def test_committed_row_published_once_then_marked_with_token_erased(
    store: SqlSessionStore, outbox: Outbox, relay: OutboxRelay, events_seen: EventStream
) -> None:
    relay.flush()  # the first flush also sweeps (nothing to sweep yet)
    relay.sweep_interval = 3600  # and no other will
    snapshot = completed()
    store.save_snapshot(snapshot)
    token = f"secret-{uuid.uuid4()}"
    paused = interrupted(token)
    outbox.add_now(paused)

    statements = count_statements(store)
    assert relay.flush() == 2
    assert statements == [], "own rows are published from memory, without a query"
    assert relay.flush() == 0, "and only once"

    seen = read_until(events_seen, relay)
    assert [(e.type, e.snapshot_id) for e in seen] == [
        ("turn.completed", snapshot.snapshot_id),
        ("turn.interrupted", paused.snapshot_id),
    ]
    assert seen[1].model_dump()["resume_token"] == token

    stored = sent_row(store, paused.event_id)
    assert token not in stored.body, "the plaintext token is erased once published"
    assert sent_row(store, seen[0].event_id).sent_at is not None
    assert outbox.unsent() == []


def test_marks_that_fail_are_retried_without_spinning(
    store: SqlSessionStore,
    outbox: Outbox,
    relay: OutboxRelay,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The store refuses the marks for a while (here: the table is renamed away): the
    marking thread tries again a second later, not every few milliseconds, and marks
    the row once the store takes writes again."""
    relay.flush()  # the first flush also sweeps (nothing to sweep yet)
    relay.sweep_interval = 3600  # and no other will
    paused = interrupted(f"secret-{uuid.uuid4()}")
    outbox.add_now(paused)
    with store.writer().begin() as conn:
        conn.execute(text("ALTER TABLE interlock_outbox RENAME TO interlock_outbox_away"))
    try:
        assert relay.flush() == 1  # published; its mark now fails
        eventually(lambda: "marking outbox rows sent failed" in caplog.text, "a failed mark", WAIT)
        threading.Event().wait(0.5)  # half the retry pause: no other attempt in it
        failures = caplog.text.count("marking outbox rows sent failed")
        assert failures == 1, f"{failures} attempts in half a second"
        [said] = [r for r in caplog.records if "marking outbox rows" in r.getMessage()]
        assert (said.levelno, said.exc_info) == (logging.WARNING, None), "one line, no traceback"
        assert "interlock_outbox" in said.getMessage()  # what the store said is in it
    finally:
        with store.writer().begin() as conn:
            conn.execute(text("ALTER TABLE interlock_outbox_away RENAME TO interlock_outbox"))
    stored = sent_row(store, paused.event_id)
    assert paused.resume_token is not None and paused.resume_token not in stored.body


def test_a_mark_that_fails_for_another_reason_is_logged_with_its_traceback(
    store: SqlSessionStore,
    outbox: Outbox,
    relay: OutboxRelay,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An error that is not the store's (a bug in marking) is logged at ERROR with its
    traceback, not as an outage's one line; the thread goes on and marks the row."""
    relay.flush()
    relay.sweep_interval = 3600
    real = outbox.mark_sent_many
    failed: list[int] = []

    def broken_once(rows: Any) -> Any:
        if not failed:
            failed.append(len(rows))
            raise ValueError("marking broke")
        return real(rows)

    monkeypatch.setattr(outbox, "mark_sent_many", broken_once)
    paused = interrupted(f"secret-{uuid.uuid4()}")
    outbox.add_now(paused)
    assert relay.flush() == 1
    assert sent_row(store, paused.event_id).sent_at is not None  # marked on the next try
    assert failed == [1]
    [said] = [r for r in caplog.records if "marking outbox rows" in r.getMessage()]
    assert said.levelno == logging.ERROR
    assert said.exc_info is not None and said.exc_info[0] is ValueError


def test_close_marks_what_was_published(
    store: SqlSessionStore, broker: Connection, events_seen: EventStream
) -> None:
    box = Outbox(store, mark_delay=3600)  # the thread alone would not mark them now
    publisher = Publisher(broker.clone())
    try:
        token = f"secret-{uuid.uuid4()}"
        paused = interrupted(token)
        box.add_now(paused)
        assert OutboxRelay(box, publisher).flush() == 1
        assert row(store, paused.event_id).sent_at is None, "not marked yet"
        box.close()
        stored = row(store, paused.event_id)
        assert stored.sent_at is not None
        assert token not in stored.body
    finally:
        box.close()
        publisher.close()
        publisher.connection.release()


# ------------------------------------------------------------ what never commits


class Boom(Exception):
    pass


def nothing_published_then(
    kept: Snapshot,
    store: SqlSessionStore,
    outbox: Outbox,
    relay: OutboxRelay,
    stream: EventStream,
) -> None:
    """Nothing is in the outbox, nothing goes out; then `kept` is saved, and its event
    alone goes out."""
    assert outbox.unsent() == []
    relay.flush()
    assert read_until(stream, relay) == []
    store.save_snapshot(kept)
    relay.flush()
    assert [e.snapshot_id for e in read_until(stream, relay)] == [kept.snapshot_id]


def test_rolled_back_save_publishes_nothing(
    store: SqlSessionStore, outbox: Outbox, relay: OutboxRelay, events_seen: EventStream
) -> None:
    lost, kept = completed(), completed()

    def fail_after_the_outbox(_conn: Any, snapshot: Snapshot, _created: bool) -> None:
        if snapshot.snapshot_id == lost.snapshot_id:
            raise Boom

    store.add_save_hook(fail_after_the_outbox)  # runs after the outbox's hook
    with pytest.raises(Boom):
        store.save_snapshot(lost)
    assert store.get_snapshot(lost.snapshot_id) is None

    def add_then_fail() -> None:
        with store.writer().begin() as conn:
            outbox.add(conn, TurnExpired(agent="rolled-back"))
            raise Boom

    with pytest.raises(Boom):
        add_then_fail()
    with store.writer().connect() as conn:  # one connection, two transactions
        with conn.begin() as first:
            outbox.add(conn, TurnExpired(agent="rolled-back"))
            first.rollback()
        with conn.begin():
            pass  # commits nothing of the first

    nothing_published_then(kept, store, outbox, relay, events_seen)


def test_save_whose_commit_fails_publishes_nothing(
    store: SqlSessionStore, outbox: Outbox, relay: OutboxRelay, events_seen: EventStream
) -> None:
    """The COMMIT itself fails (a deferred foreign key), after SQLAlchemy's `commit`
    event has fired."""
    child = checked_at_commit(store)
    lost, kept = completed(), completed()

    def orphan(conn: Any, snapshot: Snapshot, _created: bool) -> None:
        if snapshot.snapshot_id == lost.snapshot_id:
            conn.execute(insert(child).values(parent="missing"))

    store.add_save_hook(orphan)
    with pytest.raises(IntegrityError, match=r"(?i)foreign key"):
        store.save_snapshot(lost)
    assert store.get_snapshot(lost.snapshot_id) is None
    nothing_published_then(kept, store, outbox, relay, events_seen)


def test_savepoint_rolled_back_publishes_nothing_of_it(
    store: SqlSessionStore, outbox: Outbox, relay: OutboxRelay, events_seen: EventStream
) -> None:
    before, undone, after = (TurnExpired(agent=name) for name in ("before", "undone", "after"))
    with store.writer().begin() as conn:
        outbox.add(conn, before)
        savepoint = conn.begin_nested()
        outbox.add(conn, undone)
        savepoint.rollback()
        outbox.add(conn, after)

    relay.flush()
    published = [e.agent for e in read_until(events_seen, relay)]
    assert "undone" not in published
    assert "after" in published
    # what the rollback left in doubt is not lost: a sweep publishes it after the grace
    sweeper = OutboxRelay(outbox, relay.publisher, sweep_grace=0, sweep_interval=0)
    sweeper.flush()
    published += [e.agent for e in read_until(events_seen, relay)]
    assert sorted(cast(list[str], published)) == ["after", "before"]


# -------------------------------------------------------------- failures, death


def test_publish_failure_leaves_the_row_for_retry(
    store: SqlSessionStore,
    outbox: Outbox,
    relay: OutboxRelay,
    events_seen: EventStream,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(events.publisher.RETRY_POLICY, "max_retries", 0)  # fail at once
    good = relay.publisher
    relay.publisher = Publisher(Connection(f"redis://127.0.0.1:{free_port()}/0"))  # nobody
    try:
        token = f"secret-{uuid.uuid4()}"
        paused = interrupted(token)
        outbox.add_now(paused)
        with pytest.raises(BrokerError):
            relay.flush()
        assert [key for _, key, _ in outbox.mine()] == ["turn.interrupted"], "kept to retry"
    finally:
        relay.publisher.connection.release()
        relay.publisher = good

    assert relay.flush() == 1
    assert [e.event_id for e in read_until(events_seen, relay)] == [paused.event_id]
    assert token not in sent_row(store, paused.event_id).body


def _die_after_publishing(url: str, broker_url: str, published: str, unpublished: str) -> None:
    """A process that publishes one row, writes another and dies before marking either
    (nor publishing the second): what its outbox leaves to the others."""
    import os

    store = SqlSessionStore(url)
    outbox = Outbox(store)
    relay = OutboxRelay(outbox, Publisher(Connection(broker_url)))
    outbox.add_now(TurnExpired(event_id=published, agent="dead"))
    relay.flush()
    outbox.add_now(TurnExpired(event_id=unpublished, agent="dead"))
    os._exit(0)


def test_rows_of_a_dead_process_are_swept_after_the_grace(
    store: SqlSessionStore, url: str, redis_url: str
) -> None:
    published, unpublished = str(uuid.uuid4()), str(uuid.uuid4())
    with Connection(redis_url) as broker:
        stream = EventStream.bind(broker, f"test.outbox.{uuid.uuid4()}")
        publisher = Publisher(broker.clone())
        try:
            child = multiprocessing.get_context("spawn").Process(
                target=_die_after_publishing, args=(url, redis_url, published, unpublished)
            )
            child.start()
            child.join(timeout=60)
            assert child.exitcode == 0
            assert stream.next(WAIT).event_id == published

            outbox = Outbox(store)
            try:
                patient = OutboxRelay(outbox, publisher, sweep_grace=3600)
                assert patient.flush() == 0, "within the grace the rows are their writer's"
                sweeper = OutboxRelay(outbox, publisher, sweep_grace=0.1, sweep_interval=0)
                eventually(sweeper.flush, "the dead process's rows swept", WAIT)
                seen = read_until(stream, sweeper)
                if len(seen) == 1:  # swept in two flushes (the second row was younger)
                    eventually(sweeper.flush, "the second row swept", WAIT)
                    seen += read_until(stream, sweeper)
                assert sorted(e.event_id for e in seen) == sorted([published, unpublished])
                sent_row(store, published)
                sent_row(store, unpublished)
                assert sweeper.flush() == 0, "marked: swept once"
            finally:
                outbox.close()
        finally:
            publisher.close()
            publisher.connection.release()
            stream.close(delete=True)


GRACE = 0.5
"""The sweeps' grace in the test below: long enough for the steps it must fit in."""


def test_processes_sweeping_at_once_publish_each_leftover_once(
    url: str, broker: Connection, events_seen: EventStream
) -> None:
    """Rows a dead process left, swept by two processes at once (as after a crash, when
    every process starts again and sweeps at its first flush): each event goes out once.
    A sweeper that claimed rows and died before publishing them leaves them to the next
    sweep after another grace."""
    stores = [SqlSessionStore(url) for _ in range(4)]
    dead, first, second, dying = (Outbox(store) for store in stores)
    publisher = Publisher(broker.clone())
    try:
        left = [str(uuid.uuid4()) for _ in range(3)]
        for event_id in left:
            dead.add_now(TurnExpired(event_id=event_id, agent="dead"))
        time.sleep(GRACE + 0.2)
        relays = [
            OutboxRelay(box, publisher, sweep_grace=GRACE, sweep_interval=0)
            for box in (first, second)
        ]
        assert [relays[0].flush(), relays[1].flush()] == [3, 0], "claimed by the first sweep"
        assert sorted(e.event_id for e in read_until(events_seen, relays[0])) == sorted(left)

        late = str(uuid.uuid4())
        dead.add_now(TurnExpired(event_id=late, agent="dead"))
        time.sleep(GRACE + 0.2)
        assert [r[0] for r in dying.leftovers(GRACE)] != [], "claimed, then never published"
        assert relays[0].flush() == 0, "within the grace the claim holds"
        time.sleep(GRACE + 0.2)
        assert relays[1].flush() == 1, "after another grace the row is swept again"
        assert [e.event_id for e in read_until(events_seen, relays[1])] == [late]
    finally:
        publisher.close()
        publisher.connection.release()
        for box in (dead, first, second, dying):
            box.close()
        for store in stores:
            store.close()


def test_rows_of_events_published_long_ago_are_deleted(
    store: SqlSessionStore, outbox: Outbox, relay: OutboxRelay
) -> None:
    """`prune_sent` deletes the rows of events published before the retention, oldest
    first and a batch at a time; a row not yet published is kept however old it is."""
    relay.flush()
    relay.sweep_interval = 3600
    old_sent, recent_sent, old_unsent = (interrupted(f"t-{uuid.uuid4()}") for _ in range(3))
    for sent in (old_sent, recent_sent):
        outbox.add_now(sent)
    assert relay.flush() == 2
    sent_row(store, old_sent.event_id)
    sent_row(store, recent_sent.event_id)
    with store.writer().begin() as conn:  # one published a day ago, one written a day ago
        day_ago = utcnow() - timedelta(days=1)
        conn.execute(
            text("UPDATE interlock_outbox SET sent_at = :t WHERE event_id = :e"),
            {"t": day_ago, "e": old_sent.event_id},
        )
    with outbox.store.writer().begin() as conn:
        outbox.add(conn, old_unsent)
        conn.execute(
            text("UPDATE interlock_outbox SET created_at = :t WHERE event_id = :e"),
            {"t": day_ago, "e": old_unsent.event_id},
        )
    assert outbox.prune_sent(older_than=3600, limit=1000) == 1
    assert row(store, old_sent.event_id) is None
    assert row(store, recent_sent.event_id) is not None
    assert row(store, old_unsent.event_id) is not None, "never published: kept"
    assert outbox.prune_sent(older_than=3600) == 0


def test_rows_to_delete_are_found_in_the_index_not_by_reading_the_table(
    store: SqlSessionStore, outbox: Outbox
) -> None:
    """The rows of events published before the retention are looked up in the index on
    `sent_at`: the rows the retention keeps (a week of every event) are not read, where
    SQLite read the whole table at every round (every five minutes, in a write
    transaction that every writer waits for) to find that none was old enough."""
    now = utcnow()
    kept = [  # marked sent twenty at a time, as the marking thread does
        {
            "event_id": str(uuid.uuid4()),
            "routing_key": "turn.completed",
            "body": "{}",
            "created_at": now - timedelta(minutes=5),
            "sent_at": now - timedelta(minutes=5) + timedelta(seconds=n // 20),
        }
        for n in range(40_000)  # SQLite read them all once there were some 30,000
    ]
    old = str(uuid.uuid4())
    day_ago = now - timedelta(days=1)
    with store.writer().begin() as conn:
        conn.execute(insert(outbox_table), kept)
        conn.execute(
            insert(outbox_table).values(
                event_id=old,
                routing_key="turn.completed",
                body="{}",
                created_at=day_ago,
                sent_at=day_ago,
            )
        )
        conn.execute(text("ANALYZE"))  # the planner knows the table is no longer small
    ran: list[tuple[str, Any]] = []

    def keep(conn: Any, cursor: Any, statement: str, params: Any, *rest: Any) -> None:
        if statement.lstrip().upper().startswith("DELETE"):
            ran.append((statement, params))

    event.listen(store.engine, "before_cursor_execute", keep)
    try:
        assert outbox.prune_sent(older_than=3600) == 1
    finally:
        event.remove(store.engine, "before_cursor_execute", keep)
    assert row(store, old) is None
    [(statement, params)] = ran
    shown = query_plan(store, statement, params)
    assert "ix_interlock_outbox_unsent" in shown, shown  # the rows to delete: by index
    # SQLite then deletes them by rowid. PostgreSQL may join them to the table by a
    # scan of it while the table is small (a cost-based choice, which turns to the
    # primary key as the table grows): only the finding of the rows is asserted there.
    assert "SCAN interlock_outbox\n" not in f"{shown}\n", shown
