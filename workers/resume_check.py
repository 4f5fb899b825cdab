"""Whether a resume task is the one the resume consumer enqueued for an accepted decision.

Clients may write to `interlock.turns`, so a task there proves nothing by itself. A
resume runs only under the claim the resume consumer made once a decision's
resume_token matched, and the id it claims with (the decision id) is no secret:
`decision.accepted` carries it. So a resume task must also be that decision's own
resume: its turn id the one derived from the decision id, and its agent, snapshot and
answers those of the decision the log keeps as accepted. A task that is not is refused
before it touches the claim or the turn it names: it can neither run a second answer
to a pause, nor give back a claim and open an answered pause again, nor end the turn
of the real resume before that runs.
"""

from __future__ import annotations

from pydantic import ValidationError

from interlock import AgentInput
from schemas import Decision, TurnRequest, event_adapter

from .decisions import parse_decision, resume_turn_id, to_tool_resume
from .runtime import Runtime

__all__ = ["unauthentic"]


def unauthentic(rt: Runtime, request: TurnRequest) -> str | None:
    """Why `request` may not run as a resume (None: it may). Only a task that is a
    resume, or that names a claim, is checked; it costs one read of the decision log.
    A task that is neither (or whose input is no agent input) goes on, to run or to be
    refused for what it is."""
    claim = request.claimed_by
    try:
        given: AgentInput | None = AgentInput.model_validate(request.input)
    except ValidationError:
        given = None
    pause = "the pause" if request.snapshot_id is None else f"snapshot {request.snapshot_id}"
    if claim is None:
        if given is None or given.resume is None:
            return None
        return f"{pause} is not claimed by this resume (it names no claim)"
    record = rt.decisions.get(claim)
    if record is None or record.outcome != "accepted":
        return f"{pause} is not claimed by {claim!r}: no decision of that id was accepted"
    if given is None or not _is_its_resume(rt, record.body, record.event_body, request, given):
        return (
            f"{pause} is claimed by decision {claim!r}, but this task is not the resume "
            "the resume consumer enqueued for it"
        )
    return None


def _is_its_resume(
    rt: Runtime, body: str, event_body: str, request: TurnRequest, given: AgentInput
) -> bool:
    """Whether `request` (its input `given`) is the resume of the decision kept as
    `body`, whose `decision.accepted` is `event_body`: the same turn id, agent, snapshot
    and answers, built again as the consumer built them (a restart entry without input
    takes the interrupted call's, read from the snapshot)."""
    decision = parse_decision(body, "application/json")
    if not isinstance(decision, Decision) or given.resume is None:
        return False
    accepted = event_adapter.validate_json(event_body)
    if (
        request.turn_id != resume_turn_id(decision.decision_id)
        or request.decision_id not in (None, decision.decision_id)
        or request.snapshot_id != decision.snapshot_id
        or request.agent != accepted.agent
    ):
        return False
    snapshot = rt.store.get_snapshot(decision.snapshot_id)
    if snapshot is None:
        return False
    return AgentInput(resume=to_tool_resume(decision, snapshot)).to_json() == given.to_json()
