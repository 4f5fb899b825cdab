"""Running one turn from its JSON request: the body of the `interlock.run_turn` task."""

from __future__ import annotations

import logging
import threading
import uuid
from typing import Any

from interlock import AgentInput, InterlockError, StatusError
from schemas import SnapshotStatus, TurnFailed, TurnRequest

from .runtime import Runtime

__all__ = ["TurnBusy", "new_turn_request", "run_turn"]

log = logging.getLogger("interlock.worker")


def new_turn_request(
    agent: str, input: AgentInput, *, session_id: str | None = None, **kw: Any
) -> TurnRequest:
    return TurnRequest(
        turn_id=kw.pop("turn_id", None) or str(uuid.uuid4()),
        agent=agent,
        input=input.to_json(),
        session_id=session_id,
        **kw,
    )


class TurnBusy(Exception):
    """Another worker holds this turn's lease: try again later, never concurrently."""


def run_turn(rt: Runtime, payload: dict[str, Any]) -> dict[str, Any]:
    """Run the turn, keep its snapshot and event (one transaction), publish the event.

    A turn delivered twice runs once: one that already ended is not run again, and one
    whose lease another worker holds raises `TurnBusy` (the task retries it later).
    A redelivered turn whose worker died replays the journal: completed tool calls do
    not run again. A turn that fails is recorded (`turn.failed`) and not retried: it is
    an answer. Infrastructure errors (database, broker) propagate and are retried."""
    request = TurnRequest.model_validate(payload)
    ended = rt.store.find_turn(request.turn_id)
    if ended is not None:
        log.info(
            "turn %s already ended (%s); not running it again", request.turn_id, ended.status.value
        )
        _flush(rt)
        return {"turn_id": request.turn_id, "snapshot_id": ended.snapshot_id, "duplicate": True}
    owner = f"{rt.worker_id}:{uuid.uuid4().hex[:8]}"
    ttl = rt.settings.turn_lease
    if not rt.journal.acquire(request.turn_id, owner, ttl):
        raise TurnBusy(f"turn {request.turn_id} is running elsewhere")
    try:
        with _Renewal(rt, request.turn_id, owner, ttl):
            result = _run(rt, request)
    finally:
        rt.journal.release(request.turn_id, owner)
    _flush(rt)
    return result


def _run(rt: Runtime, request: TurnRequest) -> dict[str, Any]:
    try:
        agent = rt.agent(request.agent)
        out = agent.run(
            AgentInput.model_validate(request.input),
            session_id=request.session_id,
            snapshot_id=request.snapshot_id,
            claimed_by=request.claimed_by,
            turn_id=request.turn_id,
            journal=rt.journal,
        )
        return {
            "turn_id": request.turn_id,
            "finish_reason": out.finish_reason.value,
            "session_id": out.session_id,
            "snapshot_id": out.snapshot_id,
        }
    except InterlockError as exc:
        error = exc if isinstance(exc, StatusError) else StatusError(message=str(exc))
        if getattr(exc, "snapshot_id", None) is None:
            # Refused before the turn ran: no snapshot carries the event, send it here.
            session_id, last_snapshot_id = _where_it_stands(rt, request)
            rt.outbox.add_now(
                TurnFailed(
                    agent=request.agent,
                    session_id=session_id,
                    snapshot_id=None,
                    turn_id=request.turn_id,
                    error=error.to_info(),
                    last_snapshot_id=last_snapshot_id,
                )
            )
        log.info("turn %s failed: %s", request.turn_id, error)
        return {"turn_id": request.turn_id, "error": error.to_json()}


def _flush(rt: Runtime) -> None:
    try:
        rt.relay.flush()
    except Exception:
        log.exception("publishing events failed; the outbox relay will send them later")


class _Renewal:
    """Renews the turn's lease every third of its life while the turn runs."""

    def __init__(self, rt: Runtime, turn_id: str, owner: str, ttl: float) -> None:
        self.rt, self.turn_id, self.owner, self.ttl = rt, turn_id, owner, ttl
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="interlock-lease", daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            try:
                self.rt.journal.acquire(self.turn_id, self.owner, self.ttl)
            except Exception:
                log.exception("renewing the lease of turn %s failed", self.turn_id)

    def __enter__(self) -> _Renewal:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _where_it_stands(rt: Runtime, request: TurnRequest) -> tuple[str | None, str | None]:
    """The session of a refused turn and its last good snapshot (the one it continues
    from), when the request named only one of them."""
    session_id, snapshot_id = request.session_id, request.snapshot_id
    if snapshot_id is not None and session_id is None:
        found = rt.store.get_snapshot(snapshot_id)
        session_id = found.session_id if found is not None else None
    elif snapshot_id is None and session_id is not None:
        latest = rt.store.list_snapshots(
            session_id=session_id, status=SnapshotStatus.COMPLETED, limit=1
        )
        snapshot_id = latest[0].snapshot_id if latest else None
    return session_id, snapshot_id
