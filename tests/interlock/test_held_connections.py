"""What a SQLite file store's transactions cost it. Each thread keeps its connection
checked out between the store's own transactions (`interlock.stores.held`): no pool
round trip per transaction, the write lock still released after each write, at most
`pool_size` threads holding one, and every connection back in the pool when its thread
ends or the store closes. A save writes no AUTOINCREMENT counter."""

from __future__ import annotations

import gc
import os
import sqlite3
import threading
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event

from interlock import SqlSessionStore
from schemas import FinishReason, Snapshot
from tests.interlock.test_sqlite_writers import (
    WAIT,
    child_exit_code,
    finishes,
    lock_is_free,
)
from tests.interlock.test_sqlite_writers import snapshot as completed
from tests.services import eventually


class PoolCounts:
    """Checkouts and checkins of a store's pool, as they happen."""

    def __init__(self, store: SqlSessionStore) -> None:
        self.checkouts = 0
        self.checkins = 0
        self.pool = store.engine.pool

        def out(*_: Any) -> None:
            self.checkouts += 1

        def back(*_: Any) -> None:
            self.checkins += 1

        event.listen(store.engine, "checkout", out)
        event.listen(store.engine, "checkin", back)

    def checked_out(self) -> int:
        return int(self.pool.checkedout())  # type: ignore[attr-defined]


def snapshot(session_id: str, i: int, parent_id: str | None) -> Snapshot:
    """The i-th snapshot of a session, a pause (so that it can be claimed)."""
    paused = completed(session_id, i, parent_id)
    return paused.model_copy(update={"finish_reason": FinishReason.INTERRUPTED})


def session(store: SqlSessionStore, name: str, length: int = 3) -> list[Snapshot]:
    """Save a session of `length` snapshots, each read back and claimed as a resume
    does; the snapshots."""
    saved: list[Snapshot] = []
    parent: str | None = None
    for i in range(length):
        snap = snapshot(name, i, parent)
        store.save_snapshot(snap)
        assert store.get_latest_snapshot(name) == snap.model_copy(update={"inherited": 0})
        assert store.claim(snap.snapshot_id, f"{name}-resume-{i}")
        saved.append(snap)
        parent = snap.snapshot_id
    return saved


def test_a_thread_keeps_one_connection_across_the_store_transactions(
    store: SqlSessionStore,
) -> None:
    counts = PoolCounts(store)
    session(store, "first", 1)
    before = counts.checkouts
    session(store, "s", 5)  # 15 transactions
    assert counts.checkouts == before, "no checkout per transaction"
    assert counts.checkins == 0
    assert counts.checked_out() == 1


def another_store_writes(store: SqlSessionStore, db: Path) -> None:
    """A store of its own on the same file (as another process's would) saves without
    waiting for a lock `store` still holds, and `store` reads what it saved."""
    other = SqlSessionStore(f"sqlite:///{db}")
    try:
        assert finishes(lambda: other.save_snapshot(snapshot("t", 0, None)))
    finally:
        other.close()
    assert store.get_snapshot("t-0") is not None


def test_every_write_lets_the_next_writer_in(store: SqlSessionStore, db: Path) -> None:
    """The connection stays checked out, so the lock is released when the write ends,
    not when the connection goes back to the pool."""
    store.save_snapshot(snapshot("s", 0, None))
    assert lock_is_free(db)
    assert store.claim("s-0", "by")
    assert lock_is_free(db)
    with pytest.raises(ValueError, match="is not a valid SnapshotStatus"):
        store.save_snapshot(snapshot("s", 1, "s-0").model_copy(update={"status": "bogus"}))
    assert lock_is_free(db), "released after a failed write too"
    another_store_writes(store, db)


def test_at_most_pool_size_threads_hold_a_connection(store: SqlSessionStore) -> None:
    counts = PoolCounts(store)
    size = store.engine.pool.size()  # type: ignore[attr-defined]
    threads = size + 3
    saved = threading.Barrier(threads + 1)
    done = threading.Event()
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            session(store, f"t{n}", 2)
        except BaseException as exc:
            errors.append(exc)
        saved.wait(WAIT)
        done.wait(WAIT)  # alive, so whatever it holds stays held

    pool = [threading.Thread(target=work, args=(n,), daemon=True) for n in range(threads)]
    for thread in pool:
        thread.start()
    saved.wait(WAIT)
    try:
        assert errors == []
        assert counts.checked_out() == size, "the others returned theirs after each use"
        assert counts.checkins > 0
        assert len(store.list_snapshots(limit=1000)) == 2 * threads
    finally:
        done.set()
        for thread in pool:
            thread.join(WAIT)


def test_a_thread_that_ends_gives_its_connection_back(store: SqlSessionStore) -> None:
    counts = PoolCounts(store)
    thread = threading.Thread(target=session, args=(store, "gone", 2))
    thread.start()
    thread.join(WAIT)
    assert not thread.is_alive()
    gc.collect()
    eventually(lambda: counts.checked_out() == 0, "the ended thread's connection back", WAIT)
    assert len(store.list_snapshots(session_id="gone")) == 2


def test_close_gives_every_connection_back_and_the_store_still_works(
    store: SqlSessionStore,
) -> None:
    counts = PoolCounts(store)
    session(store, "a", 1)
    assert counts.checked_out() == 1
    store.close()
    assert counts.checked_out() == 0
    session(store, "b", 2)
    assert [s.snapshot_id for s in store.list_snapshots(limit=10)] == ["b-1", "b-0", "a-0"]


def test_a_store_with_a_save_hook_returns_its_connection_after_each_transaction(
    store: SqlSessionStore,
) -> None:
    """A hook may count on the connection's return to the pool (the outbox hands what
    it wrote to its relay then)."""
    counts = PoolCounts(store)
    session(store, "a", 1)
    seen: list[str] = []
    store.add_save_hook(lambda _conn, snap, _created: seen.append(snap.snapshot_id))
    assert counts.checked_out() == 0, "the held connection went back"
    checkins = counts.checkins
    session(store, "b", 2)  # 6 transactions
    assert counts.checkins == checkins + 6
    assert seen == ["b-0", "b-1"]


def test_a_transaction_inside_another_uses_a_connection_of_its_own(
    store: SqlSessionStore,
) -> None:
    store.save_snapshot(snapshot("s", 0, None))
    with store._write() as conn:
        assert store.claim_in(conn, "s-0", "outer")
        # the outer write is not committed: another connection does not see its claim
        inner = store.get_snapshot("s-0")
        assert inner is not None and inner.resumed_by is None
    after = store.get_snapshot("s-0")
    assert after is not None and after.resumed_by == "outer"


def test_an_invalidated_connection_is_replaced(store: SqlSessionStore) -> None:
    counts = PoolCounts(store)
    session(store, "a", 1)
    held = store._held
    assert held is not None
    conn = held._connection()
    assert conn is not None
    conn.invalidate()
    session(store, "b", 1)
    assert held._connection() is not conn
    assert counts.checked_out() == 1


def test_a_forked_child_uses_connections_of_its_own(store: SqlSessionStore) -> None:
    """The child never touches the connection its parent's thread held: the parent's
    next transactions on it still work."""
    session(store, "parent", 1)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            store.engine.dispose(close=False)  # the parent's pooled connections are not ours
            session(store, "child", 2)
            code = 0
        finally:
            os._exit(code)
    assert child_exit_code(pid, "the child's session") == 0
    session(store, "parent-again", 2)
    ids = {s.snapshot_id for s in store.list_snapshots(limit=10)}
    assert ids == {"parent-0", "child-0", "child-1", "parent-again-0", "parent-again-1"}


def test_a_save_writes_no_autoincrement_counter_and_older_tables_still_work(
    tmp_path: Path,
) -> None:
    """New tables keep the first-save order without SQLite's AUTOINCREMENT (which writes
    a counter page at every insert); a table made with it, as before, works the same."""
    new = tmp_path / "new.db"
    with SqlSessionStore(f"sqlite:///{new}") as store:
        session(store, "s", 3)
        assert [s.snapshot_id for s in store.list_snapshots(limit=10)] == ["s-2", "s-1", "s-0"]
    with closing(sqlite3.connect(new)) as raw:
        ddl = raw.execute(TABLE_SQL).fetchone()[0]
        assert "AUTOINCREMENT" not in ddl
        assert "PRIMARY KEY (seq)" in ddl  # seq is the rowid
        assert raw.execute(SEQUENCE_TABLES).fetchone() == (0,)

    old = tmp_path / "old.db"
    earlier = ddl.replace(
        "seq INTEGER NOT NULL, ", "seq INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT, "
    ).replace("\tCONSTRAINT pk_interlock_snapshot PRIMARY KEY (seq), \n", "")
    assert earlier.count("AUTOINCREMENT") == 1 and "PRIMARY KEY (seq)" not in earlier
    with closing(sqlite3.connect(old)) as raw:  # the table as earlier releases made it
        raw.execute(earlier)
    with SqlSessionStore(f"sqlite:///{old}") as store:
        session(store, "s", 3)
        assert [s.snapshot_id for s in store.list_snapshots(limit=10)] == ["s-2", "s-1", "s-0"]
    with closing(sqlite3.connect(old)) as raw:
        assert raw.execute("SELECT seq FROM sqlite_sequence").fetchone() == (3,)


TABLE_SQL = "SELECT sql FROM sqlite_master WHERE name = 'interlock_snapshot'"
SEQUENCE_TABLES = "SELECT count(*) FROM sqlite_master WHERE name = 'sqlite_sequence'"


def test_a_child_forked_while_other_threads_hold_connections_gives_none_back(
    store: SqlSessionStore,
) -> None:
    """The child's start lets go of the parent's other threads' thread-locals: their
    held connections must stay untouched there, not go back to the child's copy of the
    pool (whose lock a parent thread may have held at the fork)."""
    counts = PoolCounts(store)
    held_now = threading.Barrier(4)
    done = threading.Event()

    def hold(n: int) -> None:
        session(store, f"t{n}", 1)
        held_now.wait(WAIT)
        done.wait(WAIT)

    threads = [threading.Thread(target=hold, args=(n,), daemon=True) for n in range(3)]
    for thread in threads:
        thread.start()
    held_now.wait(WAIT)
    try:
        assert counts.checked_out() == 3
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                gc.collect()
                os.write(write, f"{counts.checkins} {counts.checked_out()}".encode())
                code = 0
            finally:
                os._exit(code)
        os.close(write)
        assert child_exit_code(pid, "the child's start") == 0
        with os.fdopen(read) as said:
            assert said.read() == "0 3", "the child gave none of them back"
    finally:
        done.set()
        for thread in threads:
            thread.join(WAIT)
    gc.collect()
    eventually(lambda: counts.checked_out() == 0, "the ended threads' connections back", WAIT)


def test_close_leaves_a_connection_in_use_to_its_thread(store: SqlSessionStore) -> None:
    """close() (or add_save_hook) from another thread while a thread is inside one of
    the store's transactions: that transaction goes on and commits on its connection,
    which its thread gives back as the transaction ends."""
    inside, closed = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def work() -> None:
        try:
            with store._write() as conn:
                assert store.claim_in(conn, "s-0", "inner") is False  # not saved yet
                inside.set()
                assert closed.wait(WAIT)
                conn.exec_driver_sql("SELECT 1")  # its connection is still its own
            store.save_snapshot(snapshot("s", 0, None))  # a new connection
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=work)
    thread.start()
    assert inside.wait(WAIT)
    store.close()
    closed.set()
    thread.join(WAIT)
    assert errors == []
    assert store.get_snapshot("s-0") is not None


def test_a_commit_that_fails_leaves_no_transaction_open(store: SqlSessionStore, db: Path) -> None:
    """SQLite keeps a transaction open when its COMMIT fails (a deferred constraint);
    SQLAlchemy leaves the rollback to the pool's reset, which a held connection skips."""
    with store._write() as conn:
        conn.exec_driver_sql("CREATE TABLE p (id INTEGER PRIMARY KEY)")
        conn.exec_driver_sql(
            "CREATE TABLE c (pid INTEGER REFERENCES p(id) DEFERRABLE INITIALLY DEFERRED)"
        )
    with pytest.raises(Exception, match="FOREIGN KEY"), store._write() as conn:
        conn.exec_driver_sql("INSERT INTO c VALUES (42)")
    another_store_writes(store, db)
