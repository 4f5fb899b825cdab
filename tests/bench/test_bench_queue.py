"""`bench.queue_cycle` end to end, as a smoke run: real redis-server, Interlock's worker
and resume consumer, the bare-Celery baseline with its reply consumer as a thread and as
a process. Checks the figures' shape and arithmetic, not their speed (timings are never
asserted in tests)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SYSTEMS = ("interlock", "celery_baseline", "celery_baseline_process")


def test_a_smoke_run_measures_every_system_and_divides_by_the_right_one(tmp_path: Path) -> None:
    cycles = 6
    run = subprocess.run(
        [
            sys.executable, "-m", "bench.queue_cycle",
            "--cycles", str(cycles), "--warmup", "2", "--rounds", "2", "--in-flight", "1,3",
            "--logs", str(tmp_path / "logs"),
        ],
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if not k.startswith("INTERLOCK_")},
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.strip().splitlines()
    assert len(lines) == 1, f"one JSON line on stdout, got: {run.stdout!r}"
    figures = json.loads(lines[0])
    assert figures["benchmark"] == "queue_cycle"
    assert figures["in_flight"] == [1, 3]
    for label in ("in_flight_1", "in_flight_3"):
        level = figures["results"][label]
        assert set(level) == set(SYSTEMS)
        for name in SYSTEMS:
            got = level[name]
            assert got["cycles"] == cycles, (name, got)
            assert got["cycles_per_s"] > 0
            assert 0 < got["median_ms"] <= got["p99_ms"]
            assert got["duplicate_events"] == 0
            cpu = got["cpu_ms_per_cycle"]
            assert list(cpu) == ["worker", "consumer", "redis", "bench", "total"], (name, cpu)
            assert all(v >= 0 for v in cpu.values()), (name, cpu)  # whole clock ticks: may be 0
        ours = level["interlock"]["cycles_per_s"]
        assert figures["ratios"][label] == round(ours / level["celery_baseline"]["cycles_per_s"], 2)
        assert figures["ratios_vs_process_consumer"][label] == round(
            ours / level["celery_baseline_process"]["cycles_per_s"], 2
        )
        target = figures["targets"][label]
        assert target["ratio"] == figures["ratios"][label]
        assert target["met"] is (target["ratio"] >= 0.8)
    logs = {p.name for p in (tmp_path / "logs").iterdir()}
    assert {"interlock-worker.log", "interlock-consumer.log", "baseline-worker.log"} <= logs
