"""`interlock worker --heartbeat-file`: a real worker touches the file from its own loop
while it serves, and `interlock health` reads it; a dead worker's file goes stale."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from tests.queue_helpers import APP, READY_TIMEOUT, Service, child_env, run_cli
from workers.heartbeat import EVERY


def _mtime(path: Path) -> float | None:
    return path.stat().st_mtime if path.exists() else None


def _until(check: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return False


def test_a_serving_worker_keeps_its_heartbeat_fresh(tmp_path: Path, redis_url: str) -> None:
    beat = tmp_path / "worker.alive"
    store = f"sqlite:///{tmp_path}/i.db"
    where = ["--broker", redis_url, "--store", store]
    assert run_cli("migrate", "--store", store, timeout=60).returncode == 0
    worker = Service(
        "worker",
        ["worker", "--app", APP, *where, "--concurrency", "1", "--heartbeat-file", str(beat)],
        tmp_path / "worker.log",
        env=child_env(),
    )
    try:
        worker.wait_for(" ready.", READY_TIMEOUT)
        assert _until(lambda: beat.exists(), 30), worker.tail()
        first = _mtime(beat)
        assert _until(lambda: (_mtime(beat) or 0) > (first or 0), 3 * EVERY), worker.tail()
        healthy = run_cli("health", *where, "--heartbeat-file", str(beat), timeout=60)
        assert healthy.returncode == 0, healthy.describe()
        [report] = healthy.json_lines()
        assert report["heartbeat"] == "ok" and report["heartbeat_age"] <= EVERY + 1, report
        assert "touching" in worker.output() and str(beat) in worker.output()
    finally:
        worker.kill()
    time.sleep(1.5)
    dead = run_cli("health", *where, "--heartbeat-file", str(beat), "--max-age", "1", timeout=60)
    assert dead.returncode == 1, dead.describe()
    [report] = dead.json_lines()
    assert (report["broker"], report["store"], report["heartbeat"]) == ("ok", "ok", "stale")


def test_the_variable_sets_it_too(tmp_path: Path, redis_url: str) -> None:
    """`INTERLOCK_HEARTBEAT_FILE` is read by the worker as by the resume consumer."""
    beat = tmp_path / "from-env.alive"
    worker = Service(
        "worker",
        ["worker", "--app", APP, "--broker", redis_url, "--store", f"sqlite:///{tmp_path}/i.db"],
        tmp_path / "worker.log",
        env=child_env(INTERLOCK_HEARTBEAT_FILE=str(beat)),
    )
    try:
        worker.wait_for(" ready.", READY_TIMEOUT)
        assert _until(lambda: beat.exists(), 30), worker.tail()
    finally:
        worker.kill()
