"""The turn journal and turn leases in SQL, beside a `SqlSessionStore`.

Journal: what a queue-run turn already did (model responses, tool outcomes), so a
redelivered turn replays it instead of doing it again (see `interlock.journal`).

Leases: one live run per turn. A worker takes the turn's lease before running it and
renews it while it runs; a second delivery of the same turn (a broker redelivering a
message whose visibility timeout passed, a duplicate enqueue) finds the lease held
and does not run it concurrently. A lease whose holder died expires, and the next
delivery takes over, replaying the journal.

A worker's turn costs few transactions: `begin` checks that the turn has not ended and
takes its lease in one write transaction (one statement, for a turn delivered the first
time); the snapshot that ends the turn deletes the
lease and the turn's journal entries in its own transaction (a save hook); `end`
writes only when no snapshot did (the turn was refused, or the run raised), and then
expires the lease instead of deleting it, so that the next delivery knows an earlier
run may have left journal entries.
"""

from __future__ import annotations

import contextvars
import enum
import json
import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cache
from typing import Any

from sqlalchemy import (
    Column,
    DateTime,
    Index,
    MetaData,
    Table,
    Text,
    and_,
    bindparam,
    cast,
    delete,
    exists,
    insert,
    inspect,
    literal,
    null,
    or_,
    select,
    union_all,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError
from sqlalchemy.sql.dml import Insert

from schemas import Snapshot, Status, utcnow

from ..errors import StatusError
from .failures import first_line, is_schema_error, retry_store_failures
from .fast import FastStatement
from .sql import SqlSessionStore, _from_db

__all__ = [
    "REFUSED",
    "REQUEST",
    "LeaseLost",
    "SessionLeaseLost",
    "SqlTurnJournal",
    "TurnEnding",
    "TurnStart",
    "TurnStartKind",
    "ended_turns",
    "journal_metadata",
    "refused_turns",
    "session_lease",
]

_log = logging.getLogger("interlock.journal")

RECORD_PAUSES = (0.05, 0.2, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0)
"""Seconds between the tries of a journal write that met a store failure (about 30 s in
all): a dropped connection, a server restart or a failover, waited out rather than the
turn retried and its tool run again. Waiting is safe: the write goes in only while this
run still holds the turn's lease (`LeaseLost`). Not longer, so that a worker told to
stop meanwhile stops within a container's usual grace. A table or a column the database
lacks (`is_schema_error`) is not waited for: it lasts."""


class LeaseLost(StatusError):
    """Another run of the turn took its lease from this one, which stalled past the
    lease's life (a frozen process, a store outage longer than the lease, a turn that
    outlived the broker's visibility timeout). This run stops: what it would still
    write (a journal entry, the snapshot that ends the turn, its event) is not written,
    and the other run gives the turn its one answer. ABORTED."""

    default_status = Status.ABORTED

    def __init__(self, turn_id: str, owner: str) -> None:
        super().__init__(
            Status.ABORTED,
            f"turn {turn_id}: another run took over its lease (this run, {owner}, stalled "
            "past it); this run stops and keeps nothing",
        )
        self.turn_id = turn_id


class SessionLeaseLost(LeaseLost):
    """Another turn of the session took the session's lease from this run, which stalled
    past it, and may have ended with a snapshot this one did not start from: this run's
    snapshot would fork the session. Nothing is kept, and the turn is to run again (its
    journal replays), from where the session stands then."""

    def __init__(self, turn_id: str, owner: str, session: str) -> None:
        super().__init__(turn_id, owner)
        self.message = (
            f"turn {turn_id}: another turn of session {session} took over its lease (this "
            f"run, {owner}, stalled past it); this run keeps nothing, and the turn runs again"
        )


_RUN: contextvars.ContextVar[tuple[object, str, str, str | None] | None] = contextvars.ContextVar(
    "interlock_turn_run", default=None
)
"""The turn this thread (context) runs, as a journal's `begin` started it: (that
journal's token, turn id, owner, session). Two runs of one turn in one process (the
thread pool, a stalled run and its take-over) each check their own lease, not whichever
`begin` ran last."""


def session_lease(session_id: str) -> str:
    """The key of a session's lease among the turn leases (no turn id Interlock makes
    looks like it: those are UUIDs)."""
    return f"session:{session_id}"


journal_metadata = MetaData()

_JOURNAL = Table(
    "interlock_journal",
    journal_metadata,
    Column("turn_id", Text, primary_key=True),
    Column("key", Text, primary_key=True),
    Column("session_id", Text, nullable=False),
    Column("body", Text, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    # a session's refused turns (`refused_turns`, `interlock prune`); a database made by
    # an older release gets it from `interlock migrate` (`create_missing_indexes`)
    Index("ix_interlock_journal_session", "session_id"),
)

_LEASE = Table(
    "interlock_turn_lease",
    journal_metadata,
    Column("turn_id", Text, primary_key=True),
    Column("owner", Text, nullable=False),
    Column("expires_at", DateTime(timezone=True), nullable=False),
)


_SNAP = SqlSessionStore.metadata.tables["interlock_snapshot"]
_TAKE = (
    update(_LEASE)
    .where(
        _LEASE.c.turn_id == bindparam("p_turn"),
        or_(_LEASE.c.owner == bindparam("p_owner"), _LEASE.c.expires_at <= bindparam("p_now")),
    )
    .values(owner=bindparam("p_owner"), expires_at=bindparam("p_until"))
)
_TAKE_FROM = (
    update(_LEASE)
    .where(_LEASE.c.turn_id == bindparam("p_turn"), _LEASE.c.owner == bindparam("p_holder"))
    .values(owner=bindparam("p_owner"), expires_at=bindparam("p_until"))
)
"""The lease of a holder known to be dead, taken whether it has run out or not."""
_RENEW = (
    update(_LEASE)
    .where(_LEASE.c.turn_id == bindparam("p_turn"), _LEASE.c.owner == bindparam("p_owner"))
    .values(expires_at=bindparam("p_until"))
)
_KEEP_LEASE = (
    update(_LEASE)
    .where(_LEASE.c.turn_id == bindparam("p_turn"), _LEASE.c.owner == bindparam("p_owner"))
    .values(owner=bindparam("p_owner"))
)
"""No change: it counts (and locks) the row of a lease `p_owner` still holds."""
_DROP_LEASE = delete(_LEASE).where(
    _LEASE.c.turn_id == bindparam("p_turn"), _LEASE.c.owner == bindparam("p_owner")
)
_DROP_TURN_LEASE = delete(_LEASE).where(_LEASE.c.turn_id == bindparam("p_turn"))
_LEASE_ROW = (
    select(_LEASE.c.owner, _LEASE.c.expires_at)
    .where(_LEASE.c.turn_id == bindparam("p_turn"))
    .with_for_update()
)
_RESTORE = (
    update(_LEASE)
    .where(_LEASE.c.turn_id == bindparam("p_turn"), _LEASE.c.owner == bindparam("p_owner"))
    .values(owner=bindparam("p_holder"), expires_at=bindparam("p_until"))
)
"""A lease taken and given back, as it was found (its holder's, run out)."""
_LEASE_OWNER = select(_LEASE.c.owner).where(_LEASE.c.turn_id == bindparam("p_turn"))
_DROP_ENTRIES = delete(_JOURNAL).where(_JOURNAL.c.turn_id == bindparam("p_turn"))
_LOAD = select(_JOURNAL.c.key, _JOURNAL.c.body).where(_JOURNAL.c.turn_id == bindparam("p_turn"))
_RECORD = insert(_JOURNAL)
REFUSED = "refused"
"""The journal key that ends a turn refused before it ran (no snapshot carries it)."""
REQUEST = "request"
"""The journal key that holds the fingerprint of the request that first started a turn
(`begin`): a turn id names that turn, and a start under it with another request is not
that turn (FOREIGN), so it can neither replay its journal nor end it."""
_REQUEST_OF = select(_JOURNAL.c.body).where(
    _JOURNAL.c.turn_id == bindparam("p_turn"), _JOURNAL.c.key == REQUEST
)
_REFUSAL = select(_JOURNAL.c.body).where(
    _JOURNAL.c.turn_id == bindparam("p_turn"), _JOURNAL.c.key == REFUSED
)
_ENDINGS = union_all(
    select(
        _SNAP.c.snapshot_id.label("snapshot_id"),
        cast(_SNAP.c.status, Text).label("status"),
        cast(_SNAP.c.finish_reason, Text).label("finish_reason"),
        literal(0).label("rank"),
        _SNAP.c.seq.label("seq"),
    ).where(_SNAP.c.turn_id == bindparam("p_turn")),
    select(
        cast(null(), Text).label("snapshot_id"),
        cast(literal(REFUSED), Text).label("status"),
        cast(null(), Text).label("finish_reason"),
        literal(1).label("rank"),
        literal(0).label("seq"),
    ).where(_JOURNAL.c.turn_id == bindparam("p_turn"), _JOURNAL.c.key == REFUSED),
).subquery()
_ENDED = (
    select(_ENDINGS.c.snapshot_id, _ENDINGS.c.status, _ENDINGS.c.finish_reason)
    .order_by(_ENDINGS.c.rank, _ENDINGS.c.seq)
    .limit(1)
)
"""How a turn ended: the first snapshot carrying its id (its id and status), or else
its refusal (no snapshot, status `refused`); no row while it has not ended."""

_F_TAKE_FROM, _F_REQUEST_OF = FastStatement(_TAKE_FROM), FastStatement(_REQUEST_OF)
_F_KEEP_LEASE, _F_LEASE_ROW = FastStatement(_KEEP_LEASE), FastStatement(_LEASE_ROW)
_F_RESTORE = FastStatement(_RESTORE)
# The hot path's statements, run on the DBAPI cursor (see `interlock.stores.fast`).
_F_TAKE, _F_RENEW, _F_DROP_LEASE, _F_DROP_ENTRIES, _F_LOAD, _F_RECORD, _F_ENDED = (
    FastStatement(s) for s in (_TAKE, _RENEW, _DROP_LEASE, _DROP_ENTRIES, _LOAD, _RECORD, _ENDED)
)


def _upsert(dialect: str, table: Table = _LEASE) -> postgresql.Insert | sqlite.Insert | None:
    """An INSERT into the leases (or `table`) that can take `ON CONFLICT`, in `dialect`;
    None in a dialect without it."""
    if dialect == "postgresql":
        return postgresql.insert(table)
    if dialect == "sqlite":
        return sqlite.insert(table)
    return None


@cache
def _insert_request_if_new(dialect: str) -> Insert | None:
    """The fingerprint of the request that first starts a turn (`REQUEST`), kept unless
    one is: INSERT .. ON CONFLICT (turn_id, key) DO NOTHING RETURNING turn_id. A row
    comes back when it was kept; None in a dialect without `ON CONFLICT`."""
    stmt = _upsert(dialect, _JOURNAL)
    if stmt is None:
        return None
    return stmt.on_conflict_do_nothing(
        index_elements=[_JOURNAL.c.turn_id, _JOURNAL.c.key]
    ).returning(_JOURNAL.c.turn_id)


@cache
def _insert_lease_if_new(dialect: str) -> Insert | None:
    """The lease of a turn that no snapshot carries yet, no refusal ended and no run has
    leased, in one statement where the dialect has `ON CONFLICT`: INSERT .. SELECT ..
    WHERE NOT EXISTS (a snapshot with this turn id) AND NOT EXISTS (its refusal)
    ON CONFLICT (turn_id) DO NOTHING RETURNING turn_id.
    A row comes back when it took the lease (psycopg reports no rowcount for an insert
    without RETURNING); none when the turn ended or a lease row exists."""
    stmt = _upsert(dialect)
    if stmt is None:
        return None
    new = select(
        bindparam("p_turn", type_=_LEASE.c.turn_id.type),
        bindparam("p_owner", type_=_LEASE.c.owner.type),
        bindparam("p_until", type_=_LEASE.c.expires_at.type),
    ).where(
        ~exists().where(_SNAP.c.turn_id == bindparam("p_turn")),
        ~exists().where(_JOURNAL.c.turn_id == bindparam("p_turn"), _JOURNAL.c.key == REFUSED),
    )
    stmt = stmt.from_select(["turn_id", "owner", "expires_at"], new)
    return stmt.on_conflict_do_nothing(index_elements=[_LEASE.c.turn_id]).returning(
        _LEASE.c.turn_id
    )


@cache
def _take_session_lease(dialect: str) -> Insert | None:
    """A session's lease (`session_lease`), taken when no one holds it, its holder's
    has run out, or its holder is `p_holder` (one known to have died): INSERT .. ON
    CONFLICT (turn_id) DO UPDATE .. WHERE .. RETURNING turn_id. A row comes back when it
    was taken."""
    stmt = _upsert(dialect)
    if stmt is None:
        return None
    stmt = stmt.values(
        turn_id=bindparam("p_key", type_=_LEASE.c.turn_id.type),
        owner=bindparam("p_owner", type_=_LEASE.c.owner.type),
        expires_at=bindparam("p_until", type_=_LEASE.c.expires_at.type),
    )
    taken = stmt.on_conflict_do_update(
        index_elements=[_LEASE.c.turn_id],
        set_={"owner": stmt.excluded.owner, "expires_at": stmt.excluded.expires_at},
        where=or_(
            _LEASE.c.expires_at <= bindparam("p_now"),
            _LEASE.c.owner == bindparam("p_holder", type_=_LEASE.c.owner.type),
        ),
    )
    return taken.returning(_LEASE.c.turn_id)


class TurnStartKind(enum.Enum):
    NEW = "new"
    """No run of this turn ever held its lease: there is no journal to replay."""
    TAKEN_OVER = "taken_over"
    """An earlier run held the lease (it died, or raised): replay its journal."""
    BUSY = "busy"
    """Another run holds a live lease."""
    ENDED = "ended"
    """A snapshot already carries this turn id, or the turn was refused: it is over."""
    SESSION_BUSY = "session_busy"
    """Another turn of the same session holds the session's lease (this turn's own was
    given back)."""
    FOREIGN = "foreign"
    """Another request started this turn id first: this one is not that turn, and its
    lease was given back as it was found."""


@dataclass(frozen=True)
class TurnStart:
    kind: TurnStartKind
    snapshot_id: str | None = None
    """ENDED: the snapshot the turn ended with (None for a refused turn)."""
    status: str | None = None
    """ENDED: that snapshot's status, or `refused`."""
    finish_reason: str | None = None
    """ENDED: that snapshot's finish reason (`interrupted`: the turn paused)."""

    def ended_as(self) -> str:
        """ENDED: how, in a word or two for a log line: `paused`, `refused`, or the
        snapshot's status (`completed`, `failed`, `aborted`, `expired`), with its id."""
        how = self.status or "unknown"
        if how == "completed" and self.finish_reason == "interrupted":
            how = "paused"
        return how if self.snapshot_id is None else f"{how}, snapshot {self.snapshot_id}"


def refused_turns(store: SqlSessionStore, session_id: str) -> list[tuple[str, Any, datetime]]:
    """The turns of `session_id` refused before they ran (no snapshot carries them):
    `(turn_id, error JSON, when)`, oldest first. Reads only: a store whose journal was
    never made has none."""
    if not inspect(store.engine).has_table(_JOURNAL.name):
        return []
    query = (
        select(_JOURNAL.c.turn_id, _JOURNAL.c.body, _JOURNAL.c.created_at)
        .where(_JOURNAL.c.key == REFUSED, _JOURNAL.c.session_id == session_id)
        .order_by(_JOURNAL.c.created_at)
    )
    with store.engine.connect() as conn:
        rows = conn.execute(query).all()
    return [(str(turn), json.loads(body), _from_db(when)) for turn, body, when in rows]


@dataclass(frozen=True)
class TurnEnding:
    """How a turn ended, as the store keeps it (`ended_turns`)."""

    snapshot_id: str | None
    """The first snapshot that carries the turn id; None for a turn refused before it ran."""
    status: str
    """That snapshot's status (it may have changed since: an interrupted snapshot that
    expired), or `refused`."""
    finish_reason: str | None = None
    error: Any = None
    """The failure's `{"status", "message"}`, for a failed, aborted or refused turn."""
    resumed_by: str | None = None
    """For a paused turn: the decision that has claimed its pause since (answered)."""


_ENDED_CHUNK = 500
"""Turn ids per statement of `ended_turns` (well under every database's bound limit)."""


def ended_turns(store: SqlSessionStore, turn_ids: Iterable[str]) -> dict[str, TurnEnding]:
    """The turns among `turn_ids` that have ended, and how (what `begin` tells a worker
    one turn at a time): a snapshot carries the id (its first), or else a refusal ended
    it. Reads only: a store whose journal was never made has no refusals."""
    wanted = list(dict.fromkeys(turn_ids))
    found: dict[str, TurnEnding] = {}
    journal = inspect(store.engine).has_table(_JOURNAL.name)
    snaps = select(
        _SNAP.c.turn_id,
        _SNAP.c.snapshot_id,
        _SNAP.c.status,
        _SNAP.c.finish_reason,
        _SNAP.c.error,
        _SNAP.c.resumed_by,
    ).order_by(_SNAP.c.seq)
    refusals = select(_JOURNAL.c.turn_id, _JOURNAL.c.body).where(_JOURNAL.c.key == REFUSED)
    with store.engine.connect() as conn:
        for start in range(0, len(wanted), _ENDED_CHUNK):
            chunk = wanted[start : start + _ENDED_CHUNK]
            for turn, sid, status, reason, error, by in conn.execute(
                snaps.where(_SNAP.c.turn_id.in_(chunk))
            ):
                if turn not in found:  # the first snapshot of the turn
                    failure = json.loads(error) if error else None
                    found[turn] = TurnEnding(str(sid), str(status), reason, failure, by)
            if not journal:
                continue
            for turn, body in conn.execute(refusals.where(_JOURNAL.c.turn_id.in_(chunk))):
                found.setdefault(turn, TurnEnding(None, REFUSED, None, json.loads(body)))
    return found


class SqlTurnJournal:
    """Journal entries and turn leases in the store's database."""

    def __init__(self, store: SqlSessionStore) -> None:
        self.store = store
        store.create_all(journal_metadata)
        insert_if_new = _insert_lease_if_new(store.engine.dialect.name)
        self._insert_if_new = None if insert_if_new is None else FastStatement.of(insert_if_new)
        keep_request = _insert_request_if_new(store.engine.dialect.name)
        self._keep_request = None if keep_request is None else FastStatement.of(keep_request)
        # PostgreSQL (read committed): the insert's NOT EXISTS sees the snapshots committed
        # when the statement began. If it then waited on the lease row of a run whose
        # ending snapshot was committing, that snapshot is visible only to a new statement.
        self._recheck_ended = store.engine.dialect.name == "postgresql"
        take_session = _take_session_lease(store.engine.dialect.name)
        self._take_session = None if take_session is None else FastStatement.of(take_session)
        self._held: dict[str, str] = {}  # turn id -> owner, leases `begin` took here
        self._sessions: dict[str, str] = {}  # turn id -> the session whose lease it holds
        self._token = object()  # this journal's, in `_RUN`
        self._held_lock = threading.Lock()
        store.add_save_hook(self._on_save)

    # -- the journal --------------------------------------------------------------------

    def load(self, session_id: str, turn_id: str) -> dict[str, Any]:
        with self.store.engine.begin() as conn:
            rows = _F_LOAD.execute(conn, {"p_turn": turn_id}).all()
        return {str(key): json.loads(body) for key, body in rows if key != REQUEST}

    def record(self, session_id: str, turn_id: str, key: str, value: Any) -> None:
        row = {
            "turn_id": turn_id,
            "key": key,
            "session_id": session_id,
            "body": json.dumps(value),
            "created_at": utcnow(),
        }
        # A model response fixes the refs, and so the idempotency keys, of the tool
        # calls that follow: it must survive the machine. A tool outcome need only
        # survive the process: lost with the machine, the call runs again under the
        # same key (the window `interlock.journal` describes).
        relaxed = not key.startswith("model:")

        owner, _ = self._run_of(turn_id)

        def write() -> None:
            try:
                with self.store.writer(relaxed=relaxed).begin() as conn:
                    if owner is not None:  # only while this run holds the turn
                        self._still_held(conn, turn_id, owner)
                    _F_RECORD.execute(conn, row)
            except IntegrityError:
                pass  # the first value written wins

        def said(exc: Exception, pause: float) -> None:
            _log.warning(
                "journaling %s of turn %s failed (%s); trying again in %.2f s",
                key, turn_id, first_line(exc), pause,
            )  # fmt: skip

        # What was just done (a tool's side effect) is only safe from a second run once
        # it is written: a dropped connection or a restarting server is waited out here,
        # where failing would run the call again. A table or a column the database lacks
        # is not: no wait mends it, and the run fails at once, saying so.
        try:
            retry_store_failures(write, RECORD_PAUSES, said)
        except Exception as exc:
            if is_schema_error(exc):
                _log.error(
                    "journaling %s of turn %s failed (%s): the store lacks a table or a "
                    "column the journal needs, which no wait mends, so it is not tried "
                    "again; `interlock migrate` makes the tables missing and names those "
                    "that lack columns",
                    key, turn_id, first_line(exc),
                )  # fmt: skip
            raise

    def ended_in(self, conn: Connection, turn_id: str) -> bool:
        """Whether `turn_id` has ended (a snapshot carries it, or a refusal ended it), read
        in the caller's transaction."""
        return self._ended(conn, {"p_turn": turn_id}) is not None

    def refuse_in(
        self,
        conn: Connection,
        session_id: str | None,
        turn_id: str,
        error: Any,
        *,
        owner: str | None = None,
    ) -> bool:
        """End `turn_id` as refused before it ran (`error`, JSON), in the caller's
        transaction: `begin` answers ENDED for it from then on, so a redelivery or a
        second submission of the same turn is not run later, when the reason for the
        refusal may have gone (the turn has had its answer). False when the turn had
        ended already, refused or with a snapshot, or when its lease is held by anyone
        but `owner` (the refusing run; None: a refusal that took no lease): a copy of a
        turn that runs, or ran and may run again, elsewhere. The caller must not
        announce it.

        A refusal that took no lease also ends nothing a request has started (`begin`
        kept its fingerprint): it takes that entry itself, so that a first start racing
        it (PostgreSQL: the two are not otherwise serialized) waits for it and then
        finds the turn ended."""
        mine = {"p_turn": turn_id, "p_owner": owner}
        if owner is not None and _F_KEEP_LEASE.execute(conn, mine).rowcount == 0:
            return False  # (checked first, its row locked till commit: no take-over races it)
        if self._ended(conn, {"p_turn": turn_id}) is not None:
            return False
        held = conn.execute(_LEASE_OWNER, {"p_turn": turn_id}).first()
        if held is not None and held[0] != owner:
            return False
        if owner is None and not self._kept_request(conn, turn_id, session_id, None)[0]:
            return False  # a request started it: a refusal with no lease is not its answer
        row = {
            "turn_id": turn_id,
            "key": REFUSED,
            "session_id": session_id or "",
            "body": json.dumps(error),
            "created_at": utcnow(),
        }
        _F_RECORD.execute(conn, row)
        if owner is not None:  # the turn is over: no lease
            conn.execute(_DROP_TURN_LEASE, {"p_turn": turn_id})
        return True

    # -- a worker's turn ----------------------------------------------------------------

    def begin(
        self,
        turn_id: str,
        owner: str,
        ttl: float,
        *,
        session: str | None = None,
        request: str | None = None,
    ) -> TurnStart:
        """Start a run of `turn_id`, in one write transaction: ENDED when a snapshot
        already carries the turn id, else take its lease for `ttl` seconds (NEW or
        TAKEN_OVER), else BUSY. With `request` (the fingerprint of the run's request),
        the first start of the turn keeps it, and a later one with another is FOREIGN
        (the lease given back as found). With `session`, the session's lease is taken
        too, in the same transaction, or else the turn's is given back: SESSION_BUSY.
        Leases taken here are renewed by `renew_held` and given up by the snapshot that
        ends the turn, or by `end`."""
        if self._insert_if_new is None or self._take_session is None:
            return self._begin_portable(turn_id, owner, ttl, session, request)
        now = utcnow()
        params = {"p_turn": turn_id, "p_owner": owner, "p_now": now}
        params["p_until"] = now + timedelta(seconds=ttl)
        found: tuple[Any, ...] | None = None
        with self.store.writer(relaxed=True).begin() as conn:
            if self._insert_if_new.execute(conn, params).first() is not None:
                kind = TurnStartKind.NEW  # the usual case: one statement
                if self._recheck_ended and (ended := self._ended(conn, params)) is not None:
                    _F_DROP_LEASE.execute(conn, params)
                    return ended
            elif (ended := self._ended(conn, params)) is not None:
                return ended
            else:
                # as found, to give back: a run that stalled past it may still go on
                found = _F_LEASE_ROW.execute(conn, params).first()
                if found is None or _F_TAKE.execute(conn, params).rowcount != 1:
                    return _busy_or_foreign(conn, turn_id, request)
                kind = TurnStartKind.TAKEN_OVER
            if request is not None and not self._same_request(conn, turn_id, session, request):
                _give_back(conn, kind, params, found)  # (a refusal that raced it may have ended it)
                return self._ended(conn, params) or TurnStart(TurnStartKind.FOREIGN)
            if session is not None:
                key = session_lease(session)
                taken = self._take_session.execute(
                    conn, {**params, "p_key": key, "p_holder": None}
                ).first()
                if taken is None:
                    _give_back(conn, kind, params, found)
                    return TurnStart(TurnStartKind.SESSION_BUSY)
        self._hold(turn_id, owner, session)
        return TurnStart(kind)

    def _same_request(
        self, conn: Connection, turn_id: str, session: str | None, request: str
    ) -> bool:
        """Whether `request` is the fingerprint `turn_id` was first started with; the
        first start keeps it (a journal entry, dropped with the rest when the turn's
        snapshot is saved). One statement for a turn's first start, where the dialect
        has `ON CONFLICT`; the run holds the turn's lease, so no other start races it."""
        kept, found = self._kept_request(conn, turn_id, session, request)
        return kept or found == request

    def _kept_request(
        self, conn: Connection, turn_id: str, session: str | None, value: str | None
    ) -> tuple[bool, Any]:
        """Keep `value` as the turn's `REQUEST` entry unless one is kept already: (True,
        `value`) when kept now, else (False, the one kept). A refusal keeps None."""
        row = {
            "turn_id": turn_id,
            "key": REQUEST,
            "session_id": session or "",
            "body": json.dumps(value),
            "created_at": utcnow(),
        }
        keep = self._keep_request
        if keep is not None and keep.execute(conn, row).first() is not None:
            return True, value
        found = _F_REQUEST_OF.execute(conn, {"p_turn": turn_id}).first()
        if found is None:
            _F_RECORD.execute(conn, row)
            return True, value
        return False, json.loads(found[0])

    def _hold(self, turn_id: str, owner: str, session: str | None) -> None:
        _RUN.set((self._token, turn_id, owner, session))
        with self._held_lock:
            self._held[turn_id] = owner
            if session is not None:
                self._held[session_lease(session)] = owner
                self._sessions[turn_id] = session

    @staticmethod
    def _ended(conn: Connection, params: dict[str, Any]) -> TurnStart | None:
        """ENDED when a snapshot carries the turn id (the first one), or else a refusal
        ended the turn; one statement."""
        if (ended := _F_ENDED.execute(conn, params).first()) is None:
            return None
        snapshot_id = str(ended[0]) if ended[0] is not None else None
        reason = str(ended[2]) if ended[2] is not None else None
        return TurnStart(TurnStartKind.ENDED, snapshot_id, str(ended[1]), reason)

    def _begin_portable(
        self, turn_id: str, owner: str, ttl: float, session: str | None, request: str | None
    ) -> TurnStart:
        """`begin` for a database without `ON CONFLICT`: more transactions, and every
        start counts as a take-over (the journal is always read)."""
        with self.store.engine.begin() as conn:
            ended = self._ended(conn, {"p_turn": turn_id})
        if ended is not None:
            return ended
        found = self.holder(turn_id)
        if not self.acquire(turn_id, owner, ttl):
            with self.store.engine.begin() as conn:
                return _busy_or_foreign(conn, turn_id, request)
        kind = TurnStartKind.NEW if found is None else TurnStartKind.TAKEN_OVER
        params = {"p_turn": turn_id, "p_owner": owner}
        if request is not None:
            with self.store.writer(relaxed=True).begin() as conn:
                same = self._same_request(conn, turn_id, session, request)
                if not same:
                    _give_back(conn, kind, params, found)
            if not same:
                with self.store.engine.begin() as conn:
                    ended = self._ended(conn, {"p_turn": turn_id})
                return ended or TurnStart(TurnStartKind.FOREIGN)
        if session is not None and not self.acquire(session_lease(session), owner, ttl):
            with self.store.writer(relaxed=True).begin() as conn:
                _give_back(conn, kind, params, found)
            return TurnStart(TurnStartKind.SESSION_BUSY)
        self._hold(turn_id, owner, session)
        return TurnStart(TurnStartKind.TAKEN_OVER)

    def _on_save(self, conn: Connection, snapshot: Snapshot, created: bool) -> None:
        """The snapshot that ends a turn held here gives up its lease and drops its
        journal entries, in the snapshot's own transaction: once it commits, `begin`
        answers ENDED and nothing replays them."""
        if not created or snapshot.turn_id is None:
            return
        owner, session = self._run_of(snapshot.turn_id)
        if owner is None:
            return
        params = {"p_turn": snapshot.turn_id, "p_owner": owner}
        if _F_DROP_LEASE.execute(conn, params).rowcount == 0:
            # another run took the turn over: its snapshot, not this one, ends the turn
            raise LeaseLost(snapshot.turn_id, owner)
        _F_DROP_ENTRIES.execute(conn, params)
        if session is not None:  # the session goes on from this snapshot: let it
            key = {"p_turn": session_lease(session), "p_owner": owner}
            if _F_DROP_LEASE.execute(conn, key).rowcount == 0:
                raise SessionLeaseLost(snapshot.turn_id, owner, session)

    def _run_of(self, turn_id: str) -> tuple[str | None, str | None]:
        """The owner and session of this context's run of `turn_id` (else, for a caller
        that is no such run, of the last `begin` of it in this process)."""
        run = _RUN.get()
        if run is not None and run[:2] == (self._token, turn_id):
            return run[2], run[3]
        with self._held_lock:
            return self._held.get(turn_id), self._sessions.get(turn_id)

    @staticmethod
    def _still_held(conn: Connection, turn_id: str, owner: str) -> None:
        """Raise `LeaseLost` unless `owner` holds the turn's lease (run out or not: no
        one else took it), locking its row until `conn` commits, so that no other run
        takes it over between this check and the write it guards."""
        if _F_KEEP_LEASE.execute(conn, {"p_turn": turn_id, "p_owner": owner}).rowcount == 0:
            raise LeaseLost(turn_id, owner)

    def end(self, turn_id: str, owner: str, *, snapshot_saved: bool) -> None:
        """The run of `turn_id` that `begin` started is over. When no snapshot ended the
        turn (it was refused, or the run raised), its lease is expired, not deleted:
        the next delivery takes it over and replays what this run journaled. The
        session's lease, if it took one, is given up (the snapshot gave it up already)."""
        run, session = _RUN.get(), None
        if run is not None and run[:3] == (self._token, turn_id, owner):
            _RUN.set(None)
            session = run[3]
        with self._held_lock:
            if self._held.get(turn_id) == owner:  # not another run's, begun here since
                del self._held[turn_id]
                session = self._sessions.pop(turn_id, None) or session
            if session is not None and self._held.get(session_lease(session)) == owner:
                del self._held[session_lease(session)]
        if snapshot_saved:
            return
        params = {"p_turn": turn_id, "p_owner": owner, "p_until": utcnow()}
        with self.store.writer(relaxed=True).begin() as conn:
            _F_RENEW.execute(conn, params)
            if session is not None:
                _F_DROP_LEASE.execute(conn, {**params, "p_turn": session_lease(session)})

    def expire(self, key: str, owner: str) -> None:
        """Let `owner`'s lease `key` run out now, so that the next `begin` takes it (the
        row is kept: that taker replays the journal). For a run given up, or a holder
        known to have died."""
        params = {"p_turn": key, "p_owner": owner, "p_until": utcnow()}
        with self.store.writer(relaxed=True).begin() as conn:
            _F_RENEW.execute(conn, params)

    def renew_held(self, ttl: float) -> int:
        """Extend every lease `begin` took here and not yet given up, in one
        transaction. Returns how many were renewed."""
        with self._held_lock:
            held = list(self._held.items())
        if not held:
            return 0
        until = utcnow() + timedelta(seconds=ttl)
        params = [{"p_turn": t, "p_owner": o, "p_until": until} for t, o in held]
        with self.store.writer(relaxed=True).begin() as conn:
            _F_RENEW.executemany(conn, params)
        return len(held)

    def held(self) -> dict[str, str]:
        """The leases `begin` took here and not yet given up: turn id -> owner."""
        with self._held_lock:
            return dict(self._held)

    # -- leases -------------------------------------------------------------------------

    def acquire(self, turn_id: str, owner: str, ttl: float) -> bool:
        """Take (or renew) the turn's lease for `ttl` seconds. False while another owner
        holds a live one."""
        now = utcnow()
        until = now + timedelta(seconds=ttl)
        with self.store.writer(relaxed=True).begin() as conn:
            done = conn.execute(
                update(_LEASE)
                .where(
                    _LEASE.c.turn_id == turn_id,
                    or_(_LEASE.c.owner == owner, _LEASE.c.expires_at <= now),
                )
                .values(owner=owner, expires_at=until)
            )
            if done.rowcount == 1:
                return True
        try:
            with self.store.writer(relaxed=True).begin() as conn:
                conn.execute(insert(_LEASE).values(turn_id=turn_id, owner=owner, expires_at=until))
        except IntegrityError:
            return False  # someone holds it (or took it between our two statements)
        return True

    def release(self, turn_id: str, owner: str) -> None:
        with self.store.writer(relaxed=True).begin() as conn:
            conn.execute(
                delete(_LEASE).where(and_(_LEASE.c.turn_id == turn_id, _LEASE.c.owner == owner))
            )

    def take_from(
        self,
        turn_id: str,
        holder: str,
        owner: str,
        ttl: float,
        *,
        session: str | None = None,
        request: str | None = None,
    ) -> bool:
        """Take the turn's lease from `holder` (one that is known to have died) for
        `ttl` seconds, live or not, and with `session` the session's lease too (from
        the same holder, or free): False when someone else holds either by now, or
        when `request` is not the fingerprint the turn was started with (its lease is
        then left run out, for `begin` to tell). Leases taken here are renewed and given
        up as those `begin` took."""
        now = utcnow()
        params = {
            "p_turn": turn_id,
            "p_holder": holder,
            "p_owner": owner,
            "p_until": now + timedelta(seconds=ttl),
            "p_now": now,
        }
        portable = session is not None and self._take_session is None
        if portable and not self._take_session_portable(str(session), params, ttl):
            return False  # (a database without ON CONFLICT: a transaction of its own)
        with self.store.writer(relaxed=True).begin() as conn:
            if session is not None and self._take_session is not None:
                key = {**params, "p_key": session_lease(session)}
                if self._take_session.execute(conn, key).first() is None:
                    return False
            taken = _F_TAKE_FROM.execute(conn, params).rowcount == 1
            if taken and request and not self._same_request(conn, turn_id, session, request):
                _F_RENEW.execute(conn, {**params, "p_until": now})
                taken = False
            if not taken and session is not None:  # give the session's back
                _F_DROP_LEASE.execute(conn, {**params, "p_turn": session_lease(session)})
        if taken:
            self._hold(turn_id, owner, session)
        return taken

    def _take_session_portable(self, session: str, params: dict[str, Any], ttl: float) -> bool:
        """`take_from`'s session lease without `ON CONFLICT`: the dead holder's, live or
        not, else a free or run-out one."""
        key = session_lease(session)
        with self.store.writer(relaxed=True).begin() as conn:
            if _F_TAKE_FROM.execute(conn, {**params, "p_turn": key}).rowcount == 1:
                return True
        return self.acquire(key, str(params["p_owner"]), ttl)

    def holder(self, turn_id: str) -> tuple[str, datetime] | None:
        """Who holds the turn's lease and until when (expired leases included)."""
        with self.store.engine.begin() as conn:
            row = conn.execute(
                select(_LEASE.c.owner, _LEASE.c.expires_at).where(_LEASE.c.turn_id == turn_id)
            ).first()
        return (str(row[0]), row[1]) if row is not None else None


def _busy_or_foreign(conn: Connection, turn_id: str, request: str | None) -> TurnStart:
    """The answer to a start of `turn_id` while another run holds its lease: FOREIGN
    when `request` is not the request the turn was first started with (it is another
    request under a taken id, refused now rather than left to wait for a turn that is
    not its own), else BUSY."""
    if request is not None:
        kept = _F_REQUEST_OF.execute(conn, {"p_turn": turn_id}).first()
        if kept is not None and json.loads(kept[0]) not in (None, request):
            return TurnStart(TurnStartKind.FOREIGN)
    return TurnStart(TurnStartKind.BUSY)


def _give_back(
    conn: Connection, kind: TurnStartKind, params: dict[str, Any], found: tuple[Any, ...] | None
) -> None:
    """Give back the turn's lease `begin` took, as it was found: none (NEW), or its
    holder's, run out (TAKEN_OVER: the next start replays the journal, and a holder that
    only stalled goes on holding it)."""
    if kind is TurnStartKind.NEW or found is None:
        _F_DROP_LEASE.execute(conn, params)
    else:
        holder, until = found
        restore = {"p_turn": params["p_turn"], "p_owner": params["p_owner"]}
        _F_RESTORE.execute(conn, {**restore, "p_holder": holder, "p_until": until})
