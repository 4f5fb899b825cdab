"""A session store in a SQL database (SQLite or PostgreSQL), on SQLModel / SQLAlchemy 2.

Layout: each message is stored once.

- `interlock_snapshot`: one row per snapshot. `seq` (an increasing integer, the
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

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from functools import cache
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
    func,
    insert,
    inspect,
    literal,
    or_,
    select,
    text,
    true,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import registry
from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.dml import Insert
from sqlalchemy.sql.selectable import Select
from sqlmodel import Field, SQLModel

from schemas import ErrorInfo, FinishReason, Message, Snapshot, SnapshotStatus, Status, utcnow

from ..errors import StatusError
from .base import snapshot_filters
from .engine import make_engine, sqlite_file
from .fast import FastStatement
from .held import HeldConnections
from .secrets import is_secret_parameter

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


_OPEN_WITH_DEADLINE = text("resumed_by IS NULL AND expires_at IS NOT NULL")
"""The rows of `ix_interlock_snapshot_open`: unclaimed, with a deadline (the sweep for
overdue pauses says both, so that the planners may use it)."""


class SnapshotRow(_Row, table=True):
    """One snapshot, without its messages."""

    __tablename__: ClassVar[str] = "interlock_snapshot"
    __table_args__: ClassVar[Any] = (
        Index("ix_interlock_snapshot_session_seq", "session_id", "seq"),
        Index("ix_interlock_snapshot_pending", "finish_reason", "status", "seq"),
        # The pauses still open with a deadline, by deadline: the resume consumer's sweep
        # for overdue ones (every INTERLOCK_RELAY_INTERVAL, in a write transaction) reads
        # only those, not every pause ever answered. Partial: a snapshot with no deadline,
        # or claimed, is not in it, so most saves write nothing to it. A database made by
        # an older release gets it from `interlock migrate` (`create_missing_indexes`).
        Index(
            "ix_interlock_snapshot_open",
            "finish_reason",
            "status",
            "expires_at",
            sqlite_where=_OPEN_WITH_DEADLINE,
            postgresql_where=_OPEN_WITH_DEADLINE,
        ),
        # No SQLite AUTOINCREMENT: a new row's rowid is already above every row's there
        # (snapshots are never deleted), and AUTOINCREMENT would write its counter, one
        # more page, at every save. Tables made before keep it; both work alike.
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
# FOR KEY SHARE on PostgreSQL (nothing on SQLite, whose writes run one at a time): a
# replace of the parent (`_LOCK_ROW`, FOR UPDATE) waits for a child's save that counted
# on its length, or the child's save for the replace, and then sees its new length.
_PARENT_LEN = (
    select(_SNAP.c.message_count)
    .where(_SNAP.c.snapshot_id == bindparam("p_parent"))
    .with_for_update(read=True, key_share=True)
)
_DELETE_MESSAGES = delete(_MSG).where(_MSG.c.snapshot_id == bindparam("p_sid"))
_INSERT_MESSAGES = insert(_MSG)
_OPEN_PAUSE = (  # the snapshot `p_sid`, interrupted and not past its deadline at `p_now`
    _SNAP.c.snapshot_id == bindparam("p_sid"),
    _SNAP.c.status == SnapshotStatus.COMPLETED.value,
    _SNAP.c.finish_reason == FinishReason.INTERRUPTED.value,
    or_(_SNAP.c.expires_at.is_(None), _SNAP.c.expires_at > bindparam("p_now")),
)
_CLAIM = (
    update(_SNAP)
    .where(
        *_OPEN_PAUSE,
        or_(_SNAP.c.resumed_by.is_(None), _SNAP.c.resumed_by == bindparam("p_by")),
    )
    .values(resumed_by=bindparam("p_by"), updated_at=bindparam("p_now"))
)
_NEW_TOKEN = (
    update(_SNAP)
    .where(*_OPEN_PAUSE, _SNAP.c.resumed_by.is_(None))
    .values(resume_token_hash=bindparam("p_hash"), updated_at=bindparam("p_now"))
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
# What a replace changes: neither the id nor the claim (`resumed_by` changes only through
# `claim` and `release`: a save of a copy read before a claim would undo it).
_CHANGED_COLUMNS = tuple(c for c in _ROW_COLUMNS if c not in ("snapshot_id", "resumed_by"))
_LOCK_ROW = (  # a replace's first statement: on PostgreSQL, the row's lock
    select(_SNAP.c.seq).where(_SNAP.c.snapshot_id == bindparam("p_sid")).with_for_update()
)
_INHERITING = (  # locked: a child replaced meanwhile is read as it is then
    select(_SNAP.c.snapshot_id, _SNAP.c.inherited)
    .where(_SNAP.c.parent_id == bindparam("p_sid"), _SNAP.c.inherited > 0)
    .with_for_update()
)
_OWN_ALL = update(_SNAP).where(_SNAP.c.snapshot_id == bindparam("p_sid")).values(inherited=0)
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


def _listing(
    session_id: str | None,
    status: SnapshotStatus | str | None,
    finish_reason: FinishReason | str | None,
    claimed: bool | None,
    limit: int,
) -> tuple[Select[Any], dict[str, Any]]:
    """The statement of a `list_snapshots` with these filters, and its parameters; an
    unknown `status` or `finish_reason` is INVALID_ARGUMENT (`snapshot_filters`)."""
    status, finish_reason = snapshot_filters(status, finish_reason)
    params: dict[str, Any] = {"p_limit": limit}
    if session_id is not None:
        params["p_session"] = session_id
    if status is not None:
        params["p_status"] = status.value
    if finish_reason is not None:
        params["p_finish_reason"] = finish_reason.value
    stmt = _list_statement(
        session_id is not None,
        status is not None,
        finish_reason is not None,
        None if claimed is None else bool(claimed),
    )
    return stmt, params


_GET_SNAPSHOT = select(_SNAP).where(_SNAP.c.snapshot_id == bindparam("p_sid"))
_F_GET_SNAPSHOT = FastStatement(_GET_SNAPSHOT)
_F_LATEST_ID = FastStatement(
    select(_SNAP.c.snapshot_id)
    .where(_SNAP.c.session_id == bindparam("p_session"))
    .order_by(_SNAP.c.seq.desc())
    .limit(1)
)
_BY_TURN = (
    select(_SNAP).where(_SNAP.c.turn_id == bindparam("p_turn")).order_by(_SNAP.c.seq).limit(1)
)


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
        # The store's own transactions keep each thread's connection checked out (a SQLite
        # file the store opened itself, until a save hook is added).
        pool_size = getattr(self.engine.pool, "size", None)
        self._held = (
            HeldConnections(self.engine, limit=pool_size())
            if engine is None and sqlite_file(url) and callable(pool_size)
            else None
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

    def create_missing_indexes(self, *tables: MetaData) -> list[str]:
        """Create the indexes that the tables of `tables` declare and the database holds
        them without (tables an older release made: `create_all` makes a table's indexes
        only with the table), under the same lock; the names of those made. Not done as a
        process starts: building an index blocks writes to its table meanwhile
        (PostgreSQL's CREATE INDEX), and only the table's owner may, so it is for
        `interlock migrate`."""
        made: list[str] = []
        with self._writer.begin() as conn:
            if self._dialect == "postgresql":
                conn.execute(select(func.pg_advisory_xact_lock(_DDL_LOCK_KEY)))
            found = inspect(conn)
            for group in tables:
                for table in group.sorted_tables:
                    if not found.has_table(table.name):
                        continue
                    held = {index["name"] for index in found.get_indexes(table.name)}
                    for index in sorted(table.indexes, key=lambda index: str(index.name)):
                        if index.name not in held:
                            index.create(conn)
                            made.append(str(index.name))
        return made

    def lacking_columns(self, *tables: MetaData) -> dict[str, list[str]]:
        """The tables of `tables` that the database holds without every column they need
        (made by another program, or by hand), each with the columns it lacks, in the
        order the table declares them. A table not there is not listed: `create_all`
        makes it. Reads only."""
        found = inspect(self.engine)
        name: Callable[[str], str] = str.lower if self._dialect == "sqlite" else str
        lacking: dict[str, list[str]] = {}
        for group in tables:
            for table in group.sorted_tables:
                if not found.has_table(table.name):
                    continue
                held = {name(column["name"]) for column in found.get_columns(table.name)}
                missing = [c.name for c in table.columns if name(c.name) not in held]
                if missing:
                    lacking[table.name] = missing
        return lacking

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
        """Dispose the engine's pooled connections (only an engine the store created),
        and close the connections its threads keep open."""
        if self._held is not None:
            self._held.close()
        if self._owns_engine:
            self.engine.dispose()

    dispose = close

    def __enter__(self) -> SqlSessionStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        url = self.engine.url
        secrets = {k: "***" for k in url.query if is_secret_parameter(k)}
        shown = url.update_query_dict(secrets) if secrets else url
        text = shown.render_as_string(hide_password=True).replace("=%2A%2A%2A", "=***")
        return f"SqlSessionStore({text!r})"

    def _write(self) -> AbstractContextManager[Connection]:
        """One of the store's own write transactions."""
        if self._held is not None:
            return self._held.begin(self._writer, write=True)
        return self._writer.begin()

    def _read(self) -> AbstractContextManager[Connection]:
        """One of the store's own read transactions."""
        if self._held is not None:
            return self._held.begin(self._reader, write=False)
        return self._reader.begin()

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

    def latest_snapshot_id(self, session_id: str) -> str | None:
        """The id of the session's newest snapshot, its history unread."""
        with self._read() as conn:
            rows = _F_LATEST_ID.execute(conn, {"p_session": session_id}).all()
        return str(rows[0][0]) if rows else None

    def list_snapshots(
        self,
        session_id: str | None = None,
        status: SnapshotStatus | str | None = None,
        finish_reason: FinishReason | str | None = None,
        claimed: bool | None = None,
        limit: int = 100,
    ) -> list[Snapshot]:
        if limit <= 0:
            snapshot_filters(status, finish_reason)  # an unknown filter is still refused
            return []
        return self._load(*_listing(session_id, status, finish_reason, claimed, limit))

    def get_snapshot_head(self, snapshot_id: str) -> Snapshot | None:
        """`get_snapshot` with the history unread: `messages` is empty (`SnapshotHeads`)."""
        found = self._load(_GET_SNAPSHOT, {"p_sid": snapshot_id}, whole=False)
        return found[0] if found else None

    def list_snapshot_heads(
        self,
        session_id: str | None = None,
        status: SnapshotStatus | str | None = None,
        finish_reason: FinishReason | str | None = None,
        claimed: bool | None = None,
        limit: int = 100,
    ) -> list[Snapshot]:
        """`list_snapshots` with the histories unread: `messages` is empty
        (`SnapshotHeads`)."""
        if limit <= 0:
            snapshot_filters(status, finish_reason)
            return []
        stmt, params = _listing(session_id, status, finish_reason, claimed, limit)
        return self._load(stmt, params, whole=False)

    def _load(
        self, stmt: Select[Any], params: dict[str, Any], *, whole: bool = True
    ) -> list[Snapshot]:
        """The snapshots of the rows `stmt` selects, with their histories (`whole`) or
        without (heads: `messages` empty)."""
        with self._read() as conn:
            rows = FastStatement.of(stmt).execute(conn, params).mappings()
            histories = _histories(conn, rows) if whole else {}
        return [_to_snapshot(r, histories.get(r["snapshot_id"], [])) for r in rows]

    # ------------------------------------------------------------------ writes

    def add_save_hook(self, hook: SaveHook) -> None:
        """Call `hook(conn, snapshot, created)` inside every save's transaction, before
        the snapshot is written: what the hook writes on `conn` commits or rolls back
        with the snapshot (the outbox uses this), and it may still set fields of it.

        From then on every transaction of the store checks its connection out of the
        pool and returns it, as a hook may count on (the outbox hands what it wrote to
        its relay when the connection goes back)."""
        held, self._held = self._held, None
        if held is not None:
            held.disable()  # a thread that already took `held` falls back to the pool
        self._save_hooks.append(hook)

    def save_snapshot(self, snapshot: Snapshot) -> None:
        sid = snapshot.snapshot_id
        with self._write() as conn:
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
        with self._write() as conn:
            return self.claim_in(conn, snapshot_id, by)

    def claim_in(self, conn: Connection, snapshot_id: str, by: str) -> bool:
        """`claim`, inside the caller's write transaction `conn` (begun on `writer()`):
        the claim commits or rolls back with whatever else the caller writes there."""
        params = {"p_sid": snapshot_id, "p_by": by, "p_now": _to_db(utcnow())}
        return _F_CLAIM.execute(conn, params).rowcount == 1

    def replace_token_hash_in(self, conn: Connection, snapshot_id: str, token_hash: str) -> bool:
        """Give an open pause (interrupted, unclaimed, not past its deadline) the resume
        token hash `token_hash`, inside the caller's write transaction: the token it had
        no longer matches. False when the snapshot is no such pause (any more)."""
        params = {"p_sid": snapshot_id, "p_hash": token_hash, "p_now": _to_db(utcnow())}
        return conn.execute(_NEW_TOKEN, params).rowcount == 1

    def release(self, snapshot_id: str, by: str) -> None:
        params = {"p_sid": snapshot_id, "p_by": by, "p_now": _to_db(utcnow())}
        with self._write() as conn:
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
    sid = values["snapshot_id"]
    if conn.execute(_LOCK_ROW, {"p_sid": sid}).first() is None:
        conn.execute(_INSERT_ROW, values)
        return True
    _keep_children(conn, sid)
    changes = {k: v for k, v in values.items() if k in _CHANGED_COLUMNS}
    conn.execute(_UPDATE_ROW, {"p_sid": sid, **changes})
    return False


def _keep_children(conn: Connection, sid: str) -> None:
    """Before the snapshot `sid` is replaced: each snapshot that inherits messages from
    it gets its own rows of them, as they stand, so that a replace (a history edited,
    made shorter) changes no other snapshot. Only a replace pays for it; a turn's save
    is always new."""
    children = conn.execute(_INHERITING, {"p_sid": sid}).all()
    if not children:
        return
    history = [(idx, body) for _, idx, body in _F_HISTORY_ONE.execute(conn, {"p_id": sid}).all()]
    rows = [
        {"snapshot_id": child, "idx": idx, "body": body}
        for child, inherited in children
        for idx, body in history
        if idx < inherited
    ]
    if rows:
        _F_INSERT_MESSAGES.executemany(conn, rows)
    for child, _ in children:
        conn.execute(_OWN_ALL, {"p_sid": child})


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
        expires_at=_from_db(r["expires_at"]) if r["expires_at"] is not None else None,
        resume_token_hash=r["resume_token_hash"],
        turn_id=r["turn_id"],
    )
