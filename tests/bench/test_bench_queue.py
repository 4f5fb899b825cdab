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


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bench.queue_cycle", *args],
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if not k.startswith("INTERLOCK_")},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_smoke_run_measures_every_system_and_divides_by_the_right_one(tmp_path: Path) -> None:
    cycles = 6
    run = _bench(
        "--cycles", str(cycles), "--warmup", "2", "--rounds", "2", "--in-flight", "1,3",
        "--logs", str(tmp_path / "logs"),
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
    assert figures["workers"] == {
        "pool": "prefork",
        "concurrency": 2,
        "loglevel": "INFO",
        "target_setting": True,
    }


def test_another_pool_runs_both_workers_with_it_and_meets_no_target(tmp_path: Path) -> None:
    """`--pool threads --concurrency 3`: a reference run. Both systems' workers start with
    that pool (their logs' banners say so), and no target is called met or missed."""
    run = _bench(
        "--cycles", "2", "--warmup", "0", "--rounds", "1", "--in-flight", "2",
        "--pool", "threads", "--concurrency", "3", "--logs", str(tmp_path / "logs"),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    figures = json.loads(run.stdout)
    assert figures["workers"]["pool"] == "threads", figures["workers"]
    assert figures["workers"]["concurrency"] == 3, figures["workers"]
    assert figures["workers"]["target_setting"] is False, figures["workers"]
    target = figures["targets"]["in_flight_2"]
    assert target["met"] is None, target
    assert target["ratio"] == figures["ratios"]["in_flight_2"] > 0, target
    for log in ("interlock-worker.log", "baseline-worker.log"):
        banner = (tmp_path / "logs" / log).read_text()
        assert "concurrency: 3 (thread)" in banner, (log, banner[-2000:])


def test_a_bad_concurrency_is_refused_before_anything_starts() -> None:
    run = _bench("--concurrency", "0")
    assert run.returncode == 2, run.stderr
    assert "--concurrency must be positive" in run.stderr, run.stderr
    assert run.stdout == ""
