"""A broker or a store that takes the connection and never answers (a wedged server, a
port forwarded to nothing): every command run by hand ends within its server timeout
(`INTERLOCK_SERVER_TIMEOUT`, 5 s by default) with the one line a server that cannot be
reached gets, `UNAVAILABLE: cannot reach ...`, exit 1, where it used to wait for
minutes or for good; so does a publish on a broker that answers and then stalls. The
worker and the resume consumer end so when the broker does not answer their
declarations before serving, and once serving wait as before. `--wait` still waits as
long as its `--timeout` says."""

from __future__ import annotations

import json
import selectors
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from sqlalchemy import make_url

from events.tokens import hash_token, new_token
from examples.banking import ai
from interlock import AgentInput, Message, Part, SqlSessionStore, Status, StatusError
from tests.queue_helpers import APP, Service, child_env, interlock_bin, run_cli, start_stack
from tests.services import eventually, start_redis
from workers.runtime import Runtime
from workers.settings import (
    DEFAULT_SERVER_TIMEOUT,
    Settings,
    one_shot_store_url,
)
from workers.turns import new_turn_request, run_turn

BOUND = 15.0
"""Seconds a command may take against a silent server: its timeout (5 s at most), the start of
the process, and room for a busy machine. Trying the silent server again (four reads
of the store: over 20 s) or waiting without end (the subprocess is stopped after
`HANG`) fails the test."""
HANG = 60.0
QUICK = 2
"""The server timeout most tests run their commands with (the least it may be): what
they check holds for any timeout, and the default one is checked where it is said."""


class SilentServer:
    """A TCP server on 127.0.0.1 that takes every connection, reads what it is sent and
    never answers, as a wedged Redis or PostgreSQL looks from its clients.

    With `upstream` (a port on 127.0.0.1), it first passes each connection's bytes to
    that server and back, until a client sends a command holding `stall_on`: that
    command and all that follows, on every connection old or new, is read and never
    passed on, as a server that answered the first commands and then stalled."""

    def __init__(self, upstream: int | None = None, stall_on: bytes = b"") -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.listener.getsockname()[1]
        self.accepted = 0
        self.stalled = upstream is None
        self._upstream = upstream
        self._stall_on = stall_on
        self._peer: dict[socket.socket, socket.socket] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        with selectors.DefaultSelector() as selector:
            selector.register(self.listener, selectors.EVENT_READ)
            while not self._stop.is_set():
                for key, _ in selector.select(timeout=0.1):
                    sock = key.fileobj
                    assert isinstance(sock, socket.socket)
                    if sock is self.listener:
                        conn, _ = sock.accept()
                        self.accepted += 1
                        selector.register(conn, selectors.EVENT_READ)
                        if not self.stalled and self._upstream is not None:
                            up = socket.create_connection(("127.0.0.1", self._upstream))
                            self._peer[conn], self._peer[up] = up, conn
                            selector.register(up, selectors.EVENT_READ)
                        continue
                    try:
                        data = sock.recv(65536)
                    except OSError:
                        data = b""
                    if not data:  # the client gave up (or the upstream closed)
                        selector.unregister(sock)
                        sock.close()
                        continue
                    if self._stall_on and self._stall_on in data:
                        self.stalled = True
                    peer = self._peer.get(sock)
                    if peer is not None and not self.stalled:
                        peer.sendall(data)  # passed on; stalled: read, and never answered
            for key in list(selector.get_map().values()):
                key.fileobj.close()  # type: ignore[union-attr]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


@pytest.fixture
def silent() -> Iterator[SilentServer]:
    server = SilentServer()
    try:
        yield server
    finally:
        server.close()


def timed(
    *args: str, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run `interlock ARGS` to its end (at most `HANG` seconds); it and the seconds it
    took. By default with a server timeout of `QUICK` seconds (`env` gives its own)."""
    started = time.monotonic()
    proc = subprocess.run(
        [interlock_bin(), *args],
        env=env if env is not None else child_env(INTERLOCK_SERVER_TIMEOUT=str(QUICK)),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=HANG,
        check=False,
    )
    return proc, time.monotonic() - started


def describe(proc: subprocess.CompletedProcess[str], took: float) -> str:
    return (
        f"$ interlock {' '.join(proc.args[1:])}\nexit {proc.returncode} after {took:.1f}s\n"
        f"--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
    )


def ended_unavailable(
    silent: SilentServer, proc: subprocess.CompletedProcess[str], took: float, line: str
) -> None:
    """The command connected to the silent server, gave up within `BOUND` and ended as
    for a server that cannot be reached: `line` on stderr, exit 1."""
    said = describe(proc, took)
    assert silent.accepted >= 1, "the command never connected to the silent server: " + said
    assert took < BOUND, said
    assert proc.returncode == 1, said
    assert proc.stderr.strip().splitlines()[-1] == line, said
    assert "Traceback" not in proc.stderr, said


def broker_line(silent: SilentServer) -> str:
    return f"UNAVAILABLE: cannot reach the broker: Timeout reading from 127.0.0.1:{silent.port}"


def store_urls(silent: SilentServer) -> tuple[str, str]:
    """A PostgreSQL URL of the silent server, and as messages show it."""
    url = f"postgresql+psycopg://nobody:secret@127.0.0.1:{silent.port}/interlock"
    return url, url.replace(":secret@", ":***@")


def store_line(silent: SilentServer) -> str:
    return (
        f"UNAVAILABLE: cannot reach the store: connection timeout expired ({store_urls(silent)[1]})"
    )


@pytest.fixture
def paused(tmp_path: Path) -> tuple[str, str, str]:
    """A SQLite store holding an open pause: its URL, the snapshot id, and a resume
    token that answers it (made in process, on an in-memory broker: nothing is sent)."""
    store = f"sqlite:///{tmp_path}/paused.db"
    rt = Runtime(Settings(broker_url="memory://", store_url=store), ai)
    try:
        said = AgentInput(message=Message(role="user", content=[Part(text="Transfer $5 to x")]))
        request = new_turn_request("bankingAgent", said, session_id="s-silent")
        snapshot_id = run_turn(rt, request.model_dump(mode="json"))["snapshot_id"]
        token = new_token()
        with rt.store.writer().begin() as conn:
            assert rt.store.replace_token_hash_in(conn, snapshot_id, hash_token(token))
    finally:
        rt.close()
    return store, snapshot_id, token


def token_hash(store: str, snapshot_id: str) -> str | None:
    sql = SqlSessionStore(store, create_tables=False)
    try:
        snapshot = sql.get_snapshot(snapshot_id)
        assert snapshot is not None
        return snapshot.resume_token_hash
    finally:
        sql.dispose()


# --------------------------------------------------------------------- a silent broker


def test_health_gives_up_on_a_silent_broker(silent: SilentServer, tmp_path: Path) -> None:
    broker = f"redis://127.0.0.1:{silent.port}/0"
    proc, took = timed(  # the default timeout: 5 s
        "health", "--broker", broker, "--store", f"sqlite:///{tmp_path}/h.db", env=child_env()
    )
    ended_unavailable(
        silent, proc, took, f"error: UNAVAILABLE: unhealthy: broker error: {broker_line(silent)}"
    )
    assert proc.stdout.strip() == (
        f'{{"broker": "error: {broker_line(silent)}", "store": "ok", "queues": null}}'
    ), describe(proc, took)


@pytest.mark.parametrize("wait", [False, True], ids=["submit", "submit --wait"])
def test_submit_gives_up_on_a_silent_broker(silent: SilentServer, wait: bool) -> None:
    broker = f"redis://127.0.0.1:{silent.port}/0"
    proc, took = timed(
        "submit", "--app", APP, "--agent", "bankingAgent", "--text", "Transfer $5 to x",
        "--broker", broker, *(["--wait"] if wait else []),
    )  # fmt: skip
    ended_unavailable(silent, proc, took, f"error: {broker_line(silent)}")
    assert proc.stdout == "", "no turn was sent"


def test_submit_tries_a_silent_broker_once(silent: SilentServer) -> None:
    """Its send is bounded as a whole, as the first connect is: with a timeout of 2 s,
    Celery's retries (bounded by its own 4 s connect timeout) would try the silent
    broker again, on a new connection, and take twice the timeout."""
    broker = f"redis://127.0.0.1:{silent.port}/0"
    proc, took = timed(
        "submit", "--app", APP, "--agent", "bankingAgent", "--text", "Transfer $5 to x",
        "--broker", broker, env=child_env(INTERLOCK_SERVER_TIMEOUT="2"),
    )  # fmt: skip
    ended_unavailable(silent, proc, took, f"error: {broker_line(silent)}")
    assert silent.accepted == 1, "one try: " + describe(proc, took)


@pytest.mark.parametrize("wait", [False, True], ids=["decide", "decide --wait"])
def test_decide_gives_up_on_a_silent_broker(
    silent: SilentServer, paused: tuple[str, str, str], wait: bool
) -> None:
    store, snapshot_id, token = paused
    broker = f"redis://127.0.0.1:{silent.port}/0"
    proc, took = timed(
        "decide", snapshot_id, "--token", token, "--approve", "--broker", broker,
        "--store", store, *(["--wait"] if wait else []),
    )  # fmt: skip
    ended_unavailable(silent, proc, took, f"error: {broker_line(silent)}; nothing was sent")
    assert proc.stdout == "", "no decision id: nothing was sent"


def test_resend_gives_up_on_a_silent_broker_and_keeps_the_token(
    silent: SilentServer, paused: tuple[str, str, str]
) -> None:
    store, snapshot_id, token = paused
    broker = f"redis://127.0.0.1:{silent.port}/0"
    proc, took = timed("resend", snapshot_id, "--broker", broker, "--store", store)
    ended_unavailable(silent, proc, took, f"error: {broker_line(silent)}")
    assert proc.stdout == ""
    assert token_hash(store, snapshot_id) == hash_token(token), "the old token still answers"


def test_the_demo_gives_up_on_a_silent_broker(silent: SilentServer) -> None:
    broker = f"redis://127.0.0.1:{silent.port}/0"
    proc, took = timed("demo", "--approve", "--broker", broker)
    ended_unavailable(silent, proc, took, f"error: {broker_line(silent)}")


def test_the_demo_gives_up_on_a_broker_that_stalls_on_its_turn(tmp_path: Path) -> None:
    """A Redis that answers the demo's connection and declarations, then stalls on the
    turn it sends (at the default server timeout): the demo gives up within it, where
    Celery's retries (each waiting for its answer) held it for about half a minute."""
    server = start_redis(tmp_path / "redis")
    stalling = SilentServer(upstream=server.port, stall_on=b"LPUSH")
    try:
        broker = f"redis://127.0.0.1:{stalling.port}/0"
        proc, took = timed(
            "demo", "--approve", "--broker", broker, "--store", f"sqlite:///{tmp_path}/d.db",
            env=child_env(),
        )  # fmt: skip
        said = describe(proc, took)
        assert stalling.stalled, "the send met the stall: " + said
        assert took < BOUND and proc.returncode == 1, said
        last = proc.stderr.strip().splitlines()[-1]
        assert last.startswith(f"error: {broker_line(stalling)}"), said
        assert "Traceback" not in proc.stderr and "submit:" not in proc.stdout, said
    finally:
        stalling.close()
        server.stop()


def test_the_demo_gives_up_on_a_broker_that_stalls_on_its_decision(tmp_path: Path) -> None:
    """A Redis that answers until the demo publishes its decision (the turn ran and
    paused on a worker of that Redis), then stalls: the demo gives up within its server
    timeout, where kombu's retries held it for about a minute, and ends with the one
    line of a broker that cannot be reached; the queue it read the events from, which
    it could not delete, is named."""
    server = start_redis(tmp_path / "redis")
    store = f"sqlite:///{tmp_path}/d.db"
    # the decision's publish: the routing script, given the decisions' exchange
    stall_on = b"_interlock.bound.interlock.decisions\r\n$6\r\ndirect"
    try:
        with start_stack(tmp_path / "stack", f"redis://127.0.0.1:{server.port}/0", store):
            stalling = SilentServer(upstream=server.port, stall_on=stall_on)
            try:
                broker = f"redis://127.0.0.1:{stalling.port}/0"
                proc, took = timed("demo", "--approve", "--broker", broker, "--store", store)
            finally:
                stalling.close()
        said = describe(proc, took)
        assert stalling.stalled and "human: approve" in proc.stdout, said
        assert took < BOUND + 10 and proc.returncode == 1, said  # the turn ran first
        lines = proc.stderr.strip().splitlines()
        assert lines[-1].startswith(f"error: {broker_line(stalling)}"), said
        assert lines[0].startswith("the queue interlock.demo."), said
        assert "was not deleted" in lines[0] and len(lines) == 2, said
        assert "decision" not in proc.stdout.split("human: approve")[1], "none was sent"
    finally:
        server.stop()


@pytest.mark.parametrize("command", ["decide", "resend"])
def test_a_publish_gives_up_on_a_broker_that_stalls_after_answering(
    paused: tuple[str, str, str], tmp_path: Path, command: str
) -> None:
    """A Redis that answers the connection and the declarations, then stalls on the
    publish (the decision, the new turn.interrupted): the command gives up within the
    server timeout, where kombu's retries (a new connection, ten times, each waiting
    for its answer) held it for about a minute. Nothing reached a queue."""
    store, snapshot_id, token = paused
    server = start_redis(tmp_path / "redis")
    stalling = SilentServer(upstream=server.port, stall_on=b"LPUSH")
    try:
        broker = f"redis://127.0.0.1:{stalling.port}/0"
        answer = ["--token", token, "--approve"] if command == "decide" else []
        proc, took = timed(command, snapshot_id, *answer, "--broker", broker, "--store", store)
        said = describe(proc, took)
        assert stalling.stalled, "the publish met the stall: " + said
        assert took < BOUND and proc.returncode == 1, said
        last = proc.stderr.strip().splitlines()[-1]
        assert last.startswith(f"error: {broker_line(stalling)}"), said
        assert "Traceback" not in proc.stderr, said
        assert proc.stdout == "", "no decision id, no token: " + said
        client = redis.Redis(port=server.port)
        try:
            queued = client.llen("interlock.decisions") + client.llen("interlock.interrupted")
            assert queued == 0, "nothing was sent"
        finally:
            client.close()
    finally:
        stalling.close()
        server.stop()


@pytest.mark.parametrize(
    ("args", "seconds"),
    [
        (["worker", "--pool", "solo"], 5),  # the default
        (["resume-consumer"], QUICK),
        (["worker", "--burst", "--pool", "solo"], QUICK),
        (["resume-consumer", "--burst"], 3),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else f"{v}s",
)
def test_the_worker_and_the_consumer_do_not_start_on_a_silent_broker(
    silent: SilentServer, tmp_path: Path, args: list[str], seconds: int
) -> None:
    """Served or in burst mode, the worker and the resume consumer declare the queues
    before they serve: a broker that takes the connection and never answers ends that
    step within the server timeout with one line naming it (its password hidden), exit
    1, where the process waited there for good; no traceback, and it never started."""
    broker = f"redis://nobody:secret@127.0.0.1:{silent.port}/0"
    proc, took = timed(
        *args, "--app", APP, "--broker", broker, "--store", f"sqlite:///{tmp_path}/s.db",
        env=child_env(INTERLOCK_SERVER_TIMEOUT=str(seconds)),
    )  # fmt: skip
    shown = f"redis://nobody:***@127.0.0.1:{silent.port}/0"
    ended_unavailable(
        silent,
        proc,
        took,
        f"error: UNAVAILABLE: cannot reach the broker {shown}: Timeout reading from "
        f"127.0.0.1:{silent.port}: no answer within {seconds} s (INTERLOCK_SERVER_TIMEOUT)",
    )
    assert proc.stdout == "", "it never started: " + describe(proc, took)
    assert "secret" not in proc.stderr, describe(proc, took)


def test_served_processes_outlast_the_server_timeout_once_started(tmp_path: Path) -> None:
    """The server timeout bounds only the declarations before serving: a worker and a
    resume consumer started with a 2 s timeout wait, idle, for several times that on
    their blocking reads, then run a turn and its resume."""
    server = start_redis(tmp_path / "redis")
    env = child_env(INTERLOCK_SERVER_TIMEOUT="2")
    flags = ["--app", APP, "--broker", server.url, "--store", f"sqlite:///{tmp_path}/s.db"]
    worker = Service(
        "worker", ["worker", "--pool", "solo", *flags], tmp_path / "worker.log", env=env
    )
    consumer = Service(
        "resume-consumer", ["resume-consumer", *flags], tmp_path / "consumer.log", env=env
    )
    try:
        worker.wait_for(" ready.")
        consumer.wait_for("Connected to ")
        time.sleep(6)  # three server timeouts with nothing to read
        submitted = run_cli(
            "submit", *flags, "--agent", "bankingAgent", "--text", "Transfer $5 to x", "--wait",
            env=env,
        )  # fmt: skip
        assert submitted.returncode == 0, submitted.describe() + worker.tail()
        paused = submitted.json_lines()[-1]
        assert paused["type"] == "turn.interrupted", submitted.describe()
        time.sleep(6)
        decided = run_cli(
            "decide", paused["snapshot_id"], "--token", paused["resume_token"], "--approve",
            "--wait", *flags[2:], env=env,
        )  # fmt: skip
        assert decided.returncode == 0, decided.describe() + consumer.tail()
        assert decided.json_lines()[-1]["type"] == "turn.completed", decided.describe()
        assert worker.alive and consumer.alive
        for service in (worker, consumer):
            assert "Timeout" not in service.output(), service.tail()
    finally:
        worker.stop()
        consumer.stop()
        server.stop()


# ---------------------------------------------------------------------- a silent store


def test_health_gives_up_on_a_silent_store(silent: SilentServer, redis_url: str) -> None:
    store, shown = store_urls(silent)
    proc, took = timed("health", "--broker", redis_url, "--store", store)
    said = f"UNAVAILABLE: connection timeout expired ({shown})"  # which store: named
    ended_unavailable(silent, proc, took, f"error: UNAVAILABLE: unhealthy: store error: {said}")
    report = json.loads(proc.stdout)
    assert report == {"broker": "ok", "store": f"error: {said}", "queues": report["queues"]}
    assert all(type(n) is int for n in report["queues"].values()), report


@pytest.mark.parametrize(
    "args",
    [
        ["pending"],
        ["audit", "s-silent"],
        ["migrate"],
        ["decide", "snap", "--token", "t", "--approve"],  # read with tries: tried once here
        ["resend", "snap"],
        ["prune", "--older-than", "30d"],
        ["worker", "--burst", "--app", APP],
        ["resume-consumer", "--burst", "--app", APP],
    ],
    ids=lambda args: " ".join(args[:2]) if "--burst" in args else args[0],
)
def test_every_command_gives_up_on_a_silent_store(
    silent: SilentServer, redis_url: str, args: list[str]
) -> None:
    store, _ = store_urls(silent)
    needs_broker = ("decide", "resend", "worker", "resume-consumer")
    broker = ["--broker", redis_url] if args[0] in needs_broker else []
    proc, took = timed(*args, "--store", store, *broker)
    sent = "; nothing was sent" if args[0] == "decide" else ""
    ended_unavailable(silent, proc, took, f"error: {store_line(silent)}{sent}")
    assert "connect_timeout" not in proc.stderr, "the URL is said as it was given"


@pytest.mark.parametrize("command", ["worker", "resume-consumer"])
def test_a_served_process_says_a_silent_store_and_starts(
    silent: SilentServer, redis_url: str, command: str, tmp_path: Path
) -> None:
    """Served, the worker and the resume consumer check the store before they serve as
    they check one that cannot be reached: a store that takes the connection and never
    answers is said on stderr within the server timeout, and the process starts (the
    store may answer later), where it waited at that check for good, saying nothing."""
    store, shown = store_urls(silent)
    extra = ["--pool", "solo"] if command == "worker" else []
    flags = ["--app", APP, "--broker", redis_url, "--store", store]
    started = time.monotonic()
    quick = child_env(INTERLOCK_SERVER_TIMEOUT=str(QUICK))
    service = Service(command, [command, *extra, *flags], tmp_path / f"{command}.log", quick)
    try:
        service.wait_for('"starting"', timeout=BOUND)
        took = time.monotonic() - started
        said = service.output()
        warned = f"warning: cannot reach the store: connection timeout expired ({shown})"
        assert warned in said, service.tail()
        assert took < BOUND, f"{took:.1f}s\n" + service.tail()
        assert "secret" not in said, service.tail()
    finally:
        service.kill()  # its store never answers: nothing to stop gracefully


def test_a_store_connection_gives_up_on_a_silent_server(
    silent: SilentServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store of a long-running process (no one-shot timeout in its URL) gives up
    connecting to a PostgreSQL server that never answers after `PG_CONNECT_TIMEOUT`: a
    store failure its caller retries, where psycopg waited for good."""
    from sqlalchemy.exc import OperationalError

    import interlock.stores.engine

    monkeypatch.setattr(interlock.stores.engine, "PG_CONNECT_TIMEOUT", QUICK, raising=False)
    store = SqlSessionStore(store_urls(silent)[0], create_tables=False)
    failed: list[BaseException] = []

    def read() -> None:
        try:
            store.get_latest_snapshot("s-silent")
        except BaseException as exc:
            failed.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    try:
        reader.start()
        reader.join(BOUND)
        assert not reader.is_alive(), f"still connecting after {BOUND} s"
        [error] = failed
        assert isinstance(error, OperationalError), repr(error)
        assert "timeout expired" in str(error), error
        assert silent.accepted >= 1
    finally:
        store.dispose()


def test_submit_wait_tells_a_silent_store_and_goes_on(silent: SilentServer, tmp_path: Path) -> None:
    """`submit --file --wait` reads the store for the turn ids a file gives: a silent
    store is said on stderr within the timeout, and the turns are sent and waited for."""
    server = start_redis(tmp_path / "redis")  # its own: no worker takes the turn
    try:
        store, shown = store_urls(silent)
        turns = tmp_path / "turns.jsonl"
        turns.write_text('{"text": "Transfer $5 to x", "turn_id": "silent-store-1"}\n')
        proc, took = timed(
            "submit", "--app", APP, "--agent", "bankingAgent", "--file", str(turns),
            "--broker", server.url, "--store", store, "--wait", "--timeout", "1",
        )  # fmt: skip
        said = describe(proc, took)
        assert silent.accepted >= 1 and took < BOUND, said
        assert proc.returncode == 1, said
        assert (
            "cannot tell which of the turns sent had ended before (could not read the store "
            f"{shown}: cannot reach the store: connection timeout expired ({shown}))"
        ) in proc.stderr, said
        assert [line for line in proc.stdout.splitlines() if "silent-store-1" in line], said
        assert (
            proc.stderr.strip()
            .splitlines()[-1]
            .startswith("error: DEADLINE_EXCEEDED: 0 of 1 turns ended")
        ), said
    finally:
        server.stop()


# ------------------------------------------------------------- the settings, and --wait


def test_the_server_timeout_is_read_and_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings.from_env().server_timeout == DEFAULT_SERVER_TIMEOUT == 5.0
    monkeypatch.setenv("INTERLOCK_SERVER_TIMEOUT", "7.5")
    settings = Settings.from_env()
    assert settings.server_timeout == 7.5
    assert settings.to_env()["INTERLOCK_SERVER_TIMEOUT"] == "7.5"
    for value, said in (
        ("1", "INTERLOCK_SERVER_TIMEOUT must be a number of seconds, 2 or more, got '1'"),
        ("soon", "INTERLOCK_SERVER_TIMEOUT must be a number of seconds greater than 0, got 'soon'"),
    ):
        monkeypatch.setenv("INTERLOCK_SERVER_TIMEOUT", value)
        with pytest.raises(StatusError) as info:
            Settings.from_env()
        assert (info.value.status, info.value.message) == (Status.INVALID_ARGUMENT, said)


def test_only_a_command_run_by_hand_gives_up() -> None:
    """The worker and the resume consumer wait for a slow broker and store (blocking
    reads included): their settings bound nothing. A command's settings bound its
    connections."""
    served = Settings(broker_url="redis://h:6379/0")
    assert not {"socket_timeout", "socket_connect_timeout"} & served.transport_options.keys()
    command = Settings(broker_url="redis://h:6379/0", one_shot=True, server_timeout=7.0)
    assert command.transport_options["socket_timeout"] == 7.0
    assert command.transport_options["socket_connect_timeout"] == 7.0
    rabbit = Settings(broker_url="amqp://h:5672//", one_shot=True, server_timeout=7.0)
    assert rabbit.transport_options["connect_timeout"] == 7.0
    assert "connect_timeout" not in Settings(broker_url="amqp://h:5672//").transport_options


def test_the_store_url_a_command_connects_with() -> None:
    url = "postgresql+psycopg://me:p%40ss@db:5432/interlock?sslmode=disable"
    bounded = make_url(one_shot_store_url(url, 5.0))
    assert bounded.query == {"sslmode": "disable", "connect_timeout": "5"}
    assert bounded.difference_update_query(["connect_timeout"]) == make_url(url)
    assert bounded.password == "p@ss", "the password kept as it was"
    up = make_url(one_shot_store_url(url, 2.5))
    assert up.query["connect_timeout"] == "3", "whole seconds, rounded up"
    given = "postgresql+psycopg://me@db/interlock?connect_timeout=30"
    assert one_shot_store_url(given, 5.0) == given, "the URL's own wins"
    assert one_shot_store_url("sqlite:///x.db", 5.0) == "sqlite:///x.db"


def test_the_resume_consumer_waits_for_a_slow_broker(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, redis_url: str
) -> None:
    """`interlock resume-consumer` runs with settings that bound nothing: its
    connections wait for a slow broker, and its blocking reads for their messages."""
    from click.testing import CliRunner

    import workers.app
    from workers.cli import main

    class Stop(Exception):
        pass

    made: list[Settings] = []

    def create_app(settings: Settings, registry: object = None) -> None:
        made.append(settings)
        raise Stop

    monkeypatch.setattr(workers.app, "create_app", create_app)
    flags = ["--app", APP, "--broker", redis_url, "--store", f"sqlite:///{tmp_path}/c.db"]
    result = CliRunner().invoke(main, ["resume-consumer", *flags], env=child_env())
    assert isinstance(result.exception, Stop), result.output
    [settings] = made
    assert settings.one_shot is False
    assert "socket_timeout" not in settings.transport_options


def test_the_wait_reads_within_the_socket_timeout(redis_url: str) -> None:
    """A `--wait` connection's blocking read (BLMOVE or BRPOP) is ended by the server
    within `brpop_timeout`, well within the socket timeout, so the wait never fails
    for it."""
    settings = Settings(broker_url=redis_url, one_shot=True, server_timeout=2.0)
    with settings.connection() as conn:
        channel = conn.default_channel
        assert channel.socket_timeout == 2.0
        assert 0 < channel.brpop_timeout <= settings.server_timeout / 2, channel.brpop_timeout


def test_wait_outlasts_the_socket_timeout(tmp_path: Path) -> None:
    """`submit --wait` with a 2 s server timeout waits, for several times that, for a
    worker started later, and prints the event that ends the turn."""
    server = start_redis(tmp_path / "redis")
    try:
        store = f"sqlite:///{tmp_path}/wait.db"
        flags = ["--app", APP, "--broker", server.url, "--store", store]
        env = child_env(INTERLOCK_SERVER_TIMEOUT="2")
        waiting = subprocess.Popen(
            [interlock_bin(), "submit", *flags, "--agent", "bankingAgent",
             "--text", "Transfer $5 to x", "--wait", "--timeout", "60"],
            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        try:
            client = redis.Redis.from_url(server.url)
            try:
                eventually(lambda: client.llen("interlock.turns") == 1, "the turn queued", 30)
            finally:
                client.close()
            time.sleep(6)  # three server timeouts with nothing to read
            assert waiting.poll() is None, "still waiting"
            worker = run_cli("worker", "--burst", "--pool", "solo", *flags, env=env, timeout=120)
            assert worker.returncode == 0, worker.describe()
            out, err = waiting.communicate(timeout=HANG)
        finally:
            if waiting.poll() is None:
                waiting.kill()
                waiting.communicate()
        assert waiting.returncode == 0, f"exit {waiting.returncode}\n{out}\n{err}"
        assert '"type": "turn.interrupted"' in out.splitlines()[-1], out
        assert "UNAVAILABLE" not in err and "Timeout" not in err, err
    finally:
        server.stop()
