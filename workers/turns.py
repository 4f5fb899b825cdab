"""Running one turn from its JSON request: the body of the `interlock.run_turn` task."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
import uuid
import weakref
from collections.abc import Mapping
from typing import Any

from kombu.exceptions import OperationalError as BrokerUnavailable
from pydantic import ValidationError

from interlock import AgentInput, InterlockError, ResumeValidationError, Status, StatusError
from interlock.journal import TurnJournal
from interlock.stores.failures import first_line, is_store_failure
from interlock.stores.sql_journal import (
    REFUSED,
    LeaseLost,
    SessionLeaseLost,
    SqlTurnJournal,
    TurnStartKind,
    session_lease,
)
from interlock.tools import brief
from schemas import ErrorInfo, Snapshot, SnapshotStatus, TurnFailed, TurnRequest

from .decisions import unstorable
from .holders import died_here
from .preloaded import Preloaded
from .resume_check import check_task, reserved
from .runtime import Runtime

__all__ = [
    "SessionBusy",
    "TurnBusy",
    "fingerprint",
    "log_failure",
    "new_turn_request",
    "request_of",
    "retried",
    "run_task",
    "run_turn",
]

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


def retried(exc: BaseException) -> bool:
    """Whether `exc` leaves the turn to a retry of its task, not answered: an error of
    the store (unreachable, or unusable: a file that is no database, a table missing)
    or of the broker. The turn then goes on where it stood. Any other error of the turn
    is its answer (`turn.failed`), as is a value the database refuses or a constraint
    it enforces."""
    return isinstance(exc, BrokerUnavailable) or is_store_failure(exc)


class TurnBusy(Exception):
    """Another worker holds this turn's lease: try again later, never concurrently."""


class SessionBusy(TurnBusy):
    """Another turn of the same session is running: try again soon (that turn ends in
    the time a turn takes), so that this one goes on from where that one ends."""


_NAMED_FIELDS = frozenset({"turn_id", "agent", "input"})
"""A task whose keyword arguments name one of these (and no `request`) gives its request
as keyword arguments: `send_task(..., kwargs={"turn_id": ..., "agent": ..., ...})`."""


def request_of(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[bool, Any]:
    """Whether a task's arguments hold a turn request, and that request: its one
    positional argument, `request=`, or the request's fields given as keyword
    arguments."""
    if len(args) == 1 and not kwargs:
        return True, args[0]
    if not args and set(kwargs) == {"request"}:
        return True, kwargs["request"]
    if not args and "request" not in kwargs and _NAMED_FIELDS.intersection(kwargs):
        return True, dict(kwargs)
    return False, None


def run_task(rt: Runtime, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """`run_turn` on the task's turn request: its one argument (positional, or
    `request=`), or the request's fields as keyword arguments. A task message with any
    other arguments is refused like a request that is no turn request (turn.failed,
    INVALID_ARGUMENT), where Celery would fail it with a TypeError and drop it."""
    found, request = request_of(args, kwargs)
    if found:
        return run_turn(rt, request)
    given = f"{len(args)} positional argument{'s' if len(args) != 1 else ''}"
    if kwargs:
        given += f" and keyword arguments {sorted(kwargs)}"
    first = args[0] if args else kwargs.get("request")  # whose ids turn.failed may carry
    return _unreadable(
        rt,
        first,
        f"invalid run_turn request: the task takes one argument, the request; got {given}",
    )


def run_turn(rt: Runtime, payload: dict[str, Any]) -> dict[str, Any]:
    """Run the turn, keep its snapshot and event (one transaction), publish the event.

    A turn delivered twice runs once: one that already ended (or was refused before it
    ran) is not run again, and one whose lease another worker holds raises `TurnBusy`
    (the task retries it later).
    A redelivered turn whose worker died replays the journal: completed tool calls do
    not run again. A turn that fails is recorded (`turn.failed`) and not retried: it is
    an answer. Infrastructure errors (database, broker) propagate and are retried."""
    try:
        request = TurnRequest.model_validate(payload)
    except ValidationError as exc:
        return _unreadable(rt, payload, f"invalid run_turn request: {brief(exc)}")
    bad = unstorable(payload)
    if bad is not None:  # no text column can keep it (PostgreSQL): retrying cannot help
        return _unreadable(rt, payload, f"run_turn request contains {bad}")
    checked = check_task(rt, request)
    if checked.refused is not None:
        return _not_the_consumers(rt, request, checked.refused)
    owner = f"{rt.worker_id}:{uuid.uuid4().hex[:8]}"
    session = _one_at_a_time(rt, request)
    mark = fingerprint(request)
    start = rt.journal.begin(
        request.turn_id, owner, rt.settings.turn_lease, session=session, request=mark
    )
    if start.kind is TurnStartKind.ENDED:
        log.info(
            "turn %s already ended (%s); not running it again", request.turn_id, start.ended_as()
        )
        if start.status in _UNANSWERED:  # and a crash may have kept the claim: give it back
            _give_back(rt, request.snapshot_id, request.claimed_by)
        _flush(rt)
        return {"turn_id": request.turn_id, "snapshot_id": start.snapshot_id, "duplicate": True}
    if start.kind is TurnStartKind.FOREIGN:
        return _foreign(rt, request)
    if start.kind is TurnStartKind.SESSION_BUSY:
        assert session is not None
        _expire_if_dead(rt, session_lease(session))
        raise SessionBusy(f"session {session} is running another turn")
    taken_over = start.kind is TurnStartKind.TAKEN_OVER
    if start.kind is TurnStartKind.BUSY:
        if not _take_from_the_dead(rt, request.turn_id, owner, session, mark):
            raise TurnBusy(f"turn {request.turn_id} is running elsewhere")
        taken_over = True
    _renewals(rt)
    # A first run has nothing to replay: skip reading the journal. Nor has any run of
    # this resume released its claim (only its own runs do): the pause its check read
    # is the pause as it stands, and is not read again.
    journal = rt.journal if taken_over else _FirstRun(rt.journal)
    paused = None if taken_over else checked.paused
    saved = False
    try:
        result = _run(rt, request, journal, owner, paused)
        saved = "snapshot_id" in result
    finally:
        rt.journal.end(request.turn_id, owner, snapshot_saved=saved)
    _flush(rt)
    return result


def _one_at_a_time(rt: Runtime, request: TurnRequest) -> str | None:
    """The session whose lease a turn takes with its own: a new message to a named
    session (or to one of its snapshots) runs only while no other turn of that session
    does. Both would go on from the same latest snapshot, and the session would fork
    (one turn's messages missing from the other's history, two pauses open at once). A
    resume needs none: its claim on the pause already makes it the only turn that goes
    on from there (and only a claimed resume gets this far)."""
    if request.claimed_by is not None:
        return None
    if request.snapshot_id is None or request.session_id is not None:
        return request.session_id
    found = rt.store.get_snapshot_head(request.snapshot_id)  # an unknown one is refused later
    return found.session_id if found is not None else None


def _expire_if_dead(rt: Runtime, key: str) -> None:
    """A lease whose holder was a process of this machine that has died (a pool process
    killed mid-turn) runs out now, for the next delivery to take, not once its time is up."""
    held = rt.journal.holder(key)
    if held is not None and died_here(held[0]):
        rt.journal.expire(key, held[0])
        log.warning("%s: its holder %s has died here; letting it go", key, held[0])


def fingerprint(request: TurnRequest) -> str:
    """What a turn id names: the request that first started it, as a digest of its JSON
    (keys sorted). A redelivery, a retry and the consumer's re-enqueue of one decision
    carry the same request; a task reusing the id with anything else is another turn."""
    canonical = json.dumps(request.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _take_from_the_dead(
    rt: Runtime, turn_id: str, owner: str, session: str | None, mark: str
) -> bool:
    """The lease of a busy turn whose holder was a process of this machine that has
    died (a pool process killed mid-turn): taken over now, not once it runs out (with
    the session's lease, which that holder had taken with it)."""
    held = rt.journal.holder(turn_id)
    if held is None or not died_here(held[0]):
        return False
    ttl = rt.settings.turn_lease
    if not rt.journal.take_from(turn_id, held[0], owner, ttl, session=session, request=mark):
        return False
    log.warning("turn %s: its holder %s has died here; taking it over", turn_id, held[0])
    return True


_UNANSWERED = (REFUSED, SnapshotStatus.FAILED.value, SnapshotStatus.ABORTED.value)
"""How a turn can end without an answer to the pause it resumed: that pause's claim is
given back, so it can be answered again."""


def _give_back(rt: Runtime, snapshot_id: str | None, claimed_by: str | None) -> None:
    """Release the claim a refused or failed resume turn held on its pause: the resume
    consumer's, the only one a worker runs under (idempotent; a claim someone else
    holds is left alone). A task that names no claim gives back nothing, whatever its
    turn id: no claim is made under a turn id here."""
    if snapshot_id is not None and claimed_by is not None:
        rt.store.release(snapshot_id, claimed_by)


def _unreadable(rt: Runtime, payload: Any, reason: str) -> dict[str, Any]:
    """A task whose argument is no turn request (a client that wrote the task message by
    hand): it cannot run, and says so with `turn.failed` (INVALID_ARGUMENT), carrying
    what ids could be read. Not retried: it would fail the same way."""
    fields = payload if isinstance(payload, dict) else {}

    def read(key: str) -> str | None:
        value = fields.get(key)
        return value if isinstance(value, str) and unstorable(value) is None else None

    error = StatusError(Status.INVALID_ARGUMENT, reason)
    turn_id = read("turn_id")
    log.warning("turn %s refused: %s", turn_id, error.message)
    event = TurnFailed(
        agent=read("agent"),
        session_id=read("session_id"),
        turn_id=turn_id,
        error=error.to_info(),
        last_snapshot_id=read("snapshot_id"),
    )
    # The claim it names cannot be told from one copied out of decision.accepted: it
    # stays, and the consumer's resume runs under it.
    fresh = _refuse(rt, event, own=False)
    _flush(rt)
    result: dict[str, Any] = {"turn_id": turn_id, "error": error.to_json()}
    return result if fresh else {**result, "duplicate": True}


def _refuse(rt: Runtime, event: TurnFailed, *, owner: str | None = None, own: bool = True) -> bool:
    """Announce a turn refused before it ran (`event`) and, when it has an id, end it
    with the journal's refusal entry, in one transaction. False when that turn was
    refused (and announced) before, or runs elsewhere (its lease held by another than
    `owner`, this run's): nothing is written.

    A turn id Interlock keeps for its own (`reserved`) is ended here only by its `own`
    task (the resume the consumer enqueued). Any other task's refusal under it is
    announced without the turn's ids (and not at all once the turn ended): that turn
    has not had its answer, and whoever waits on it must not read one."""
    journal, outbox = rt.journal, rt.outbox  # built (tables created) before the transaction
    turn_id = event.turn_id
    with rt.store.writer().begin() as conn:
        if reserved(turn_id) and not own:
            assert turn_id is not None
            if journal.ended_in(conn, turn_id):
                return False  # a copy of a turn that has had its answer: nothing to say
            event = event.model_copy(
                update={
                    "turn_id": None,
                    "session_id": None,
                    "last_snapshot_id": None,
                    "error": _naming(event.error, turn_id),
                }
            )
        elif turn_id is not None and not journal.refuse_in(
            conn, event.session_id, turn_id, event.error.model_dump(mode="json"), owner=owner
        ):
            return False
        outbox.add(conn, event)
    return True


def _naming(error: ErrorInfo, turn_id: str) -> ErrorInfo:
    """`error`, its message naming `turn_id` where it does not yet: an event that
    leaves the turn's ids out still tells its sender which task it answers."""
    if repr(turn_id) in error.message:
        return error
    return error.model_copy(
        update={"message": f"{error.message} (the task's turn_id: {turn_id!r})"}
    )


def _input_of(request: TurnRequest) -> AgentInput:
    try:
        return AgentInput.model_validate(request.input)
    except ValidationError as exc:
        raise StatusError(
            Status.INVALID_ARGUMENT, f"invalid run_turn request: {brief(exc, at='input')}"
        ) from exc


def _foreign(rt: Runtime, request: TurnRequest) -> dict[str, Any]:
    """A task under the id of a turn another request started (and that has not ended):
    not that turn. It runs nothing and touches nothing of that turn; its turn.failed
    (ALREADY_EXISTS) carries none of the turn's ids, since that turn has still to give
    its own answer."""
    error = StatusError(
        Status.ALREADY_EXISTS,
        f"turn_id {request.turn_id!r} names another turn, started with another request "
        "(its agent, session or input differ): a new turn needs a new turn_id",
    )
    log.warning("turn %s refused: %s", request.turn_id, error.message)
    _refuse(rt, TurnFailed(agent=request.agent, error=error.to_info()))
    _flush(rt)
    return {"turn_id": request.turn_id, "error": error.to_json()}


def _not_the_consumers(rt: Runtime, request: TurnRequest, why: StatusError) -> dict[str, Any]:
    """A task `check_task` refuses: answered with turn.failed, and its turn ended like
    any refused turn, unless its id is a reserved one (a real resume's, copied out of
    decision.accepted: that resume must still run and have its own answer). The claim
    it names is not given back, for the same reason."""
    hint = _RESUME_HINT if why.status == Status.PERMISSION_DENIED else ""
    error = StatusError(why.status, f"{why.message}{hint}")
    log.warning("turn %s refused: %s", request.turn_id, why.message)
    session_id, last_snapshot_id = _where_it_stands(rt, request)
    event = TurnFailed(
        agent=request.agent,
        session_id=session_id,
        turn_id=request.turn_id,
        error=error.to_info(),
        last_snapshot_id=last_snapshot_id,
    )
    fresh = _refuse(rt, event, own=False)
    _flush(rt)
    result: dict[str, Any] = {"turn_id": request.turn_id, "error": error.to_json()}
    return result if fresh else {**result, "duplicate": True}


_RESUME_HINT = (
    ". A paused turn is resumed by a decision sent to interlock.decisions with its "
    "resume_token: the resume consumer checks the token, claims the pause and enqueues "
    "the resume; a resume task sent to interlock.turns without that claim is refused"
)


def _run(
    rt: Runtime,
    request: TurnRequest,
    journal: TurnJournal,
    owner: str,
    paused: Snapshot | None = None,
) -> dict[str, Any]:
    try:
        agent = rt.agent(request.agent)
        if paused is not None:
            agent = agent.with_store(Preloaded(rt.store, paused))
        out = agent.run(
            _input_of(request),
            session_id=request.session_id,
            snapshot_id=request.snapshot_id,
            claimed_by=request.claimed_by,
            turn_id=request.turn_id,
            journal=journal,
            claim_required=True,  # the resume consumer's, made once the token matched
        )
        return {
            "turn_id": request.turn_id,
            "finish_reason": out.finish_reason.value,
            "session_id": out.session_id,
            "snapshot_id": out.snapshot_id,
        }
    except SessionLeaseLost as lost:
        # Another turn of the session ran meanwhile: this one runs again, after it.
        log.warning("%s", lost.message)
        raise SessionBusy(lost.message) from lost
    except LeaseLost as lost:
        # This run stalled past its lease and another took the turn over: that run
        # answers it; nothing of this one was kept. Retried later as a busy turn is,
        # not acked alone: on Redis the other run's delivery is this message (the same
        # tag), and the retry's copy stands in for it, should that run die too (it then
        # finds the turn ended, or takes it over).
        log.warning("%s", lost.message)
        raise TurnBusy(lost.message) from lost
    except Exception as exc:
        if retried(exc):
            raise  # the store or the broker: the task is retried, the turn goes on later
        if isinstance(exc, ResumeValidationError) and exc.status == Status.PERMISSION_DENIED:
            error = StatusError(exc.status, f"{exc.message}{_RESUME_HINT}")
        elif isinstance(exc, StatusError):
            error = exc
        elif isinstance(exc, InterlockError):
            error = StatusError(message=str(exc))
        else:  # a bug, ours or a plugin's: retrying cannot help; answered, not left hanging
            log.exception("turn %s could not run", request.turn_id)
            error = StatusError(Status.INTERNAL, f"{type(exc).__name__}: {exc}")
        unanswered = True  # a refusal, or a failed snapshot: the pause can be answered
        if getattr(exc, "snapshot_id", None) is None:
            # Refused before the turn ran: no snapshot carries the event or ends the
            # turn. The journal's refusal entry ends it, in the event's transaction.
            session_id, last_snapshot_id = _where_it_stands(rt, request)
            unanswered = _refuse(
                rt,
                TurnFailed(
                    agent=request.agent,
                    session_id=session_id,
                    turn_id=request.turn_id,
                    error=error.to_info(),
                    last_snapshot_id=last_snapshot_id,
                ),
                owner=owner,
            )
        if unanswered:
            _give_back(rt, request.snapshot_id, request.claimed_by)
        log.info("turn %s failed: %s", request.turn_id, error)
        failed: dict[str, Any] = {"turn_id": request.turn_id, "error": error.to_json()}
        ended_with = getattr(exc, "snapshot_id", None)
        if ended_with is not None:
            failed["snapshot_id"] = ended_with  # the failed snapshot ended the turn
        return failed


def _flush(rt: Runtime) -> None:
    try:
        rt.relay.flush()
    except Exception as exc:
        log_failure(log, exc, "publishing events failed; the outbox relay will send them later")


def log_failure(
    logger: logging.Logger, exc: Exception, what: str, then: str = "", *, outage: bool | None = None
) -> None:
    """`what` failed with `exc`: an outage of the store or broker (`outage`; by default
    `retried(exc)`) in one WARNING line, `WHAT (Type: first line)THEN`; any other error
    at ERROR, `WHAT THEN`, with its traceback (a bug)."""
    if retried(exc) if outage is None else outage:
        logger.warning("%s (%s: %s)%s", what, type(exc).__name__, first_line(exc), then)
    else:
        logger.exception("%s%s", what, then)


class _FirstRun:
    """The journal of a turn that no run has started before: nothing to load."""

    def __init__(self, journal: TurnJournal) -> None:
        self._journal = journal

    def load(self, session_id: str, turn_id: str) -> dict[str, Any]:
        return {}

    def record(self, session_id: str, turn_id: str, key: str, value: Any) -> None:
        self._journal.record(session_id, turn_id, key, value)


class _Renewals:
    """One thread per process and journal renews every lease held there, every third
    of a lease's life, in one transaction. It ends with its journal."""

    def __init__(self, journal: SqlTurnJournal, ttl: float) -> None:
        self.pid = os.getpid()
        self._journal = weakref.ref(journal)
        self._ttl = ttl
        threading.Thread(target=self._loop, name="interlock-leases", daemon=True).start()

    def _loop(self) -> None:
        while True:
            time.sleep(self._ttl / 3)
            journal = self._journal()
            if journal is None:
                return
            try:
                journal.renew_held(self._ttl)
            except Exception as exc:
                log_failure(log, exc, "renewing turn leases failed")
            del journal


_renewers: weakref.WeakKeyDictionary[SqlTurnJournal, _Renewals] = weakref.WeakKeyDictionary()
_renewers_lock = threading.Lock()


def _renewals(rt: Runtime) -> None:
    """Start the renewal thread of this process's journal, once (again after a fork)."""
    with _renewers_lock:
        found = _renewers.get(rt.journal)
        if found is None or found.pid != os.getpid():
            _renewers[rt.journal] = _Renewals(rt.journal, rt.settings.turn_lease)


def _where_it_stands(rt: Runtime, request: TurnRequest) -> tuple[str | None, str | None]:
    """The session of a refused turn and its last good snapshot (the one it continues
    from): the snapshot it named if that exists (none if not), else its session's
    latest completed one."""
    session_id, snapshot_id = request.session_id, request.snapshot_id
    if snapshot_id is not None:  # named: it is where the session stands, if it exists
        found = rt.store.get_snapshot_head(snapshot_id)
        if found is None:
            return session_id, None
        return session_id or found.session_id, snapshot_id
    if session_id is not None:
        latest = rt.store.list_snapshot_heads(
            session_id=session_id, status=SnapshotStatus.COMPLETED, limit=1
        )
        snapshot_id = latest[0].snapshot_id if latest else None
    return session_id, snapshot_id
