"""Deadlines: interrupted snapshots whose `expires_at` passed are marked `expired`, and
`turn.expired` goes out through the outbox (same transaction)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import and_, select, update

from interlock import FinishReason, SnapshotStatus, SqlSessionStore
from interlock.stores.sql import metadata
from schemas import TurnExpired, utcnow

from .outbox import Outbox

__all__ = ["expire_overdue"]

_SNAP = metadata.tables["interlock_snapshot"]


def expire_overdue(
    store: SqlSessionStore, outbox: Outbox, *, now: datetime | None = None, limit: int = 500
) -> list[TurnExpired]:
    """Expire every unclaimed interrupted snapshot past its deadline. The update is
    conditional, so a decision claiming the snapshot at the same moment either wins
    (the snapshot resumes) or loses (it gets FAILED_PRECONDITION): never both."""
    now = now or utcnow()
    overdue = and_(
        _SNAP.c.status == SnapshotStatus.COMPLETED.value,
        _SNAP.c.finish_reason == FinishReason.INTERRUPTED.value,
        _SNAP.c.resumed_by.is_(None),
        _SNAP.c.expires_at.is_not(None),
        _SNAP.c.expires_at <= now,
    )
    expired: list[TurnExpired] = []
    with store.writer().begin() as conn:
        rows = conn.execute(
            select(
                _SNAP.c.snapshot_id,
                _SNAP.c.session_id,
                _SNAP.c.agent,
                _SNAP.c.turn_id,
                _SNAP.c.expires_at,
            )
            .where(overdue)
            .order_by(_SNAP.c.seq)
            .limit(limit)
        ).all()
        for row in rows:
            done = conn.execute(
                update(_SNAP)
                .where(_SNAP.c.snapshot_id == row.snapshot_id, overdue)
                .values(
                    status=SnapshotStatus.EXPIRED.value,
                    finish_reason=FinishReason.EXPIRED.value,
                    updated_at=now,
                )
            )
            if done.rowcount != 1:
                continue
            event = TurnExpired(
                agent=row.agent,
                session_id=row.session_id,
                snapshot_id=row.snapshot_id,
                turn_id=row.turn_id,
                expires_at=row.expires_at,
            )
            outbox.add(conn, event)
            expired.append(event)
    return expired
