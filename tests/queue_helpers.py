"""Helpers for the end-to-end queue tests: real `interlock worker` and
`interlock resume-consumer` processes, and a "dashboard" that reads events and
publishes decisions as plain JSON, the way a program in another language would.

- `QueueStack` / `start_stack(directory, broker_url, store_url)`: the two long-running
  processes, each in a session of its own (its process group is killed at teardown),
  their output captured to files in `directory`.
- `Dashboard`: a kombu connection with a queue of its own bound to `interlock.events`
  with "#" (bound BEFORE anything is submitted, so no event is missed). It keeps every
  event it reads (`history`) so waits never drop one, and publishes decisions as JSON.
- `QueueReader` (`interrupted_reader`, `dead_reader`): reads a named queue of the
  topology (`interlock.interrupted`, `interlock.decisions.dead`) as raw JSON.
- `module_stack(dir, pg_admin, broker_url=None)`: the body of a module-scoped fixture:
  a private redis-server (unless a broker is given), a private PostgreSQL database and
  the two processes. `dashboard_for(stack, request)`: the body of a per-test fixture;
  a failed test's report shows both processes' output.
- `rabbitmq_vhost()`: a fresh RabbitMQ vhost for a test module (or a purge of "/").
- `Service(name, args, log, env=None)` on its own: `.wait_for(marker)`, `.kill()`
  (SIGKILL the process group, prefork children included), `.stop()`;
  `report_logs_on_failure(stack, request)` for a stack of one's own (test_faults.py).

Isolation: each test module has its own broker, database and processes; inside a
module, each test has its own event queue (deleted after it), its own sessions, and
tags what it publishes (decision ids, nonces in headers), so no test sees another's
messages as its own.

Every wait has a timeout; nothing synchronizes by sleeping. Ordering "barriers" are
used instead: the resume consumer handles one decision at a time, in queue order, so
once the outcome of a sentinel decision is seen, every decision published before it
has been answered (`Dashboard.consumer_barrier`); the worker runs one turn at a time
(concurrency 1, prefetch 1), so once a turn submitted last has paused, every turn
enqueued before it has run (`Dashboard.worker_barrier`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import jsonschema
import pytest
from kombu.connection import Connection
from kombu.entity import Queue
from kombu.message import Message as KombuMessage
from kombu.messaging import Consumer, Producer

from events.publisher import Publisher
from events.stream import EventStream
from events.topology import DECISIONS_DEAD, INTERRUPTED, TURNS, TURNS_DEAD, all_queues, event_queue
from schemas import EventBase
from tests.services import create_pg_database, drop_pg_database, service_unavailable, start_redis

__all__ = [
    "AGENT",
    "APP",
    "EVENT_TIMEOUT",
    "SECRET",
    "CliResult",
    "Dashboard",
    "QueueReader",
    "QueueStack",
    "Service",
    "Submitter",
    "child_env",
    "cli_submit",
    "dashboard_for",
    "dead_reader",
    "decision",
    "decisions_only_user",
    "interlock_bin",
    "interrupted_reader",
    "module_stack",
    "rabbitmq_vhost",
    "report_logs_on_failure",
    "run_cli",
    "start_stack",
    "stream_queue",
]

APP = "examples.banking:ai"
AGENT = "bankingAgent"
SECRET = "queue-e2e-secret"
EVENT_TIMEOUT = 30.0
"""Seconds to wait for one hop (an event, an outcome). Generous: a hop takes ~0.1 s."""
SCHEMAS = Path(__file__).resolve().parents[1] / "docs" / "schemas"
"""The JSON Schemas a reader of the queues is given (docs/queues.md)."""

READY_TIMEOUT = 60.0


def interlock_bin() -> str:
    """The `interlock` script of the venv running the tests."""
    candidate = Path(sys.executable).with_name("interlock")
    if candidate.exists():
        return str(candidate)
    found = shutil.which("interlock")
    assert found is not None, "the interlock command is not installed (pip install -e .)"
    return found


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a child process: no INTERLOCK_* leaking in from the caller
    (flags say where the broker and the store are), the test secret, unbuffered output."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("INTERLOCK_")}
    env.update(INTERLOCK_SECRET=SECRET, PYTHONUNBUFFERED="1", PYTHONWARNINGS="default")
    env.update(extra)
    return env


# ---------------------------------------------------------------- one-shot commands


@dataclass(frozen=True)
class CliResult:
    args: list[str]
    returncode: int
    stdout: str
    stderr: str

    def json_lines(self) -> list[dict[str, Any]]:
        """The JSON lines of stdout (other lines, such as the demo's hops, skipped)."""
        out = []
        for line in self.stdout.splitlines():
            line = line.strip()
            if line.startswith("{"):
                out.append(json.loads(line))
        return out

    def describe(self) -> str:
        return (
            f"$ interlock {' '.join(self.args)}\nexit {self.returncode}\n"
            f"--- stdout\n{self.stdout}\n--- stderr\n{self.stderr}"
        )


def run_cli(
    *args: str,
    env: dict[str, str] | None = None,
    timeout: float = 90.0,
    cwd: Path | None = None,
    stdin: str | None = None,
) -> CliResult:
    """Run `interlock ARGS...` to the end (`stdin`: piped to it; else none); never raises
    on a non-zero exit."""
    proc = subprocess.run(
        [interlock_bin(), *args],
        env=env if env is not None else child_env(),
        **({"input": stdin} if stdin is not None else {"stdin": subprocess.DEVNULL}),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        check=False,
    )
    return CliResult(list(args), proc.returncode, proc.stdout, proc.stderr)


# ---------------------------------------------------------------- long-running processes


class Service:
    """One long-running `interlock ...` process in a session of its own; stdout and
    stderr go to `log`."""

    def __init__(
        self, name: str, args: list[str], log: Path, env: dict[str, str] | None = None
    ) -> None:
        self.name = name
        self.args = args
        self.log = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                [interlock_bin(), *args],
                env=env if env is not None else child_env(),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def output(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def tail(self, chars: int = 6000) -> str:
        text = self.output()
        return text[-chars:]

    def wait_for(self, marker: str, timeout: float = 60.0) -> None:
        """Wait until `marker` shows in the output; fail if the process exits first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if marker in self.output():
                return
            if not self.alive:
                raise AssertionError(
                    f"{self.name} exited with {self.proc.returncode} at start:\n" + self.tail()
                )
            time.sleep(0.05)
        raise AssertionError(f"{self.name} not ready in {timeout}s:\n{self.tail()}")

    def kill(self) -> None:
        """SIGKILL the whole process group at once (a prefork worker's children too),
        as a machine dying would, and reap the leader."""
        _signal_group(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self, timeout: float = 15.0, sig: signal.Signals = signal.SIGTERM) -> str:
        """Send `sig` (SIGTERM; SIGINT is Ctrl-C) to the process group, SIGKILL it if it
        is still there after `timeout`. Returns how it ended ("exit N", "killed")."""
        if self.proc.poll() is None:
            _signal_group(self.proc.pid, sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                _signal_group(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
                return "killed"
        # children of the group (prefork pool) may outlive the leader: reap them too
        _signal_group(self.proc.pid, signal.SIGKILL)
        return f"exit {self.proc.returncode}"


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


@dataclass
class QueueStack:
    """A worker and a resume consumer on one broker and one store."""

    broker_url: str
    store_url: str
    directory: Path
    worker: Service | None = None
    consumer: Service | None = None
    ended: dict[str, str] = field(default_factory=dict)

    @property
    def services(self) -> list[Service]:
        return [s for s in (self.worker, self.consumer) if s is not None]

    def start(self) -> None:
        common = ["--app", APP, "--broker", self.broker_url, "--store", self.store_url]
        self.worker = Service(
            "worker",
            ["worker", *common, "--concurrency", "1", "--pool", "prefork", "-l", "INFO"],
            self.directory / "worker.log",
        )
        self.consumer = Service(
            "resume-consumer", ["resume-consumer", *common], self.directory / "consumer.log"
        )
        # Ready: the worker says "... ready." once it consumes interlock.turns, the
        # consumer logs "Connected to" once it is on the broker.
        self._wait_for(self.worker, " ready.")
        self._wait_for(self.consumer, "Connected to ")

    def _wait_for(self, service: Service, marker: str) -> None:
        service.wait_for(marker, READY_TIMEOUT)

    def check_alive(self) -> None:
        for service in self.services:
            if not service.alive:
                raise AssertionError(
                    f"{service.name} died (exit {service.proc.returncode}):\n{service.tail()}"
                )

    def logs(self, chars: int = 6000) -> str:
        return "\n".join(
            f"===== {s.name} ({'running' if s.alive else f'exit {s.proc.returncode}'}), "
            f"{s.log}\n{s.tail(chars)}"
            for s in self.services
        )

    def stop(self) -> None:
        for service in self.services:
            self.ended[service.name] = service.stop()


@contextlib.contextmanager
def start_stack(directory: Path, broker_url: str, store_url: str) -> Iterator[QueueStack]:
    """Start a worker and a resume consumer; stop both (process groups) at the end."""
    directory.mkdir(parents=True, exist_ok=True)
    stack = QueueStack(broker_url, store_url, directory)
    try:
        stack.start()
        yield stack
    finally:
        stack.stop()


# ---------------------------------------------------------------- submitting turns


def cli_submit(stack: QueueStack, text: str) -> dict[str, Any]:
    """`interlock submit` as a user runs it; returns its JSON line {turn_id, session_id}."""
    result = run_cli(
        "submit", "--app", APP, "--agent", AGENT, "--text", text,
        "--broker", stack.broker_url, "--store", stack.store_url,
    )  # fmt: skip
    assert result.returncode == 0, result.describe()
    lines = result.json_lines()
    assert len(lines) == 1, result.describe()
    return lines[0]


class Submitter:
    """Enqueues `interlock.run_turn` from this process, as a backend in Python would
    (what `interlock submit` does, without starting an interpreter per turn)."""

    def __init__(self, stack: QueueStack) -> None:
        from workers.app import create_app
        from workers.settings import Settings

        self.app = create_app(
            Settings(broker_url=stack.broker_url, store_url=stack.store_url, app=APP)
        )

    def __call__(self, text: str, session_id: str | None = None) -> str:
        from interlock import AgentInput, Message, Part
        from workers.app import send_turn
        from workers.turns import new_turn_request

        session_id = session_id or str(uuid.uuid4())
        request = new_turn_request(
            AGENT,
            AgentInput(message=Message(role="user", content=[Part(text=text)])),
            session_id=session_id,
        )
        send_turn(self.app, request)
        return session_id

    def close(self) -> None:
        self.app.close()


# ---------------------------------------------------------------- the dashboard


def decision(
    snapshot_id: str | None,
    resume_token: str | None,
    *,
    restart: list[dict[str, Any]] | None = None,
    respond: list[dict[str, Any]] | None = None,
    decision_id: str | None = None,
    reviewer: str = "reviewer@example.com",
) -> dict[str, Any]:
    """A decision as a plain JSON dict, the wire form of docs/queues.md."""
    body: dict[str, Any] = {
        "schema_version": 1,
        "decision_id": decision_id or str(uuid.uuid4()),
        "snapshot_id": snapshot_id,
        "resume_token": resume_token,
        "reviewer": reviewer,
    }
    if restart is not None:
        body["restart"] = restart
    if respond is not None:
        body["respond"] = respond
    return body


Match = Callable[[EventBase], bool]
TURN_TYPES = ("turn.interrupted", "turn.completed", "turn.failed")
T = TypeVar("T")


class Dashboard:
    """Reads every event from a queue of its own (bound with "#") and publishes
    decisions as JSON. Waits search `history`, so an event read while waiting for
    another one is never lost."""

    def __init__(
        self,
        stack: Any,
        submit: Callable[[str, str | None], str],
        *,
        transport_options: dict[str, Any] | None = None,
    ) -> None:
        """`stack`: a `QueueStack`, or anything with `broker_url` and `check_alive()`.
        `transport_options`: the broker options every client shares (the visibility
        timeout), when the test's services do not run with the defaults."""
        self.stack = stack
        self.conn = Connection(stack.broker_url, transport_options=transport_options or {})
        self.conn.ensure_connection(max_retries=3)
        self.stream = EventStream.bind(self.conn, f"test.{uuid.uuid4()}", "#")
        self.history: list[EventBase] = []
        self.producer = Producer(self.conn)
        self._submit = submit

    def close(self) -> None:
        try:
            self.stream.close(delete=True)
        finally:
            self.producer.release()
            self.conn.release()

    # -- reading

    def _pump(self, timeout: float) -> None:
        try:
            event = self.stream.next(timeout)
        except TimeoutError:
            return
        self.history.append(event)

    def wait_until(
        self, found: Callable[[], T | None], what: str, timeout: float = EVENT_TIMEOUT
    ) -> T:
        """Read events until `found()` (which looks at `history`) returns something."""
        deadline = time.monotonic() + timeout
        while True:
            result = found()
            if result is not None:
                return result
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            self.stack.check_alive()
            self._pump(min(remaining, 1.0))
        seen = "\n".join(f"  {e.type} {e.model_dump_json()[:300]}" for e in self.history)
        raise AssertionError(f"no {what} within {timeout:.0f}s. Events seen:\n{seen}")

    def wait(self, match: Match, what: str, timeout: float = EVENT_TIMEOUT) -> EventBase:
        """The first event in `history` that matches, reading more as needed."""
        return self.wait_until(
            lambda: next((e for e in self.history if match(e)), None), what, timeout
        )

    def turn_event(
        self,
        session_id: str,
        types: tuple[str, ...] = TURN_TYPES,
        *,
        exclude: set[str] | None = None,
    ) -> EventBase:
        """The first turn event of the session whose snapshot is not in `exclude`."""
        skip = exclude or set()
        return self.wait(
            lambda e: e.session_id == session_id and e.type in types and e.snapshot_id not in skip,
            f"{'/'.join(types)} of session {session_id}",
        )

    def outcomes(self, decision_id: str | None) -> list[EventBase]:
        """Every decision.accepted/rejected read so far for `decision_id`, in order."""
        return [
            e
            for e in self.history
            if e.type.startswith("decision.") and getattr(e, "decision_id", None) == decision_id
        ]

    def outcome(self, decision_id: str, nth: int = 1) -> EventBase:
        """The `nth` decision.accepted/rejected published for `decision_id`."""

        def found() -> EventBase | None:
            got = self.outcomes(decision_id)
            return got[nth - 1] if len(got) >= nth else None

        return self.wait_until(found, f"outcome #{nth} of decision {decision_id}")

    def events(self, match: Match) -> list[EventBase]:
        return [e for e in self.history if match(e)]

    # -- publishing

    def publish_json(
        self,
        body: dict[str, Any] | list[Any] | str,
        *,
        exchange: str = "interlock.decisions",
        headers: dict[str, Any] | None = None,
    ) -> None:
        """A decision as JSON text, published the way any AMQP/Redis client would."""
        text = body if isinstance(body, str) else json.dumps(body)
        self.publish_raw(text.encode(), "application/json", exchange=exchange, headers=headers)

    def publish_raw(
        self,
        body: bytes,
        content_type: str,
        *,
        exchange: str = "",
        headers: dict[str, Any] | None = None,
    ) -> None:
        self.producer.publish(
            body,
            exchange=exchange,
            routing_key="interlock.decisions",
            content_type=content_type,
            content_encoding="binary" if content_type != "application/json" else "utf-8",
            headers=headers or {},
            delivery_mode=2,
        )

    def publish_event(self, event: EventBase) -> None:
        """Put an event of the test's own on `interlock.events` (a marker)."""
        Publisher(self.conn, declare_topology=False).publish_event(event)

    # -- flows

    def submit(self, text: str, session_id: str | None = None) -> str:
        """Submit a turn of the banking agent (in a new session unless one is given);
        returns its session id."""
        return self._submit(text, session_id)

    def paused(self, text: str) -> Any:
        """Submit `text` and wait until its turn pauses; returns the turn.interrupted."""
        session_id = self.submit(text)
        event = self.turn_event(session_id)
        assert event.type == "turn.interrupted", event.model_dump_json()
        return event

    def approve_all(self, interrupted: Any, approved: bool = True) -> dict[str, Any]:
        """A decision that restarts every interrupt with {"approved": approved}."""
        return decision(
            interrupted.snapshot_id,
            interrupted.resume_token,
            restart=[
                {"name": i.name, "ref": i.ref, "resumed": {"approved": approved}}
                for i in interrupted.interrupts
            ],
        )

    def resolve(self, interrupted: Any, approved: bool = True) -> EventBase:
        """Answer every interrupt; expect acceptance; return the next turn event."""
        body = self.approve_all(interrupted, approved)
        self.publish_json(body)
        accepted = self.outcome(body["decision_id"])
        assert accepted.type == "decision.accepted", accepted.model_dump_json()
        return self.resumed_turn(accepted)

    def resumed_turn(self, accepted: EventBase) -> EventBase:
        """The turn event (interrupted, completed or failed) of the resume that
        `accepted` enqueued: the one with its turn_id."""
        assert accepted.type == "decision.accepted" and accepted.turn_id, accepted
        return self.wait(
            lambda e: e.type in TURN_TYPES and e.turn_id == accepted.turn_id,
            f"turn event of the resumed turn {accepted.turn_id}",
        )

    def consumer_barrier(self) -> None:
        """Every decision published before this call has its outcome out: publish a
        sentinel (an unknown snapshot) and wait for its rejection."""
        sentinel = decision(f"barrier-{uuid.uuid4()}", "x", restart=[])
        self.publish_json(sentinel)
        event = self.outcome(sentinel["decision_id"])
        assert getattr(event, "error", None) is not None
        assert event.error.status == "NOT_FOUND", event.model_dump_json()  # type: ignore[attr-defined]

    def worker_barrier(self) -> None:
        """Every turn enqueued before this call has run: submit one and wait for it."""
        self.paused("Transfer $1 to barrier")


# ---------------------------------------------------------------- raw task messages


def celery_headers(task: str = "interlock.run_turn", **extra: Any) -> dict[str, Any]:
    """The headers of a Celery (protocol 2) task message, as a client in another
    language would write them."""
    task_id = str(uuid.uuid4())
    return {
        "lang": "py",
        "task": task,
        "id": task_id,
        "root_id": task_id,
        "parent_id": None,
        "group": None,
        "retries": 0,
        "eta": None,
        "expires": None,
        "argsrepr": "()",
        "kwargsrepr": "{}",
        **extra,
    }


def put_on_turns(stack: Any, body: bytes, content_type: str, headers: dict[str, Any]) -> None:
    """A message on `interlock.turns`, as any AMQP/Redis client would put it there."""
    with Connection(stack.broker_url) as conn:
        producer = Producer(conn)
        producer.publish(
            body,
            exchange=TURNS,
            routing_key=TURNS,
            content_type=content_type,
            content_encoding="utf-8" if content_type == "application/json" else "binary",
            headers=headers,
            delivery_mode=2,
        )


# ---------------------------------------------------------------- raw queue reader


class QueueReader:
    """Reads one queue of the topology as raw JSON (a dashboard in another language
    would do just this). Every message read is acked, and checked against `schema` (a
    file of docs/schemas) when one is given; `wait` returns the first one that matches,
    keeping the others in `seen`."""

    def __init__(self, broker_url: str, queue: Queue, schema: str | None = None) -> None:
        self.schema = json.loads((SCHEMAS / schema).read_text()) if schema else None
        self.conn = Connection(broker_url)
        self.conn.ensure_connection(max_retries=3)
        self.seen: list[tuple[dict[str, Any], dict[str, Any], str | None]] = []
        channel = self.conn.channel()
        for q in all_queues():  # as a client would: make sure the topology exists
            q.bind(channel).declare()
        self.consumer = Consumer(channel, queues=[queue], on_message=self._on_message)
        self.consumer.consume()

    def _on_message(self, message: KombuMessage) -> None:
        body = message.body
        text = body.decode() if isinstance(body, bytes) else body
        value = json.loads(text)
        self.seen.append((value, dict(message.headers or {}), message.content_type))
        message.ack()
        if self.schema is not None:
            jsonschema.validate(value, self.schema)

    def wait(
        self, match: Callable[[dict[str, Any]], bool], what: str, timeout: float = EVENT_TIMEOUT
    ) -> tuple[dict[str, Any], dict[str, Any], str | None]:
        deadline = time.monotonic() + timeout
        while True:
            for item in self.seen:
                if match(item[0]):
                    return item
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no {what} within {timeout:.0f}s; read: {self.seen!r}")
            with contextlib.suppress(TimeoutError, socket.timeout):
                self.conn.drain_events(timeout=min(remaining, 1.0))

    def close(self) -> None:
        channel = self.consumer.channel
        try:
            self.consumer.cancel()
        finally:
            if channel is not None:
                channel.close()
            self.conn.release()


def interrupted_reader(broker_url: str) -> QueueReader:
    return QueueReader(broker_url, INTERRUPTED, schema="turn.interrupted.schema.json")


def dead_reader(broker_url: str) -> QueueReader:
    return QueueReader(broker_url, DECISIONS_DEAD, schema="dead_letter.schema.json")


def dead_turns_reader(broker_url: str) -> QueueReader:
    return QueueReader(broker_url, TURNS_DEAD, schema="dead_letter.schema.json")


def stream_queue(conn: Connection, pattern: str) -> EventStream:
    """A queue of the test's own bound with `pattern` (deleted by `close(delete=True)`)."""
    return EventStream(conn, event_queue(f"test.{pattern}.{uuid.uuid4()}", pattern))


# ---------------------------------------------------------------- fixtures' bodies


@contextlib.contextmanager
def module_stack(
    directory: Path, pg_admin: str, broker_url: str | None = None
) -> Iterator[QueueStack]:
    """A private PostgreSQL database and (unless `broker_url` is given) a private
    redis-server, with a worker and a resume consumer on them. Everything is torn down
    in reverse order: processes, database, redis."""
    with contextlib.ExitStack() as stack:
        if broker_url is None:
            server = start_redis(directory / "redis")
            stack.callback(server.stop)
            broker_url = server.url
        store_url = create_pg_database(pg_admin)
        stack.callback(drop_pg_database, pg_admin, store_url)
        yield stack.enter_context(start_stack(directory, broker_url, store_url))


STACK_KEY = pytest.StashKey[Any]()
"""The stack whose processes' output a failed test's report shows (anything with
`logs(chars)`)."""


class _LogsOnFailure:
    """Adds the worker's and the consumer's output to the report of a failed test
    that used a dashboard."""

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        stack = item.stash.get(STACK_KEY, None)
        if stack is not None and report.failed:
            report.sections.append(
                (f"interlock worker and resume-consumer ({call.when})", stack.logs(20000))
            )
        return report


def report_logs_on_failure(stack: Any, request: pytest.FixtureRequest) -> None:
    """If the test fails, its report shows `stack.logs(20000)` (the processes' output)."""
    plugins = request.config.pluginmanager
    if not plugins.has_plugin("interlock-queue-logs"):
        plugins.register(_LogsOnFailure(), "interlock-queue-logs")
    request.node.stash[STACK_KEY] = stack


@contextlib.contextmanager
def dashboard_for(stack: QueueStack, request: pytest.FixtureRequest) -> Iterator[Dashboard]:
    """A dashboard for one test. A failed test's report shows the worker's and the
    consumer's output; both must still be running when the test ends."""
    report_logs_on_failure(stack, request)
    submitter = Submitter(stack)
    dash = Dashboard(stack, submitter)
    try:
        yield dash
    finally:
        dash.close()
        submitter.close()
    stack.check_alive()


# ---------------------------------------------------------------- RabbitMQ

RABBIT_HOST = ("127.0.0.1", 5672)


def _rabbit_listening() -> bool:
    try:
        with socket.create_connection(RABBIT_HOST, timeout=2):
            return True
    except OSError:
        return False


@contextlib.contextmanager
def rabbitmq_vhost() -> Iterator[str]:
    """The URL of a fresh vhost (made with rabbitmqctl, deleted after); when rabbitmqctl
    cannot make one, "/" with the Interlock queues purged. Skips locally (fails in CI)
    when RabbitMQ does not answer."""
    if not _rabbit_listening():
        service_unavailable("RabbitMQ is not reachable on 127.0.0.1:5672")
    vhost = f"interlock_test_{uuid.uuid4().hex[:12]}"
    ctl = shutil.which("rabbitmqctl")
    made = False
    if ctl is not None:
        add = subprocess.run([ctl, "add_vhost", vhost], capture_output=True, timeout=60)
        if add.returncode == 0:
            perms = [ctl, "set_permissions", "-p", vhost, "guest", ".*", ".*", ".*"]
            made = subprocess.run(perms, capture_output=True, timeout=60).returncode == 0
    url = f"amqp://guest:guest@127.0.0.1:5672/{vhost if made else ''}"
    try:
        with Connection(url, connect_timeout=5) as conn:
            conn.ensure_connection(max_retries=2)
            if not made:
                with conn.channel() as channel:
                    for q in all_queues():
                        q.bind(channel).declare()
                        q.bind(channel).purge()
    except Exception as exc:
        service_unavailable(f"RabbitMQ at {url} does not accept guest: {exc}")
    try:
        yield url
    finally:
        if made and ctl is not None:
            subprocess.run([ctl, "delete_vhost", vhost], capture_output=True, timeout=60)


@contextlib.contextmanager
def decisions_only_user(url: str) -> Iterator[str]:
    """`url` (a vhost of the test's own) as a RabbitMQ user of its own that may write to
    `interlock.decisions` alone, and configure and read nothing: a reviewer's user as
    docs/operations.md ("Who may publish where") describes it. Deleted after."""
    vhost = url.rsplit("/", 1)[1]
    ctl = shutil.which("rabbitmqctl")
    if not vhost or ctl is None:
        service_unavailable("needs a vhost of the test's own (rabbitmqctl)")
    user = f"reviewer_{uuid.uuid4().hex[:8]}"
    subprocess.run([ctl, "add_user", user, "pw"], check=True, capture_output=True, timeout=60)
    try:
        subprocess.run(
            [ctl, "set_permissions", "-p", vhost, user, "^$", r"^interlock\.decisions$", "^$"],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
        yield url.replace("guest:guest@", f"{user}:pw@", 1)
    finally:
        subprocess.run([ctl, "delete_user", user], capture_output=True, timeout=60)
