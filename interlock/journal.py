"""The turn journal: what a turn already did, so a redelivered turn replays it.

A worker can die mid-turn; its task is then delivered again and the turn runs again
from the last snapshot. The journal keeps each tool call's outcome as it completes, and
each model response before the first tool acting on it runs, keyed by session, turn and
step (`model:N`) or call ref (`tool:REF`). The second run replays them: the model is
not asked again (so the calls and their refs are the same) and completed tools do not
run again. A model response that no tool acted on is not kept: the turn's snapshot
supersedes it, and a run that died before that snapshot asks the model again.

One window remains: a crash inside a tool after its side effect and before its
journal entry is written (or, for a store that does not wait for the disk on such
entries, a power cut before it got there). The tool then runs again on redelivery.
`ctx.idempotency_key` is the same on both runs (it depends on the session and the
call's ref, and the ref is replayed), so a tool that passes it to the outside system
(a payment API's idempotency key, a unique column) makes the second request harmless.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any, Protocol, runtime_checkable

__all__ = ["InMemoryJournal", "TurnJournal", "session_for_turn"]

_TURN_SESSIONS = uuid.UUID("d61b228a-9bea-4d19-932f-e4a43089ac06")
"""The namespace of the sessions named after a turn id (`session_for_turn`)."""


def session_for_turn(turn_id: str) -> str:
    """The session a turn that names none begins, when it may run again (a run with a
    journal): the same on every run of `turn_id`, so that a run after a crash goes on in
    the session the first one began, its journal replays, and each call keeps its
    `ctx.idempotency_key` (which depends on the session)."""
    return str(uuid.uuid5(_TURN_SESSIONS, turn_id))


@runtime_checkable
class TurnJournal(Protocol):
    """Durable per-turn memory. Values are JSON."""

    def load(self, session_id: str, turn_id: str) -> dict[str, Any]:
        """Every entry of the turn, by key."""
        ...

    def record(self, session_id: str, turn_id: str, key: str, value: Any) -> None:
        """Keep `value` under `key` (the first value written wins)."""
        ...


class InMemoryJournal:
    """A journal in the process's memory (tests, single processes)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[tuple[str, str], dict[str, Any]] = {}

    def load(self, session_id: str, turn_id: str) -> dict[str, Any]:
        with self._lock:
            return dict(self._entries.get((session_id, turn_id), {}))

    def record(self, session_id: str, turn_id: str, key: str, value: Any) -> None:
        with self._lock:
            self._entries.setdefault((session_id, turn_id), {}).setdefault(key, value)
