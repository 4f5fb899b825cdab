"""The event a freshly saved snapshot announces."""

from __future__ import annotations

from schemas import (
    ErrorInfo,
    EventBase,
    FinishReason,
    InterruptInfo,
    Snapshot,
    SnapshotStatus,
    Status,
    TurnCompleted,
    TurnFailed,
    TurnInterrupted,
)

from .tokens import hash_token, new_token

__all__ = ["event_for_snapshot"]


def event_for_snapshot(snapshot: Snapshot) -> EventBase | None:
    """`turn.interrupted`, `turn.completed` or `turn.failed` for a new snapshot. An
    interrupted one gets a fresh resume token, whose hash is set on the snapshot."""
    ids = {
        "agent": snapshot.agent,
        "session_id": snapshot.session_id,
        "snapshot_id": snapshot.snapshot_id,
        "turn_id": snapshot.turn_id,
    }
    message = snapshot.last_model_message
    if snapshot.status == SnapshotStatus.COMPLETED:
        if snapshot.finish_reason == FinishReason.INTERRUPTED and message is not None:
            token = new_token()
            snapshot.resume_token_hash = hash_token(token)
            interrupts = [
                InterruptInfo(
                    name=p.tool_request.name,
                    ref=p.tool_request.ref or "",
                    input=p.tool_request.input,
                    payload=p.meta("interrupt") or {},
                )
                for p in message.interrupts
                if p.tool_request is not None
            ]
            return TurnInterrupted(
                **ids,
                interrupts=interrupts,
                resume_token=token,
                expires_at=snapshot.expires_at,
                message=message,
            )
        return TurnCompleted(
            **ids, finish_reason=snapshot.finish_reason or FinishReason.STOP, message=message
        )
    if snapshot.status in (SnapshotStatus.FAILED, SnapshotStatus.ABORTED):
        return TurnFailed(
            **ids,
            error=snapshot.error or ErrorInfo(status=Status.UNKNOWN, message="turn failed"),
            last_snapshot_id=snapshot.parent_id,
        )
    return None
