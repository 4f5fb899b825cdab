"""Writers of one SQLite file queue on a lock file beside it (`make_engine`): taken by
write transactions only, released on every way out of them, shared correctly by
processes and their forks."""

from __future__ import annotations

import errno
import fcntl
import multiprocessing
import os
import signal
import sqlite3
import threading
import uuid
from collections.abc import Callable
from multiprocessing.synchronize import Event as ProcessEvent
from pathlib import Path

import pytest
from sqlalchemy import func, insert, select, text
from sqlalchemy.exc import IntegrityError, OperationalError

import interlock.stores.engine
import interlock.stores.sql
from interlock import SqlSessionStore
from schemas import FinishReason, Message, Snapshot, SnapshotStatus
from tests.services import eventually
from tests.sql_helpers import checked_at_commit

WAIT = 20.0
"""Seconds a write may wait here before the test fails (below the 30 s after which a
writer would go on without the lock)."""


def lock_is_free(db: Path) -> bool:
    """Whether another open file (as another process would) can take the lock now."""
    fd = os.open(f"{db}.writelock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # releases it, if taken
    return True


def snapshot(session_id: str, i: int, parent_id: str | None) -> Snapshot:
    """The i-th snapshot of a session: i + 1 messages, all but the last inherited."""
    return Snapshot(
        snapshot_id=f"{session_id}-{i}",
        session_id=session_id,
        parent_id=parent_id,
        agent="a",
        status=SnapshotStatus.COMPLETED,
        finish_reason=FinishReason.STOP,
        inherited=i,
        messages=[
            Message.model_validate({"role": "user", "content": [{"text": f"{session_id} {n}"}]})
            for n in range(i + 1)
        ],
    )


def child_exit_code(pid: int, what: str) -> int:
    """The exit code of the forked child `pid`, which must exit within `WAIT` seconds
    (else it is killed and the test fails)."""
    status: list[int] = []

    def exited() -> bool:
        done, raw = os.waitpid(pid, os.WNOHANG)
        if done:
            status.append(os.waitstatus_to_exitcode(raw))
        return bool(status)

    try:
        eventually(exited, what, WAIT)
    finally:
        if not status:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    return status[0]


def finishes(work: Callable[[], object]) -> bool:
    """Whether `work()` completes, in a thread, within `WAIT` seconds."""
    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    thread.join(WAIT)
    return not thread.is_alive()


def test_write_transactions_hold_the_lock_reads_do_not(store: SqlSessionStore, db: Path) -> None:
    assert lock_is_free(db)
    with store.writer().begin() as conn:
        assert not lock_is_free(db)
        conn.execute(text("SELECT 1"))
    assert lock_is_free(db), "released once the transaction is over"
    with store.engine.connect() as conn, conn.begin():
        conn.execute(text("SELECT 1"))
        assert lock_is_free(db), "reads take no lock"
    with store.writer().connect() as conn:
        with conn.begin():
            assert not lock_is_free(db)
        with conn.begin():  # a second write on the connection (it already holds the lock)
            assert not lock_is_free(db)
    assert lock_is_free(db)


class Boom(Exception):
    pass


def test_a_write_that_raises_releases_the_lock(store: SqlSessionStore, db: Path) -> None:
    def fail() -> None:
        with store.writer().begin() as conn:
            conn.execute(text("SELECT 1"))
            raise Boom

    with pytest.raises(Boom):
        fail()
    assert lock_is_free(db)
    assert finishes(lambda: store.save_snapshot(snapshot("s", 0, None))), "the next write waits"


def test_a_stopped_holder_delays_writers_but_does_not_hang_them(
    store: SqlSessionStore,
    db: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Another process holds the lock file and never lets go (stopped, not dead): after
    the lock timeout a writer goes on, and SQLite's own locking decides."""
    monkeypatch.setattr(interlock.stores.engine, "_LOCK_TIMEOUT", 0.3)
    fd = os.open(f"{db}.writelock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # another open file: as another process would
        assert finishes(lambda: store.save_snapshot(snapshot("s", 0, None)))
    finally:
        os.close(fd)
    assert store.get_snapshot("s-0") is not None
    assert "not free within" in caplog.text
    assert finishes(lambda: store.save_snapshot(snapshot("s", 1, "s-0"))), "the lock works again"
    assert lock_is_free(db)


class _CountingFcntl:
    """`fcntl` as the store sees it, counting the locks it tries without waiting."""

    LOCK_EX, LOCK_NB, LOCK_UN = fcntl.LOCK_EX, fcntl.LOCK_NB, fcntl.LOCK_UN

    def __init__(self) -> None:
        self.tries = 0

    def flock(self, fd: int, operation: int) -> None:
        if operation & fcntl.LOCK_NB:
            self.tries += 1
        fcntl.flock(fd, operation)


def test_a_writer_waits_for_a_held_lock_without_polling(
    store: SqlSessionStore, db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Held by another process, the lock is waited for in one blocking call, which
    returns as the holder lets go: not by trying again and sleeping in between."""
    store.save_snapshot(snapshot("s", 0, None))  # the lock's file is open here
    counting = _CountingFcntl()
    monkeypatch.setattr(interlock.stores.engine, "fcntl", counting)
    fd = os.open(f"{db}.writelock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)  # another open file: as another process would
    writer = threading.Thread(target=store.save_snapshot, args=(snapshot("s", 1, "s-0"),))
    try:
        writer.start()
        eventually(lambda: counting.tries >= 1, "the writer tried the lock", WAIT)
        writer.join(0.3)  # meanwhile a polling writer would try again every few ms
        assert writer.is_alive(), "the writer waits while the lock is held"
    finally:
        os.close(fd)  # lets go of the lock
    writer.join(WAIT)
    assert not writer.is_alive()
    assert counting.tries == 1
    assert store.get_snapshot("s-1") is not None
    assert lock_is_free(db)


def test_a_lock_got_after_the_writer_gave_up_is_let_go(
    store: SqlSessionStore, db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wait ends at the lock timeout; when the holder lets go later, the lock the
    helper then takes is released, not kept from every other writer."""
    monkeypatch.setattr(interlock.stores.engine, "_LOCK_TIMEOUT", 0.2)
    fd = os.open(f"{db}.writelock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        assert finishes(lambda: store.save_snapshot(snapshot("s", 0, None)))
    finally:
        os.close(fd)
    eventually(lambda: lock_is_free(db), "the late lock let go", WAIT)
    other = os.open(f"{db}.writelock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(other, fcntl.LOCK_EX)  # free for another process: taken at once
    finally:
        os.close(other)
    assert finishes(lambda: store.save_snapshot(snapshot("s", 1, "s-0")))
    assert store.get_latest_snapshot("s") is not None


def test_the_helper_thread_ends_when_idle_and_starts_again(
    store: SqlSessionStore, db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The helper that waits for a contended lock ends after a while with nothing to do;
    the next contended write starts a new one, and waits as before."""
    monkeypatch.setattr(interlock.stores.engine, "_WAITER_IDLE", 0.1)
    store.save_snapshot(snapshot("s", 0, None))

    lock = interlock.stores.engine._WriteLock.beside(str(db))
    assert lock is not None

    def helpers() -> int:  # this lock's helper thread: 1 while it runs
        waiter = lock._waiter
        return int(waiter is not None and waiter._fd >= 0)

    for i in (1, 2):
        fd = os.open(f"{db}.writelock", os.O_RDWR | os.O_CREAT)
        fcntl.flock(fd, fcntl.LOCK_EX)  # held elsewhere: the write waits on the helper
        writer = threading.Thread(
            target=store.save_snapshot, args=(snapshot("s", i, f"s-{i - 1}"),)
        )
        try:
            writer.start()
            eventually(lambda: helpers() == 1, "a helper waiting for the lock", WAIT)
        finally:
            os.close(fd)
        writer.join(WAIT)
        assert not writer.is_alive()
        eventually(lambda: helpers() == 0, "the idle helper gone", WAIT)
    latest = store.get_latest_snapshot("s")
    assert latest is not None and latest.snapshot_id == "s-2"
    assert lock_is_free(db)


class _NoBlockingLocks(_CountingFcntl):
    """`fcntl` whose waiting locks fail, as with a kernel out of lock records."""

    def flock(self, fd: int, operation: int) -> None:
        if operation == fcntl.LOCK_EX:
            raise OSError(errno.ENOLCK, "No locks available")
        super().flock(fd, operation)


def test_a_helper_that_cannot_lock_lets_writers_go_on_at_once(
    store: SqlSessionStore,
    db: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The blocking flock fails: the waiting writer goes on without the lock file (SQLite
    orders the writers), at once rather than after the lock timeout, and so do later ones."""
    store.save_snapshot(snapshot("s", 0, None))
    monkeypatch.setattr(interlock.stores.engine, "fcntl", _NoBlockingLocks())
    monkeypatch.setattr(interlock.stores.engine, "_LOCK_TIMEOUT", 3600.0)
    fd = os.open(f"{db}.writelock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # held elsewhere: the writer must wait, and cannot
        assert finishes(lambda: store.save_snapshot(snapshot("s", 1, "s-0")))
        assert finishes(lambda: store.save_snapshot(snapshot("s", 2, "s-1")))
    finally:
        os.close(fd)
    assert "could not lock the file" in caplog.text
    latest = store.get_latest_snapshot("s")
    assert latest is not None and latest.snapshot_id == "s-2"


def test_a_failed_commit_releases_the_lock(store: SqlSessionStore, db: Path) -> None:
    child = checked_at_commit(store)

    def orphan() -> None:
        with store.writer().begin() as conn:
            conn.execute(insert(child).values(parent="missing"))  # checked at COMMIT

    with pytest.raises(IntegrityError):
        orphan()
    assert lock_is_free(db)
    assert finishes(lambda: store.save_snapshot(snapshot("s", 0, None)))


def test_a_write_that_cannot_begin_is_a_store_failure(store: SqlSessionStore, db: Path) -> None:
    """`BEGIN IMMEDIATE` runs from SQLAlchemy's `begin` event. When it fails (here
    another program, outside the lock file, holds SQLite's write lock past the
    connection's busy timeout), the error is SQLAlchemy's, as for any statement: a
    store failure (retried), the lock file let go, and the store usable afterwards."""
    from interlock.stores.failures import is_store_failure

    with store.engine.connect() as conn:  # the pool's one warm connection: wait 10 ms
        conn.exec_driver_sql("PRAGMA busy_timeout = 10")
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    caught: Exception | None = None
    try:
        with store.writer().begin() as conn:
            conn.execute(text("SELECT 1"))
    except Exception as exc:  # which type is the point: not the driver's own
        caught = exc
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert isinstance(caught, OperationalError), repr(caught)
    assert "locked" in str(caught)
    assert is_store_failure(caught)
    assert lock_is_free(db)
    assert finishes(lambda: store.save_snapshot(snapshot("s", 0, None)))


def test_an_invalidated_connection_releases_the_lock(store: SqlSessionStore, db: Path) -> None:
    with store.writer().connect() as conn:
        conn.begin()
        assert not lock_is_free(db)
        conn.invalidate()
        assert lock_is_free(db)
    assert finishes(lambda: store.save_snapshot(snapshot("s", 0, None)))


def test_a_connection_closed_mid_write_releases_the_lock(store: SqlSessionStore, db: Path) -> None:
    conn = store.writer().connect()
    conn.begin()
    conn.execute(text("SELECT 1"))
    conn.close()  # rolled back on its way to the pool
    assert lock_is_free(db)
    assert finishes(lambda: store.save_snapshot(snapshot("s", 0, None)))


def _write_sessions(url: str, session_id: str, count: int, start: ProcessEvent) -> None:
    store = SqlSessionStore(url)
    start.wait(60)
    parent: str | None = None
    for i in range(count):
        store.save_snapshot(snapshot(session_id, i, parent))
        parent = f"{session_id}-{i}"
    store.close()


def test_processes_writing_at_once_stay_correct(store: SqlSessionStore, db: Path) -> None:
    count = 60
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Event()
    sessions = [f"p{n}-{uuid.uuid4().hex[:6]}" for n in range(3)]
    writers = [
        ctx.Process(target=_write_sessions, args=(f"sqlite:///{db}", sid, count, start))
        for sid in sessions[:2]
    ]
    for writer in writers:
        writer.start()
    start.set()
    _write_sessions(f"sqlite:///{db}", sessions[2], count, start)  # and this process too
    for writer in writers:
        writer.join(timeout=120)
        assert writer.exitcode == 0

    assert Path(f"{db}.writelock").exists()
    for sid in sessions:
        last = store.get_latest_snapshot(sid)
        assert last is not None
        assert last.snapshot_id == f"{sid}-{count - 1}"
        assert [m.content[0].text for m in last.messages] == [f"{sid} {n}" for n in range(count)]
    with store.engine.connect() as conn:
        total = conn.execute(select(func.count()).select_from(interlock.stores.sql._SNAP)).scalar()
    assert total == 3 * count


def test_a_forked_child_gets_a_lock_of_its_own(store: SqlSessionStore, db: Path) -> None:
    """Forked while this process holds the lock: the child's write waits for the
    parent to release it, not (for the 30 s before giving up) on its copy of the
    parent's thread lock."""
    store.save_snapshot(snapshot("parent", 0, None))  # the lock's file is open here
    lock = interlock.stores.engine._WriteLock.beside(str(db))
    assert lock is not None
    holder = object()
    lock.acquire(holder)  # as a write transaction of another thread would
    pid = os.fork()
    if pid == 0:  # the child: write on the parent's store, then leave at once
        code = 1
        try:
            store.engine.dispose(close=False)  # the parent's pooled connections are not ours
            store.save_snapshot(snapshot("child", 0, None))
            code = 0
        finally:
            os._exit(code)
    lock.release(holder)
    assert child_exit_code(pid, "write of the child") == 0, "the child wrote"
    assert store.get_snapshot("child-0") is not None


def test_without_flock_writers_rely_on_sqlite(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(interlock.stores.engine, "fcntl", None)
    db = tmp_path / "plain.db"
    store = SqlSessionStore(f"sqlite:///{db}")
    try:
        store.save_snapshot(snapshot("s", 0, None))
        assert store.get_snapshot("s-0") is not None
    finally:
        store.close()
    assert not Path(f"{db}.writelock").exists()


def test_a_lock_file_that_cannot_be_opened_leaves_ordering_to_sqlite(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "odd.db"
    Path(f"{db}.writelock").mkdir()  # not a file: it cannot be opened for writing
    store = SqlSessionStore(f"sqlite:///{db}")
    try:
        for i in range(3):
            store.save_snapshot(snapshot("s", i, f"s-{i - 1}" if i else None))
        assert store.get_latest_snapshot("s") is not None
    finally:
        store.close()
    assert sum("cannot lock" in r.getMessage() for r in caplog.records) == 1, "said once"
