"""Deleting what the store keeps of sessions long done, for `interlock prune`.

A session is pruned when it has been idle for longer than the retention (its newest
snapshot was last written before the cutoff) and it waits for no one and nothing: none
of its snapshots is an open pause (interrupted and not claimed) or `pending`, its newest
is no claimed pause (a decision answered it: its resume is queued or runs), no turn of
it holds the session's lease (a new message running), and the journal holds no entry of
a turn of it that has not ended (a run that died, to be retried). Its snapshots, their
messages, its decision records and the journal's refusals of its turns are deleted
together, a batch of sessions per write transaction. Decision records and refusals that
name no session (a malformed decision, an unknown snapshot), or one the store holds no
snapshot of, are deleted once received before the cutoff.

While a batch is deleted, it holds the lease of each of its sessions, as a turn of a
new message does: such a turn, sent to a session as it is pruned, either starts before
(and the session is kept) or after (and finds no history: the session starts anew).
A session that would go but for such a turn (one holds its lease, or went on in it as
the batch was deleted) is kept, and counted as kept busy.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    Table,
    and_,
    bindparam,
    case,
    delete,
    exists,
    false,
    func,
    inspect,
    or_,
    select,
)
from sqlalchemy.engine import Connection

from events.decision_log import decision_table
from interlock import FinishReason, SnapshotStatus, SqlSessionStore
from interlock.stores.sql import metadata as store_metadata
from interlock.stores.sql_journal import REFUSED, journal_metadata, session_lease
from schemas import utcnow

from .settings import PRUNE_BATCH, PRUNE_BATCH_MAX

__all__ = ["PRUNE_BATCH", "PRUNE_BATCH_MAX", "Pruned", "cutoff_of", "prune_sessions"]


_SNAP: Table = store_metadata.tables["interlock_snapshot"]
_MSG: Table = store_metadata.tables["interlock_message"]
_JOURNAL: Table = journal_metadata.tables["interlock_journal"]
_LEASE: Table = journal_metadata.tables["interlock_turn_lease"]
_DECISION: Table = decision_table

_OWNER_PREFIX = "prune:"


@dataclass
class Pruned:
    """What a prune deleted (or, for a dry run, would delete), and the sessions it kept
    only because a turn of a new message ran on them (`kept_busy`)."""

    sessions: int = 0
    snapshots: int = 0
    messages: int = 0
    decisions: int = 0
    refusals: int = 0
    kept_busy: int = 0

    def add(self, other: Pruned) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def prune_sessions(
    store: SqlSessionStore,
    older_than: float,
    *,
    batch: int = PRUNE_BATCH,
    dry_run: bool = False,
    on_batch: Callable[[Pruned], None] | None = None,
) -> tuple[Pruned, datetime]:
    """Delete the sessions idle for more than `older_than` seconds and settled (the
    module's docstring), `batch` sessions a transaction, then the decision records and
    refusals older than that which name no session, or one with no snapshot.
    `on_batch(total so far)` after each transaction. With `dry_run`, count what would
    go and change nothing. Returns the counts and the cutoff."""
    if not 1 <= batch <= PRUNE_BATCH_MAX:
        raise ValueError(f"batch must be from 1 to {PRUNE_BATCH_MAX}")
    cutoff = cutoff_of(older_than)
    tables = set(inspect(store.engine).get_table_names())
    rules = _Rules(cutoff, tables)
    total = Pruned()
    after = ""
    while True:
        with store.engine.connect() if dry_run else store.writer().begin() as conn:
            chosen = rules.sessions(conn, after, batch)
            ids = [session for session, busy in chosen if not busy]
            if not ids:
                done = Pruned()
            elif dry_run:
                done = rules.count(conn, ids)
            else:
                done = rules.delete(conn, ids)
            done.kept_busy += len(chosen) - len(ids)
            if len(chosen) < batch:
                done.add(rules.unattached(conn, dry_run))
        total.add(done)
        if on_batch is not None and (chosen or done.decisions or done.refusals):
            on_batch(replace(total))
        if len(chosen) < batch:
            return total, cutoff
        after = chosen[-1][0]


def cutoff_of(older_than: float) -> datetime:
    """The time before which a session idle for more than `older_than` seconds was last
    written: now, less that."""
    return utcnow() - timedelta(seconds=older_than)


class _Rules:
    """The statements of a prune with `cutoff`, on a database holding `tables`: the
    decision log and the journal may not exist (a store used in process only)."""

    def __init__(self, cutoff: datetime, tables: set[str]) -> None:
        self.cutoff = cutoff
        self.decisions = _DECISION.name in tables
        self.journal = _JOURNAL.name in tables
        self.leases = _LEASE.name in tables
        self._owner = f"{_OWNER_PREFIX}{uuid.uuid4().hex}"  # of the leases it takes

    def sessions(
        self, conn: Connection, after: str, batch: int, among: Sequence[str] | None = None
    ) -> list[tuple[str, bool]]:
        """Up to `batch` sessions after `after` (and of `among`, if given), in session id
        order, that are prunable but may be busy: each with whether a turn of a new message
        holds its lease (not this prune's), which keeps it."""
        paused = and_(
            _SNAP.c.status == SnapshotStatus.COMPLETED.value,
            _SNAP.c.finish_reason == FinishReason.INTERRUPTED.value,
        )
        waiting = or_(
            _SNAP.c.status == SnapshotStatus.PENDING.value,
            and_(paused, _SNAP.c.resumed_by.is_(None)),
        )
        # a claimed pause no snapshot follows: its resume is queued or runs
        claimed = func.max(case((and_(paused, _SNAP.c.resumed_by.is_not(None)), _SNAP.c.seq)))
        busy: Any = false()
        if self.leases:  # a turn of a new message runs on it (not this prune's lease)
            busy = exists().where(
                _LEASE.c.turn_id == "session:" + _SNAP.c.session_id, _LEASE.c.owner != self._owner
            )
        query = select(_SNAP.c.session_id, busy).where(_SNAP.c.session_id > after)
        if among is not None:
            query = query.where(_SNAP.c.session_id.in_(among))
        if self.journal:  # a turn of the session that has not ended: it may run again
            ended = _JOURNAL.alias("ended")
            unended = select(_JOURNAL.c.session_id).where(
                ~exists().where(ended.c.turn_id == _JOURNAL.c.turn_id, ended.c.key == REFUSED)
            )
            # not correlated: read once a statement (a store not migrated since the
            # journal's index on session_id came lacks it, and a subquery run for each
            # snapshot row would then read the journal each time)
            query = query.where(_SNAP.c.session_id.not_in(unended))
        query = (
            query.group_by(_SNAP.c.session_id)
            .having(
                and_(
                    func.max(_SNAP.c.updated_at) < self.cutoff,
                    func.sum(case((waiting, 1), else_=0)) == 0,
                    or_(claimed.is_(None), claimed < func.max(_SNAP.c.seq)),
                )
            )
            .order_by(_SNAP.c.session_id)
            .limit(batch)
        )
        return [(str(session), bool(held)) for session, held in conn.execute(query)]

    def count(self, conn: Connection, ids: Sequence[str]) -> Pruned:
        snapshots = _in(_SNAP.c.session_id)
        own = select(_SNAP.c.snapshot_id).where(snapshots)
        counted = Pruned(sessions=len(ids))
        counted.snapshots = _count(conn, select(func.count()).where(snapshots), ids)
        counted.messages = _count(
            conn, select(func.count()).where(_MSG.c.snapshot_id.in_(own)), ids
        )
        if self.decisions:
            query = select(func.count()).where(_in(_DECISION.c.session_id))
            counted.decisions = _count(conn, query, ids)
        if self.journal:
            query = select(func.count()).where(_in(_JOURNAL.c.session_id))
            counted.refusals = _count(conn, query.where(_JOURNAL.c.key == REFUSED), ids)
        return counted

    def delete(self, conn: Connection, ids: Sequence[str]) -> Pruned:
        """Delete the sessions `ids` (chosen in this transaction), holding their leases
        meanwhile; those whose lease another holds now are left, and so are those a turn
        went on in since they were chosen (PostgreSQL: read committed, a statement sees
        what committed before it; once the leases are held, no turn of a new message
        can end there): kept busy."""
        chosen = len(ids)
        if self.leases:
            ids = self._lease(conn, ids)
            if ids:
                ids = [session for session, _ in self.sessions(conn, "", len(ids), among=ids)]
        done = Pruned(sessions=len(ids), kept_busy=chosen - len(ids))
        if ids:
            own = select(_SNAP.c.snapshot_id).where(_in(_SNAP.c.session_id))
            done.messages = _rows(conn, delete(_MSG).where(_MSG.c.snapshot_id.in_(own)), ids)
            done.snapshots = _rows(conn, delete(_SNAP).where(_in(_SNAP.c.session_id)), ids)
            if self.decisions:
                done.decisions = _rows(
                    conn, delete(_DECISION).where(_in(_DECISION.c.session_id)), ids
                )
            if self.journal:  # only refused turns are left in it (`sessions`)
                theirs = _in(_JOURNAL.c.session_id)
                refused = delete(_JOURNAL).where(theirs, _JOURNAL.c.key == REFUSED)
                done.refusals = _rows(conn, refused, ids)
                _rows(conn, delete(_JOURNAL).where(theirs), ids)  # their requests
        if self.leases:
            conn.execute(delete(_LEASE).where(_LEASE.c.owner == self._owner))
        return done

    def _lease(self, conn: Connection, ids: Sequence[str]) -> list[str]:
        """Take the lease of each session of `ids` that has none, for this transaction
        (a turn of a new message waits for it, then finds the session gone); the ids of
        those taken."""
        until = utcnow() + timedelta(minutes=5)
        rows = [
            {"turn_id": session_lease(session), "owner": self._owner, "expires_at": until}
            for session in ids
        ]
        taken = {str(row[0]) for row in conn.execute(_insert_if_new(conn, rows))}
        return [session for session in ids if session_lease(session) in taken]

    def unattached(self, conn: Connection, dry_run: bool) -> Pruned:
        """The decision records and refusals older than the cutoff that name no session,
        or a session the store holds no snapshot of (a turn refused before a session's
        first snapshot, a session pruned before)."""
        found = Pruned()
        if self.decisions:
            named = _DECISION.c.session_id
            where = and_(_DECISION.c.received_at < self.cutoff, or_(named.is_(None), _none(named)))
            found.decisions = _apply(conn, _DECISION, where, dry_run)
        if self.journal:
            named = _JOURNAL.c.session_id
            where = and_(
                _JOURNAL.c.key == REFUSED,
                _JOURNAL.c.created_at < self.cutoff,
                or_(named == "", _none(named)),
            )
            if not dry_run:  # the turns' other entry (their request) first
                turns = select(_JOURNAL.c.turn_id).where(where).scalar_subquery()
                requests = and_(_JOURNAL.c.turn_id.in_(turns), _JOURNAL.c.key != REFUSED)
                conn.execute(delete(_JOURNAL).where(requests))
            found.refusals = _apply(conn, _JOURNAL, where, dry_run)
        return found


def _none(session_id: Any) -> Any:
    """The store holds no snapshot of the session `session_id` (a column) names."""
    return ~exists().where(_SNAP.c.session_id == session_id)


def _in(column: Any) -> Any:
    return column.in_(bindparam("p_ids", expanding=True))


def _count(conn: Connection, query: Any, ids: Sequence[str]) -> int:
    return int(conn.execute(query, {"p_ids": list(ids)}).scalar_one())


def _rows(conn: Connection, statement: Any, ids: Sequence[str]) -> int:
    return int(conn.execute(statement, {"p_ids": list(ids)}).rowcount)


def _apply(conn: Connection, table: Table, where: Any, dry_run: bool) -> int:
    if dry_run:
        return int(conn.execute(select(func.count()).select_from(table).where(where)).scalar_one())
    return int(conn.execute(delete(table).where(where)).rowcount)


def _insert_if_new(conn: Connection, rows: list[dict[str, Any]]) -> Any:
    """INSERT `rows` into the leases, each unless its key is there: the keys inserted
    come back."""
    if conn.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert(_LEASE).values(rows).on_conflict_do_nothing().returning(_LEASE.c.turn_id)
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    return sqlite_insert(_LEASE).values(rows).on_conflict_do_nothing().returning(_LEASE.c.turn_id)
