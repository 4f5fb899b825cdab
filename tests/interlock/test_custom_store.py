"""A store of the user's own: any object with the `SessionStore` methods serves an
agent, with every rule that rests on the store (the continuation point, the once-only
claim, rule 6) kept. This one keeps whole snapshots in dicts and knows nothing of the
built-in stores."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from examples.banking import TransferOutput, transferMoney
from interlock import (
    FinishReason,
    Interlock,
    ResumeValidationError,
    SessionStore,
    Snapshot,
    SnapshotStatus,
    Status,
    StatusError,
    ToolResume,
)


class DictStore:
    """Whole snapshots, copied in and out; a lock makes `claim` atomic."""

    def __init__(self) -> None:
        self.snapshots: dict[str, Snapshot] = {}
        self.order: list[str] = []  # first saves, oldest first
        self.lock = threading.Lock()

    def get_snapshot(self, snapshot_id: str) -> Snapshot | None:
        found = self.snapshots.get(snapshot_id)
        return found.model_copy(deep=True) if found is not None else None

    def get_latest_snapshot(self, session_id: str) -> Snapshot | None:
        found = self.list_snapshots(session_id=session_id, limit=1)
        return found[0] if found else None

    def save_snapshot(self, snapshot: Snapshot) -> None:
        with self.lock:
            if snapshot.snapshot_id not in self.snapshots:
                self.order.append(snapshot.snapshot_id)
            self.snapshots[snapshot.snapshot_id] = snapshot.model_copy(deep=True)

    def claim(self, snapshot_id: str, by: str) -> bool:
        with self.lock:
            snap = self.snapshots.get(snapshot_id)
            if snap is None or snap.status != SnapshotStatus.COMPLETED:
                return False
            if snap.finish_reason != FinishReason.INTERRUPTED:
                return False
            if snap.resumed_by not in (None, by):
                return False
            snap.resumed_by = by
            return True

    def release(self, snapshot_id: str, by: str) -> None:
        with self.lock:
            snap = self.snapshots.get(snapshot_id)
            if snap is not None and snap.resumed_by == by:
                snap.resumed_by = None

    def list_snapshots(
        self,
        session_id: str | None = None,
        status: SnapshotStatus | None = None,
        finish_reason: FinishReason | None = None,
        claimed: bool | None = None,
        limit: int = 100,
    ) -> list[Snapshot]:
        found: list[Snapshot] = []
        for sid in reversed(self.order):
            snap = self.snapshots[sid]
            if session_id is not None and snap.session_id != session_id:
                continue
            if status is not None and snap.status != status:
                continue
            if finish_reason is not None and snap.finish_reason != finish_reason:
                continue
            if claimed is not None and (snap.resumed_by is not None) != claimed:
                continue
            found.append(snap.model_copy(deep=True))
        return found[:limit]


Bank = tuple[Any, Any, DictStore]
"""The agent, its tool, its store."""


@pytest.fixture
def bank() -> Bank:
    store = DictStore()
    ai = Interlock(secret="custom")
    tool = ai.define_interruptible_tool("transferMoney", "transfer", transferMoney.fn)
    agent = ai.define_agent("bank", model="scripted/banking", tools=[tool], store=store)
    return agent, tool, store


def test_a_store_of_ones_own_serves_an_agent(bank: Bank) -> None:
    agent, tool, store = bank
    assert isinstance(store, SessionStore)
    out = agent.run_text("Transfer $500 to savings.")
    assert out.finish_reason is FinishReason.INTERRUPTED and out.snapshot_id in store.snapshots
    reply = tool.respond(out.interrupts[0], TransferOutput(success=True, transaction_id="t-1"))
    done = agent.run(ToolResume(respond=[reply]), session_id=out.session_id)
    assert done.text == "Done: transferred $500.00 to savings, transaction t-1."
    assert store.snapshots[str(out.snapshot_id)].resumed_by is not None
    with pytest.raises(ResumeValidationError) as again:  # a second reviewer
        agent.run(ToolResume(respond=[reply]), snapshot_id=out.snapshot_id)
    assert again.value.status is Status.FAILED_PRECONDITION
    assert "already resumed" in again.value.message
    latest = store.get_latest_snapshot(str(out.session_id))
    assert latest is not None and latest.snapshot_id == done.snapshot_id
    assert [m.role for m in latest.messages][:2] == ["user", "model"]  # the whole history


def test_concurrent_answers_on_a_store_of_ones_own_resume_once(
    bank: Bank,
) -> None:
    agent, tool, store = bank
    out = agent.run_text("Transfer $20 to checking.")
    reply = tool.respond(out.interrupts[0], TransferOutput(success=True, transaction_id="t-2"))

    def answer(_: int) -> str:
        try:
            agent.run(ToolResume(respond=[reply]), snapshot_id=out.snapshot_id)
        except StatusError as exc:
            return exc.status.value
        return "OK"

    with ThreadPoolExecutor(6) as pool:
        outcomes = sorted(pool.map(answer, range(6)))
    assert outcomes == ["FAILED_PRECONDITION"] * 5 + ["OK"]
    completed = store.list_snapshots(
        session_id=str(out.session_id), finish_reason=FinishReason.STOP
    )
    assert len(completed) == 1


def test_a_store_of_ones_own_keeps_rule_six(bank: Bank) -> None:
    """An expired pause refuses its answer, by snapshot and by session."""
    agent, tool, store = bank
    out = agent.run_text("Transfer $7 to savings.")
    snap = store.get_snapshot(str(out.snapshot_id))
    assert snap is not None
    store.save_snapshot(
        snap.model_copy(
            update={"status": SnapshotStatus.EXPIRED, "finish_reason": FinishReason.EXPIRED}
        )
    )
    reply = tool.respond(out.interrupts[0], TransferOutput(success=True))
    for address in ({"snapshot_id": out.snapshot_id}, {"session_id": out.session_id}):
        with pytest.raises(ResumeValidationError) as info:
            agent.run(ToolResume(respond=[reply]), **address)
        assert info.value.status is Status.FAILED_PRECONDITION
        assert "expired" in info.value.message
