"""The `SessionStore` protocol every store implements."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from schemas import FinishReason, Snapshot, SnapshotStatus, Status

from ..errors import StatusError

__all__ = ["LatestSnapshotId", "SessionStore", "SnapshotHeads", "snapshot_filters"]


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
        """Insert or replace the snapshot with that id. A replace changes no other
        snapshot (a child keeps the history it was saved with), nor the claim
        (`resumed_by`: only `claim` and `release` change it). The first
        `snapshot.inherited` messages may be taken as the parent's, unchanged; a
        snapshot read back has `inherited` 0."""
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
        """Snapshots matching every given filter, newest (last first saved) first. An
        unknown `status` or `finish_reason` is INVALID_ARGUMENT (`snapshot_filters`)."""
        ...


@runtime_checkable
class LatestSnapshotId(Protocol):
    """What a store may offer besides `SessionStore`: the id of a session's newest
    snapshot without reading its history. An agent continuing a session from a snapshot
    (`snapshot_id=`, as a connection does) asks it whether that snapshot is still the
    newest; without it, the agent reads the newest snapshot whole. Both stores here have
    it."""

    def latest_snapshot_id(self, session_id: str) -> str | None:
        """The id of the snapshot `get_latest_snapshot(session_id)` returns, or None."""
        ...


@runtime_checkable
class SnapshotHeads(Protocol):
    """What a store may offer besides `SessionStore`: snapshots without their history
    (heads: every field as `get_snapshot` has it, but `messages` left empty). An agent
    asks for heads where it needs only a snapshot's session, status or pause: the
    session a `snapshot_id=` names, whether a session is paused beside the snapshot a
    new message branches from, the turn an expired pause started from. Without them,
    it reads those snapshots whole. Both stores here have them.

    A head is for reading only: saved, it would replace the snapshot's history with
    none."""

    def get_snapshot_head(self, snapshot_id: str) -> Snapshot | None:
        """`get_snapshot(snapshot_id)` with its history unread (`messages` empty)."""
        ...

    def list_snapshot_heads(
        self,
        session_id: str | None = None,
        status: SnapshotStatus | None = None,
        finish_reason: FinishReason | None = None,
        claimed: bool | None = None,
        limit: int = 100,
    ) -> list[Snapshot]:
        """`list_snapshots(...)` with the histories unread (`messages` empty)."""
        ...


def snapshot_filters(
    status: SnapshotStatus | str | None, finish_reason: FinishReason | str | None
) -> tuple[SnapshotStatus | None, FinishReason | None]:
    """`list_snapshots`' `status` and `finish_reason` as enums; an unknown value is
    INVALID_ARGUMENT listing the valid ones."""
    return (
        None if status is None else _status(status),
        None if finish_reason is None else _finish_reason(finish_reason),
    )


def _status(value: SnapshotStatus | str) -> SnapshotStatus:
    try:
        return SnapshotStatus(value)
    except ValueError:
        pass
    hint = ""
    if value == FinishReason.INTERRUPTED:
        hint = (
            "; a paused snapshot has status 'completed' and finish_reason 'interrupted' "
            "(list_snapshots(status='completed', finish_reason='interrupted'))"
        )
    valid = ", ".join(s.value for s in SnapshotStatus)
    raise StatusError(
        Status.INVALID_ARGUMENT, f"unknown snapshot status {value!r} (valid: {valid}){hint}"
    )


def _finish_reason(value: FinishReason | str) -> FinishReason:
    try:
        return FinishReason(value)
    except ValueError:
        valid = ", ".join(r.value for r in FinishReason)
        raise StatusError(
            Status.INVALID_ARGUMENT, f"unknown finish_reason {value!r} (valid: {valid})"
        ) from None
