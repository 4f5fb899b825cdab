"""A session's history of interrupts and decisions, for `interlock audit`."""

from __future__ import annotations

import json
from typing import Any

from events.decision_log import DecisionLog
from interlock import FinishReason, SnapshotStatus, SqlSessionStore
from interlock.stores.sql_journal import refused_turns
from schemas import wire_time

__all__ = ["session_history"]


def _snapshot_entries(snap: Any) -> list[dict[str, Any]]:
    """A snapshot's entry; a pause that expired unanswered shows as what it asked (at
    its pause) and its expiry (at its deadline)."""
    if snap.status == SnapshotStatus.EXPIRED:
        asked = _snapshot_entry(snap, "interrupted")
        expired = {
            "at": wire_time(snap.expires_at or snap.created_at, microseconds=True),
            "kind": "expired",
            "snapshot_id": snap.snapshot_id,
            "turn_id": snap.turn_id,
        }
        return [asked, expired]
    return [_snapshot_entry(snap)]


def _snapshot_entry(snap: Any, kind: str | None = None) -> dict[str, Any]:
    if kind is None:
        kind = snap.status.value
    if snap.status == SnapshotStatus.COMPLETED:
        kind = "interrupted" if snap.finish_reason == FinishReason.INTERRUPTED else "completed"
    entry: dict[str, Any] = {
        "at": wire_time(snap.created_at, microseconds=True),
        "kind": kind,
        "snapshot_id": snap.snapshot_id,
        "turn_id": snap.turn_id,
    }
    message = snap.last_model_message
    if kind == "interrupted" and message is not None:
        entry["interrupts"] = [
            {"name": p.tool_request.name, "ref": p.tool_request.ref, "payload": p.meta("interrupt")}
            for p in message.interrupts
            if p.tool_request is not None
        ]
        entry["expires_at"] = (
            wire_time(snap.expires_at, microseconds=True) if snap.expires_at else None
        )
        entry["resumed_by"] = snap.resumed_by
    elif kind == "completed" and message is not None:
        entry["text"] = message.text
    if snap.error is not None:
        entry["error"] = snap.error.model_dump(mode="json")
    return entry


def _answers(body: str) -> dict[str, Any]:
    try:
        data = json.loads(body)
    except ValueError:
        return {}
    if not isinstance(data, dict):
        return {}
    return {key: data.get(key, []) for key in ("respond", "restart")}


def session_history(
    store: SqlSessionStore, decisions: DecisionLog | None, session_id: str
) -> list[dict[str, Any]]:
    """Interrupts, decisions and outcomes of a session, oldest first: its snapshots, the
    decisions read for it, and the turns refused before they ran (a message sent while
    it was paused, say)."""
    snaps = store.list_snapshots(session_id=session_id, limit=100_000)
    entries = [entry for snap in snaps for entry in _snapshot_entries(snap)]
    for turn_id, error, when in refused_turns(store, session_id):
        entries.append(
            {
                "at": wire_time(when, microseconds=True),
                "kind": "refused",
                "turn_id": turn_id,
                "error": error,
            }
        )
    for record in decisions.for_session(session_id) if decisions is not None else []:
        entries.append(
            {
                "at": wire_time(record.received_at, microseconds=True),
                "kind": "decision",
                "decision_id": record.decision_id,
                "snapshot_id": record.snapshot_id,
                "reviewer": record.reviewer,
                "outcome": record.outcome,
                "status": record.status,
                "message": record.message,
                **_answers(record.body),
            }
        )
    entries.sort(key=lambda e: e["at"])
    return entries
