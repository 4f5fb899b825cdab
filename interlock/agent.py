"""Agents: run a turn, keep its snapshot, resume it."""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from schemas import (
    AgentChunk,
    AgentInput,
    AgentOutput,
    FinishReason,
    Message,
    Part,
    Snapshot,
    SnapshotStatus,
    Status,
    ToolResume,
    TurnEnd,
    utcnow,
    wire_time,
)

from ._ids import new_id
from .errors import (
    InterlockError,
    ResumeSnapshotNotFoundError,
    ResumeValidationError,
    SnapshotNotFoundError,
    StatusError,
)
from .journal import TurnJournal, session_for_turn
from .middleware import Middleware
from .resume import (
    Answer,
    already_resumed,
    check_resumable,
    passed_deadline,
    pending_interrupts,
    plan_resume,
)
from .stores.base import LatestSnapshotId, SessionStore, SnapshotHeads
from .tools import Tool
from .turn import Turn, TurnResult

if TYPE_CHECKING:
    from .connection import Connection
    from .registry import Interlock

__all__ = ["Agent", "as_input"]

Emit = Callable[[AgentChunk], None]


@dataclass
class _Base:
    """Where a turn starts: the session, and the snapshot it continues (if any)."""

    session_id: str
    snapshot: Snapshot | None
    from_state: bool = False
    by_snapshot: bool = False
    """Addressed by `snapshot_id=`: the snapshot continued need not be the latest."""
    unnamed: bool = False
    """A new session that no id named (neither `session_id=` nor `snapshot_id=`)."""


class _ClaimedResumeEnded(ResumeValidationError):
    """A resume run again under its claim after that claim's run ended: refused, and
    the claim, which holds the answer given, is kept."""


def _store_unavailable(exc: BaseException) -> bool:
    """True for an error of the SQL store (`is_store_failure`): it says nothing of the
    turn, whose run is then retried rather than ended as failed. Tools' and models'
    errors reach here as `StatusError`s, never as these."""
    from .stores.failures import is_store_failure

    return is_store_failure(exc)


def as_input(value: AgentInput | Message | ToolResume | str | None) -> AgentInput:
    if isinstance(value, AgentInput):
        return value
    if isinstance(value, Message):
        return AgentInput(message=value)
    if isinstance(value, ToolResume):
        return AgentInput(resume=value)
    if isinstance(value, str):
        return AgentInput(message=Message(role="user", content=[Part(text=value)]))
    raise StatusError(Status.INVALID_ARGUMENT, "an agent input needs a message or a resume")


@dataclass(frozen=True)
class Agent:
    """An agent of a registry. Build it with `Interlock.define_agent`."""

    name: str
    registry: Interlock
    model: str
    system: str | None = None
    tools: tuple[Tool[Any, Any], ...] = ()
    middleware: tuple[Middleware, ...] = ()
    store: SessionStore | None = None
    max_turns: int = 10
    config: Mapping[str, Any] | None = None
    interrupt_expires_in: float | None = None

    @property
    def tool_map(self) -> dict[str, Tool[Any, Any]]:
        return {t.name: t for t in self.tools}

    def with_store(self, store: SessionStore | None) -> Agent:
        """The same agent keeping its sessions in `store`."""
        return replace(self, store=store)

    # -- public API -------------------------------------------------------------------

    def run_text(
        self,
        text: str,
        *,
        session_id: str | None = None,
        snapshot_id: str | None = None,
        state: str | None = None,
        turn_id: str | None = None,
        on_chunk: Emit | None = None,
        journal: TurnJournal | None = None,
    ) -> AgentOutput:
        """Run one turn with a user message of `text` (`run`'s keywords, but those of a
        resume)."""
        return self.run(
            text,
            session_id=session_id,
            snapshot_id=snapshot_id,
            state=state,
            turn_id=turn_id,
            on_chunk=on_chunk,
            journal=journal,
        )

    def run(
        self,
        input: AgentInput | Message | ToolResume | str | None = None,
        *,
        session_id: str | None = None,
        snapshot_id: str | None = None,
        state: str | None = None,
        claimed_by: str | None = None,
        turn_id: str | None = None,
        on_chunk: Emit | None = None,
        journal: TurnJournal | None = None,
        claim_required: bool = False,
    ) -> AgentOutput:
        """Run one turn: a new message, or a resume of the paused turn.

        With a store, address the session by `session_id` or `snapshot_id`; without one,
        pass the `state` of the last output. `claimed_by` runs a resume whose snapshot
        the caller already claimed with that id (run again once a run under it has
        ended, it is "already resumed"); with `claim_required`, a resume runs
        only so (`PERMISSION_DENIED` otherwise): the run claims nothing itself. The
        queue's worker runs resumes so, because only the resume consumer, which checks
        each decision's resume_token, may claim a pause. With a `journal`, the turn's model
        responses and tool outcomes are kept as they complete, and a second run of the
        same `turn_id` replays them instead of doing them again.

        New messages to one session (`session_id=`, or `snapshot_id=` of one of its
        snapshots) run one at a time in a process: side by side, both would go on from
        the same latest snapshot and fork the session. (Workers hold a lease on the
        session for the same reason.)"""
        agent_input = as_input(input)
        session = self._session_of(agent_input, session_id, snapshot_id)
        one_at_a_time = (
            _session_lock(self.store, session)
            if self.store is not None and session is not None
            else contextlib.nullcontext()
        )
        with one_at_a_time:
            return self._run(
                agent_input,
                session_id=session_id,
                snapshot_id=snapshot_id,
                state=state,
                claimed_by=claimed_by,
                turn_id=turn_id,
                on_chunk=on_chunk,
                journal=journal,
                claim_required=claim_required,
            )

    def _session_of(
        self, agent_input: AgentInput, session_id: str | None, snapshot_id: str | None
    ) -> str | None:
        """The session a new message goes on in, to run one at a time there: the one
        named, or that of the snapshot named (None for a resume: its claim on the pause
        makes it the only turn going on from there). A snapshot named is read without
        its history where the store can: the turn reads it whole once it holds the lock."""
        if self.store is None or agent_input.resume is not None:
            return None
        if snapshot_id is None or session_id is not None:
            return session_id
        found = self._head(snapshot_id)
        return found.session_id if found is not None else None

    def _run(
        self,
        agent_input: AgentInput,
        *,
        session_id: str | None,
        snapshot_id: str | None,
        state: str | None,
        claimed_by: str | None,
        turn_id: str | None,
        on_chunk: Emit | None,
        journal: TurnJournal | None,
        claim_required: bool = False,
    ) -> AgentOutput:
        # A run with a journal is one that may run again (a queued turn delivered again
        # after its worker died). A session it begins is named after its turn id, so the
        # next run goes on in it. Without a caller's claim, its resume claims under its
        # turn id, and the next run of the same turn goes on under that claim.
        if claimed_by is not None and agent_input.resume is None:
            raise StatusError(
                Status.INVALID_ARGUMENT,
                "claimed_by goes with a resume, which runs under the claim on its pause; "
                "a new message claims nothing",
            )
        again = journal is not None
        fresh = session_for_turn(turn_id) if again and turn_id else None
        base = self._address(agent_input, session_id, snapshot_id, state, new_session=fresh)
        answers: Mapping[str, Answer] | None = None
        claim: str | None = None
        claimer = claimed_by or (f"turn:{turn_id}" if again and turn_id else new_id())
        turn_id = turn_id or new_id()
        try:
            if agent_input.resume is not None:
                # A run that may run again (a journal) is kept to once by its runner: the
                # queue's worker records each turn's end. Without one, a run under the
                # caller's claim looks for itself whether that claim's run has ended.
                ended_check = journal is None
                answers = self._plan(agent_input.resume, base, claimer, ended_check=ended_check)
            else:
                self._check_not_paused(base)
            turn = Turn(
                agent=self.name,
                model=self.registry.lookup_model(self.model),  # before a claim could leak
                system=self.system,
                tools=self.tool_map,
                middleware=self.middleware,
                max_turns=self.max_turns,
                history=base.snapshot.messages if base.snapshot else [],
                session_id=base.session_id,
                turn_id=turn_id,
                emit=on_chunk,
                config=dict(self.config) if self.config else None,
                journal=journal,
            )
            if agent_input.resume is not None:  # the claim comes last
                if claim_required:
                    self._check_claimed(base, claimed_by)
                claim = self._claim(base, claimer, mine=claimed_by is None)
        except InterlockError as exc:
            # A resume the caller claimed (the resume consumer) and this run refused (a
            # model that cannot be reached, a rule that no longer holds) has had its
            # answer: the claim is given back, as for a resumed turn that fails, so the
            # pause can be answered again. A claim held by someone else is not touched
            # (`release` checks). An error of the store is no answer: the caller retries
            # under its claim. Nor is the claim of a resume whose run has ended given
            # back: it holds the answer that run gave.
            ended = isinstance(exc, _ClaimedResumeEnded)
            if agent_input.resume is not None and claimed_by is not None and not ended:
                self._release(base, claimed_by)
            raise
        # A claim this run made itself is given back whenever the run ends without its
        # snapshot (cancelled, interrupted, the store failing): the pause can be answered
        # again. A caller's claim (`claimed_by`: the worker of a queued resume), or that
        # of a run that may run again, must outlive a crash: the next run goes on under
        # it. It is given back only with a failed snapshot kept, once the turn has had
        # its answer.
        own = claim if claimed_by is None and not again else None
        try:
            if answers is not None:
                result = turn.resume(answers)
            else:
                assert agent_input.message is not None
                result = turn.start(agent_input.message)
        except Exception as exc:
            if _store_unavailable(exc):  # not the turn's answer: a retry goes on from here
                self._release(base, own)
                raise
            self._record_failure(base, turn, exc, claim, own)
            raise
        except BaseException:
            self._release(base, own)
            raise
        try:
            out = self._finish(base, turn, result)
        except BaseException:
            self._release(base, own)
            raise
        # Saved: the turn is over and its claim stays, whatever the caller's callback does.
        if on_chunk is not None:
            end = TurnEnd(finish_reason=result.finish_reason, snapshot_id=out.snapshot_id)
            on_chunk(AgentChunk(turn_end=end))
        return out

    def validate_resume(
        self,
        input: AgentInput | ToolResume,
        *,
        session_id: str | None = None,
        snapshot_id: str | None = None,
        state: str | None = None,
        claimed_by: str | None = None,
    ) -> None:
        """Every check of a resume up to the claim. Writes nothing; raises on the first
        rule broken (`ResumeValidationError` and the like)."""
        agent_input = as_input(input)
        if agent_input.resume is None:
            raise ResumeValidationError(Status.INVALID_ARGUMENT, "input is not a resume")
        base = self._address(agent_input, session_id, snapshot_id, state)
        self._plan(agent_input.resume, base, claimed_by)

    def connect(
        self,
        *,
        session_id: str | None = None,
        snapshot_id: str | None = None,
        state: str | None = None,
    ) -> Connection:
        """A connection that holds the session across turns."""
        from .connection import Connection

        return Connection(self, session_id=session_id, snapshot_id=snapshot_id, state=state)

    # -- steps ------------------------------------------------------------------------

    def _address(
        self,
        agent_input: AgentInput,
        session_id: str | None,
        snapshot_id: str | None,
        state: str | None,
        *,
        new_session: str | None = None,
    ) -> _Base:
        """`_base`; for a resume, how the session is addressed is the first of its checks
        (rule 7), and a failure is a `ResumeValidationError`."""
        try:
            return self._base(
                session_id,
                snapshot_id,
                state,
                resume=agent_input.resume is not None,
                new_session=new_session,
            )
        except SnapshotNotFoundError as exc:
            if agent_input.resume is None:
                raise
            raise ResumeSnapshotNotFoundError(exc.message) from exc
        except StatusError as exc:
            if agent_input.resume is None or type(exc) is not StatusError:
                raise
            raise ResumeValidationError(exc.status, exc.message) from exc

    def _base(
        self,
        session_id: str | None,
        snapshot_id: str | None,
        state: str | None,
        *,
        resume: bool = False,
        new_session: str | None = None,
    ) -> _Base:
        """The session and snapshot a run goes on from; a new session (none named) gets
        the id `new_session`, else a random one."""
        if self.store is None:
            if session_id is not None or snapshot_id is not None:
                raise StatusError(
                    Status.FAILED_PRECONDITION,
                    f"agent {self.name!r} has no session store: pass the state of the last "
                    "output (state=...), not a session or snapshot id",
                )
            if state is None:
                return _Base(new_session or new_id(), None)
            snapshot = self.registry.state_codec.decode(state)
            if snapshot.agent != self.name:
                raise StatusError(
                    Status.PERMISSION_DENIED,
                    f"state belongs to agent {snapshot.agent!r}, not {self.name!r}",
                )
            return _Base(snapshot.session_id, snapshot, from_state=True)
        if state is not None:
            raise StatusError(
                Status.FAILED_PRECONDITION,
                f"agent {self.name!r} keeps its sessions in a store: pass session_id or "
                "snapshot_id, not state",
            )
        if snapshot_id is not None:
            found = self.store.get_snapshot(snapshot_id)
            if found is None:
                raise SnapshotNotFoundError(f"snapshot {snapshot_id} not found")
            snapshot = found
            if session_id is not None and snapshot.session_id != session_id:
                raise StatusError(
                    Status.INVALID_ARGUMENT,
                    f"snapshot {snapshot_id} belongs to another session than {session_id}",
                )
            if snapshot.agent != self.name:
                raise StatusError(
                    Status.INVALID_ARGUMENT,
                    f"snapshot {snapshot_id} belongs to agent {snapshot.agent!r}, "
                    f"not {self.name!r}",
                )
            return _Base(snapshot.session_id, snapshot, by_snapshot=True)
        if session_id is not None:
            latest = self._session_snapshot(session_id, resume=resume)
            if latest is not None and latest.agent != self.name:
                raise StatusError(
                    Status.INVALID_ARGUMENT,
                    f"session {session_id} belongs to agent {latest.agent!r}, not {self.name!r}",
                )
            return _Base(session_id, latest)
        return _Base(new_session or new_id(), None, unnamed=new_session is None)

    def _session_snapshot(
        self, session_id: str, *, resume: bool, heads: bool = False
    ) -> Snapshot | None:
        """The snapshot that `session_id=` continues: the session's latest `completed`
        one (failed and aborted turns are skipped: the last good snapshot stays the
        continuation point).

        A resume answers the session's newest pause: when that one is `expired` (or a
        store's own `pending`), the resume gets it and rule 6 refuses it
        (FAILED_PRECONDITION), rather than an earlier snapshot in which its refs are not
        pending. A new message is no answer: a pause that expired (marked so, or past
        its deadline and not yet swept) ended its turn, and the message goes on from the
        snapshot that turn started from, as after a failed turn.

        With `heads`, for a caller that needs only the snapshot's fields, it comes
        without its history where the store can (`SnapshotHeads`)."""
        newest = self._newest(session_id, None, heads=heads)
        if newest is None:
            return None
        if newest.agent != self.name:  # another agent's session: the caller refuses it,
            return newest  # even where that agent left no snapshot to go on from
        if newest.status == SnapshotStatus.EXPIRED or (
            newest.status == SnapshotStatus.PENDING and resume
        ):
            return newest if resume else self._before_turn(newest, heads=heads)
        if newest.status != SnapshotStatus.COMPLETED:
            newest = self._newest(session_id, SnapshotStatus.COMPLETED, heads=heads)
        if newest is not None and not resume and _lapsed(newest):
            return self._before_turn(newest, heads=heads)
        return newest

    def _newest(
        self, session_id: str, status: SnapshotStatus | None, *, heads: bool
    ) -> Snapshot | None:
        """The session's newest snapshot (of `status`, if given); with `heads`, without
        its history where the store can."""
        store = self.store
        assert store is not None
        if heads and isinstance(store, SnapshotHeads):
            found = store.list_snapshot_heads(session_id=session_id, status=status, limit=1)
        elif status is None:
            return store.get_latest_snapshot(session_id)
        else:
            found = store.list_snapshots(session_id=session_id, status=status, limit=1)
        return found[0] if found else None

    def _before_turn(self, snapshot: Snapshot, *, heads: bool = False) -> Snapshot | None:
        """The snapshot the turn of `snapshot` started from: its parent, past the pauses
        of that turn that were answered on the way (a re-pausing tool). The chain is
        walked without histories where the store can; only the snapshot found is read
        whole (not even it, with `heads`)."""
        found = self._parent(snapshot)
        while found is not None and found.is_interrupted:
            found = self._parent(found)
        return found if found is None or heads else self._whole(found)

    def _parent(self, snapshot: Snapshot) -> Snapshot | None:
        return None if snapshot.parent_id is None else self._head(snapshot.parent_id)

    def _head(self, snapshot_id: str) -> Snapshot | None:
        """The snapshot `snapshot_id`, its history unread where the store can
        (`SnapshotHeads`: `messages` then empty), for what needs only its fields."""
        store = self.store
        assert store is not None
        if isinstance(store, SnapshotHeads):
            return store.get_snapshot_head(snapshot_id)
        return store.get_snapshot(snapshot_id)

    def _whole(self, snapshot: Snapshot) -> Snapshot | None:
        """`snapshot`, as `_head` or `_session_snapshot(heads=True)` gave it, with its
        history: read again where that gave a head."""
        store = self.store
        assert store is not None
        if isinstance(store, SnapshotHeads):
            return store.get_snapshot(snapshot.snapshot_id)
        return snapshot

    def _plan(
        self,
        resume: ToolResume,
        base: _Base,
        claimed_by: str | None,
        *,
        ended_check: bool = True,
    ) -> Mapping[str, Answer]:
        if base.snapshot is None and self.store is None:
            raise ResumeValidationError(
                Status.FAILED_PRECONDITION,
                "a resume needs the paused turn: pass the state of the interrupted output",
            )
        if base.snapshot is None:  # a new session: rule 1 refuses every answer
            try:
                return plan_resume([], resume, self.tool_map, self.middleware)
            except ResumeValidationError as exc:
                why = (
                    "no session_id or snapshot_id was given, so it went to a new session, "
                    "which has no paused turn: pass those of the interrupted output"
                    if base.unnamed
                    else f"session {base.session_id} has no paused turn"
                )
                raise ResumeValidationError(exc.status, f"{exc.message} ({why})") from None
        # A snapshot that did not pause has nothing pending: the parts refuse the resume
        # (a ref from an earlier turn, or one not found), as rule 1 says.
        check_resumable(base.snapshot, claimed_by, interrupted=False)
        if ended_check:
            self._check_claim_open(base, claimed_by)
        return plan_resume(base.snapshot.messages, resume, self.tool_map, self.middleware)

    def _check_claim_open(self, base: _Base, claimed_by: str | None) -> None:
        """Rule 6 for a resume under the claim it holds (`claimed_by`): the claim stays
        on the pause once its run has ended, so a run of it again (a message delivered
        twice) is "already resumed" once that run saved what followed the pause. While
        a pause stands, nothing else is saved in its session (new messages and branches
        are refused) but the failed or aborted snapshots of answers that failed (and
        gave their claims back), so a newer completed snapshot there is that run's.
        Asked only of a pause this claim holds (`_went_on`)."""
        snap = base.snapshot
        if (
            self.store is None
            or base.from_state
            or snap is None
            or claimed_by is None
            or snap.resumed_by != claimed_by
            or not self._went_on(snap)  # not run yet, or cut short: it goes on
        ):
            return
        raise _ClaimedResumeEnded(
            Status.FAILED_PRECONDITION,
            f"snapshot {snap.snapshot_id} was already resumed: its run under claim "
            f"{claimed_by!r} has ended; continue the session from its latest snapshot "
            f"(session_id={snap.session_id})",
        )

    def _went_on(self, pause: Snapshot) -> bool:
        """Whether the session of `pause` went on past it: a completed snapshot newer than
        the pause stands there (the failed or aborted snapshots of answers that failed
        do not count: they gave their claims back). The newest snapshot's id first, where
        the store can tell it alone (`LatestSnapshotId`); the newest completed one only
        when that is not the pause."""
        latest = self._newest_id(pause.session_id)
        if latest is None or latest == pause.snapshot_id:
            return False
        current = self._newest(pause.session_id, SnapshotStatus.COMPLETED, heads=True)
        return current is not None and current.snapshot_id != pause.snapshot_id

    def _check_claimed(self, base: _Base, by: str | None) -> None:
        """A resume that must run under a claim made before it (`claim_required`)."""
        snap = base.snapshot
        if self.store is None:  # no store, no claim: nothing could have claimed the pause
            raise ResumeValidationError(
                Status.PERMISSION_DENIED,
                f"agent {self.name!r} has no session store, so no pause of it can be "
                "claimed: a resume that must run under a claim (claim_required) cannot run",
            )
        if snap is None or (by is not None and snap.resumed_by == by):
            return
        raise ResumeValidationError(
            Status.PERMISSION_DENIED,
            f"snapshot {snap.snapshot_id} is not claimed "
            + ("by this resume (it names no claim)" if by is None else f"by {by!r}")
            + ": this run resumes only a pause its caller claimed first",
        )

    def _claim(self, base: _Base, by: str, *, mine: bool) -> str | None:
        """Claim the snapshot for this resume under `by` (the caller's claim, or with
        `mine` one this run makes); idempotent for the same `by`."""
        if self.store is None or base.snapshot is None:
            return None
        if not mine and base.snapshot.resumed_by == by:
            return by  # claimed by the caller before this run read it: nothing to do
        if not self.store.claim(base.snapshot.snapshot_id, by):
            raise already_resumed(base.snapshot)
        return by

    def _is_newest(self, snap: Snapshot) -> bool:
        """Whether `snap` is its session's newest snapshot, asked without reading a
        history where the store can (`LatestSnapshotId`): a completed snapshot that is
        the newest is what `session_id=` continues, so no pause stands beside it."""
        store = self.store
        if not isinstance(store, LatestSnapshotId):
            return False  # unknown: the caller reads the session's snapshot whole
        return store.latest_snapshot_id(snap.session_id) == snap.snapshot_id

    def _newest_id(self, session_id: str) -> str | None:
        """The id of the session's newest snapshot, its history unread where the store
        can (`LatestSnapshotId`, `SnapshotHeads`)."""
        store = self.store
        assert store is not None
        if isinstance(store, LatestSnapshotId):
            return store.latest_snapshot_id(session_id)
        newest = self._newest(session_id, None, heads=True)
        return newest.snapshot_id if newest is not None else None

    def _pause_beside(self, snap: Snapshot) -> Snapshot | None:
        """The pause standing in `snap`'s session, read whole, when `snap` (completed,
        not interrupted) is not what `session_id=` continues and that is a pause; else
        None. Whether there is one is asked without reading histories where the store
        can (`SnapshotHeads`, or `LatestSnapshotId` while `snap` is the newest): only a
        pause found is read whole, for the refusal to name what it waits for."""
        if not isinstance(self.store, SnapshotHeads) and self._is_newest(snap):
            return None
        current = self._session_snapshot(snap.session_id, resume=False, heads=True)
        if current is None or not current.is_interrupted:
            return None
        return self._whole(current) or current

    def _check_not_paused(self, base: _Base) -> None:
        """Refuse a new message the session cannot take now (§4, rules 6 and 8): a
        `ResumeValidationError`, as the resume rules' refusals are; nothing is written."""
        snap = base.snapshot
        if snap is not None and snap.status != SnapshotStatus.COMPLETED:
            raise ResumeValidationError(
                Status.FAILED_PRECONDITION,
                f"snapshot {snap.snapshot_id} is {snap.status.value} and cannot be continued; "
                "it is kept for inspection",
            )
        if snap is not None and base.by_snapshot and not snap.is_interrupted:
            # An earlier snapshot may be continued (a new branch), but not while the
            # session is paused: its pause would stay open beside the branch's turn.
            snap = self._pause_beside(snap) or snap
        if snap is None or not snap.is_interrupted:
            return
        deadline = passed_deadline(snap) if snap.resumed_by is None else None
        if deadline is not None:  # a pause past its deadline ended its turn: none to answer
            if snap is not base.snapshot:
                return  # beside the snapshot this message branches from: no pause stands
            raise ResumeValidationError(
                Status.FAILED_PRECONDITION,
                f"snapshot {snap.snapshot_id} expired at {wire_time(deadline)} and cannot be "
                "continued"
                + (
                    ""
                    if base.from_state
                    else f"; it is kept for inspection (session {snap.session_id} goes on "
                    "from the snapshot its turn started from: address it by session_id=, or "
                    "open a new connection with agent.connect(session_id=...))"
                ),
            )
        if snap.resumed_by is not None and not base.from_state:
            if self.store is not None and self._went_on(snap):
                raise ResumeValidationError(  # addressed by snapshot_id=, after its resume went on
                    Status.FAILED_PRECONDITION,
                    f"snapshot {snap.snapshot_id} was already resumed: continue the session "
                    f"from its latest snapshot (session_id={snap.session_id})",
                )
            raise ResumeValidationError(
                Status.FAILED_PRECONDITION,
                f"session {base.session_id} is being resumed (snapshot {snap.snapshot_id}): "
                "send the next message once that turn has ended",
            )
        waiting = ", ".join(
            f"{p.tool_request.name} (ref {p.tool_request.ref})"
            for p in pending_interrupts(snap.messages)
            if p.tool_request is not None
        )
        raise ResumeValidationError(
            Status.FAILED_PRECONDITION,
            f"session {base.session_id} is paused: answer the pending interrupts first ({waiting})",
        )

    def _snapshot(
        self, base: _Base, turn: Turn, status: SnapshotStatus, reason: FinishReason
    ) -> Snapshot:
        inherited = turn.inherited if base.snapshot is not None else 0
        now = utcnow()
        return Snapshot(
            snapshot_id=new_id(),
            session_id=base.session_id,
            parent_id=base.snapshot.snapshot_id if base.snapshot else None,
            agent=self.name,
            status=status,
            finish_reason=reason,
            messages=list(turn.messages),
            created_at=now,
            updated_at=now,
            inherited=max(0, min(inherited, len(turn.messages))),
            turn_id=turn.turn_id,
        )

    def _finish(self, base: _Base, turn: Turn, result: TurnResult) -> AgentOutput:
        snapshot = self._snapshot(base, turn, SnapshotStatus.COMPLETED, result.finish_reason)
        if result.finish_reason == FinishReason.INTERRUPTED:
            deadline = turn.expires_in or self.interrupt_expires_in
            if deadline is not None:
                snapshot.expires_at = snapshot.created_at + timedelta(seconds=deadline)
        out = AgentOutput(
            finish_reason=result.finish_reason,
            message=result.message,
            session_id=base.session_id,
        )
        if self.store is not None:
            self.store.save_snapshot(snapshot)
            out.snapshot_id = snapshot.snapshot_id
        else:
            out.state = self.registry.state_codec.encode(snapshot)
        return out

    def _release(self, base: _Base, claim: str | None) -> None:
        if claim is not None and self.store is not None and base.snapshot is not None:
            self.store.release(base.snapshot.snapshot_id, claim)

    def _record_failure(
        self, base: _Base, turn: Turn, exc: Exception, claim: str | None, own: str | None
    ) -> None:
        """Keep a failed (or aborted) snapshot for inspection, then release the claim;
        when the snapshot cannot be kept, release only a claim the run made (`own`)."""
        if self.store is None:
            return
        aborted = isinstance(exc, StatusError) and exc.status == Status.ABORTED
        snapshot = self._snapshot(
            base,
            turn,
            SnapshotStatus.ABORTED if aborted else SnapshotStatus.FAILED,
            FinishReason.ABORTED if aborted else FinishReason.FAILED,
        )
        error = exc if isinstance(exc, StatusError) else None
        snapshot.error = (  # what no StatusError says is a bug, ours or a plugin's
            error.to_info()
            if error is not None
            else StatusError(Status.INTERNAL, f"{type(exc).__name__}: {exc}").to_info()
        )
        try:
            self.store.save_snapshot(snapshot)
        except BaseException:
            self._release(base, own)
            raise
        self._release(base, claim)
        if isinstance(exc, StatusError):
            exc.snapshot_id = snapshot.snapshot_id


def _lapsed(snapshot: Snapshot) -> bool:
    """A pause whose deadline passed with no answer claimed in time."""
    return (
        snapshot.is_interrupted
        and snapshot.resumed_by is None
        and passed_deadline(snapshot) is not None
    )


_SESSION_LOCKS: weakref.WeakValueDictionary[tuple[int, str], threading.RLock] = (
    weakref.WeakValueDictionary()
)
_SESSION_LOCKS_GUARD = threading.Lock()


def _session_lock(store: object, session_id: str) -> threading.RLock:
    """The lock of one session of one store in this process (kept while in use)."""
    key = (id(store), session_id)
    with _SESSION_LOCKS_GUARD:
        lock = _SESSION_LOCKS.get(key)
        if lock is None:
            lock = _SESSION_LOCKS[key] = threading.RLock()
        return lock
