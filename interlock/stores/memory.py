"""A session store in the process's memory, for tests, examples and single processes."""

from __future__ import annotations

import threading

from schemas import FinishReason, Snapshot, SnapshotStatus, utcnow

__all__ = ["InMemorySessionStore"]


def _claimable(snap: Snapshot) -> bool:
    return (
        snap.status == SnapshotStatus.COMPLETED and snap.finish_reason == FinishReason.INTERRUPTED
    )


class InMemorySessionStore:
    """Keeps snapshots in a dict. Claims are atomic across threads, not processes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._snapshots: dict[str, Snapshot] = {}
        self._order: dict[str, int] = {}
        self._seq = 0

    def get_snapshot(self, snapshot_id: str) -> Snapshot | None:
        with self._lock:
            snap = self._snapshots.get(snapshot_id)
            return snap.model_copy(deep=True) if snap is not None else None

    def get_latest_snapshot(self, session_id: str) -> Snapshot | None:
        found = self.list_snapshots(session_id=session_id, limit=1)
        return found[0] if found else None

    def save_snapshot(self, snapshot: Snapshot) -> None:
        with self._lock:
            if snapshot.snapshot_id not in self._order:
                self._seq += 1
                self._order[snapshot.snapshot_id] = self._seq
            self._snapshots[snapshot.snapshot_id] = snapshot.model_copy(deep=True)

    def claim(self, snapshot_id: str, by: str) -> bool:
        with self._lock:
            snap = self._snapshots.get(snapshot_id)
            if snap is None or not _claimable(snap):
                return False
            if snap.resumed_by is None:
                snap.resumed_by = by
                snap.updated_at = utcnow()
                return True
            return snap.resumed_by == by

    def release(self, snapshot_id: str, by: str) -> None:
        with self._lock:
            snap = self._snapshots.get(snapshot_id)
            if snap is not None and snap.resumed_by == by:
                snap.resumed_by = None
                snap.updated_at = utcnow()

    def list_snapshots(
        self,
        session_id: str | None = None,
        status: SnapshotStatus | None = None,
        finish_reason: FinishReason | None = None,
        claimed: bool | None = None,
        limit: int = 100,
    ) -> list[Snapshot]:
        with self._lock:
            snaps = sorted(
                self._snapshots.values(),
                key=lambda s: self._order[s.snapshot_id],
                reverse=True,
            )
            out = [
                s.model_copy(deep=True)
                for s in snaps
                if (session_id is None or s.session_id == session_id)
                and (status is None or s.status == status)
                and (finish_reason is None or s.finish_reason == finish_reason)
                and (claimed is None or (s.resumed_by is not None) == claimed)
            ]
            return out[:limit]
