"""Helpers shared by the benchmarks: the banking cycle, timing figures, versions, output."""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import replace
from importlib import metadata
from pathlib import Path
from typing import Any, TypeVar

from examples.banking import TransferOutput, bankingAgent, transferMoney
from interlock import Agent, AgentOutput, FinishReason, ToolResume

__all__ = [
    "PROMPT",
    "approval_decision",
    "banking_agent",
    "disk_flush_ms",
    "emit",
    "interlock_cycle",
    "percentile",
    "round_order",
    "summarize",
    "versions",
]

T = TypeVar("T")

PROMPT = "Transfer $500 to savings"
SCRIPTED_MODEL = "scripted/banking"

_PACKAGES = (
    "interlock",
    "pydantic",
    "pydantic-core",
    "sqlalchemy",
    "sqlmodel",
    "langgraph",
    "langgraph-checkpoint",
    "langgraph-checkpoint-sqlite",
    "langchain-core",
    "pydantic-ai-slim",
)


_ROOT = Path(__file__).resolve().parent.parent


def versions() -> dict[str, str | None]:
    """The Python and package versions of this run (None: not installed)."""
    found: dict[str, str | None] = {
        "python": platform.python_version(),
        "implementation": sys.implementation.name,
        "sqlite": _sqlite_version(),
    }
    for name in _PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def _sqlite_version() -> str:
    import sqlite3

    return sqlite3.sqlite_version


def interlock_cycle(
    agent: Agent,
    i: int,
    *,
    session_id: str | None = None,
    snapshot_id: str | None = None,
) -> AgentOutput:
    """One interrupt-and-resume cycle of the banking agent: the transfer request pauses
    for approval, the caller answers with the tool's output, the turn completes.

    Without `session_id`/`snapshot_id` it starts a new session; with them it continues
    that session (or branches from that snapshot). The resume addresses the session, as
    the README does."""
    out = agent.run_text(PROMPT, session_id=session_id, snapshot_id=snapshot_id)
    if out.finish_reason != FinishReason.INTERRUPTED:
        raise AssertionError(f"expected an interrupt, got {out.finish_reason}")
    reply = transferMoney.respond(
        out.interrupts[0], TransferOutput(success=True, transaction_id=f"txn-{i}")
    )
    done = agent.run(ToolResume(respond=[reply]), session_id=out.session_id)
    if done.finish_reason != FinishReason.STOP or not done.message:
        raise AssertionError(f"expected a final answer, got {done.finish_reason}")
    if f"txn-{i}" not in done.message.text:
        raise AssertionError(f"final answer does not name the transaction: {done.message.text}")
    return done


def banking_agent(store: Any) -> Agent:
    """The example's banking agent on the scripted model `scripted/banking` (whatever
    model `INTERLOCK_BANKING_MODEL` names), keeping its sessions in `store`."""
    return replace(bankingAgent.with_store(store), model=SCRIPTED_MODEL)


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) of already sorted values: nearest-rank, except the
    median (q=50), which is the usual one (the mean of the middle two of an even count)."""
    if not sorted_values:
        return math.nan
    if q == 50:
        return statistics.median(sorted_values)
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def summarize(latencies_s: Sequence[float]) -> dict[str, float | int]:
    """cycles/s (cycles over their summed time), median and p99 in ms."""
    ordered = sorted(latencies_s)
    total = sum(ordered)
    return {
        "cycles": len(ordered),
        "cycles_per_s": round(len(ordered) / total, 1) if total > 0 else math.nan,
        "median_ms": round(percentile(ordered, 50) * 1000, 3),
        "p99_ms": round(percentile(ordered, 99) * 1000, 3),
    }


def round_order(systems: Sequence[T], r: int) -> list[T]:
    """The order the systems run in round `r`: rotated by one every two rounds, and
    reversed in every odd round. Over an even number of rounds each system runs right
    after another as often as right before it, so that what one leaves behind (a
    process's tail of work, a cache it filled) is not always met by the same one."""
    shift = (r // 2) % len(systems)
    order = list(systems[shift:]) + list(systems[:shift])
    return order[::-1] if r % 2 else order


def git_state() -> str | None:
    """The commit measured, with "+dirty" when the work tree has changes."""
    import subprocess

    def git(*args: str) -> str:
        run = subprocess.run(
            ["git", "-C", str(_ROOT), *args], capture_output=True, text=True, check=True, timeout=10
        )
        return run.stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+dirty" if dirty else "")


def emit(figures: dict[str, Any]) -> None:
    """Print the benchmark's one JSON line."""
    print(json.dumps(figures, sort_keys=False, default=str), flush=True)


def approval_decision(interrupted: dict[str, Any]) -> dict[str, Any]:
    """The decision a reviewer's dashboard sends for a `turn.interrupted` event (plain
    JSON): every interrupt restarted with `{"approved": true}`."""
    return {
        "schema_version": 1,
        "decision_id": str(uuid.uuid4()),
        "snapshot_id": interrupted["snapshot_id"],
        "resume_token": interrupted["resume_token"],
        "reviewer": "bench@localhost",
        "restart": [
            {"name": i["name"], "ref": i["ref"], "resumed": {"approved": True}}
            for i in interrupted["interrupts"]
        ],
    }


def disk_flush_ms(folder: Path, samples: int = 50) -> float:
    """The median time, in ms, the disk under `folder` takes to flush what a durable
    SQLite commit of our cycle appends to its WAL (nine frames of a 4 kB page, about 37
    kB; `fdatasync`), a millisecond after the flush before it, as a cycle's commits
    come: a gauge of the machine's disk, whose flush time varies from one VM to the
    next, and in time (on some virtual disks a flush right after another is many times
    faster than one after a pause)."""
    path = folder / f"flush-gauge-{uuid.uuid4().hex}"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    frame = b"\0" * (4096 + 24)
    flush = getattr(os, "fdatasync", os.fsync)  # macOS has no fdatasync
    try:
        waits = []
        for i in range(samples):
            time.sleep(0.001)
            for k in range(9):
                os.pwrite(fd, frame, ((i % 16) * 9 + k) * len(frame))
            start = time.perf_counter()
            flush(fd)
            waits.append(time.perf_counter() - start)
    finally:
        os.close(fd)
        path.unlink()
    return round(statistics.median(waits) * 1000, 3)
