"""`bench.cycle` and `bench.growth` as smoke runs: one JSON line each, with the commit
measured, the versions, and ratios that are the quotients of the figures printed beside
them. Checks the figures' shape and arithmetic, not their speed (timings are never
asserted in tests)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _one_line(module: str) -> dict[str, Any]:
    run = subprocess.run(
        [sys.executable, "-m", module, "--quick"],
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if not k.startswith("INTERLOCK_")},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.strip().splitlines()
    assert len(lines) == 1, f"one JSON line on stdout, got: {run.stdout!r}"
    figures: dict[str, Any] = json.loads(lines[0])
    return figures


def _head() -> str | None:
    if not (ROOT / ".git").exists():
        return None
    return subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def _says_its_commit_and_versions(figures: dict[str, Any]) -> None:
    head = _head()
    if head is not None:
        assert figures["git"].split("+")[0] == head, figures["git"]
    assert figures["versions"]["interlock"] and figures["versions"]["pydantic"]
    assert figures["machine"]["cpus"] >= 1


def test_the_in_process_cycle_prints_ours_and_each_installed_peer_with_their_ratios() -> None:
    figures = _one_line("bench.cycle")
    assert figures["benchmark"] == "cycle"
    _says_its_commit_and_versions(figures)
    results = figures["results"]
    for ours in ("interlock_memory", "interlock_sqlite", "interlock_sqlite_sync_normal"):
        got = results[ours]
        assert got["cycles"] == figures["cycles"], got
        assert 0 < got["median_ms"] <= got["p99_ms"], got
    # the in-process cycle commits three times: the pause, the claim, the end
    assert results["interlock_sqlite"]["commits_per_cycle"] == 3.0
    assert results["interlock_sqlite_sync_normal"]["commits_per_cycle"] == 3.0
    assert "commits_per_cycle" not in results["interlock_memory"]
    ours_rate = results["interlock_sqlite"]["cycles_per_s"]
    for name in ("langgraph_sqlite", "langgraph_sqlite_exit"):
        peer = results[name]
        label = f"interlock_sqlite_vs_{name}"
        ratio = figures["ratios"][label]
        if peer is None:  # the peers are the `bench` extra's: said in the notes, no ratio
            assert ratio is None
            assert any("pip install '.[bench]'" in note for note in figures["notes"])
        else:  # computed from the unrounded times: within the rounding of the rates
            assert ratio == pytest.approx(ours_rate / peer["cycles_per_s"], abs=0.015)
            assert peer["commits_per_cycle"] > 0
        target = figures["targets"][label]
        assert target["met"] is (None if ratio is None else ratio >= 3.0)
    exit_peer = results["langgraph_sqlite_exit"]
    if exit_peer is not None:  # saved only at the pause and the end, fewer than by default
        assert exit_peer["commits_per_cycle"] < results["langgraph_sqlite"]["commits_per_cycle"]


def test_growth_prints_the_bytes_each_size_writes_and_their_ratio() -> None:
    figures = _one_line("bench.growth")
    assert figures["benchmark"] == "growth"
    _says_its_commit_and_versions(figures)
    sizes = figures["sizes"]
    written = [figures["results"][str(n)]["bytes_written"]["params_total"] for n in sizes]
    assert all(b > 0 for b in written), written
    label = f"params_bytes_{sizes[-1]}_vs_{sizes[0]}"  # --quick: 100 vs 10
    assert figures["ratios"][label] == round(written[-1] / written[0], 2)
    assert figures["targets"][label]["met"] is (written[-1] / written[0] <= 2)
    wal = [figures["results"][str(n)]["bytes_written"]["wal_bytes"] for n in sizes]
    wal_label = f"wal_bytes_{sizes[-1]}_vs_{sizes[0]}"
    assert figures["targets"][wal_label]["ratio"] == round(wal[-1] / wal[0], 2)
    assert figures["targets"][wal_label]["met"] is (wal[-1] / wal[0] <= 2)
    for n in sizes:  # one more cycle in the session: the pause, the claim, the end
        assert figures["results"][str(n)]["bytes_written"]["wal_commits"] == 3
    for kind in ("cycle_sqlite", "cycle_memory", "continued_sqlite", "continued_memory"):
        timed = [figures["results"][str(n)][kind] for n in sizes]
        assert all(t["median_ms"] > 0 and t["repeat"] == figures["repeat"] for t in timed), kind
        name = f"time_{kind.replace('cycle_', '')}_{sizes[-1]}_vs_{sizes[0]}"
        expected = round(timed[-1]["median_ms"] / timed[0]["median_ms"], 2)
        assert figures["ratios"][name] == expected, (name, figures["ratios"])
