"""A session store in a SQL database (SQLite or PostgreSQL), on SQLModel / SQLAlchemy 2.

Layout: each message is stored once.

- `interlock_snapshot`: one row per snapshot. `seq` (an autoincrement integer, the
  surrogate primary key) orders snapshots by their first save, newest first;
  `snapshot_id` is the unique natural key every query uses.
- `interlock_message`: `(snapshot_id, idx, body)`. A snapshot stores only the messages
  it added: positions `inherited ..` of its history. The rest is its parent's:
  `history(s) = history(parent)[: s.inherited] + own rows`. A snapshot that replaced
  its parent's last message (say, an interrupt that became `resolvedInterrupt`) has
  `inherited = len(parent) - 1` and stores its own version of that message.

Reads rebuild the whole history with one recursive query over the parent chain, so a
`get_snapshot` is two queries and a `list_snapshots` page is two queries too.

Migrations: the store creates its tables if they are missing (`create_tables()`,
called on construction; safe to run from many processes at once). Schema changes ship
as additive columns with defaults, so an older database keeps working. A deployment
that manages its schema itself points Alembic at `SqlSessionStore.metadata` (the
store's own `MetaData`, holding only these two tables, with a naming convention) and
builds the store with `create_tables=False`.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from functools import cache, partial
from typing import Any, ClassVar

from pydantic import TypeAdapter
from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    Table,
    Text,
    and_,
    bindparam,
    case,
    delete,
    event,
    func,
    insert,
    literal,
    or_,
    select,
    text,
    true,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import InvalidatePoolError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from sqlalchemy.orm import registry
from sqlalchemy.pool import ConnectionPoolEntry, StaticPool
from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.dml import Insert
from sqlalchemy.sql.selectable import Select
from sqlmodel import Field, SQLModel, create_engine

from schemas import ErrorInfo, FinishReason, Message, Snapshot, SnapshotStatus, Status, utcnow

from ..errors import StatusError
from .base import snapshot_filters
from .fast import FastStatement

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: writers queue in SQLite's busy handler
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "MessageRow",
    "SaveHook",
    "SnapshotRow",
    "SqlSessionStore",
    "make_engine",
    "metadata",
]

_log = logging.getLogger(__name__)

SaveHook = Callable[[Connection, Snapshot, bool], None]
"""`hook(conn, snapshot, created)`, run in a save's transaction (see `add_save_hook`)."""

# Alembic-friendly constraint names.
_NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = MetaData(naming_convention=_NAMING)
"""The store's own MetaData: only `interlock_snapshot` and `interlock_message`."""

_registry = registry(metadata=metadata)

# An INTEGER PRIMARY KEY is SQLite's rowid (autoincrement); BIGSERIAL elsewhere.
_SEQ_TYPE = BigInteger().with_variant(Integer(), "sqlite")

# A parent chain longer than this is treated as corrupt (a cycle).
_MAX_CHAIN = 100_000

# Key of the PostgreSQL advisory lock that serializes concurrent `create_tables`.
_DDL_LOCK_KEY = 0x1A7E_7100C


class _Row(SQLModel, registry=_registry):
    """Base of this module's tables: they live in `metadata`, not SQLModel's global one."""


class SnapshotRow(_Row, table=True):
    """One snapshot, without its messages."""

    __tablename__: ClassVar[str] = "interlock_snapshot"
    __table_args__: ClassVar[Any] = (
        Index("ix_interlock_snapshot_session_seq", "session_id", "seq"),
        Index("ix_interlock_snapshot_pending", "finish_reason", "status", "seq"),
        {"sqlite_autoincrement": True},
    )

    seq: int | None = Field(
        default=None, sa_column=Column(_SEQ_TYPE, primary_key=True, autoincrement=True)
    )
    snapshot_id: str = Field(sa_column=Column(Text, nullable=False, unique=True))
    session_id: str = Field(sa_column=Column(Text, nullable=False))
    parent_id: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    agent: str = Field(sa_column=Column(Text, nullable=False))
    status: str = Field(sa_column=Column(Text, nullable=False))
    finish_reason: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    error: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    created_at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))
    updated_at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))
    resumed_by: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    inherited: int = Field(
        default=0, sa_column=Column(Integer, nullable=False, server_default=text("0"))
    )
    message_count: int = Field(
        default=0, sa_column=Column(Integer, nullable=False, server_default=text("0"))
    )
    expires_at: datetime | None = Field(
        default=None, sa_column=Column(DateTime(timezone=True), nullable=True)
    )
    resume_token_hash: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    turn_id: str | None = Field(default=None, sa_column=Column(Text, nullable=True, index=True))


class MessageRow(_Row, table=True):
    """One message of one snapshot, at position `idx` of its history, as JSON text."""

    __tablename__: ClassVar[str] = "interlock_message"

    snapshot_id: str = Field(
        sa_column=Column(
            Text,
            ForeignKey("interlock_snapshot.snapshot_id", ondelete="CASCADE"),
            primary_key=True,
        )
    )
    idx: int = Field(sa_column=Column(Integer, primary_key=True, autoincrement=False))
    body: str = Field(sa_column=Column(Text, nullable=False))


_SNAP: Table = metadata.tables["interlock_snapshot"]
_MSG: Table = metadata.tables["interlock_message"]

# The statements of the hot path are built once, with bound parameters, so SQLAlchemy
# neither rebuilds them nor recomputes their cache keys on every call: it only binds.
_SNAPSHOT_EXISTS = select(_SNAP.c.seq).where(_SNAP.c.snapshot_id == bindparam("p_sid"))
_PARENT_LEN = select(_SNAP.c.message_count).where(_SNAP.c.snapshot_id == bindparam("p_parent"))
_DELETE_MESSAGES = delete(_MSG).where(_MSG.c.snapshot_id == bindparam("p_sid"))
_INSERT_MESSAGES = insert(_MSG)
_CLAIM = (
    update(_SNAP)
    .where(
        _SNAP.c.snapshot_id == bindparam("p_sid"),
        _SNAP.c.status == SnapshotStatus.COMPLETED.value,
        _SNAP.c.finish_reason == FinishReason.INTERRUPTED.value,
        or_(_SNAP.c.resumed_by.is_(None), _SNAP.c.resumed_by == bindparam("p_by")),
        or_(_SNAP.c.expires_at.is_(None), _SNAP.c.expires_at > bindparam("p_now")),
    )
    .values(resumed_by=bindparam("p_by"), updated_at=bindparam("p_now"))
)
_RELEASE = (
    update(_SNAP)
    .where(_SNAP.c.snapshot_id == bindparam("p_sid"), _SNAP.c.resumed_by == bindparam("p_by"))
    .values(resumed_by=None, updated_at=bindparam("p_now"))
)
# Run on the DBAPI cursor (`FastStatement`): SQLAlchemy's per-statement machinery would
# cost more than SQLite takes to run them, inside the write transaction.
_F_SNAPSHOT_EXISTS = FastStatement(_SNAPSHOT_EXISTS)
_F_PARENT_LEN = FastStatement(_PARENT_LEN)
_F_INSERT_MESSAGES = FastStatement(_INSERT_MESSAGES)
_F_CLAIM = FastStatement(_CLAIM)
# Every column of a snapshot row but `seq` (kept on replace: it is the first-save order).
_ROW_COLUMNS = tuple(c.name for c in _SNAP.c if c.name != "seq")
_CHANGED_COLUMNS = tuple(c for c in _ROW_COLUMNS if c != "snapshot_id")
_UPDATE_ROW = (
    update(_SNAP)
    .where(_SNAP.c.snapshot_id == bindparam("p_sid"))
    .values({c: bindparam(c) for c in _CHANGED_COLUMNS})
)
_INSERT_ROW = insert(_SNAP)


@cache
def _insert_new_statement(dialect: str) -> Insert | None:
    """INSERT .. ON CONFLICT (snapshot_id) DO NOTHING, where the dialect has it: one
    statement for a new snapshot (the usual save), an UPDATE after it for a replace."""
    if dialect == "postgresql":
        return postgresql.insert(_SNAP).on_conflict_do_nothing(index_elements=[_SNAP.c.snapshot_id])
    if dialect == "sqlite":
        return sqlite.insert(_SNAP).on_conflict_do_nothing(index_elements=[_SNAP.c.snapshot_id])
    return None


@cache
def _list_statement(
    session: bool, status: bool, finish_reason: bool, claimed: bool | None
) -> Select[Any]:
    """The snapshot rows of a `list_snapshots` with these filters, newest first; the
    filter values and the limit are bound parameters (`p_session`, ..., `p_limit`)."""
    conds: list[Any] = []
    if session:
        conds.append(_SNAP.c.session_id == bindparam("p_session"))
    if status:
        conds.append(_SNAP.c.status == bindparam("p_status"))
    if finish_reason:
        conds.append(_SNAP.c.finish_reason == bindparam("p_finish_reason"))
    if claimed is not None:
        conds.append(_SNAP.c.resumed_by.is_not(None) if claimed else _SNAP.c.resumed_by.is_(None))
    return (
        select(_SNAP)
        .where(and_(true(), *conds))
        .order_by(_SNAP.c.seq.desc())
        .limit(bindparam("p_limit", type_=Integer))
    )


_GET_SNAPSHOT = select(_SNAP).where(_SNAP.c.snapshot_id == bindparam("p_sid"))
_F_GET_SNAPSHOT = FastStatement(_GET_SNAPSHOT)
_BY_TURN = (
    select(_SNAP).where(_SNAP.c.turn_id == bindparam("p_turn")).order_by(_SNAP.c.seq).limit(1)
)


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
    a pooled connection that sat idle for `PING_AFTER` seconds or more is pinged before
    use (`pool_pre_ping=True` pings at every checkout instead).

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
    after its COMMIT or ROLLBACK), begins a read, is invalidated or closed: never later
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


class SqlSessionStore:
    """Snapshots in SQLite (the default) or PostgreSQL; `claim` is one conditional UPDATE,
    atomic across processes."""

    metadata: ClassVar[MetaData] = metadata

    def __init__(
        self,
        url: str = "sqlite:///interlock.db",
        *,
        engine: Engine | None = None,
        create_tables: bool = True,
    ) -> None:
        """`url` is a SQLAlchemy URL (`sqlite:///path.db`, `postgresql+psycopg://...`).

        Pass `engine` to use one you built (`make_engine(url)` configures SQLite the
        way the store wants it); the store then does not dispose it on `close()`.
        """
        self._owns_engine = engine is None
        self._save_hooks: list[SaveHook] = []
        self.engine: Engine = engine if engine is not None else make_engine(url)
        self._dialect = self.engine.dialect.name
        # Writes: BEGIN IMMEDIATE on SQLite (see make_engine). Reads: one consistent
        # view for the snapshot rows and their history.
        self._writer = self.engine.execution_options(interlock_write=True)
        self._relaxed_writer = self.engine.execution_options(
            interlock_write=True, interlock_relaxed=True
        )
        self._reader = (
            self.engine.execution_options(isolation_level="REPEATABLE READ")
            if self._dialect == "postgresql"
            else self.engine
        )
        if create_tables:
            self.create_tables()

    # ----------------------------------------------------------------- lifecycle

    def create_tables(self) -> None:
        """Create the store's tables and indexes if they are missing.

        Idempotent and safe from many processes at once (PostgreSQL: under an advisory
        lock; SQLite: inside `BEGIN IMMEDIATE`). It never alters an existing table:
        schema changes ship as additive columns with defaults; for real migrations,
        point Alembic at `SqlSessionStore.metadata`.
        """
        self.create_all(self.metadata)

    def create_all(self, tables: MetaData) -> None:
        """Create the tables of `tables` if missing, under the same cross-process lock
        (for tables that live beside the store: the outbox, the decision log, ...)."""
        with self._writer.begin() as conn:
            if self._dialect == "postgresql":
                conn.execute(select(func.pg_advisory_xact_lock(_DDL_LOCK_KEY)))
            tables.create_all(conn, checkfirst=True)

    @staticmethod
    def fast(statement: ClauseElement) -> FastStatement:
        """`statement` compiled once per dialect and then only bound, run on the DBAPI
        cursor (`FastStatement`): for the hot statements of tables beside the store."""
        return FastStatement.of(statement)

    def writer(self, *, relaxed: bool = False) -> Engine:
        """The engine for write transactions (`BEGIN IMMEDIATE` on SQLite).

        `relaxed`: for records that only need to survive a crash of the process, not of
        the machine (turn leases, journal entries whose loss the journal's remaining
        window covers, marks of published events). Their commits do not wait for the
        disk (SQLite: synchronous NORMAL under WAL; PostgreSQL: synchronous_commit off
        for the transaction); the next ordinary commit takes them to the disk with it,
        since the log is written in order."""
        return self._relaxed_writer if relaxed else self._writer

    def reader(self) -> Engine:
        """The engine for reads: one consistent view per transaction (REPEATABLE READ on
        PostgreSQL)."""
        return self._reader

    def close(self) -> None:
        """Dispose the engine's pooled connections (only an engine the store created)."""
        if self._owns_engine:
            self.engine.dispose()

    dispose = close

    def __enter__(self) -> SqlSessionStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SqlSessionStore({self.engine.url.render_as_string(hide_password=True)!r})"

    # ------------------------------------------------------------------- reads

    def get_snapshot(self, snapshot_id: str) -> Snapshot | None:
        found = self._load(_GET_SNAPSHOT, {"p_sid": snapshot_id})
        return found[0] if found else None

    def get_snapshot_in(self, conn: Connection, snapshot_id: str) -> Snapshot | None:
        """`get_snapshot` on the caller's connection (a transaction on `reader()`): reads
        of other tables beside it share its connection, its round trips and its view."""
        rows = _F_GET_SNAPSHOT.execute(conn, {"p_sid": snapshot_id}).mappings()
        histories = _histories(conn, rows)
        return _to_snapshot(rows[0], histories[snapshot_id]) if rows else None

    def find_turn(self, turn_id: str) -> Snapshot | None:
        """The snapshot the turn `turn_id` ended with (any status), or None while it
        has not ended. (Workers ask the same question inside the transaction that takes
        the turn's lease: `SqlTurnJournal.begin`.)"""
        found = self._load(_BY_TURN, {"p_turn": turn_id})
        return found[0] if found else None

    def get_latest_snapshot(self, session_id: str) -> Snapshot | None:
        found = self.list_snapshots(session_id=session_id, limit=1)
        return found[0] if found else None

    def list_snapshots(
        self,
        session_id: str | None = None,
        status: SnapshotStatus | None = None,
        finish_reason: FinishReason | None = None,
        claimed: bool | None = None,
        limit: int = 100,
    ) -> list[Snapshot]:
        status, finish_reason = snapshot_filters(status, finish_reason)
        params: dict[str, Any] = {"p_limit": limit}
        if session_id is not None:
            params["p_session"] = session_id
        if status is not None:
            params["p_status"] = status.value
        if finish_reason is not None:
            params["p_finish_reason"] = finish_reason.value
        if limit <= 0:
            return []
        stmt = _list_statement(
            session_id is not None,
            status is not None,
            finish_reason is not None,
            None if claimed is None else bool(claimed),
        )
        return self._load(stmt, params)

    def _load(self, stmt: Select[Any], params: dict[str, Any]) -> list[Snapshot]:
        with self._reader.connect() as conn, conn.begin():
            rows = FastStatement.of(stmt).execute(conn, params).mappings()
            histories = _histories(conn, rows)
        return [_to_snapshot(r, histories[r["snapshot_id"]]) for r in rows]

    # ------------------------------------------------------------------ writes

    def add_save_hook(self, hook: SaveHook) -> None:
        """Call `hook(conn, snapshot, created)` inside every save's transaction, before
        the snapshot is written: what the hook writes on `conn` commits or rolls back
        with the snapshot (the outbox uses this), and it may still set fields of it."""
        self._save_hooks.append(hook)

    def save_snapshot(self, snapshot: Snapshot) -> None:
        sid = snapshot.snapshot_id
        with self._writer.begin() as conn:
            if self._save_hooks:
                created = _F_SNAPSHOT_EXISTS.execute(conn, {"p_sid": sid}).first() is None
                for hook in self._save_hooks:
                    hook(conn, snapshot, created)
            base = self._storage_base(conn, snapshot)
            values = _row_values(snapshot, base)
            # The snapshot row first: on PostgreSQL its row lock serializes concurrent
            # saves of the same id before their message rows are touched. A new row has
            # no message rows yet (they cascade from it), so only a replace deletes them.
            if not _write_row(conn, values):
                conn.execute(_DELETE_MESSAGES, {"p_sid": sid})
            own = [
                {"snapshot_id": sid, "idx": i, "body": snapshot.messages[i].model_dump_json()}
                for i in range(base, len(snapshot.messages))
            ]
            if own:
                _F_INSERT_MESSAGES.executemany(conn, own)

    def _storage_base(self, conn: Connection, snapshot: Snapshot) -> int:
        """How many leading messages this save may leave to the parent's rows."""
        want = min(max(snapshot.inherited, 0), len(snapshot.messages))
        parent = snapshot.parent_id
        if want == 0 or parent is None or parent == snapshot.snapshot_id:
            return 0
        parent_len = _F_PARENT_LEN.execute(conn, {"p_parent": parent}).scalar()
        if parent_len is None or parent_len < want:
            _log.warning(
                "snapshot %s inherits %d messages from %s, which has %s; storing all of them",
                snapshot.snapshot_id,
                want,
                parent,
                "no record" if parent_len is None else parent_len,
            )
            return 0
        return want

    def claim(self, snapshot_id: str, by: str) -> bool:
        with self._writer.begin() as conn:
            return self.claim_in(conn, snapshot_id, by)

    def claim_in(self, conn: Connection, snapshot_id: str, by: str) -> bool:
        """`claim`, inside the caller's write transaction `conn` (begun on `writer()`):
        the claim commits or rolls back with whatever else the caller writes there."""
        params = {"p_sid": snapshot_id, "p_by": by, "p_now": _to_db(utcnow())}
        return _F_CLAIM.execute(conn, params).rowcount == 1

    def release(self, snapshot_id: str, by: str) -> None:
        params = {"p_sid": snapshot_id, "p_by": by, "p_now": _to_db(utcnow())}
        with self._writer.begin() as conn:
            conn.execute(_RELEASE, params)


# ---------------------------------------------------------------------- helpers


def _to_db(ts: datetime) -> datetime:
    """UTC, as the database keeps it (naive values are taken to be UTC already)."""
    return ts.replace(tzinfo=UTC) if ts.tzinfo is None else ts.astimezone(UTC)


def _from_db(ts: datetime) -> datetime:
    """Timezone-aware UTC (SQLite hands back naive values)."""
    return ts.replace(tzinfo=UTC) if ts.tzinfo is None else ts.astimezone(UTC)


def _row_values(s: Snapshot, base: int) -> dict[str, Any]:
    return {
        "snapshot_id": s.snapshot_id,
        "session_id": s.session_id,
        "parent_id": s.parent_id,
        "agent": s.agent,
        "status": SnapshotStatus(s.status).value,
        "finish_reason": FinishReason(s.finish_reason).value if s.finish_reason else None,
        "error": s.error.model_dump_json() if s.error is not None else None,
        "created_at": _to_db(s.created_at),
        "updated_at": _to_db(s.updated_at),
        "resumed_by": s.resumed_by,
        "inherited": base,
        "message_count": len(s.messages),
        "expires_at": _to_db(s.expires_at) if s.expires_at is not None else None,
        "resume_token_hash": s.resume_token_hash,
        "turn_id": s.turn_id,
    }


def _write_row(conn: Connection, values: dict[str, Any]) -> bool:
    """Insert the snapshot row, or replace it in place (keeping `seq`, its first-save
    order). True when the row is new."""
    insert_new = _insert_new_statement(conn.dialect.name)
    if insert_new is not None and FastStatement.of(insert_new).execute(conn, values).rowcount == 1:
        return True
    changes = {k: v for k, v in values.items() if k != "snapshot_id"}
    if conn.execute(_UPDATE_ROW, {"p_sid": values["snapshot_id"], **changes}).rowcount == 1:
        return False
    conn.execute(_INSERT_ROW, values)
    return True


def _history_statement(many: bool) -> Select[Any]:
    """The messages of the snapshots `p_ids` (an expanding parameter) or, for the usual
    single snapshot, of `p_id` (cheaper to bind), by snapshot and position: a recursive
    walk up each parent chain (see `_histories`)."""
    seed = select(
        _SNAP.c.snapshot_id.label("root"),
        _SNAP.c.snapshot_id.label("link"),
        _SNAP.c.parent_id.label("parent_id"),
        _SNAP.c.inherited.label("inherited"),
        _SNAP.c.message_count.label("upper"),
        literal(0, Integer).label("depth"),
    ).where(
        _SNAP.c.snapshot_id.in_(bindparam("p_ids", expanding=True))
        if many
        else _SNAP.c.snapshot_id == bindparam("p_id")
    )
    chain = seed.cte("interlock_chain", recursive=True)
    parent = _SNAP.alias("interlock_parent")
    step = select(
        chain.c.root,
        parent.c.snapshot_id,
        parent.c.parent_id,
        parent.c.inherited,
        case((chain.c.inherited < chain.c.upper, chain.c.inherited), else_=chain.c.upper),
        chain.c.depth + 1,
    ).where(
        parent.c.snapshot_id == chain.c.parent_id,
        chain.c.inherited > 0,
        chain.c.depth < _MAX_CHAIN,
    )
    chain = chain.union_all(step)
    return (
        select(chain.c.root, _MSG.c.idx, _MSG.c.body)
        .select_from(chain)
        .join(_MSG, and_(_MSG.c.snapshot_id == chain.c.link, _MSG.c.idx < chain.c.upper))
        .order_by(chain.c.root, _MSG.c.idx)
    )


_HISTORY_ONE = _history_statement(many=False)
_HISTORY_MANY = _history_statement(many=True)
_F_HISTORY_ONE = FastStatement(_HISTORY_ONE)
_MESSAGES = TypeAdapter(list[Message])


def _histories(conn: Connection, rows: Sequence[Mapping[str, Any]]) -> dict[str, list[Message]]:
    """The whole message history of each snapshot row, in one recursive query.

    The chain walks from each snapshot to its ancestors while the current link still
    inherits something. Each link contributes its own rows below `upper`, the smallest
    `inherited` of the links below it, so every position comes from exactly one link.
    """
    out: dict[str, list[Message]] = {r["snapshot_id"]: [] for r in rows}
    ids = [r["snapshot_id"] for r in rows if r["message_count"] > 0]
    if not ids:
        return out
    positions: dict[str, list[int]] = {sid: [] for sid in ids}
    bodies: dict[str, list[str]] = {sid: [] for sid in ids}
    found = (
        _F_HISTORY_ONE.execute(conn, {"p_id": ids[0]}).all()
        if len(ids) == 1
        else conn.execute(_HISTORY_MANY, {"p_ids": ids}).all()  # expanding: SQLAlchemy's path
    )
    for root, idx, body in found:
        positions[root].append(idx)
        bodies[root].append(body)
    for sid, texts in bodies.items():
        # One parse per history (a JSON array of the bodies), not one per message.
        out[sid] = _MESSAGES.validate_json("[" + ",".join(texts) + "]")

    expected = {r["snapshot_id"]: r["message_count"] for r in rows}
    for sid in ids:
        if positions[sid] != list(range(expected[sid])):
            raise StatusError(
                Status.DATA_LOSS,
                f"snapshot {sid}: history has positions {_ranges(positions[sid])}, "
                f"expected 0..{expected[sid] - 1} (an ancestor is missing or was rewritten)",
            )
    return out


def _ranges(xs: Iterable[int]) -> str:
    xs = list(xs)
    return f"{xs[:5]}{'...' if len(xs) > 5 else ''} ({len(xs)} in all)"


def _to_snapshot(r: Mapping[str, Any], messages: list[Message]) -> Snapshot:
    return Snapshot(
        snapshot_id=r["snapshot_id"],
        session_id=r["session_id"],
        parent_id=r["parent_id"],
        agent=r["agent"],
        status=SnapshotStatus(r["status"]),
        finish_reason=FinishReason(r["finish_reason"]) if r["finish_reason"] else None,
        messages=messages,
        error=ErrorInfo.model_validate_json(r["error"]) if r["error"] else None,
        created_at=_from_db(r["created_at"]),
        updated_at=_from_db(r["updated_at"]),
        resumed_by=r["resumed_by"],
        inherited=r["inherited"],
        expires_at=_from_db(r["expires_at"]) if r["expires_at"] is not None else None,
        resume_token_hash=r["resume_token_hash"],
        turn_id=r["turn_id"],
    )
