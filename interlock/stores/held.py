"""One connection per thread, kept open between transactions, for a SQLite file store.

Checking a connection out of SQLAlchemy's pool and building a `Connection` around it,
then handing it back, costs a transaction more Python than SQLite takes to run one of
the store's statements; keeping each thread's connection checked out skips that, and
keeps the connection's page cache warm. The connections are the store's engine's own
(its events see every statement), at most as many as the pool keeps (`pool_size`):
threads beyond that check one out per transaction, as before.

A thread's connection goes back to the pool when the thread ends (its thread-local is
collected) or the store closes. A transaction begun while the thread's connection is
already in one (a save hook reading the store, say) runs on a connection of its own.
After a fork the child checks out connections of its own; the parent's are never used
or closed there.
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


class _Slot:
    """A thread's held connection. When the thread-local lets go of it (the thread
    ended, or the connection is replaced) the connection goes back to the pool, in the
    process that checked it out; in a forked child, whose start lets go of the parent's
    other threads' slots, it is kept untouched instead (giving it back there could wait
    for a pool lock a parent thread held at the fork, and would hand the parent's
    connection to the child's pool)."""

    __slots__ = ("__weakref__", "conn", "options", "pid")

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.pid = os.getpid()
        self.options: tuple[bool, bool] | None = None
        weakref.finalize(self, _give_back, conn, self.pid).atexit = False


def _give_back(conn: Connection, pid: int) -> None:
    if os.getpid() != pid:
        _INHERITED.append(conn)
    else:
        conn.close()


class HeldConnections:
    """Per thread, one `Connection` of `engine` that stays checked out between
    transactions, for up to `limit` threads at once."""

    def __init__(self, engine: Engine, limit: int) -> None:
        self.engine = engine
        self.limit = limit
        self._local = threading.local()
        self._open: weakref.WeakSet[_Slot] = weakref.WeakSet()
        self._lock = threading.Lock()
        _ALL.add(self)

    @contextmanager
    def begin(self, engine: Engine, *, write: bool, relaxed: bool = False) -> Iterator[Connection]:
        """A transaction with the execution options `interlock_write=write` and
        `interlock_relaxed=relaxed`, committed when the block ends (rolled back on an
        error), on this thread's connection; on a connection of `engine` (the store's
        engine with those options) when this thread holds none (past `limit`) or its
        connection is in a transaction already."""
        slot = self._slot()
        if slot is None or slot.conn.in_transaction():
            with engine.begin() as own:
                yield own
            return
        conn = slot.conn
        if slot.options != (write, relaxed):  # set only when they change: not free
            conn.execution_options(interlock_write=write, interlock_relaxed=relaxed)
            slot.options = (write, relaxed)
        try:
            with conn.begin():
                yield conn
        finally:
            if write:
                end_write(conn)  # no return to the pool to release the write lock

    def _slot(self) -> _Slot | None:
        local: Any = self._local
        slot: _Slot | None = getattr(local, "slot", None)
        if slot is not None and (
            slot.pid != os.getpid() or slot.conn.closed or slot.conn.invalidated
        ):
            slot = local.slot = None  # given back (or, in a forked child, kept) as it goes
        if slot is None:
            with self._lock:
                if len(self._open) >= self.limit:
                    return None
                slot = _Slot(self.engine.connect())
                self._open.add(slot)
            local.slot = slot
        return slot

    def close(self) -> None:
        """Return every thread's connection to the pool (none may be in a transaction);
        a thread that uses the store again checks out a new one."""
        with self._lock:
            slots = list(self._open)
            self._open.clear()
        for slot in slots:
            slot.conn.close()


_ALL: weakref.WeakSet[HeldConnections] = weakref.WeakSet()


def _after_fork() -> None:
    """In a forked child: the parent's connections are not ours to count or close, and
    a lock another thread of the parent held would never be released."""
    for held in list(_ALL):
        held._lock = threading.Lock()
        held._open = weakref.WeakSet()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)
