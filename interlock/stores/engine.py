"""The engines the SQL stores run on: SQLite configured for many writers (WAL, a lock
file writers queue on, `synchronous` from the URL, commits that need not wait for the
disk where a write says so) and PostgreSQL (idle connections pinged, relaxed writes
with `synchronous_commit` off). `make_engine` is also `interlock.stores.sql.make_engine`.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
import time
import weakref
from functools import partial
from typing import Any, ClassVar

from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import InvalidatePoolError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from sqlalchemy.pool import ConnectionPoolEntry, StaticPool
from sqlmodel import create_engine

from schemas import Status

from ..errors import StatusError

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: writers queue in SQLite's busy handler
    fcntl = None  # type: ignore[assignment]

__all__ = ["PING_AFTER", "end_write", "make_engine", "sqlite_file"]

_log = logging.getLogger("interlock.stores.sql")


PG_CONNECT_TIMEOUT = 10
"""Seconds a new PostgreSQL connection may take (libpq's `connect_timeout`, unless the
URL gives its own): a server that takes the connection and never answers fails the
transaction that wanted it, a store failure the caller retries, where psycopg would wait
for minutes, or for good."""

PG_KEEPALIVES: dict[str, int] = {
    "keepalives": 1,
    "keepalives_idle": 30,
    "keepalives_interval": 10,
    "keepalives_count": 3,
    "tcp_user_timeout": 60_000,
}
"""libpq's TCP settings for every PostgreSQL connection through libpq (psycopg; a URL's
own win): a host that has gone (its machine down, its address moved by a failover) is
given up on within a minute and a half, a store failure the caller retries, where the
kernel's defaults waited some two hours for the reply to a request the host had
acknowledged before it went, and a quarter of an hour for one it never acknowledged.
A server that is up but slow, or stopped on a machine still up, answers them: such a
wait is not cut, unless a request too large for the network's buffers lies unread for
the user timeout."""

_RELAXED = "SET LOCAL synchronous_commit TO OFF"
"""What a relaxed write transaction runs first on PostgreSQL."""


def make_engine(url: str, **kwargs: Any) -> Engine:
    """An engine configured the way the store needs it.

    SQLite: a 30 s busy timeout, WAL journal, foreign keys on, and SQLAlchemy (not the
    driver) emitting BEGIN, so writes start with `BEGIN IMMEDIATE` and racing writers
    queue instead of failing with "database is locked". Writers of a database file
    first take a lock file beside it (`<path>.writelock`, see `_WriteLock`), so they
    queue in the kernel rather than in SQLite's polling busy handler. An in-memory
    SQLite URL shares one connection, one thread at a time. `?synchronous=normal` (or `off`, `full`,
    `extra`) in a SQLite URL sets that pragma on every connection; SQLite's default,
    FULL, waits for the disk at every commit. PostgreSQL (`postgresql+psycopg://...`):
    connecting gives up after `PG_CONNECT_TIMEOUT` seconds (unless the URL says
    `connect_timeout`), a host gone silent is given up on by TCP (`PG_KEEPALIVES`),
    and a pooled connection that sat idle for `PING_AFTER` seconds
    or more is pinged before use (`pool_pre_ping=True` pings at every checkout instead).

    Both hand out the most recently returned pooled connection first (`pool_use_lifo`,
    unless `poolclass` is given): a thread doing one transaction after another keeps
    one warm connection (SQLite reloads the pages a connection cached once another
    connection has written, so rotating through the pool costs reads), and the others
    sit idle, to be pinged or dropped, instead of taking turns.
    """
    sa_url = make_url(url)
    if "poolclass" not in kwargs:
        kwargs.setdefault("pool_use_lifo", True)
    if sa_url.get_backend_name() == "postgresql":
        ping_idle = "pool_pre_ping" not in kwargs
        pg_args = dict(kwargs.pop("connect_args", {}))
        defaults: dict[str, int] = {"connect_timeout": PG_CONNECT_TIMEOUT}
        if sa_url.get_driver_name() in ("psycopg", "psycopg2"):  # libpq's own names
            defaults.update(PG_KEEPALIVES)
        for name, value in defaults.items():
            if name not in sa_url.query:
                pg_args.setdefault(name, value)
        kwargs["connect_args"] = pg_args
        pg_engine = create_engine(sa_url, **kwargs)
        if ping_idle:
            _ping_when_idle(pg_engine)

        @event.listens_for(pg_engine, "begin")
        def _on_pg_begin(conn: Connection) -> None:
            if conn.get_execution_options().get("interlock_relaxed", False):
                cursor = conn.connection.cursor()
                try:  # the driver opens the transaction with it
                    cursor.execute(_RELAXED)
                except BaseException as exc:
                    # SQLAlchemy does not see what this event runs: wrap the driver's
                    # error as its own are (a lost connection is then invalidated, and
                    # is a store failure, retried), not let it out raw.
                    conn._handle_dbapi_exception(exc, _RELAXED, None, cursor, None)
                finally:
                    cursor.close()

        return pg_engine
    if sa_url.get_backend_name() != "sqlite":
        return create_engine(sa_url, **kwargs)

    synchronous = sa_url.query.get("synchronous")
    if synchronous is not None:
        if not isinstance(synchronous, str) or synchronous.lower() not in _SYNCHRONOUS:
            raise StatusError(
                Status.INVALID_ARGUMENT,
                f"synchronous={synchronous!r} in the store URL: use one of "
                + ", ".join(_SYNCHRONOUS),
            )
        synchronous = synchronous.lower()
        sa_url = sa_url.difference_update_query(["synchronous"])

    memory = sa_url.database in (None, "", ":memory:") or "mode=memory" in str(sa_url)
    connect_args = dict(kwargs.pop("connect_args", {}))
    connect_args.setdefault("timeout", 30)
    if memory:
        connect_args.setdefault("check_same_thread", False)
        if kwargs.get("poolclass") is None:
            kwargs.pop("pool_use_lifo", None)  # one shared connection: no order to choose
            kwargs["poolclass"] = _SharedMemoryPool
    engine = create_engine(sa_url, connect_args=connect_args, **kwargs)
    write_lock = _WriteLock.beside(sa_url.database) if not memory else None

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: ConnectionPoolEntry) -> None:
        dbapi_conn.isolation_level = None  # the driver no longer emits BEGIN; we do
        cur = dbapi_conn.cursor()
        try:
            cur.execute("PRAGMA busy_timeout = 30000")
            if not memory:
                cur.execute("PRAGMA journal_mode = WAL")
            if synchronous is not None:
                cur.execute(f"PRAGMA synchronous = {synchronous}")  # one of _SYNCHRONOUS
            cur.execute("PRAGMA foreign_keys = ON")
            cur.execute("PRAGMA synchronous")
            _record.info["interlock_sync"] = _record.info["interlock_sync_default"] = int(
                cur.fetchone()[0]
            )
            _record.info["interlock_write_lock"] = write_lock  # for `end_write`
        finally:
            cur.close()

    def _sync_for(conn: Connection, write: bool) -> str | None:
        """The PRAGMA to run before this write transaction, if its connection must
        change its `synchronous` level: relaxed writes do not wait for the disk (NORMAL,
        when the database's level is above it); other writes have the database's level.
        Reads commit nothing: they leave the level as it is."""
        if not write:
            return None
        info = conn.connection.info
        want = info["interlock_sync_default"]
        if conn.get_execution_options().get("interlock_relaxed", False):
            want = min(want, _NORMAL)
        if info.get("interlock_sync") == want:
            return None
        info["interlock_sync"] = want
        return f"PRAGMA synchronous = {want}"

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        write = conn.get_execution_options().get("interlock_write", False)
        dbapi_conn = conn.connection.dbapi_connection
        if write_lock is not None:
            if write:
                write_lock.acquire(dbapi_conn)
            else:
                write_lock.release(dbapi_conn)  # a write before it on this connection ended
        # Straight to the driver: this runs for every transaction, and SQLAlchemy's
        # statement machinery would cost more than the BEGIN itself.
        statement: str | None = None
        try:
            cursor = conn.connection.cursor()
            try:
                statement = _sync_for(conn, write)
                if statement is not None:
                    cursor.execute(statement)
                statement = "BEGIN IMMEDIATE" if write else "BEGIN"
                cursor.execute(statement)
            finally:
                cursor.close()
        except BaseException as exc:
            if write_lock is not None:
                write_lock.release(dbapi_conn)
            if statement is None:
                raise
            # As SQLAlchemy raises its own statements' errors (a locked or broken
            # database is then a store failure), not the driver's raw.
            conn._handle_dbapi_exception(exc, statement, None, None, None)

    if write_lock is not None:
        write_lock.listen(engine)
    return engine


def sqlite_file(url: str) -> bool:
    """Whether `url` is a SQLite database in a file (not in memory)."""
    sa_url = make_url(url)
    if sa_url.get_backend_name() != "sqlite":
        return False
    return not (sa_url.database in (None, "", ":memory:") or "mode=memory" in str(sa_url))


def end_write(conn: Connection) -> None:
    """Let the next writer of the file in, after a write transaction on `conn` ended
    (committed or rolled back) while `conn` stays checked out: the lock is otherwise
    released when a connection goes back to the pool."""
    if conn.closed or conn.invalidated:
        return  # released as the connection was invalidated or closed
    lock: _WriteLock | None = conn.connection.info.get("interlock_write_lock")
    if lock is not None:
        lock.release(conn.connection.dbapi_connection)


PING_AFTER = 1.0
"""Seconds a pooled PostgreSQL connection may sit idle and still be used without a ping.
A busy worker reuses its connections within milliseconds: pinging each checkout would
cost a round trip per transaction (about a tenth of a turn's). A connection lost while
in use, or within this time (the server restarted), fails that one operation with a
disconnect error, and the pool replaces all of its connections: workers retry the
turn, consumers requeue the decision."""


class _SharedMemoryPool(StaticPool):
    """The pool of an in-memory SQLite database: its one connection, shared by every
    thread, held by one thread at a time from checkout to checkin (a second thread
    waits, up to `timeout` seconds), so two threads never run a transaction on it at
    once. Taken before the pool hands the connection out: StaticPool keeps one record,
    and two threads holding it at once would confuse its bookkeeping. A plain lock, not
    a thread's own: a connection given back from another thread (by the garbage
    collector) frees it too. One thread should not hold two connections of it at once
    (StaticPool then loses track of the first, and so would this lock)."""

    timeout = 30.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lock = threading.Lock()
        self._holder: int | None = None
        self._depth = 0

    def _do_get(self) -> Any:
        me = threading.get_ident()
        if self._holder == me:
            self._depth += 1
        else:
            if not self._lock.acquire(timeout=self.timeout):
                raise PoolTimeoutError(
                    f"the in-memory SQLite database was held by another thread for "
                    f"{self.timeout:.0f}s"
                )
            self._holder, self._depth = me, 1
        try:
            return super()._do_get()
        except BaseException:
            self._let_go()
            raise

    def _do_return_conn(self, record: Any) -> None:
        try:
            super()._do_return_conn(record)
        finally:
            self._let_go()

    def _let_go(self) -> None:
        self._depth -= 1
        if self._depth <= 0:
            self._holder, self._depth = None, 0
            with contextlib.suppress(RuntimeError):  # already free
                self._lock.release()


def _ping_when_idle(engine: Engine) -> None:
    """Ping a connection at checkout when it sat idle in the pool for `PING_AFTER`
    seconds or more; a dead one, and every connection older than it, is replaced before
    anyone uses it (SQLAlchemy's recipe for pessimistic disconnect handling, with
    `InvalidatePoolError` as its own pre-ping raises)."""

    def on_checkin(_dbapi_conn: Any, record: ConnectionPoolEntry) -> None:
        record.info["interlock_idle_since"] = time.monotonic()

    def on_checkout(dbapi_conn: Any, record: ConnectionPoolEntry, _proxy: Any) -> None:
        since = record.info.pop("interlock_idle_since", None)
        if since is None or time.monotonic() - since < PING_AFTER:
            return  # new, or used a moment ago
        try:
            engine.dialect.do_ping(dbapi_conn)
        except engine.dialect.loaded_dbapi.Error as exc:
            # The server dropped it: it likely dropped the others too (a restart), some of
            # them used too recently to be pinged. Retire every connection made before
            # now, as SQLAlchemy's own pre-ping does, and check out a new one.
            raise InvalidatePoolError(f"idle connection is gone: {exc}") from exc

    event.listen(engine, "checkin", on_checkin)
    event.listen(engine, "checkout", on_checkout)


_SYNCHRONOUS = ("off", "normal", "full", "extra")
"""SQLite's `synchronous` settings a store URL may ask for."""

_NORMAL = 1
"""SQLite's `synchronous=NORMAL`: under WAL, a commit is safe from a crash of the
process, not from one of the machine, until the next commit that waits for the disk
(every earlier commit is then on the disk too: the log is written in order)."""


class _WriteLock:
    """Writers of one SQLite file queue on an exclusive `flock` of a lock file beside it
    (within a process, first on a thread lock: a flock belongs to an open file, which
    the process's threads share) before they `BEGIN IMMEDIATE`.

    Without it, a writer that finds the database locked sleeps in SQLite's busy handler,
    polling with sleeps of up to 100 ms, while the holder may be done in one; a writer
    waiting on the flock wakes as soon as it is released (a blocking `flock`, made by a
    helper thread so that the wait can end at a deadline). The lock is taken when a write
    transaction begins, and released when its connection goes back to the pool (right
    after its COMMIT or ROLLBACK; `end_write`, for a connection held between
    transactions), begins a read, is invalidated or closed: never later
    than SQLite's own lock. A thread that cannot get the lock within the busy timeout
    goes on without it, as do programs that do not know it: SQLite's locking stays the
    authority, this only orders the waiting. One object per file and process, shared by
    its engines; after a fork the child opens the file again.
    """

    _by_path: ClassVar[weakref.WeakValueDictionary[str, _WriteLock]] = weakref.WeakValueDictionary()
    _registry_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd = -1  # opened on first use, in the process that uses it
        self._threads = threading.Lock()
        self._holder: Any = None  # the DBAPI connection whose transaction holds the lock
        self._unusable = False  # the file cannot be opened or locked: SQLite alone orders
        self._waiter: _FlockWaiter | None = None  # started at the first contended lock

    def __del__(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)

    @classmethod
    def beside(cls, database: str | None) -> _WriteLock | None:
        """The lock of the database file `database`; None where there is no `flock`."""
        if fcntl is None or not database or database.startswith("file:"):
            return None
        path = os.path.abspath(database) + ".writelock"
        with cls._registry_lock:
            lock = cls._by_path.get(path)
            if lock is None:
                lock = cls._by_path[path] = cls(path)
        return lock

    def acquire(self, holder: Any) -> None:
        if self._holder is holder or self._unusable:
            return  # holder: a second write transaction on a connection still checked out
        if not self._threads.acquire(timeout=_LOCK_TIMEOUT):
            _log.warning("%s: no turn within %.0fs; writing without it", self.path, _LOCK_TIMEOUT)
            return
        try:
            if self._fd < 0:
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            if not self._flock(time.monotonic() + _LOCK_TIMEOUT):
                self._threads.release()
                _log.warning(
                    "%s: not free within %.0fs; writing without it", self.path, _LOCK_TIMEOUT
                )
                return
        except OSError as exc:
            self._threads.release()
            self._unusable = True
            _log.warning("%s: cannot lock (%s); writers queue in SQLite instead", self.path, exc)
            return
        except BaseException:
            self._threads.release()
            raise
        self._holder = holder

    def _flock(self, deadline: float) -> bool:
        """Lock the file, waiting until `deadline` at most (a holder that is stopped,
        not dead, must not hang every writer: past the deadline SQLite's busy timeout
        decides). Free, it is taken at once; held, a helper thread waits for it in a
        blocking `flock`, so this writer goes on the moment the holder lets go."""
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            pass
        if self._waiter is None:
            self._waiter = _FlockWaiter(self._fd)
        if self._waiter.wait(deadline - time.monotonic()):
            return True
        if self._waiter.broken:  # the caller stops using the lock file
            raise OSError(errno.ENOLCK, "the write lock's helper could not lock the file")
        return False

    def release(self, holder: Any) -> None:
        if holder is None or self._holder is not holder:
            return
        self._holder = None
        try:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            self._threads.release()

    def listen(self, engine: Engine) -> None:
        """Release on every path a connection leaves its transaction by, errors included."""

        def on_checkin(dbapi_conn: Any, _record: ConnectionPoolEntry) -> None:
            self.release(dbapi_conn)

        def on_invalidate(dbapi_conn: Any, _record: ConnectionPoolEntry, _exc: Any) -> None:
            self.release(dbapi_conn)

        def on_close(dbapi_conn: Any, *_: Any) -> None:
            self.release(dbapi_conn)

        event.listen(engine, "checkin", on_checkin)
        event.listen(engine, "invalidate", on_invalidate)
        event.listen(engine, "close", on_close)
        event.listen(engine, "close_detached", on_close)

    @classmethod
    def _after_fork(cls) -> None:
        """In a forked child: the parent's open files and thread locks are not ours (a
        flock the parent held stays the parent's until it releases it)."""
        cls._registry_lock = threading.Lock()
        for lock in list(cls._by_path.values()):
            if lock._fd >= 0:
                os.close(lock._fd)
            lock._fd = -1
            lock._threads = threading.Lock()
            lock._holder = None
            if lock._waiter is not None:
                lock._waiter.forget()
            lock._waiter = None  # its thread is the parent's


class _FlockWaiter:
    """A daemon thread that takes a contended flock with a blocking call, for the one
    thread of the process that waits for it (`_WriteLock` lets one in at a time).

    The waiting thread gives up at its deadline; a lock the helper gets after that is
    let go at once, unless a later waiter is waiting for it by then. The helper locks
    through a duplicate of the lock's descriptor (the same open file, so the same
    flock): whichever thread took it, the waiter holds it and releases it as usual. The
    thread ends after `_WAITER_IDLE` seconds with no request, and starts again at the
    next one."""

    def __init__(self, fd: int) -> None:
        self._lock_fd = fd
        self._fd = -1  # the helper's duplicate, while its thread runs
        self._cv = threading.Condition()
        self._requested = 0  # the number of the latest request
        self._waiting = 0  # the request whose thread waits now (0: none)
        self._granted = 0  # the request the lock was taken for
        self.broken = False  # flock failed in the helper: callers go on at once

    def wait(self, timeout: float) -> bool:
        """Whether the lock was taken for this caller within `timeout` seconds."""
        with self._cv:
            if self._fd < 0:
                self._fd = os.dup(self._lock_fd)
                name = "interlock-writelock"
                threading.Thread(target=self._run, args=(self._fd,), name=name, daemon=True).start()
            self._requested += 1
            ticket = self._waiting = self._requested
            self._cv.notify_all()
            done = self._cv.wait_for(
                lambda: self._granted == ticket or self.broken, max(timeout, 0.0)
            )
            if done and self._granted == ticket:
                return True
            self._waiting = 0  # gone on without it: the helper lets go of a late lock
            return False

    def _run(self, fd: int) -> None:
        served = 0
        while True:
            with self._cv:
                if not self._cv.wait_for(partial(_newer, self, served), _WAITER_IDLE):
                    if self._fd == fd:
                        self._fd = -1
                    os.close(fd)
                    return
                served = self._requested
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except OSError as exc:  # no lock to be had (ENOLCK): writers go on without
                _log.warning("write lock helper: %s; writers queue in SQLite instead", exc)
                with self._cv:
                    self.broken = True
                    self._fd = -1
                    self._cv.notify_all()
                os.close(fd)
                return
            with self._cv:
                if self._waiting:
                    self._granted = self._waiting
                    served = self._requested  # asked for while it waited: answered too
                    self._cv.notify_all()
                else:
                    fcntl.flock(fd, fcntl.LOCK_UN)

    def forget(self) -> None:
        """In a forked child: close the parent's helper's descriptor (kept open, it
        would keep a lock the parent dies holding), without touching its thread."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _newer(waiter: _FlockWaiter, served: int) -> bool:
    return waiter._requested > served


_WAITER_IDLE = 10.0
"""Seconds a write lock's helper thread waits for a request before it ends."""


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_WriteLock._after_fork)

_LOCK_TIMEOUT = 30.0
"""Seconds a thread waits for its process's turn to write before going on without the
write lock (SQLite's busy timeout then applies)."""
