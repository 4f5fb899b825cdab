"""`claim` is once-only across processes: 8 OS processes race for the same snapshot.

The 8 claimers are spawned once for the module (a spawn costs an interpreter start and
the imports) and serve one job per test: build their own `SqlSessionStore` from the
URL, connect, then for each round wait at a barrier and claim the round's snapshot,
all at the same moment.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
from collections.abc import Iterator
from dataclasses import dataclass, field
from multiprocessing.context import SpawnProcess
from multiprocessing.queues import Queue, SimpleQueue
from multiprocessing.synchronize import Barrier
from pathlib import Path

import pytest

from interlock.stores import SqlSessionStore
from schemas import FinishReason, Message, Part, Snapshot, SnapshotStatus

WORKERS = 8
ROUNDS = 5  # each round races for a fresh snapshot
TIMEOUT = 60.0

Job = tuple[str, list[str]] | None  # (url, snapshot ids), None to stop
Outcome = tuple[str | None, int, bool, str | None]  # (snapshot id, worker, won, error)


def _claimer(
    worker: int, jobs: SimpleQueue[Job], results: Queue[Outcome], barrier: Barrier
) -> None:
    """Runs in a spawned process until it gets None."""
    while (job := jobs.get()) is not None:
        url, snapshot_ids = job
        try:
            store = SqlSessionStore(url)
            try:
                store.get_snapshot(snapshot_ids[0])  # connected before the start line
                for sid in snapshot_ids:
                    barrier.wait(TIMEOUT)
                    results.put((sid, worker, store.claim(sid, f"worker-{worker}"), None))
            finally:
                store.close()
        except BaseException as exc:  # report, never leave the parent hanging
            barrier.abort()
            results.put((None, worker, False, f"{type(exc).__name__}: {exc}"))
    # Everything is closed; flush the results and skip interpreter teardown (~0.2 s of
    # CPU per process, which 8 processes on a small CI machine feel).
    results.close()
    results.join_thread()
    os._exit(0)


@dataclass
class Claimers:
    barrier: Barrier
    results: Queue[Outcome]
    jobs: list[SimpleQueue[Job]] = field(default_factory=list)
    procs: list[SpawnProcess] = field(default_factory=list)

    def race(self, url: str, snapshot_ids: list[str]) -> list[Outcome]:
        self.barrier.reset()
        for q in self.jobs:
            q.put((url, snapshot_ids))
        outcomes: list[Outcome] = []
        for _ in range(WORKERS * len(snapshot_ids)):
            try:
                item = self.results.get(timeout=TIMEOUT)
            except queue.Empty:
                pytest.fail(f"claimers stalled; got {len(outcomes)} results: {outcomes}")
            if item[3] is not None:
                pytest.fail(f"claimer {item[1]} failed: {item[3]}")
            outcomes.append(item)
        return outcomes


@pytest.fixture(scope="module")
def claimers() -> Iterator[Claimers]:
    ctx = mp.get_context("spawn")
    pool = Claimers(barrier=ctx.Barrier(WORKERS), results=ctx.Queue())
    try:
        for w in range(WORKERS):
            jobs: SimpleQueue[Job] = ctx.SimpleQueue()
            proc = ctx.Process(
                target=_claimer, args=(w, jobs, pool.results, pool.barrier), daemon=True
            )
            proc.start()
            pool.jobs.append(jobs)
            pool.procs.append(proc)
        yield pool
    finally:
        for q in pool.jobs:
            q.put(None)
        for p in pool.procs:
            p.join(TIMEOUT)
            if p.is_alive():
                p.kill()
                p.join()
            p.close()
        for q in pool.jobs:
            q.close()
        pool.results.close()
        pool.results.join_thread()


def _race(claimers: Claimers, url: str) -> None:
    snapshot_ids = [f"race-{r}" for r in range(ROUNDS)]
    setup = SqlSessionStore(url)
    try:
        for sid in snapshot_ids:
            setup.save_snapshot(
                Snapshot(
                    snapshot_id=sid,
                    session_id="race",
                    agent="a",
                    status=SnapshotStatus.COMPLETED,
                    finish_reason=FinishReason.INTERRUPTED,
                    messages=[Message(role="user", content=[Part(text="hi")])],
                )
            )
        outcomes = claimers.race(url, snapshot_ids)
        for sid in snapshot_ids:
            tried = sorted(w for s, w, _, _ in outcomes if s == sid)
            winners = [w for s, w, won, _ in outcomes if s == sid and won]
            assert tried == list(range(WORKERS))
            assert len(winners) == 1, f"{sid}: {len(winners)} winners {winners}"
            stored = setup.get_snapshot(sid)
            assert stored is not None
            assert stored.resumed_by == f"worker-{winners[0]}"
    finally:
        setup.close()


def test_claim_race_sqlite(claimers: Claimers, tmp_path: Path) -> None:
    _race(claimers, f"sqlite:///{tmp_path / 'race.db'}")


def test_claim_race_postgresql(claimers: Claimers, pg_url: str) -> None:
    _race(claimers, pg_url)
