"""The `SessionStore` protocol every store implements."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from schemas import FinishReason, Snapshot, SnapshotStatus

__all__ = ["SessionStore"]


@runtime_checkable
class SessionStore(Protocol):
    """Where snapshots live. Implementations must make `claim` atomic across processes."""

    def get_snapshot(self, snapshot_id: str) -> Snapshot | None:
        """The snapshot with that id (whole history in `messages`), or None."""
        ...

    def get_latest_snapshot(self, session_id: str) -> Snapshot | None:
        """The newest snapshot of the session, whatever its status, or None. Newest is
        the last first saved (a replace keeps a snapshot's place), not the latest
        `created_at`: clocks of several machines need not agree."""
        ...

    def save_snapshot(self, snapshot: Snapshot) -> None:
        """Insert or replace the snapshot with that id."""
        ...

    def claim(self, snapshot_id: str, by: str) -> bool:
        """Claim an interrupted snapshot for one resume. Exactly one claimer wins;
        claiming again with the same `by` is True."""
        ...

    def release(self, snapshot_id: str, by: str) -> None:
        """Undo a claim made with `by` (a no-op when `by` does not hold it)."""
        ...

    def list_snapshots(
        self,
        session_id: str | None = None,
        status: SnapshotStatus | None = None,
        finish_reason: FinishReason | None = None,
        claimed: bool | None = None,
        limit: int = 100,
    ) -> list[Snapshot]:
        """Snapshots matching every given filter, newest (last first saved) first."""
        ...
