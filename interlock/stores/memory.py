"""A session store in the process's memory, for tests, examples and single processes.

Messages are kept as their JSON text, the way the SQL store keeps them, and a snapshot
shares the texts of the messages it inherited from its parent: saving a turn
serializes only the messages it added, and reading a snapshot parses its history in
one call (`validate_json`), where copying it object by object would cost several
times as much on a long session. Callers get fresh objects either way and never share
one with the store."""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterable
from datetime import date, datetime, time, timedelta
from enum import Enum
from typing import Any, cast

from pydantic import BaseModel, TypeAdapter

from schemas import FinishReason, Message, Snapshot, SnapshotStatus, utcnow

from .base import snapshot_filters

__all__ = ["InMemorySessionStore"]

# Immutable: a deep copy may share them. The exact types first (a set lookup), then
# their subclasses (str enums and the like).
_ATOMIC = (str, int, float, bool, type(None), datetime, date, time, timedelta, Enum)
_ATOMIC_TYPES = frozenset(_ATOMIC)
_MODEL_TYPES: dict[type, bool] = {}  # type -> is it a pydantic model


def _clone(value: Any) -> Any:
    """A deep copy, as `copy.deepcopy` makes one, but fast for what snapshots hold:
    pydantic models, dicts and lists of JSON values. Immutable values (str, numbers,
    enums, datetimes) are shared rather than rebuilt; anything else goes through
    `copy.deepcopy`. Used where the store copied with `model_copy(deep=True)`."""
    kind = type(value)
    if kind in _ATOMIC_TYPES:
        return value
    if kind is dict:
        return {k: v if type(v) in _ATOMIC_TYPES else _clone(v) for k, v in value.items()}
    if kind is list:
        return [v if type(v) in _ATOMIC_TYPES else _clone(v) for v in value]
    is_model = _MODEL_TYPES.get(kind)
    if is_model is None:
        is_model = _MODEL_TYPES[kind] = issubclass(kind, BaseModel)
    if not is_model and isinstance(value, _ATOMIC):
        return value
    if is_model and value.__pydantic_extra__ is None:
        private = value.__pydantic_private__
        if not private:  # what `BaseModel.__copy__` does, with the values copied deeply
            clone = object.__new__(kind)
            fields = {
                k: v if type(v) in _ATOMIC_TYPES else _clone(v) for k, v in value.__dict__.items()
            }
            object.__setattr__(clone, "__dict__", fields)
            object.__setattr__(clone, "__pydantic_fields_set__", set(value.__pydantic_fields_set__))
            object.__setattr__(clone, "__pydantic_extra__", None)
            object.__setattr__(clone, "__pydantic_private__", None if private is None else {})
            return clone
    return copy.deepcopy(value)


_MESSAGES = TypeAdapter(list[Message])


class _Stored:
    """A snapshot as the store keeps it: its fields without the messages (`head`), and
    the JSON text of each message of its history."""

    __slots__ = ("head", "texts")

    def __init__(self, head: Snapshot, texts: list[str]) -> None:
        self.head = head
        self.texts = texts

    def fields(self) -> tuple[Snapshot, list[str]]:
        """A copy of the fields, and the texts (never changed once stored). Under the
        store's lock: claims change the fields in place."""
        return cast(Snapshot, _clone(self.head)), self.texts


def _snapshot(fields: tuple[Snapshot, list[str]]) -> Snapshot:
    """The snapshot of `_Stored.fields()`, its history parsed: the caller's to change."""
    head, texts = fields
    head.__dict__["messages"] = _MESSAGES.validate_json("[" + ",".join(texts) + "]")
    return head


def _claimable(snap: Snapshot) -> bool:
    return (
        snap.status == SnapshotStatus.COMPLETED
        and snap.finish_reason == FinishReason.INTERRUPTED
        and (snap.expires_at is None or snap.expires_at > utcnow())
    )


class InMemorySessionStore:
    """Keeps snapshots in a dict. Claims are atomic across threads, not processes.

    Snapshots are copied on the way in and out, so callers never share one with the store.
    `_snapshots` keeps first-save order (a replace keeps its place), which is the order
    of `list_snapshots`, newest first; `_sessions` indexes it by session."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._snapshots: dict[str, _Stored] = {}
        self._sessions: dict[str, list[str]] = {}

    def get_snapshot(self, snapshot_id: str) -> Snapshot | None:
        with self._lock:
            found = self._snapshots.get(snapshot_id)
            fields = found.fields() if found is not None else None
        return _snapshot(fields) if fields is not None else None

    def get_latest_snapshot(self, session_id: str) -> Snapshot | None:
        found = self.list_snapshots(session_id=session_id, limit=1)
        return found[0] if found else None

    def latest_snapshot_id(self, session_id: str) -> str | None:
        with self._lock:
            ids = self._sessions.get(session_id)
            return ids[-1] if ids else None

    def save_snapshot(self, snapshot: Snapshot) -> None:
        if type(snapshot.status) is not SnapshotStatus or not (
            snapshot.finish_reason is None or type(snapshot.finish_reason) is FinishReason
        ):  # built without validation (`model_copy(update=...)`): checked as the SQL
            # store's read checks it, so that what comes back is a valid snapshot
            snapshot = Snapshot.model_validate(snapshot.model_dump(warnings=False))
        messages = snapshot.messages
        parent_id = snapshot.parent_id
        with self._lock:
            parent = self._snapshots.get(parent_id) if parent_id is not None else None
        # Like the SQL store: the first `inherited` messages are the parent's, unchanged,
        # when the parent holds that many; they share its texts.
        want = min(max(snapshot.inherited, 0), len(messages))
        if parent is None or parent_id == snapshot.snapshot_id or len(parent.texts) < want:
            want = 0
        texts = parent.texts[:want] if parent is not None and want else []
        texts.extend(m.model_dump_json() for m in messages[want:])
        # What is read back owes nothing to a parent (`inherited` 0): saved again, after
        # an edit, it is stored as it stands. Each snapshot holds its own list of texts,
        # so a replace changes no other snapshot.
        update: dict[str, Any] = {"messages": [], "inherited": 0}
        head = cast(Snapshot, _clone(snapshot.model_copy(update=update)))
        stored = _Stored(head, texts)
        with self._lock:
            old = self._snapshots.get(snapshot.snapshot_id)
            if old is not None:  # the claim changes only through `claim` and `release`
                head.resumed_by = old.head.resumed_by
            self._snapshots[snapshot.snapshot_id] = stored
            if old is None:
                self._sessions.setdefault(snapshot.session_id, []).append(snapshot.snapshot_id)
            elif old.head.session_id != snapshot.session_id:  # moved to another session
                for session in (old.head.session_id, snapshot.session_id):
                    self._sessions[session] = [
                        sid for sid, s in self._snapshots.items() if s.head.session_id == session
                    ]

    def claim(self, snapshot_id: str, by: str) -> bool:
        with self._lock:
            found = self._snapshots.get(snapshot_id)
            if found is None or not _claimable(found.head):
                return False
            head = found.head
            if head.resumed_by is None:
                head.resumed_by = by
                head.updated_at = utcnow()
                return True
            return head.resumed_by == by

    def release(self, snapshot_id: str, by: str) -> None:
        with self._lock:
            found = self._snapshots.get(snapshot_id)
            if found is not None and found.head.resumed_by == by:
                found.head.resumed_by = None
                found.head.updated_at = utcnow()

    def list_snapshots(
        self,
        session_id: str | None = None,
        status: SnapshotStatus | str | None = None,
        finish_reason: FinishReason | str | None = None,
        claimed: bool | None = None,
        limit: int = 100,
    ) -> list[Snapshot]:
        picked = self._pick(session_id, status, finish_reason, claimed, limit)
        return [_snapshot(fields) for fields in picked]

    def get_snapshot_head(self, snapshot_id: str) -> Snapshot | None:
        """`get_snapshot` with the history unread: `messages` is empty (`SnapshotHeads`)."""
        with self._lock:
            found = self._snapshots.get(snapshot_id)
            return found.fields()[0] if found is not None else None

    def list_snapshot_heads(
        self,
        session_id: str | None = None,
        status: SnapshotStatus | str | None = None,
        finish_reason: FinishReason | str | None = None,
        claimed: bool | None = None,
        limit: int = 100,
    ) -> list[Snapshot]:
        """`list_snapshots` with the histories unread: `messages` is empty
        (`SnapshotHeads`)."""
        return [head for head, _ in self._pick(session_id, status, finish_reason, claimed, limit)]

    def _pick(
        self,
        session_id: str | None,
        status: SnapshotStatus | str | None,
        finish_reason: FinishReason | str | None,
        claimed: bool | None,
        limit: int,
    ) -> list[tuple[Snapshot, list[str]]]:
        """The fields (`_Stored.fields`) of the snapshots `list_snapshots` returns."""
        status, finish_reason = snapshot_filters(status, finish_reason)
        picked: list[tuple[Snapshot, list[str]]] = []
        if limit <= 0:
            return []
        with self._lock:
            ids: Iterable[str] = (
                reversed(self._sessions.get(session_id, ()))
                if session_id is not None
                else reversed(self._snapshots)
            )
            for sid in ids:
                found = self._snapshots[sid]
                s = found.head
                if (
                    (status is None or s.status == status)
                    and (finish_reason is None or s.finish_reason == finish_reason)
                    and (claimed is None or (s.resumed_by is not None) == claimed)
                ):
                    picked.append(found.fields())
                    if len(picked) >= limit:
                        break
        return picked
