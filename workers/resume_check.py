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

from dataclasses import dataclass

from pydantic import ValidationError

from events.decision_log import DecisionRecord
from interlock import AgentInput, Status, StatusError
from interlock.stores.sql_journal import session_lease
from schemas import Decision, Snapshot, TurnRequest, event_adapter

from .decisions import RESUME_PREFIX, parse_decision, resume_request
from .runtime import Runtime

__all__ = ["RESERVED", "TaskCheck", "check_task", "reserved", "reserved_said"]


RESERVED = (RESUME_PREFIX, session_lease(""))
"""Starts of the turn ids only Interlock gives: an accepted decision's resume
(`resume:DECISION_ID`), and the keys of session leases, which share the turn leases'
table. A task that is no accepted decision's resume may not take one: it would end the
real resume's turn before it ran, or free a running turn's session."""


@dataclass(frozen=True)
class TaskCheck:
    """What `check_task` found: why the task may not run (`refused`; None: it may go
    on), and for a resume that may, the paused snapshot as the check read it
    (`paused`), so that the run need not read it again."""

    refused: StatusError | None = None
    paused: Snapshot | None = None


def check_task(rt: Runtime, request: TurnRequest) -> TaskCheck:
    """Whether `request` may run: refused if it is a resume, or a task that names a
    claim, that is not the resume the consumer enqueued for an accepted decision
    (PERMISSION_DENIED), after NOT_FOUND where the snapshot it names does not exist (the
    resume consumer's order); or a task that takes a turn id Interlock keeps for its own
    (INVALID_ARGUMENT). It costs a resume one read transaction: the decision log and
    the snapshot. A task that is neither (or whose input is no agent input) goes on, to run
    or to be refused for what it is."""
    claim = request.claimed_by
    try:
        given: AgentInput | None = AgentInput.model_validate(request.input)
    except ValidationError:
        given = None
    pause = "the pause" if request.snapshot_id is None else f"snapshot {request.snapshot_id}"
    resume = given is not None and given.resume is not None
    if claim is None and not resume:
        if reserved(request.turn_id):
            return TaskCheck(StatusError(Status.INVALID_ARGUMENT, reserved_said(request.turn_id)))
        return TaskCheck()
    # One read transaction for the log and the snapshot, as the consumer reads them; and
    # in its order: a snapshot that does not exist is NOT_FOUND before any permission.
    snapshot_id, snapshot, record = request.snapshot_id, None, None
    decisions = rt.decisions  # built (its table checked or made) before the read opens
    with rt.store.reader().connect() as conn, conn.begin():
        if claim is not None:
            record = decisions.get(claim, conn=conn)
        if snapshot_id is not None:
            snapshot = rt.store.get_snapshot_in(conn, snapshot_id)
    if snapshot_id is not None and snapshot is None:
        return TaskCheck(StatusError(Status.NOT_FOUND, f"snapshot {snapshot_id} not found"))
    if claim is None:
        return _denied(f"{pause} is not claimed by this resume (it names no claim)")
    if record is None or record.outcome != "accepted":
        return _denied(f"{pause} is not claimed by {claim!r}: no decision of that id was accepted")
    if given is None or snapshot is None or not _is_its_resume(record, snapshot, request, given):
        return _denied(
            f"{pause} is claimed by decision {claim!r}, but this task is not the resume "
            "the resume consumer enqueued for it"
        )
    return TaskCheck(paused=snapshot)


def reserved(turn_id: str | None) -> bool:
    """Whether `turn_id` starts as only the turn ids Interlock gives do (`RESERVED`)."""
    return turn_id is not None and turn_id.startswith(RESERVED)


def reserved_said(turn_id: str) -> str:
    """Why a task may not take the reserved turn id `turn_id`."""
    starts = " or ".join(repr(start) for start in RESERVED)
    return (
        f"turn_id {turn_id!r} is reserved: turn ids starting with {starts} are given by "
        "Interlock (an accepted decision's resume, a session's lease); choose another"
    )


def _denied(reason: str) -> TaskCheck:
    return TaskCheck(StatusError(Status.PERMISSION_DENIED, reason))


def _is_its_resume(
    record: DecisionRecord, snapshot: Snapshot, request: TurnRequest, given: AgentInput
) -> bool:
    """Whether `request` (its input `given`) is the resume of the accepted decision
    `record` keeps, on the pause `snapshot` (the one `request` names): the same turn id,
    agent, snapshot and answers, built again as the consumer built them (a restart entry
    without input takes the interrupted call's, read from the snapshot)."""
    decision = parse_decision(record.body, "application/json", logged=True)
    if not isinstance(decision, Decision) or given.resume is None:
        return False
    accepted = event_adapter.validate_json(record.event_body)
    if request.agent != accepted.agent or snapshot.snapshot_id != decision.snapshot_id:
        return False
    expected = resume_request(decision, snapshot)
    ids = {"agent", "input"}  # the agent as accepted; the input compared as parsed
    if expected.model_dump(exclude=ids) != request.model_dump(exclude=ids):
        return False  # turn_id, session_id, claimed_by, decision_id, schema_version
    return AgentInput.model_validate(expected.input).to_json() == given.to_json()
