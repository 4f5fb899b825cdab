"""The benchmarks' process keeper: a run ended by SIGTERM (a CI job's time-out, `kill`)
stops what it started, as one ended by Ctrl-C does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import sys, time
from pathlib import Path
from bench._services import Processes

processes = Processes()
try:
    child = processes.start("sleeper", ["sleep", "300"], Path(sys.argv[1]))
    print(child.pid, flush=True)
    time.sleep(300)
finally:
    processes.stop_all()
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_terminated_run_stops_the_processes_it_started(tmp_path: Path) -> None:
    run = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "sleeper.log")],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        text=True,
    )
    child = 0
    try:
        assert run.stdout is not None
        child = int(run.stdout.readline())
        assert _alive(child)
        run.send_signal(signal.SIGTERM)
        assert run.wait(timeout=30) == 128 + signal.SIGTERM
        deadline = time.monotonic() + 10
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child), "the run's process outlived it"
    finally:
        if child and _alive(child):  # what the run left behind: not this test's to keep
            os.kill(child, signal.SIGKILL)
        if run.poll() is None:
            run.kill()
            run.wait()
        if run.stdout is not None:
            run.stdout.close()
