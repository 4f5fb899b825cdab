"""Real services for tests: a private redis-server, private PostgreSQL databases.

Plain functions, so any test can use them directly. When a service is missing the
test is skipped locally, and fails when `CI` is set (never a silent skip in CI).

- `start_redis(directory, appendonly=False) -> RedisServer` (`.url`, `.stop()`,
  `.start()`, `.restart()`, `.ping()`); `INTERLOCK_TEST_REDIS_URL` is honoured by the
  `redis_url` fixture in conftest.py, not here.
- `pg_admin_url() -> str`, `create_pg_database(admin_url) -> str`,
  `drop_pg_database(admin_url, url)`; `INTERLOCK_TEST_PG_URL` is the admin URL.
- `eventually(found, what, timeout)`: poll until a service's state is as expected.
"""

from __future__ import annotations

import contextlib
import functools
import getpass
import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NoReturn, TypeVar

import psycopg
import pytest
from psycopg import sql
from sqlalchemy.engine import make_url

__all__ = [
    "PG_DEFAULT_ADMIN_URLS",
    "RedisServer",
    "create_pg_database",
    "drop_pg_database",
    "eventually",
    "free_port",
    "in_ci",
    "pg_admin_url",
    "pg_database",
    "service_unavailable",
    "start_redis",
]


def in_ci() -> bool:
    return bool(os.environ.get("CI"))


def service_unavailable(message: str) -> NoReturn:
    """Skip the test locally; fail it when `CI` is set."""
    if in_ci():
        pytest.fail(f"{message} (CI is set: a missing service is a failure)", pytrace=False)
    pytest.skip(message)


T = TypeVar("T")


def eventually(
    found: Callable[[], T], what: str, timeout: float = 10.0, *, every: float = 0.05
) -> T:
    """The first truthy result of `found()`, polled `every` seconds; fails after
    `timeout` seconds (a wait, never a timing assertion)."""
    deadline = time.monotonic() + timeout
    while True:
        result = found()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout:.0f}s")
        time.sleep(every)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


# ------------------------------------------------------------------------ redis


def _redis_ping(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """A private redis-server process on 127.0.0.1. Data lives in `directory`."""

    def __init__(self, directory: Path, port: int, *, appendonly: bool = False) -> None:
        self.directory = directory
        self.port = port
        self.appendonly = appendonly
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def ping(self) -> bool:
        return _redis_ping("127.0.0.1", self.port)

    def start(self, timeout: float = 10.0) -> None:
        """Start the server (again, on the same port and directory) and wait for PING."""
        if self.running:
            return
        binary = shutil.which("redis-server")
        if binary is None:
            raise FileNotFoundError("redis-server not found on PATH")
        args = [
            binary,
            "--bind", "127.0.0.1",
            "--port", str(self.port),
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", "always",
            "--dir", str(self.directory),
            "--daemonize", "no",
        ]  # fmt: skip
        with open(self.directory / "redis.log", "ab") as log:
            self.proc = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.proc.wait()
                self.proc = None
                raise RuntimeError(f"redis-server exited at start: {self._log_tail()}")
            if self.ping():
                return
            time.sleep(0.02)
        self.stop()
        raise TimeoutError(f"redis-server did not answer PING in {timeout}s: {self._log_tail()}")

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server (SIGTERM, then SIGKILL) and reap it."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        else:
            proc.wait()

    def kill(self) -> None:
        """Kill the server abruptly (SIGKILL), as a crash would."""
        proc, self.proc = self.proc, None
        if proc is not None:
            proc.kill()
            proc.wait()

    def restart(self) -> None:
        self.stop()
        self.start()

    def _log_tail(self) -> str:
        try:
            return (self.directory / "redis.log").read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def __enter__(self) -> RedisServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_redis(directory: Path, *, appendonly: bool = False, attempts: int = 3) -> RedisServer:
    """Start a private redis-server on a free port; calls `service_unavailable` when it
    cannot (no binary, will not start)."""
    if shutil.which("redis-server") is None:
        service_unavailable("redis-server is not installed (or set INTERLOCK_TEST_REDIS_URL)")
    directory.mkdir(parents=True, exist_ok=True)
    error: Exception | None = None
    for _ in range(attempts):  # a free port can be taken between probe and bind
        server = RedisServer(directory, free_port(), appendonly=appendonly)
        try:
            server.start()
            return server
        except (RuntimeError, TimeoutError) as exc:
            error = exc
    service_unavailable(f"could not start redis-server: {error}")


# ------------------------------------------------------------------- postgresql

PG_DEFAULT_ADMIN_URLS = (
    "postgresql+psycopg://postgres@127.0.0.1:5432/postgres",
    "postgresql+psycopg://root@127.0.0.1:5432/postgres",
    "postgresql+psycopg://{user}@127.0.0.1:5432/postgres",
)


def _conninfo(url: str) -> str:
    """A SQLAlchemy URL as a libpq URI (psycopg does not know `+psycopg`)."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@functools.cache
def _find_admin_url() -> tuple[str | None, str]:
    env = os.environ.get("INTERLOCK_TEST_PG_URL")
    candidates = [env] if env else [u.format(user=getpass.getuser()) for u in PG_DEFAULT_ADMIN_URLS]
    errors = []
    for url in dict.fromkeys(candidates):
        try:
            with psycopg.connect(_conninfo(url), autocommit=True, connect_timeout=3) as conn:
                conn.execute("SELECT 1")
            return url, ""
        except psycopg.Error as exc:
            errors.append(f"{url}: {str(exc).strip().splitlines()[0] if str(exc) else exc!r}")
    return None, "; ".join(errors)


def pg_admin_url() -> str:
    """A PostgreSQL URL allowed to create databases (`INTERLOCK_TEST_PG_URL`, else the
    local server as postgres, root or the OS user); `service_unavailable` when none works."""
    url, why = _find_admin_url()
    if url is None:
        service_unavailable(f"PostgreSQL is not available ({why}); set INTERLOCK_TEST_PG_URL")
    return url


def create_pg_database(admin_url: str, prefix: str = "interlock_test_") -> str:
    """Create a fresh, empty database; return its SQLAlchemy URL (`postgresql+psycopg://`)."""
    name = f"{prefix}{uuid.uuid4().hex[:16]}"
    with psycopg.connect(_conninfo(admin_url), autocommit=True, connect_timeout=3) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = make_url(admin_url).set(drivername="postgresql+psycopg", database=name)
    return url.render_as_string(hide_password=False)


def drop_pg_database(admin_url: str, url: str) -> None:
    """Drop a database made by `create_pg_database`, closing its connections (FORCE)."""
    name = make_url(url).database
    with psycopg.connect(_conninfo(admin_url), autocommit=True, connect_timeout=3) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name or ""))
        )


@contextlib.contextmanager
def pg_database() -> Iterator[str]:
    """A private database for the duration of the block; yields its URL."""
    admin = pg_admin_url()
    url = create_pg_database(admin)
    try:
        yield url
    finally:
        drop_pg_database(admin, url)
