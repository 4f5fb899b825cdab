"""How many times each kind of run reads a session's history from the SQL store.

A history is parsed at about 10 µs a message: on a long session every read of it that a
run does not need is most of that run's time. These tests count the history queries a
run sends to a real SQLite file (the store's recursive query over a snapshot's parent
chain), and pin each run to the reads it needs: the snapshot it goes on from, and a
pause only where a refusal names what it waits for. What needs only a snapshot's
session, status or pause reads it without its history (`SnapshotHeads`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
from sqlalchemy import event

from examples.banking import TransferOutput, bankingAgent, transferMoney
from interlock import (
    Agent,
    AgentOutput,
    FinishReason,
    ResumeValidationError,
    SnapshotHeads,
    SqlSessionStore,
    Status,
    ToolResume,
)

PROMPT = "Transfer $500 to savings"


class HistoryReads:
    """Counts the history queries sent on an engine, while in a `with` block."""

    def __init__(self, store: SqlSessionStore) -> None:
        self.store = store
        self.count = 0

    def _seen(self, _conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if "interlock_chain" in statement:  # the recursive walk up a parent chain
            self.count += 1

    def __enter__(self) -> HistoryReads:
        self.count = 0
        event.listen(self.store.engine, "before_cursor_execute", self._seen)
        return self

    def __exit__(self, *exc: object) -> None:
        event.remove(self.store.engine, "before_cursor_execute", self._seen)


def answer(out: AgentOutput, i: int = 0) -> ToolResume:
    reply = transferMoney.respond(
        out.interrupts[0], TransferOutput(success=True, transaction_id=f"txn-{i}")
    )
    return ToolResume(respond=[reply])


class Session:
    """A banking session of a few interrupt-and-resume cycles in the store, with its
    newest snapshot and an earlier completed one (a branch point)."""

    def __init__(self, agent: Agent, cycles: int = 3) -> None:
        self.agent = agent
        done: list[AgentOutput] = []
        session_id: str | None = None
        for i in range(cycles):
            out = agent.run_text(PROMPT, session_id=session_id)
            session_id = out.session_id
            done.append(agent.run(answer(out, i), session_id=session_id))
        assert session_id is not None and all(d.finish_reason is FinishReason.STOP for d in done)
        self.session_id = session_id
        self.newest = str(done[-1].snapshot_id)
        self.earlier = str(done[-2].snapshot_id)

    def pause(self) -> AgentOutput:
        out = self.agent.run_text(PROMPT, session_id=self.session_id)
        assert out.finish_reason is FinishReason.INTERRUPTED
        return out


@pytest.fixture
def agent(store: SqlSessionStore) -> Agent:
    return replace(bankingAgent.with_store(store), model="scripted/banking")


@pytest.fixture
def session(agent: Agent) -> Session:
    return Session(agent)


def test_the_sql_store_reads_heads(store: SqlSessionStore) -> None:
    assert isinstance(store, SnapshotHeads)


def reads(store: SqlSessionStore, run: Callable[[], Any]) -> tuple[int, Any]:
    with HistoryReads(store) as counted:
        result = run()
    return counted.count, result


def test_a_new_session_reads_no_history(store: SqlSessionStore, agent: Agent) -> None:
    n, out = reads(store, lambda: agent.run_text(PROMPT))
    assert out.finish_reason is FinishReason.INTERRUPTED
    assert n == 0


def test_session_id_reads_the_history_once(store: SqlSessionStore, session: Session) -> None:
    agent = session.agent
    n, out = reads(store, lambda: agent.run_text(PROMPT, session_id=session.session_id))
    assert out.finish_reason is FinishReason.INTERRUPTED
    assert n == 1, "a new message: the newest snapshot"
    n, done = reads(store, lambda: agent.run(answer(out), session_id=session.session_id))
    assert done.finish_reason is FinishReason.STOP
    assert n == 1, "a resume: the pause"


@pytest.mark.parametrize("which", ["newest", "earlier"])
def test_snapshot_id_reads_the_history_once(
    store: SqlSessionStore, session: Session, which: str
) -> None:
    """The snapshot named is read whole once: its session (to run one message at a
    time there) and whether a pause stands beside it (for an earlier one, a branch)
    are asked without a history."""
    named = session.newest if which == "newest" else session.earlier
    n, out = reads(store, lambda: session.agent.run_text(PROMPT, snapshot_id=named))
    assert out.finish_reason is FinishReason.INTERRUPTED
    assert n == 1
    paused = store.get_snapshot(str(out.snapshot_id))
    assert paused is not None and paused.parent_id == named


def test_a_branch_beside_a_pause_reads_the_pause_to_name_it(
    store: SqlSessionStore, session: Session
) -> None:
    """Refused (rule 8): the snapshot named, then the pause, whose interrupts the
    refusal names; nothing else."""
    session.pause()
    count = len(store.list_snapshots(session_id=session.session_id, limit=1000))

    def branch() -> ResumeValidationError:
        with pytest.raises(ResumeValidationError) as info:
            session.agent.run_text(PROMPT, snapshot_id=session.earlier)
        return info.value

    n, err = reads(store, branch)
    assert err.status is Status.FAILED_PRECONDITION
    assert "answer the pending interrupts first (transferMoney (ref" in err.message
    assert n == 2
    assert len(store.list_snapshots(session_id=session.session_id, limit=1000)) == count


def test_a_branch_beside_a_pause_being_resumed_reads_no_more(
    store: SqlSessionStore, session: Session
) -> None:
    """The pause claimed: the refusal says it is being resumed; whether it is still
    the session's newest is asked without a history."""
    paused = session.pause()
    assert store.claim(str(paused.snapshot_id), "elsewhere")

    def branch() -> ResumeValidationError:
        with pytest.raises(ResumeValidationError) as info:
            session.agent.run_text(PROMPT, snapshot_id=session.earlier)
        return info.value

    n, err = reads(store, branch)
    assert f"session {session.session_id} is being resumed" in err.message
    assert n == 2


def test_resumes_of_the_queue_path_read_the_pause_once(
    store: SqlSessionStore, session: Session
) -> None:
    """`validate_resume` (the resume consumer's check) and the worker's run under the
    consumer's claim each read the paused snapshot once."""
    agent = session.agent
    out = session.pause()
    sid = str(out.snapshot_id)
    n, _ = reads(store, lambda: agent.validate_resume(answer(out), snapshot_id=sid))
    assert n == 1
    assert store.claim(sid, "decision-1")
    n, done = reads(
        store,
        lambda: agent.run(
            answer(out), snapshot_id=sid, claimed_by="decision-1", claim_required=True
        ),
    )
    assert done.finish_reason is FinishReason.STOP
    assert n == 1


def test_a_message_after_a_lapsed_pause_reads_the_turn_start_once(
    store: SqlSessionStore, agent: Agent
) -> None:
    """A pause past its deadline ended its turn: a new message goes on from where that
    turn started. The pause is read (the session's newest), the chain back to that start
    is walked without histories, and only the start is read whole."""
    hasty = replace(agent, interrupt_expires_in=0.01)
    session = Session(agent, cycles=2)
    paused = hasty.run_text(PROMPT, session_id=session.session_id)
    assert paused.finish_reason is FinishReason.INTERRUPTED
    time.sleep(0.05)
    n, out = reads(store, lambda: agent.run_text(PROMPT, session_id=session.session_id))
    assert out.finish_reason is FinishReason.INTERRUPTED
    again = store.get_snapshot(str(out.snapshot_id))
    assert again is not None and again.parent_id == session.newest
    assert n == 2


def test_a_cycle_branching_from_an_earlier_snapshot_reads_two_histories(
    store: SqlSessionStore, session: Session
) -> None:
    """The branch's new message reads the snapshot it goes on from, its resume the
    pause it answers: two histories for the cycle (four before heads)."""
    agent = session.agent

    def cycle() -> AgentOutput:
        out = agent.run_text(PROMPT, snapshot_id=session.earlier)
        return agent.run(answer(out), session_id=session.session_id)

    n, done = reads(store, cycle)
    assert done.finish_reason is FinishReason.STOP
    assert n == 2
