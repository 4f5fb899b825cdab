"""One connection per thread, kept open between transactions, for a SQLite file store.

Checking a connection out of SQLAlchemy's pool and building a `Connection` around it,
then handing it back, costs a transaction more Python than SQLite takes to run one of
the store's statements; keeping each thread's connection checked out skips that, and
keeps the connection's page cache warm. The connections are the store's engine's own
(its events see every statement), at most as many as the pool keeps (`pool_size`):
threads beyond that check one out per transaction, as before.

A thread's connection goes back to the pool when the thread ends (its thread-local is
collected) or the store closes. Only the thread that holds a connection uses it or
gives it back while it is in a transaction: `close()` from another thread returns the
idle ones at once and leaves the busy ones to their threads, which give them back as
their transaction ends. A transaction begun while the thread's connection is already
in one (a save hook reading the store, say) runs on a connection of its own. After a
fork the child checks out connections of its own; the parent's are never used, closed
or given back to the pool there (not even those of the parent's other threads, whose
thread-locals the child collects as it starts).
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy.engine import Connection, Engine

from .engine import end_write

__all__ = ["HeldConnections"]

# Connections a forked child inherited from its parent: kept referenced, never closed
# (closing a SQLite connection another process opened can disturb that process).
_INHERITED: list[Connection] = []


def _give_back(conn: Connection, pid: int) -> None:
    """The thread that held `conn` ended (its slot was collected): return it to the
    pool, in the process that checked it out; in a forked child, keep it untouched."""
    if os.getpid() != pid:
        _INHERITED.append(conn)
        return
    conn.close()


def _end_transaction(conn: Connection) -> None:
    """Roll back what SQLite still holds open once SQLAlchemy's transaction has ended: a
    COMMIT that failed (a deferred constraint, SQLITE_BUSY) leaves it open, and
    SQLAlchemy counts on the pool's reset at checkin, which a held connection skips;
    left open, it would keep SQLite's write lock (and its snapshot) for good."""
    if conn.closed or conn.invalidated:
        return
    dbapi: Any = conn.connection.dbapi_connection
    if dbapi is not None and dbapi.in_transaction:
        try:
            dbapi.rollback()
        except Exception:
            conn.invalidate()  # the pool closes it; the thread checks out another


class _Slot:
    """A thread's held connection, with what its owner and `close()` agree on."""

    __slots__ = ("__weakref__", "busy", "conn", "finalizer", "generation", "options", "pid")

    def __init__(self, conn: Connection, generation: int) -> None:
        self.conn = conn
        self.pid = os.getpid()
        self.generation = generation
        self.busy = False  # in one of the store's transactions, on its own thread
        self.options: tuple[bool, bool] | None = None
        # Not a reference to the slot: given back when the thread-local lets go of it.
        self.finalizer = weakref.finalize(self, _give_back, conn, self.pid)
        self.finalizer.atexit = False


class HeldConnections:
    """Per thread, one `Connection` of `engine` that stays checked out between
    transactions, for up to `limit` threads at once."""

    def __init__(self, engine: Engine, limit: int) -> None:
        self.engine = engine
        self.limit = limit
        self._local = threading.local()
        self._open: weakref.WeakSet[_Slot] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._generation = 0  # bumped by close(): older slots are given back
        self._disabled = False
        _ALL.add(self)

    @contextmanager
    def begin(self, engine: Engine, *, write: bool, relaxed: bool = False) -> Iterator[Connection]:
        """A transaction with the execution options `interlock_write=write` and
        `interlock_relaxed=relaxed`, committed when the block ends (rolled back on an
        error), on this thread's connection; on a connection of `engine` (the store's
        engine with those options) when this thread holds none (past `limit`, or after
        `disable()`) or its connection is in a transaction already."""
        slot = self._take()
        if slot is None:
            with engine.begin() as own:
                yield own
            return
        try:
            conn = slot.conn
            if slot.options != (write, relaxed):  # set only when they change: not free
                conn.execution_options(interlock_write=write, interlock_relaxed=relaxed)
                slot.options = (write, relaxed)
            try:
                with conn.begin():
                    yield conn
            finally:
                _end_transaction(conn)
                if write:
                    end_write(conn)  # no return to the pool to release the write lock
        finally:
            self._put(slot)
            del slot  # a traceback kept of this frame must not keep the slot alive

    def _slot(self) -> _Slot | None:
        """This thread's slot, made if there is room; under `_lock`."""
        local: Any = self._local
        slot: _Slot | None = getattr(local, "slot", None)
        if slot is not None:
            if slot.pid != os.getpid():  # the parent's, in a forked child
                slot = local.slot = None
            elif slot.busy:
                return slot
            elif slot.generation != self._generation:  # closed by close()
                slot = local.slot = None
            elif slot.conn.closed or slot.conn.invalidated:
                self._open.discard(slot)
                slot.finalizer.detach()
                slot.conn.close()
                slot = local.slot = None
        if slot is None:
            if self._disabled or len(self._open) >= self.limit:
                return None
            slot = local.slot = _Slot(self.engine.connect(), self._generation)
            self._open.add(slot)
        return slot

    def _take(self) -> _Slot | None:
        with self._lock:
            slot = self._slot()
            if slot is None or slot.busy:
                return None  # past the limit, or a transaction inside another
            slot.busy = True
            return slot

    def _put(self, slot: _Slot) -> None:
        with self._lock:
            slot.busy = False
            if slot.generation == self._generation:
                return
        # close() ran while this thread used it: give it back now, from this thread.
        slot.finalizer.detach()
        slot.conn.close()

    def _connection(self) -> Connection | None:
        """This thread's connection (for tests), made if there is room."""
        with self._lock:
            slot = self._slot()
        return None if slot is None else slot.conn

    def close(self) -> None:
        """Return every thread's connection to the pool: the idle ones now, those in a
        transaction when it ends (by their own thread); a thread that uses the store
        again checks out a new one."""
        with self._lock:
            self._generation += 1
            slots = list(self._open)
            self._open.clear()
            idle = [s for s in slots if not s.busy]
            for slot in idle:  # detached here: an owner dropping its slot now closes nothing
                slot.finalizer.detach()
        for slot in idle:  # their owners no longer use them: the generation changed
            slot.conn.close()

    def disable(self) -> None:
        """`close()`, and hold no connection from now on."""
        with self._lock:
            self._disabled = True
        self.close()


_ALL: weakref.WeakSet[HeldConnections] = weakref.WeakSet()


def _after_fork() -> None:
    """In a forked child: the parent's connections are not ours to count or close, and
    a lock another thread of the parent held would never be released."""
    for held in list(_ALL):
        held._lock = threading.Lock()
        held._open = weakref.WeakSet()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)
