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


class HeldConnections:
    """Per thread, one `Connection` of `engine` that stays checked out between
    transactions, for up to `limit` threads at once."""

    def __init__(self, engine: Engine, limit: int) -> None:
        self.engine = engine
        self.limit = limit
        self._local = threading.local()
        self._open: weakref.WeakSet[Connection] = weakref.WeakSet()
        self._lock = threading.Lock()
        _ALL.add(self)

    @contextmanager
    def begin(self, engine: Engine, *, write: bool, relaxed: bool = False) -> Iterator[Connection]:
        """A transaction with the execution options `interlock_write=write` and
        `interlock_relaxed=relaxed`, committed when the block ends (rolled back on an
        error), on this thread's connection; on a connection of `engine` (the store's
        engine with those options) when this thread holds none (past `limit`) or its
        connection is in a transaction already."""
        conn = self._connection()
        if conn is None or conn.in_transaction():
            with engine.begin() as own:
                yield own
            return
        local: Any = self._local
        if local.options != (write, relaxed):  # set only when they change: not free
            conn.execution_options(interlock_write=write, interlock_relaxed=relaxed)
            local.options = (write, relaxed)
        try:
            with conn.begin():
                yield conn
        finally:
            if write:
                end_write(conn)  # no return to the pool to release the write lock

    def _connection(self) -> Connection | None:
        local: Any = self._local
        conn: Connection | None = getattr(local, "conn", None)
        pid = os.getpid()
        if conn is not None and local.pid != pid:
            _INHERITED.append(conn)  # a forked child's copy of the parent's connection
            conn = local.conn = None
        if conn is not None and (conn.closed or conn.invalidated):
            conn.close()
            conn = local.conn = None
        if conn is None:
            with self._lock:
                if len(self._open) >= self.limit:
                    return None
                conn = self.engine.connect()
                self._open.add(conn)
            local.conn, local.pid, local.options = conn, pid, None
        return conn

    def close(self) -> None:
        """Return every thread's connection to the pool (none may be in a transaction);
        a thread that uses the store again checks out a new one."""
        with self._lock:
            conns = list(self._open)
            self._open.clear()
        for conn in conns:
            conn.close()


_ALL: weakref.WeakSet[HeldConnections] = weakref.WeakSet()


def _after_fork() -> None:
    """In a forked child: the parent's connections are not ours to count or close, and
    a lock another thread of the parent held would never be released."""
    for held in list(_ALL):
        held._lock = threading.Lock()
        held._open = weakref.WeakSet()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)
