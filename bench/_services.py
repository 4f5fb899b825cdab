"""Processes for the distributed benchmark: a private redis-server, long-running
subprocesses in process groups of their own, a private PostgreSQL database.

Every process is started in a session of its own (its own process group) and stopped
with SIGTERM to the group, then SIGKILL to the group, so a prefork pool's children go
with their parent. `Processes` keeps them all and stops them in reverse order.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import NoReturn

__all__ = [
    "Process",
    "Processes",
    "StartError",
    "free_port",
    "group_cpu_seconds",
    "pg_database",
    "redis_server",
]

PG_ADMIN_URLS = (
    "postgresql+psycopg://postgres@127.0.0.1:5432/postgres",
    "postgresql+psycopg://root@127.0.0.1:5432/postgres",
    "postgresql+psycopg://{user}@127.0.0.1:5432/postgres",
)


class StartError(RuntimeError):
    """A service could not be started (or is not installed)."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Process:
    """One subprocess in a session of its own; stdout and stderr go to `log`."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        log: Path,
        *,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.argv = argv
        self.log = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                argv,
                env=env,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.pid = self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def output(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def tail(self, chars: int = 3000) -> str:
        return self.output()[-chars:]

    def check(self) -> None:
        if not self.alive:
            raise StartError(f"{self.name} exited with {self.proc.returncode}:\n{self.tail()}")

    def wait_for(self, marker: str, timeout: float = 60.0) -> None:
        """Until `marker` shows in the output (or the process dies, or time runs out)."""
        deadline = time.monotonic() + timeout
        while marker not in self.output():
            self.check()
            if time.monotonic() > deadline:
                raise StartError(f"{self.name} not ready in {timeout:.0f}s:\n{self.tail()}")
            time.sleep(0.05)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM to the group, SIGKILL to it after `timeout`; reap the leader."""
        if self.alive:
            _signal_group(self.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                _signal_group(self.pid, signal.SIGKILL)
                self.proc.wait()
        # children of the group (a prefork pool) may outlive the leader: end them too
        _signal_group(self.pid, signal.SIGKILL)
        self.proc.wait()


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def group_cpu_seconds(pgid: int) -> float | None:
    """User + system CPU seconds of the live processes of group `pgid` (Linux /proc;
    None elsewhere). Children that already exited are not counted."""
    proc = Path("/proc")
    if not proc.is_dir():
        return None
    ticks = 0
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid:  # fields: state, ppid, pgrp, ..., utime(11), stime(12)
            ticks += int(fields[11]) + int(fields[12])
    return ticks / _TICK


class Processes:
    """The processes of a run, stopped together (newest first), once."""

    def __init__(self) -> None:
        self.started: list[Process] = []
        self.cleanups: list[Callable[[], None]] = []
        # A SIGTERM (a CI job's time-out, `kill`) ends the run the way Ctrl-C does:
        # through the callers' clean-up, which stops every process, instead of leaving
        # redis-server and the workers running.
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, _terminated)

    def start(self, *args: object, **kwargs: object) -> Process:
        process = Process(*args, **kwargs)  # type: ignore[arg-type]
        self.started.append(process)
        return process

    def stop_all(self) -> None:
        """Stop every process and run the clean-ups; a Ctrl-C or a SIGTERM meanwhile is
        ignored so that nothing is left running."""
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            while self.started:
                process = self.started.pop()
                with contextlib.suppress(Exception):
                    process.stop()
            while self.cleanups:
                cleanup = self.cleanups.pop()
                with contextlib.suppress(Exception):
                    cleanup()
        finally:
            signal.signal(signal.SIGINT, previous)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _terminated(signum: int, frame: FrameType | None) -> NoReturn:
    raise SystemExit(128 + signum)


def _redis_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def redis_server(processes: Processes, directory: Path, attempts: int = 3) -> str:
    """A private redis-server on a free port of 127.0.0.1, no persistence; its URL."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise StartError("redis-server is not installed (apt-get install redis-server)")
    directory.mkdir(parents=True, exist_ok=True)
    last = ""
    for _ in range(attempts):  # a free port can be taken between probe and bind
        port = free_port()
        argv = [
            binary,
            "--bind", "127.0.0.1",
            "--port", str(port),
            "--save", "",
            "--appendonly", "no",
            "--dir", str(directory),
            "--daemonize", "no",
        ]  # fmt: skip
        process = processes.start("redis-server", argv, directory / f"redis-{port}.log")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and process.alive:
            if _redis_ping(port):
                return f"redis://127.0.0.1:{port}/0"
            time.sleep(0.02)
        last = process.tail()
        process.stop()
        processes.started.remove(process)
    raise StartError(f"could not start redis-server: {last}")


def redis_server_version() -> str | None:
    binary = shutil.which("redis-server")
    if binary is None:
        return None
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False)
    for word in out.stdout.split():
        if word.startswith("v="):
            return word[2:]
    return None


def _conninfo(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def _pg_admin_url() -> str:
    import psycopg

    env = os.environ.get("INTERLOCK_BENCH_PG_URL") or os.environ.get("INTERLOCK_TEST_PG_URL")
    candidates = [env] if env else [u.format(user=getpass.getuser()) for u in PG_ADMIN_URLS]
    errors = []
    for url in dict.fromkeys(candidates):
        try:
            with psycopg.connect(_conninfo(url), autocommit=True, connect_timeout=3) as conn:
                conn.execute("SELECT 1")
            return url
        except psycopg.Error as exc:
            errors.append(f"{url}: {str(exc).strip().splitlines()[0] if str(exc) else exc!r}")
    raise StartError(
        "PostgreSQL is not available (" + "; ".join(errors) + "); set INTERLOCK_BENCH_PG_URL "
        "to a URL allowed to create databases"
    )


@contextlib.contextmanager
def pg_database() -> Iterator[tuple[str, str | None]]:
    """A fresh database on the local PostgreSQL, dropped at the end (FORCE); yields its
    SQLAlchemy URL and the server's version."""
    import psycopg
    from psycopg import sql
    from sqlalchemy.engine import make_url

    admin = _pg_admin_url()
    name = f"interlock_bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(_conninfo(admin), autocommit=True, connect_timeout=3) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        row = conn.execute("SHOW server_version").fetchone()
    version = str(row[0]).split()[0] if row else None
    url = make_url(admin).set(drivername="postgresql+psycopg", database=name)
    try:
        yield url.render_as_string(hide_password=False), version
    finally:
        with psycopg.connect(_conninfo(admin), autocommit=True, connect_timeout=3) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
