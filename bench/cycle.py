"""The interrupt-and-resume cycle, in process: Interlock against LangGraph and Pydantic AI.

One cycle, on a new session each time: "Transfer $500 to savings" -> the model asks for
`transferMoney` -> the turn pauses for approval -> the caller answers (with the tool's
output) -> a second model call answers with text. Interlock runs the example's banking
agent (scripted model, no network) on an `InMemorySessionStore` and on a
`SqlSessionStore` over a SQLite file; the peers run the same agent shape (see peers.py).

    python -m bench.cycle [--cycles N] [--rounds R] [--quick]

Prints one JSON line: cycles/s, median and p99 ms per system, the ratios of ours to
each peer's rate (3.0 = three times as many cycles per second), and the versions used.
The systems run in interleaved rounds, the order rotating, so that a noisy neighbour
slows them alike; `ratios_round_median` is the median over the rounds of each round's
ratio, which a burst of outside load moves less than the overall one.
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
    summarize,
    versions,
)

__all__ = ["main", "run"]

TARGET = 3.0
"""Goal: ours with the SQLite store at least this many times the peers' cycle rate."""

# (ratio name, ours, peer): ours' cycles/s divided by the peer's.
RATIOS = (
    ("interlock_sqlite_vs_langgraph_sqlite", "interlock_sqlite", "langgraph_sqlite"),
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
TARGETS = ("interlock_sqlite_vs_langgraph_sqlite", "interlock_sqlite_vs_pydantic_ai")

PEERS: tuple[Callable[[Path], peers.Peer], ...] = (
    peers.langgraph_memory,
    peers.langgraph_sqlite,
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
        ),
        peers.Peer(
            "interlock_sqlite_sync_normal",
            _cycle_of(banking_agent(normal_store)),
            _OURS + "SqlSessionStore on a SQLite file, ?synchronous=normal (WAL, opt-in)",
            close=normal_store.close,
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

    ratios: dict[str, float | None] = {}
    round_medians: dict[str, float | None] = {}
    for label, ours, peer in RATIOS:
        a, b = results.get(ours), results.get(peer)
        if not a or not b:
            ratios[label] = round_medians[label] = None
            continue
        ratios[label] = round(a["cycles_per_s"] / b["cycles_per_s"], 2)
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
        "notes": notes,
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
    `rounds` batches, interleaved between the systems, the order rotating each round."""
    for system in systems:
        for i in range(warmup):
            system.cycle(-1 - i)
    by_round: dict[str, list[list[float]]] = {s.name: [] for s in systems}
    per_round = [cycles // rounds + (1 if r < cycles % rounds else 0) for r in range(rounds)]
    clock = time.perf_counter
    serial = 0
    for r, count in enumerate(per_round):
        shift = r % len(systems)
        for system in systems[shift:] + systems[:shift]:
            gc.collect()
            batch: list[float] = []
            cycle = system.cycle
            for _ in range(count):
                serial += 1
                t0 = clock()
                cycle(serial)
                batch.append(clock() - t0)
            by_round[system.name].append(batch)
    return by_round


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
