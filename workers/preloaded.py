"""A session store that answers for one snapshot already read."""

from __future__ import annotations

from interlock.stores.base import SessionStore
from schemas import FinishReason, Snapshot, SnapshotStatus

__all__ = ["Preloaded"]


class Preloaded:
    """`store`, except that `get_snapshot` of the snapshot just read answers with it.
    Writes, claims and every other read go to `store`.

    The consumer validates a decision against the snapshot it has just read; the
    worker runs the first delivery of a resume on the paused snapshot its check of the
    task read. Neither reads it twice. A claimed pause changes only through a run of its
    own resume (a release when that fails; expiry passes claimed snapshots by), and none
    has run before a first delivery: the copy is the pause as it stands."""

    def __init__(self, store: SessionStore, snapshot: Snapshot) -> None:
        self._store = store
        self._snapshot = snapshot

    def get_snapshot(self, snapshot_id: str) -> Snapshot | None:
        if snapshot_id == self._snapshot.snapshot_id:
            return self._snapshot
        return self._store.get_snapshot(snapshot_id)

    def get_latest_snapshot(self, session_id: str) -> Snapshot | None:
        return self._store.get_latest_snapshot(session_id)

    def save_snapshot(self, snapshot: Snapshot) -> None:
        self._store.save_snapshot(snapshot)

    def claim(self, snapshot_id: str, by: str) -> bool:
        return self._store.claim(snapshot_id, by)

    def release(self, snapshot_id: str, by: str) -> None:
        self._store.release(snapshot_id, by)

    def list_snapshots(
        self,
        session_id: str | None = None,
        status: SnapshotStatus | None = None,
        finish_reason: FinishReason | None = None,
        claimed: bool | None = None,
        limit: int = 100,
    ) -> list[Snapshot]:
        return self._store.list_snapshots(session_id, status, finish_reason, claimed, limit)
