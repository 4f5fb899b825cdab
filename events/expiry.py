"""Deadlines: interrupted snapshots whose `expires_at` passed are marked `expired`, and
`turn.expired` goes out through the outbox (same transaction)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import and_, select, update

from schemas import FinishReason, SnapshotStatus, TurnExpired, utcnow

from .outbox import Outbox
from .store import SqlStore

__all__ = ["expire_overdue"]


def expire_overdue(
    store: SqlStore, outbox: Outbox, *, now: datetime | None = None, limit: int = 500
) -> list[TurnExpired]:
    """Expire every unclaimed interrupted snapshot past its deadline. The update is
    conditional, so a decision claiming the snapshot at the same moment either wins
    (the snapshot resumes) or loses (it gets FAILED_PRECONDITION): never both."""
    now = now or utcnow()
    snaps = store.metadata.tables["interlock_snapshot"]
    overdue = and_(
        snaps.c.status == SnapshotStatus.COMPLETED.value,
        snaps.c.finish_reason == FinishReason.INTERRUPTED.value,
        snaps.c.resumed_by.is_(None),
        snaps.c.expires_at.is_not(None),
        snaps.c.expires_at <= now,
    )
    expired: list[TurnExpired] = []
    with store.writer().begin() as conn:
        rows = conn.execute(
            select(
                snaps.c.snapshot_id,
                snaps.c.session_id,
                snaps.c.agent,
                snaps.c.turn_id,
                snaps.c.expires_at,
            )
            .where(overdue)
            .order_by(snaps.c.seq)
            .limit(limit)
        ).all()
        for row in rows:
            done = conn.execute(
                update(snaps)
                .where(snaps.c.snapshot_id == row.snapshot_id, overdue)
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
