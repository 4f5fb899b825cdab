"""Running one turn from its JSON request: the body of the `interlock.run_turn` task."""

from __future__ import annotations

import logging
import uuid
from typing import Any

from interlock import AgentInput, InterlockError, StatusError
from schemas import SnapshotStatus, TurnFailed, TurnRequest

from .runtime import Runtime

__all__ = ["new_turn_request", "run_turn"]

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


def run_turn(rt: Runtime, payload: dict[str, Any]) -> dict[str, Any]:
    """Run the turn, keep its snapshot and event (one transaction), publish the event.

    A turn that fails is recorded (`turn.failed`) and is not retried: it is an answer.
    Infrastructure errors (database, broker) propagate so the task is retried."""
    request = TurnRequest.model_validate(payload)
    try:
        agent = rt.agent(request.agent)
        out = agent.run(
            AgentInput.model_validate(request.input),
            session_id=request.session_id,
            snapshot_id=request.snapshot_id,
            claimed_by=request.claimed_by,
            turn_id=request.turn_id,
        )
        result: dict[str, Any] = {
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
        result = {"turn_id": request.turn_id, "error": error.to_json()}
    try:
        rt.relay.flush()
    except Exception:
        log.exception("publishing events failed; the outbox relay will send them later")
    return result


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
