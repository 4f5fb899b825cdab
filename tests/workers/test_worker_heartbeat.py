"""`--heartbeat-file`: a real worker touches the file from its own loop while it serves,
and `interlock health` reads it; a dead worker's file goes stale. A file that cannot be
touched at start-up is a wrong setting, refused at once; one that stops being touchable
while the resume consumer serves is said in its log, and decisions go on."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.queue_helpers import APP, READY_TIMEOUT, Dashboard, Service, child_env, run_cli
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


@pytest.mark.parametrize("command", ["worker", "resume-consumer"])
def test_a_heartbeat_file_that_cannot_be_touched_is_refused_at_start(
    tmp_path: Path, redis_url: str, command: str
) -> None:
    beat = tmp_path / "no-such-folder" / "x.alive"
    where = ["--broker", redis_url, "--store", f"sqlite:///{tmp_path}/i.db"]
    result = run_cli(command, "--app", APP, *where, "--heartbeat-file", str(beat), timeout=60)
    assert result.returncode == 1, result.describe()
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: INVALID_ARGUMENT: cannot touch the heartbeat file {beat}: No such file or "
        "directory: check --heartbeat-file or INTERLOCK_HEARTBEAT_FILE"
    ), result.describe()
    assert "Traceback" not in result.stderr and result.stdout == "", result.describe()
    assert not beat.parent.exists()
    folder = tmp_path / "folder.alive"  # its time can be set; no health check takes it
    folder.mkdir()
    result = run_cli(command, "--app", APP, *where, "--heartbeat-file", str(folder), timeout=60)
    assert result.returncode == 1, result.describe()
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: INVALID_ARGUMENT: cannot touch the heartbeat file {folder}: Is a directory: "
        "check --heartbeat-file or INTERLOCK_HEARTBEAT_FILE"
    ), result.describe()
    assert result.stdout == "", result.describe()


class _Alone:
    """A resume consumer on its own, as `Dashboard` expects of a stack."""

    def __init__(self, broker_url: str, consumer: Service) -> None:
        self.broker_url = broker_url
        self.consumer = consumer

    def check_alive(self) -> None:
        assert self.consumer.alive, self.consumer.tail()


def _serving_with_beat(tmp_path: Path, redis_url: str, *args: str) -> tuple[Service, Path]:
    """`interlock ARGS...` serving, its heartbeat file in a folder of its own."""
    folder = tmp_path / "beats"
    folder.mkdir()
    store = f"sqlite:///{tmp_path}/i.db"
    assert run_cli("migrate", "--store", store, timeout=60).returncode == 0
    where = ["--app", APP, "--broker", redis_url, "--store", store]
    beat = folder / f"{args[0]}.alive"
    service = Service(
        args[0],
        [*args, *where, "--heartbeat-file", str(beat)],
        tmp_path / f"{args[0]}.log",
        env=child_env(),
    )
    return service, beat


def test_the_consumer_goes_on_when_its_heartbeat_file_cannot_be_touched(
    tmp_path: Path, redis_url: str
) -> None:
    consumer, beat = _serving_with_beat(tmp_path, redis_url, "resume-consumer")
    folder = beat.parent
    dashboard: Dashboard | None = None
    try:
        consumer.wait_for("Connected to ", READY_TIMEOUT)
        assert _until(lambda: beat.exists(), 30), consumer.tail()
        shutil.rmtree(folder)  # the volume went away under it
        said = "cannot touch the heartbeat file"
        assert _until(lambda: said in consumer.output(), 30), consumer.tail()
        dashboard = Dashboard(_Alone(redis_url, consumer), lambda text, session: "")
        dashboard.consumer_barrier()  # a decision is still read, checked and answered
        dashboard.consumer_barrier()
        assert consumer.alive, consumer.tail()
        assert consumer.output().count(said) == 1, consumer.tail()  # said once, not per loop
        folder.mkdir()
        assert _until(lambda: beat.exists(), 30), consumer.tail()
        again = "touching the heartbeat file"  # logged just after the touch
        assert _until(lambda: again in consumer.output(), 30), consumer.tail()
        assert "Traceback" not in consumer.output(), consumer.tail()
    finally:
        if dashboard is not None:
            dashboard.close()
        consumer.kill()


def test_the_worker_goes_on_when_its_heartbeat_file_cannot_be_touched(
    tmp_path: Path, redis_url: str
) -> None:
    worker, beat = _serving_with_beat(tmp_path, redis_url, "worker", "--pool", "solo")
    folder = beat.parent
    try:
        worker.wait_for(" ready.", READY_TIMEOUT)
        shutil.rmtree(folder)
        said = "cannot touch the heartbeat file"
        assert _until(lambda: said in worker.output(), 3 * EVERY), worker.tail()
        time.sleep(2 * EVERY + 1)  # two more ticks fail the same way: not said again
        assert worker.alive and worker.output().count(said) == 1, worker.tail()
        folder.mkdir()
        assert _until(lambda: beat.exists(), 3 * EVERY), worker.tail()
        again = "touching the heartbeat file"  # logged just after the touch
        assert _until(lambda: again in worker.output(), 30), worker.tail()
    finally:
        worker.kill()
