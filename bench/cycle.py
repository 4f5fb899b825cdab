"""The interrupt-and-resume cycle, in process: Interlock against LangGraph and Pydantic AI.

One cycle, on a new session each time: "Transfer $500 to savings" -> the model asks for
`transferMoney` -> the turn pauses for approval -> the caller answers (with the tool's
output) -> a second model call answers with text. Interlock runs the example's banking
agent (scripted model, no network) on an `InMemorySessionStore` and on a
`SqlSessionStore` over a SQLite file; the peers run the same agent shape (see peers.py).

    python -m bench.cycle [--cycles N] [--warmup W] [--rounds R] [--quick]

Prints one JSON line: cycles/s, median and p99 ms per system, the commits a cycle
makes on each SQLite file (read from its write-ahead log), the ratios of ours to each
peer's rate (3.0 = three times as many cycles per second), and the versions used. The
systems run in interleaved rounds, the order rotating and reversing, so that a noisy
neighbour slows them alike and no system always runs right after another;
`ratios_round_median` is the median over the rounds of each round's ratio, which a
burst of outside load moves less than the overall one.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from interlock import Agent, InMemorySessionStore, SqlSessionStore

from . import peers
from ._common import (
    banking_agent,
    disk_flush_ms,
    emit,
    git_state,
    interlock_cycle,
    round_order,
    summarize,
    versions,
)
from ._wal import checkpoint, wal_commits

__all__ = ["main", "run"]

TARGET = 3.0
"""Goal: ours with the SQLite store at least this many times the peers' cycle rate."""

# (ratio name, ours, peer): ours' cycles/s divided by the peer's.
RATIOS = (
    ("interlock_sqlite_vs_langgraph_sqlite", "interlock_sqlite", "langgraph_sqlite"),
    ("interlock_sqlite_vs_langgraph_sqlite_exit", "interlock_sqlite", "langgraph_sqlite_exit"),
    ("interlock_sqlite_vs_pydantic_ai", "interlock_sqlite", "pydantic_ai_memory"),
    ("interlock_sqlite_vs_pydantic_ai_sqlite", "interlock_sqlite", "pydantic_ai_sqlite"),
    ("interlock_memory_vs_langgraph_memory", "interlock_memory", "langgraph_memory"),
    ("interlock_memory_vs_pydantic_ai", "interlock_memory", "pydantic_ai_memory"),
    (
        "interlock_sqlite_sync_normal_vs_langgraph_sqlite_sync_normal",
        "interlock_sqlite_sync_normal",
        "langgraph_sqlite_sync_normal",
    ),
)
TARGETS = (
    "interlock_sqlite_vs_langgraph_sqlite",
    "interlock_sqlite_vs_langgraph_sqlite_exit",
    "interlock_sqlite_vs_pydantic_ai",
)
"""The goal's ratios. LangGraph is measured twice: as it runs by default (a checkpoint
after every step) and saving only where ours does (at the pause and at the end)."""
COUNTED_CYCLES = 10
"""Untimed cycles after the rounds, over which the commits a cycle makes are counted
(few enough for the WAL to stay under SQLite's automatic checkpoint)."""

PEERS: tuple[Callable[[Path], peers.Peer], ...] = (
    peers.langgraph_memory,
    peers.langgraph_sqlite,
    peers.langgraph_sqlite_exit,
    peers.langgraph_sqlite_sync_normal,
    peers.pydantic_ai_memory,
    peers.pydantic_ai_sqlite,
)

_OURS = "examples.banking bankingAgent, scripted/banking model, "


def _cycle_of(agent: Agent) -> Callable[[int], None]:
    def cycle(i: int) -> None:
        interlock_cycle(agent, i)

    return cycle


def _ours(tmp: Path) -> list[peers.Peer]:
    sql_store = SqlSessionStore(f"sqlite:///{tmp / 'interlock.db'}")
    # Opt-in, not the default: under WAL a commit then survives a crash of the
    # process, not of the machine.
    normal_store = SqlSessionStore(
        f"sqlite:///{tmp / 'interlock_sync_normal.db'}?synchronous=normal"
    )
    return [
        peers.Peer(
            "interlock_memory",
            _cycle_of(banking_agent(InMemorySessionStore())),
            _OURS + "InMemorySessionStore",
        ),
        peers.Peer(
            "interlock_sqlite",
            _cycle_of(banking_agent(sql_store)),
            _OURS + "SqlSessionStore on a SQLite file (WAL, synchronous=FULL, the default)",
            close=sql_store.close,
            db=tmp / "interlock.db",
        ),
        peers.Peer(
            "interlock_sqlite_sync_normal",
            _cycle_of(banking_agent(normal_store)),
            _OURS + "SqlSessionStore on a SQLite file, ?synchronous=normal (WAL, opt-in)",
            close=normal_store.close,
            db=tmp / "interlock_sync_normal.db",
        ),
    ]


def run(cycles: int, warmup: int, rounds: int) -> dict[str, Any]:
    started = time.perf_counter()
    notes: list[str] = []
    missing: list[str] = []
    with tempfile.TemporaryDirectory(prefix="interlock-bench-") as tmp_name:
        tmp = Path(tmp_name)
        flush_before = disk_flush_ms(tmp)
        systems = _ours(tmp)
        for build in PEERS:
            try:
                systems.append(build(tmp))
            except peers.PeerMissing as exc:
                missing.append(build.__name__)
                notes.append(f"{build.__name__}: not run, {exc}; pip install '.[bench]'")
        try:
            by_round = _measure(systems, cycles, warmup, rounds)
            commits = {s.name: _commits_per_cycle(s) for s in systems if s.db is not None}
        finally:
            for system in systems:
                system.close()
        flush_after = disk_flush_ms(tmp)

    measured = {s.name: s for s in systems}
    results: dict[str, Any] = {}
    for name in [s.name for s in systems[:3]] + [build.__name__ for build in PEERS]:
        found = measured.get(name)
        if found is None:
            results[name] = None  # not installed: see notes
            continue
        flat = [x for batch in by_round[name] for x in batch]
        results[name] = {**summarize(flat), "setup": found.note}
        if name in commits:
            results[name]["commits_per_cycle"] = commits[name]

    ratios: dict[str, float | None] = {}
    round_medians: dict[str, float | None] = {}
    for label, ours, peer in RATIOS:
        if not results.get(ours) or not results.get(peer):
            ratios[label] = round_medians[label] = None
            continue
        ours_s, peer_s = (sum(sum(batch) for batch in by_round[n]) for n in (ours, peer))
        ratios[label] = round(peer_s / ours_s, 2)  # equal cycle counts: the rates' ratio
        per_round = [
            sum(p) / sum(o) for o, p in zip(by_round[ours], by_round[peer], strict=True) if o
        ]
        round_medians[label] = round(statistics.median(per_round), 2)
    targets: dict[str, Any] = {}
    for label in TARGETS:
        ratio = ratios[label]
        targets[label] = {
            "goal": f">= {TARGET}x",
            "ratio": ratio,
            "ratio_round_median": round_medians[label],
            "met": None if ratio is None else ratio >= TARGET,
        }
    return {
        "benchmark": "cycle",
        "cycles": cycles,
        "warmup": warmup,
        "rounds": rounds,
        "results": results,
        "ratios": ratios,
        "ratios_round_median": round_medians,
        "targets": targets,
        "notes": [
            "commits_per_cycle: the transactions a cycle commits to its SQLite file, "
            f"counted in the write-ahead log over {COUNTED_CYCLES} untimed cycles after the "
            "rounds; with synchronous=FULL each waits for the disk to flush",
            "pydantic_ai_*: Agent.run_sync, as a synchronous caller runs it (ours is "
            "synchronous too)",
            *notes,
        ],
        "git": git_state(),
        "versions": versions(),
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            # a durable commit waits for this; the ratios to Pydantic AI (which writes
            # nothing) move with it
            "disk_flush_ms": {"before": flush_before, "after": flush_after},
        },
        "elapsed_s": round(time.perf_counter() - started, 1),
    }


def _measure(
    systems: list[peers.Peer], cycles: int, warmup: int, rounds: int
) -> dict[str, list[list[float]]]:
    """Per-cycle seconds of each system, by round. After a warm-up, the cycles run in
    `rounds` batches, interleaved between the systems (`round_order`). Before each batch
    the heap so far is collected and frozen, so that no system's collections scan what
    the others (or its own earlier batches) keep: the in-memory stores and savers keep
    every session they ran."""
    for system in systems:
        for i in range(warmup):
            system.cycle(-1 - i)
    by_round: dict[str, list[list[float]]] = {s.name: [] for s in systems}
    per_round = [cycles // rounds + (1 if r < cycles % rounds else 0) for r in range(rounds)]
    clock = time.perf_counter
    serial = 0
    try:
        for r, count in enumerate(per_round):
            for system in round_order(systems, r):
                gc.collect()
                gc.freeze()
                batch: list[float] = []
                cycle = system.cycle
                for _ in range(count):
                    serial += 1
                    t0 = clock()
                    cycle(serial)
                    batch.append(clock() - t0)
                by_round[system.name].append(batch)
    finally:
        gc.unfreeze()
    return by_round


def _commits_per_cycle(system: peers.Peer) -> float:
    """The commits one cycle of `system` makes to its SQLite file, on average over
    `COUNTED_CYCLES` cycles run after the WAL is checkpointed and emptied."""
    assert system.db is not None
    checkpoint(system.db)
    for i in range(COUNTED_CYCLES):
        system.cycle(-10_000 - i)
    time.sleep(0.1)  # a checkpoint a peer writes in the background (LangGraph's "async")
    return round(wal_commits(system.db) / COUNTED_CYCLES, 2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cycle", description=__doc__)
    parser.add_argument("--cycles", type=int, default=300, help="timed cycles per system")
    parser.add_argument("--warmup", type=int, default=30, help="untimed cycles per system first")
    parser.add_argument("--rounds", type=int, default=10, help="interleaved batches")
    parser.add_argument("--quick", action="store_true", help="a tiny smoke run (12 cycles)")
    args = parser.parse_args(argv)
    if args.quick:
        args.cycles, args.warmup, args.rounds = 12, 2, 2
    if args.cycles < 1 or args.rounds < 1 or args.warmup < 0:
        parser.error("--cycles and --rounds must be positive, --warmup not negative")
    emit(run(args.cycles, args.warmup, min(args.rounds, args.cycles)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
