"""What one more interrupt-and-resume cycle costs as a session's history grows.

For sessions with 10, 100 and 1,000 prior messages (built by running the banking
cycle many times on ONE session, so the store holds the real chain of snapshots), one
more cycle is run from the session's last snapshot and measured:

- bytes written to the SQLite store by one more cycle that goes on in the session
  (both turns by `session_id=`, as an application continues a conversation): the sizes
  of the parameters of every INSERT, UPDATE and DELETE (counted by a SQLAlchemy
  `before_cursor_execute` hook: message bodies, snapshot rows, the claim), and the WAL
  bytes and commits the cycle wrote (the WAL is emptied before it);
- time per cycle, on the SQLite store and on the in-memory store (the median of
  `--repeat` cycles, each branching from the same snapshot, so each sees exactly N
  prior messages).

    python -m bench.growth [--sizes 10,100,1000] [--repeat K] [--quick]

Prints one JSON line, with the ratios bytes@largest / bytes@smallest, of the parameters
and of the WAL (goal: <= 2 for both; the store keeps each message once, so a cycle
writes only what it adds).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import event

from interlock import Agent, InMemorySessionStore, Snapshot, SqlSessionStore

from ._common import banking_agent, emit, git_state, interlock_cycle, versions
from ._wal import checkpoint, wal_bytes, wal_commits

__all__ = ["main", "run"]

BYTES_GOAL = 2.0
"""Goal: bytes written by one cycle at the largest size / at the smallest, at most this."""

CHAT = "Hello"  # the scripted model answers with text: two messages, no tool call


class _WriteCounter:
    """Sums the parameter bytes of the writes the engine sends to the database."""

    def __init__(self) -> None:
        self.by_table: dict[str, int] = {}
        self.statements = 0
        self.rows = 0

    @property
    def total(self) -> int:
        return sum(self.by_table.values())

    def __call__(
        self,
        _conn: Any,
        _cursor: Any,
        statement: str,
        parameters: Any,
        _context: Any,
        executemany: bool,
    ) -> None:
        verb = statement.lstrip().split(None, 1)[0].upper()
        if verb not in ("INSERT", "UPDATE", "DELETE"):
            return
        table = "message" if "interlock_message" in statement else "snapshot"
        rows = parameters if executemany else [parameters]
        self.statements += 1
        self.rows += len(rows)
        size = sum(_param_bytes(v) for row in rows for v in _values(row))
        self.by_table[table] = self.by_table.get(table, 0) + size


def _values(row: Any) -> list[Any]:
    if isinstance(row, dict):
        return list(row.values())
    return list(row or ())


def _param_bytes(value: Any) -> int:
    """The size a parameter takes as SQLite stores it (text as UTF-8)."""
    if value is None:
        return 0
    if isinstance(value, bytes | bytearray | memoryview):
        return len(value)
    if isinstance(value, bool):
        return 1
    if isinstance(value, int | float):
        return 8
    if isinstance(value, dt.datetime | dt.date):
        return len(str(value))
    return len(str(value).encode())


def _build(agent: Agent, size: int) -> tuple[str, str]:
    """A session with `size` messages (4 per cycle, 2 per chat): its id and last snapshot."""
    if size < 2 or size % 2:
        raise ValueError(f"a session size must be even and at least 2, got {size}")
    session_id: str | None = None
    out = None
    if size % 4:
        out = agent.run_text(CHAT)
        session_id = out.session_id
    for i in range(size // 4):
        out = interlock_cycle(agent, i, session_id=session_id)
        session_id = out.session_id
    assert out is not None and out.snapshot_id is not None and session_id is not None
    return session_id, out.snapshot_id


def _timed(cycle: Callable[[int], Any], repeat: int) -> dict[str, float]:
    times = []
    for i in range(repeat):
        t0 = time.perf_counter()
        cycle(i)
        times.append(time.perf_counter() - t0)
    return _summary(times)


def _summary(times: list[float]) -> dict[str, float]:
    return {
        "median_ms": round(statistics.median(times) * 1000, 3),
        "mean_ms": round(statistics.fmean(times) * 1000, 3),
        "repeat": len(times),
    }


def measure(size: int, repeat: int, tmp: Path) -> dict[str, Any]:
    db = tmp / f"growth-{size}.db"
    store = SqlSessionStore(f"sqlite:///{db}")
    try:
        agent = banking_agent(store)
        t0 = time.perf_counter()
        session_id, base = _build(agent, size)
        build_s = time.perf_counter() - t0
        snapshot = store.get_snapshot(base)
        assert snapshot is not None
        prior = len(snapshot.messages)
        if prior != size:
            raise AssertionError(f"built {prior} messages, wanted {size}")
        chain = len(store.list_snapshots(session_id=session_id, limit=1_000_000))

        # One more cycle in the session, its writes counted.
        checkpoint(db)
        counter = _WriteCounter()
        event.listen(store.engine, "before_cursor_execute", counter)
        try:
            done = interlock_cycle(agent, 0, session_id=session_id)
        finally:
            event.remove(store.engine, "before_cursor_execute", counter)
        wal, commits = wal_bytes(db), wal_commits(db)
        after = store.get_snapshot(done.snapshot_id or "")
        assert after is not None and len(after.messages) == size + 4

        sql_time = _timed(lambda i: interlock_cycle(agent, i, snapshot_id=base), repeat)

        memory = InMemorySessionStore()
        memory.save_snapshot(snapshot)
        memory_agent = banking_agent(memory)
        memory_time = _timed(lambda i: interlock_cycle(memory_agent, i, snapshot_id=base), repeat)
    finally:
        store.close()
    checkpoint(db)
    sql_continued = _continued(
        lambda i: _sqlite_copy(db, tmp / f"copy-{size}-{i}.db"), session_id, repeat
    )
    memory_continued = _continued(lambda i: _memory_copy(snapshot), session_id, repeat)
    return {
        "prior_messages": prior,
        "snapshots_in_session": chain,
        "build_s": round(build_s, 2),
        "bytes_written": {
            "params_total": counter.total,
            "params_by_table": counter.by_table,
            "write_statements": counter.statements,
            "rows_written": counter.rows,
            "wal_bytes": wal,
            "wal_commits": commits,
        },
        "cycle_sqlite": sql_time,
        "cycle_memory": memory_time,
        "continued_sqlite": sql_continued,
        "continued_memory": memory_continued,
    }


def _sqlite_copy(db: Path, copy: Path) -> SqlSessionStore:
    """A store on a copy of the checkpointed database `db`: the same chain of snapshots."""
    shutil.copyfile(db, copy)
    return SqlSessionStore(f"sqlite:///{copy}")


def _memory_copy(snapshot: Snapshot) -> InMemorySessionStore:
    """A memory store holding `snapshot` (its whole history) as its session's newest."""
    memory = InMemorySessionStore()
    memory.save_snapshot(snapshot)
    return memory


def _continued(
    make_store: Callable[[int], InMemorySessionStore | SqlSessionStore],
    session_id: str,
    repeat: int,
) -> dict[str, float]:
    """The cycle as a session goes on (both turns by `session_id=`), each of `repeat`
    times on a fresh copy of the session (made untimed), so that each sees exactly its
    N prior messages: the history is read once a turn."""
    times = []
    for i in range(repeat):
        store = make_store(i)
        try:
            agent = banking_agent(store)
            if store.get_latest_snapshot(session_id) is None:  # and warms the connection
                raise AssertionError(f"the copy lost session {session_id}")
            t0 = time.perf_counter()
            interlock_cycle(agent, i, session_id=session_id)
            times.append(time.perf_counter() - t0)
        finally:
            if isinstance(store, SqlSessionStore):
                store.close()
    return _summary(times)


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 2) if b else None


def run(sizes: list[int], repeat: int) -> dict[str, Any]:
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="interlock-growth-") as tmp_name:
        results = {str(n): measure(n, repeat, Path(tmp_name)) for n in sizes}
    small, large = results[str(min(sizes))], results[str(max(sizes))]
    label = f"{max(sizes)}_vs_{min(sizes)}"

    def written(r: dict[str, Any], key: str) -> float:
        return float(r["bytes_written"][key])

    ratios = {
        f"params_bytes_{label}": _ratio(
            written(large, "params_total"), written(small, "params_total")
        ),
        f"wal_bytes_{label}": _ratio(written(large, "wal_bytes"), written(small, "wal_bytes")),
        f"time_sqlite_{label}": _ratio(
            large["cycle_sqlite"]["median_ms"], small["cycle_sqlite"]["median_ms"]
        ),
        f"time_memory_{label}": _ratio(
            large["cycle_memory"]["median_ms"], small["cycle_memory"]["median_ms"]
        ),
        f"time_continued_sqlite_{label}": _ratio(
            large["continued_sqlite"]["median_ms"], small["continued_sqlite"]["median_ms"]
        ),
        f"time_continued_memory_{label}": _ratio(
            large["continued_memory"]["median_ms"], small["continued_memory"]["median_ms"]
        ),
    }
    targets: dict[str, Any] = {}
    for name in (f"params_bytes_{label}", f"wal_bytes_{label}"):
        ratio = ratios[name]
        targets[name] = {
            "goal": f"<= {BYTES_GOAL}",
            "ratio": ratio,
            "met": None if ratio is None else ratio <= BYTES_GOAL,
        }
    return {
        "benchmark": "growth",
        "sizes": sizes,
        "repeat": repeat,
        "results": results,
        "ratios": ratios,
        "targets": targets,
        "notes": [
            "bytes_written: one cycle going on in the session (session_id=); params: "
            "parameters of INSERT/UPDATE/DELETE statements (text as UTF-8, numbers 8 "
            "bytes); wal_bytes: the WAL after the cycle, emptied before it (whole pages, "
            "B-tree and index pages included); wal_commits: the transactions it committed",
            "cycle_*: the cycle branching from the session's last snapshot (snapshot_id=), "
            "the same snapshot each time; continued_*: the cycle going on in the session "
            "(session_id=), each time on a fresh copy of it",
            "cycle_memory/continued_memory: the memory store holds the session's last "
            "snapshot alone (its whole history), not the chain of snapshots the SQLite "
            "store holds",
        ],
        "git": git_state(),
        "versions": versions(),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "elapsed_s": round(time.perf_counter() - started, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.growth", description=__doc__)
    parser.add_argument(
        "--sizes", default="10,100,1000", help="prior messages per session, comma-separated"
    )
    parser.add_argument("--repeat", type=int, default=20, help="timed cycles per size")
    parser.add_argument("--quick", action="store_true", help="a tiny smoke run (10 and 100)")
    args = parser.parse_args(argv)
    sizes = [10, 100] if args.quick else [int(x) for x in args.sizes.split(",") if x.strip()]
    repeat = 3 if args.quick else args.repeat
    if not sizes or any(n < 2 or n % 2 for n in sizes) or repeat < 1:
        parser.error("--sizes must be even numbers >= 2, --repeat positive")
    emit(run(sorted(set(sizes)), repeat))
    return 0


if __name__ == "__main__":
    sys.exit(main())
