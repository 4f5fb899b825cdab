"""The outbox: an event is written in the same transaction as its snapshot, then a
relay publishes it and marks it sent. Unsent rows go out again at start-up and
periodically, so a process dying between the two loses nothing (duplicates are
harmless: events carry ids).

A process publishes the rows it wrote itself from memory: `add` keeps what the event
needs beside the row, and the outbox takes it as publishable only once the row's
transaction has committed (SQLAlchemy's events tell; a rolled-back row is dropped and
never published). Published rows are marked sent (and their resume tokens erased) in
one transaction for many rows, up to a quarter of a second later (`MARK_DELAY`), by a
thread of the process, so the turn path pays no read and no write for them.

Rows of other processes a relay sweeps only once they are `SWEEP_GRACE` seconds old,
and at most once per `SWEEP_INTERVAL`: a live process publishes its own rows within
milliseconds and marks them well within the grace, so the sweep takes what a dead (or
stuck) one left instead of racing the live ones and publishing their events twice. A
sweep claims the rows it takes (`Outbox.leftovers`), so the sweeps of several processes
(all those started again after a crash) publish each one once.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Index,
    Integer,
    MetaData,
    Table,
    Text,
    bindparam,
    delete,
    event,
    insert,
    select,
    update,
)
from sqlalchemy.engine import Connection, ExceptionContext
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.pool import ConnectionPoolEntry

from schemas import EventBase, Snapshot, utcnow

from .publisher import Publisher
from .snapshot_events import event_for_snapshot
from .store import SqlStore

__all__ = [
    "MARK_DELAY",
    "RETENTION",
    "SWEEP_GRACE",
    "SWEEP_INTERVAL",
    "Outbox",
    "OutboxRelay",
    "outbox_metadata",
    "outbox_table",
]

log = logging.getLogger("interlock.outbox")

outbox_metadata = MetaData()
outbox_table = Table(
    "interlock_outbox",
    outbox_metadata,
    Column(
        "id", BigInteger().with_variant(Integer(), "sqlite"), primary_key=True, autoincrement=True
    ),
    Column("event_id", Text, nullable=False, unique=True),
    Column("routing_key", Text, nullable=False),
    Column("body", Text, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("sent_at", DateTime(timezone=True), nullable=True),
    Index("ix_interlock_outbox_unsent", "sent_at", "id"),
)


_OUT = outbox_table.c
_INSERT = insert(outbox_table)
_SELECT = select(_OUT.id, _OUT.routing_key, _OUT.body)
_UNSENT = _SELECT.where(_OUT.sent_at.is_(None)).order_by(_OUT.id).limit(bindparam("p_limit"))
_UNSENT_BEFORE = (
    _SELECT.where(_OUT.sent_at.is_(None), _OUT.created_at <= bindparam("p_before"))
    .order_by(_OUT.id)
    .limit(bindparam("p_limit"))
)
_CLAIM = (
    update(outbox_table)
    .where(
        _OUT.id.in_(bindparam("p_ids", expanding=True)),
        _OUT.sent_at.is_(None),
        _OUT.created_at <= bindparam("p_before"),
    )
    .values(created_at=bindparam("p_now"))
    .returning(_OUT.id)
)
_MARK_SENT = (
    update(outbox_table)
    .where(_OUT.id == bindparam("p_id"))
    .values(sent_at=bindparam("p_at"), body=bindparam("p_body"))
)
_INSERT_RETURNING = _INSERT.returning(_OUT.id)
# Oldest first by the time of publication, the order of `ix_interlock_outbox_unsent`: the
# rows to delete are found in that index, however many rows the retention keeps (in the
# order of `id`, SQLite read the whole table each round to find none).
_PRUNE = delete(outbox_table).where(
    _OUT.id.in_(
        select(_OUT.id)
        .where(_OUT.sent_at.is_not(None), _OUT.sent_at < bindparam("p_before"))
        .order_by(_OUT.sent_at, _OUT.id)
        .limit(bindparam("p_limit"))
    )
)

RETENTION = 7 * 24 * 3600.0
"""Seconds a published event's row is kept (`INTERLOCK_OUTBOX_RETENTION`): a week, to
look at what went out; the resume consumer then deletes it."""

SWEEP_GRACE = 2.0
"""Seconds a row stays its writer's to publish before another process's sweep takes it
(a live writer publishes within milliseconds of its commit, and marks the row sent
within `MARK_DELAY`). Clocks of the machines sharing a store should agree to well
within this."""

SWEEP_INTERVAL = 1.0
"""A relay's `flush()` sweeps the whole table at most this often (its own rows go out
on every flush)."""

MARK_DELAY = 0.25
"""Seconds a published row waits to be marked sent (its resume token erased), so that
one transaction marks the rows published meanwhile. A busy worker publishes an event
every few milliseconds: each marking transaction is one more writer for the database
(on SQLite, one more turn at its single write lock), so the longer the wait, the fewer
there are (at 20 ms they cost a busy worker about a tenth of its CPU). Short all the
same: the plaintext token should not outlive the publish by much (the published event
itself carries it to the queue's readers). Must stay well below `SWEEP_GRACE`."""

_MARK_RETRY = 1.0
"""Seconds the marking thread waits after a failed attempt (the store is unreachable)."""

_MAX_MINE = 10_000
"""At most this many committed rows written here wait in memory to be published (older
ones are left to sweeps)."""

Row = tuple[int, str, str]
"""An outbox row to publish: (id, routing key, body)."""


class Outbox:
    """The outbox table beside a SQL session store (`SqlStore`); every snapshot the store saves for
    the first time gets its event written in the same transaction.

    Rows written here wait in memory, once committed, to be published (`mine()`); the
    relay reports what went out (`published()`), and a thread started on first use
    marks those rows sent in batches (`flush_marks()`; `close()` marks what is left).
    """

    def __init__(self, store: SqlStore, *, mark_delay: float = MARK_DELAY) -> None:
        self.store = store
        self.engine = store.engine
        # On the driver's cursor (`SqlStore.fast`): inside the snapshot's transaction.
        self._insert = store.fast(_INSERT_RETURNING)
        self._mark_sent = store.fast(_MARK_SENT)
        self.mark_delay = mark_delay
        store.create_all(outbox_metadata)
        store.add_save_hook(self._on_save)
        self._lock = threading.Lock()  # guards the two dicts below; never held over I/O
        self._mine: dict[int, tuple[str, str]] = {}  # committed here, not yet published
        self._to_mark: dict[int, str] = {}  # published, not yet marked: id -> body
        self._marking = threading.Lock()  # one `flush_marks` at a time
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._marker: threading.Thread | None = None
        # Per-connection keys (in the pooled connection's `info`) of the rows written
        # in its open transaction, and of those whose COMMIT is under way.
        self._staged: object = object()
        self._committing: object = object()
        self._watch_commits()

    def _on_save(self, conn: Connection, snapshot: Snapshot, created: bool) -> None:
        if not created:
            return
        event = event_for_snapshot(snapshot)
        if event is not None:
            self.add(conn, event)

    def add(self, conn: Connection, event: EventBase) -> None:
        """Write `event` as an unsent row, inside the caller's transaction: this process
        publishes it once that transaction has committed."""
        body = event.model_dump_json()
        values = {
            "event_id": event.event_id,
            "routing_key": event.type,
            "body": body,
            "created_at": utcnow(),
        }
        if conn.dialect.insert_returning:
            row_id = self._insert.execute(conn, values).scalar()
        else:  # pragma: no cover - SQLite and PostgreSQL both have RETURNING
            key = conn.execute(_INSERT, values).inserted_primary_key
            row_id = None if key is None else key[0]
        if row_id is None:  # pragma: no cover - every dialect we support returns it
            raise RuntimeError("the outbox row's id was not returned")
        conn.info.setdefault(self._staged, []).append((int(row_id), event.type, body))

    def add_now(self, event: EventBase) -> None:
        """Write `event` in a transaction of its own."""
        with self.store.writer().begin() as conn:
            self.add(conn, event)

    # -------------------------------------------------------- reading the table

    def prune_sent(self, older_than: float = RETENTION, limit: int = 1000) -> int:
        """Delete up to `limit` rows published more than `older_than` seconds ago (the
        oldest first); returns how many. Unsent rows are never deleted."""
        before = utcnow() - timedelta(seconds=older_than)
        with self.store.writer(relaxed=True).begin() as conn:
            done = conn.execute(_PRUNE, {"p_before": before, "p_limit": limit})
        return int(done.rowcount or 0)

    def unsent(self, limit: int = 500) -> list[Row]:
        with self.engine.begin() as conn:
            rows = conn.execute(_UNSENT, {"p_limit": limit}).all()
        return [(int(r[0]), str(r[1]), str(r[2])) for r in rows]

    def unsent_before(self, age: float, limit: int = 500) -> list[Row]:
        """Unsent rows written at least `age` seconds ago, oldest first."""
        before = utcnow() - timedelta(seconds=age)
        with self.engine.begin() as conn:
            rows = conn.execute(_UNSENT_BEFORE, {"p_before": before, "p_limit": limit}).all()
        return [(int(r[0]), str(r[1]), str(r[2])) for r in rows]

    def leftovers(self, age: float, limit: int = 500) -> list[Row]:
        """`unsent_before(age)`, without the rows this process is about to publish or
        to mark itself (they are not left over), claimed for this process: their
        `created_at` moves to now, so that the sweeps of other processes leave them
        alone for another `age` seconds (several processes starting after a crash
        would each publish them again). Rows another sweep claimed first are not
        returned; a sweeper that dies before publishing leaves its rows to the next
        sweep after that."""
        with self._lock:  # before the query: a row marked meanwhile is not in its result
            known = self._mine.keys() | self._to_mark.keys()
        rows = [r for r in self.unsent_before(age, limit) if r[0] not in known]
        if not rows:
            return []  # the usual case: a read, and no write
        now = utcnow()
        params = {
            "p_ids": [r[0] for r in rows],
            "p_before": now - timedelta(seconds=age),
            "p_now": now,
        }
        # Need not wait for the disk: a claim lost with the machine only means another
        # sweep may publish these events too (events carry ids).
        with self.store.writer(relaxed=True).begin() as conn:
            claimed = {int(r[0]) for r in conn.execute(_CLAIM, params)}
        return [r for r in rows if r[0] in claimed]

    # ------------------------------------------------------------ own rows

    def mine(self) -> list[Row]:
        """The committed rows written here that are not published yet, oldest first."""
        with self._lock:
            return [(row_id, key, body) for row_id, (key, body) in self._mine.items()]

    def published(self, rows: Sequence[Row]) -> None:
        """These rows went out: mark them sent within `mark_delay` seconds."""
        if not rows:
            return
        with self._lock:
            for row_id, _key, body in rows:
                self._mine.pop(row_id, None)
                self._to_mark[row_id] = body
            if self._marker is None or not self._marker.is_alive():
                # Started on first use: in a prefork child, after the fork.
                self._marker = threading.Thread(
                    target=self._mark_loop, name="interlock-outbox-marks", daemon=True
                )
                self._marker.start()
        self._wake.set()

    def flush_marks(self) -> int:
        """Mark every published row sent now, in one transaction. Returns how many."""
        with self._marking:
            with self._lock:
                rows = list(self._to_mark.items())
            self.mark_sent_many(rows)
            with self._lock:
                for row_id, _body in rows:
                    self._to_mark.pop(row_id, None)
        return len(rows)

    def close(self) -> None:
        """Stop the marking thread and mark what was published (a later use starts the
        thread again). Rows it fails to mark are left to sweeps."""
        self._stop.set()
        self._wake.set()
        marker = self._marker
        if marker is not None and marker is not threading.current_thread():
            marker.join(timeout=10)
        self._stop.clear()
        try:
            self.flush_marks()
        except Exception as exc:
            _log_failure(exc, "marking outbox rows sent failed; sweeps will publish them again")

    def _mark_loop(self) -> None:
        while True:
            self._wake.wait()
            if self._stop.wait(self.mark_delay):
                return
            self._wake.clear()
            try:
                self.flush_marks()
            except Exception as exc:
                _log_failure(exc, "marking outbox rows sent failed; trying again in a second")
                if self._stop.wait(_MARK_RETRY):  # the store is down: do not spin on it
                    return
                self._wake.set()

    def _committed(self, rows: Sequence[Row]) -> None:
        with self._lock:
            for row_id, key, body in rows:
                self._mine[row_id] = (key, body)
            while len(self._mine) > _MAX_MINE:
                del self._mine[next(iter(self._mine))]

    def _watch_commits(self) -> None:
        """Hand the rows `add` staged on a connection to the outbox once their transaction
        has committed, and drop them when it has not.

        SQLAlchemy's `commit` event fires *before* the COMMIT runs, so it only sets the
        staged rows aside. A COMMIT that fails raises through `handle_error`, which drops
        them; one that succeeds is followed by the connection's return to the pool or by
        its next transaction, either of which hands them over. A rollback (of the
        transaction) or an invalidated connection drops them: they are not in the table,
        and their events never go out.
        """
        staged, committing = self._staged, self._committing

        def hand_over(info: dict[Any, Any]) -> None:
            rows = info.pop(committing, None)
            if rows:
                self._committed(rows)

        def usable(conn: Connection) -> bool:
            return not (conn.closed or conn.invalidated)

        def on_begin(conn: Connection) -> None:
            hand_over(conn.info)  # the previous transaction's COMMIT returned

        def on_commit(conn: Connection) -> None:
            info = conn.info
            rows = info.pop(staged, None)
            if rows:
                info.setdefault(committing, []).extend(rows)

        def on_rollback(conn: Connection) -> None:
            if usable(conn):
                conn.info.pop(staged, None)

        def on_error(context: ExceptionContext) -> None:
            conn = context.connection
            if conn is not None and usable(conn):
                conn.info.pop(committing, None)  # the COMMIT failed

        def on_rollback_savepoint(conn: Connection, _name: str | None, _context: Any) -> None:
            # Which of the staged rows the savepoint took back is not known here: drop them
            # all. Those that do commit are left to the sweeps (published after the grace).
            if usable(conn):
                conn.info.pop(staged, None)

        def on_checkin(_dbapi_conn: Any, record: ConnectionPoolEntry) -> None:
            record.info.pop(staged, None)  # never committed: the pool rolls it back
            hand_over(record.info)

        def on_invalidate(_dbapi_conn: Any, record: ConnectionPoolEntry, _exc: Any) -> None:
            record.info.pop(staged, None)
            record.info.pop(committing, None)

        engine = self.engine
        event.listen(engine, "begin", on_begin)
        event.listen(engine, "commit", on_commit)
        event.listen(engine, "rollback", on_rollback)
        event.listen(engine, "handle_error", on_error)
        event.listen(engine, "rollback_savepoint", on_rollback_savepoint)
        event.listen(engine, "checkin", on_checkin)
        event.listen(engine, "invalidate", on_invalidate)

    # ------------------------------------------------------------ marking

    def mark_sent(self, row_id: int, body: str) -> None:
        """Mark a row sent, erasing the plaintext resume token from it."""
        self.mark_sent_many([(row_id, body)])

    def mark_sent_many(self, rows: Sequence[tuple[int, str]]) -> None:
        """Mark rows sent (one transaction), erasing the plaintext resume tokens."""
        if not rows:
            return
        at = utcnow()
        params = [
            {"p_id": row_id, "p_at": at, "p_body": _erase_token(body)} for row_id, body in rows
        ]
        # Need not wait for the disk: a mark lost with the machine only means the event
        # is published again (events carry ids) and its row marked again.
        with self.store.writer(relaxed=True).begin() as conn:
            self._mark_sent.executemany(conn, params)


def _log_failure(exc: Exception, what: str) -> None:
    """The store's own error (it went away, a table is missing) in one WARNING line, as
    the rows are marked or swept later anyway; anything else at ERROR, with its
    traceback."""
    if isinstance(exc, DBAPIError | PoolTimeout):
        cause = getattr(exc, "orig", None) or exc
        said = (str(cause).strip().splitlines() or [""])[0]
        log.warning("%s (%s: %s)", what, type(exc).__name__, said)
    else:
        log.exception("%s", what)


def _erase_token(body: str) -> str:
    data: dict[str, Any] = json.loads(body)
    if data.get("resume_token"):
        data["resume_token"] = None
        return json.dumps(data)
    return body


class OutboxRelay:
    """Publishes unsent outbox rows in order (`flush()`; the worker calls it after each
    turn, the resume consumer's maintenance periodically)."""

    def __init__(
        self,
        outbox: Outbox,
        publisher: Publisher,
        *,
        sweep_interval: float = SWEEP_INTERVAL,
        sweep_grace: float = SWEEP_GRACE,
    ) -> None:
        self.outbox = outbox
        self.publisher = publisher
        self.sweep_interval = sweep_interval
        self.sweep_grace = sweep_grace
        self._swept_at: float | None = None
        self._lock = threading.Lock()

    def flush(self, limit: int = 500) -> int:
        """Publish the committed rows this process wrote (from memory: no query); then,
        at most once per `sweep_interval`, every other unsent row at least
        `sweep_grace` seconds old (what a process that died before publishing, or
        before marking, left). Returns how many rows went out."""
        with self._lock:
            sent = self._publish(self.outbox.mine())
            now = time.monotonic()
            if self._swept_at is None or now - self._swept_at >= self.sweep_interval:
                self._swept_at = now
                sent += self._publish(self.outbox.leftovers(self.sweep_grace, limit))
        return sent

    def _publish(self, rows: Sequence[Row]) -> int:
        """Publish `rows` in order; those that went out are marked sent soon, also when
        a later one fails (what did not go out stays this process's to retry at its
        next flush, and other processes' sweeps take it after the grace)."""
        done = 0
        try:
            for _row_id, routing_key, body in rows:
                self.publisher.publish_raw_event(routing_key, body)
                done += 1
        finally:
            self.outbox.published(rows[:done])
        return done
