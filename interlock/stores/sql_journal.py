"""The turn journal and turn leases in SQL, beside a `SqlSessionStore`.

Journal: what a queue-run turn already did (model responses, tool outcomes), so a
redelivered turn replays it instead of doing it again (see `interlock.journal`).

Leases: one live run per turn. A worker takes the turn's lease before running it and
renews it while it runs; a second delivery of the same turn (a broker redelivering a
message whose visibility timeout passed, a duplicate enqueue) finds the lease held
and does not run it concurrently. A lease whose holder died expires, and the next
delivery takes over, replaying the journal.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    Column,
    DateTime,
    MetaData,
    Table,
    Text,
    and_,
    delete,
    insert,
    or_,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError

from schemas import utcnow

from .sql import SqlSessionStore

__all__ = ["SqlTurnJournal", "journal_metadata"]

journal_metadata = MetaData()

_JOURNAL = Table(
    "interlock_journal",
    journal_metadata,
    Column("turn_id", Text, primary_key=True),
    Column("key", Text, primary_key=True),
    Column("session_id", Text, nullable=False),
    Column("body", Text, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
)

_LEASE = Table(
    "interlock_turn_lease",
    journal_metadata,
    Column("turn_id", Text, primary_key=True),
    Column("owner", Text, nullable=False),
    Column("expires_at", DateTime(timezone=True), nullable=False),
)


class SqlTurnJournal:
    """Journal entries and turn leases in the store's database."""

    def __init__(self, store: SqlSessionStore) -> None:
        self.store = store
        store.create_all(journal_metadata)

    # -- the journal --------------------------------------------------------------------

    def load(self, session_id: str, turn_id: str) -> dict[str, Any]:
        with self.store.engine.connect() as conn:
            rows = conn.execute(
                select(_JOURNAL.c.key, _JOURNAL.c.body).where(_JOURNAL.c.turn_id == turn_id)
            ).all()
        return {str(key): json.loads(body) for key, body in rows}

    def record(self, session_id: str, turn_id: str, key: str, value: Any) -> None:
        row = {
            "turn_id": turn_id,
            "key": key,
            "session_id": session_id,
            "body": json.dumps(value),
            "created_at": utcnow(),
        }
        try:
            with self.store.writer().begin() as conn:
                conn.execute(insert(_JOURNAL).values(row))
        except IntegrityError:
            pass  # the first value written wins

    # -- leases -------------------------------------------------------------------------

    def acquire(self, turn_id: str, owner: str, ttl: float) -> bool:
        """Take (or renew) the turn's lease for `ttl` seconds. False while another owner
        holds a live one."""
        now = utcnow()
        until = now + timedelta(seconds=ttl)
        with self.store.writer().begin() as conn:
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
            with self.store.writer().begin() as conn:
                conn.execute(insert(_LEASE).values(turn_id=turn_id, owner=owner, expires_at=until))
        except IntegrityError:
            return False  # someone holds it (or took it between our two statements)
        return True

    def release(self, turn_id: str, owner: str) -> None:
        with self.store.writer().begin() as conn:
            conn.execute(
                delete(_LEASE).where(and_(_LEASE.c.turn_id == turn_id, _LEASE.c.owner == owner))
            )

    def holder(self, turn_id: str) -> tuple[str, datetime] | None:
        """Who holds the turn's lease and until when (expired leases included)."""
        with self.store.engine.connect() as conn:
            row = conn.execute(
                select(_LEASE.c.owner, _LEASE.c.expires_at).where(_LEASE.c.turn_id == turn_id)
            ).first()
        return (str(row[0]), row[1]) if row is not None else None
