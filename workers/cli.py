"""The `interlock` command line. Each command prints one JSON line on success, and a
clear message with a non-zero exit on error."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO, TypeVar

import click
from kombu.connection import Connection

from interlock import AgentInput, InterlockError, Message, Part, Status, StatusError, status_of

from .settings import Settings, redact_url

if TYPE_CHECKING:
    from celery import Celery

    from interlock import SqlSessionStore

    from .turn_file import FileTurn

__all__ = ["main"]

DEMO_TEXT = "Transfer $500 to my savings account."
PROGRESS_EVERY = 100
"""A batch (`submit --file`) reports its progress on stderr every this many turns."""
F = TypeVar("F", bound=Callable[..., Any])


def emit(data: dict[str, Any]) -> None:
    """Print one JSON line."""
    click.echo(json.dumps(data, default=str))


def fail(message: str, code: int = 1) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def clear_errors(fn: F) -> F:
    """Turn Interlock errors into a one-line message and exit code 1."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except InterlockError as exc:
            fail(f"{status_of(exc).value}: {getattr(exc, 'message', str(exc))}")
        except OSError as exc:
            fail(f"UNAVAILABLE: {exc}")
        except Exception as exc:
            reason = unreachable(exc)
            if reason is None:
                raise
            fail(f"UNAVAILABLE: {reason}")

    return wrapper  # type: ignore[return-value]


def unreachable(exc: Exception) -> str | None:
    """One line saying which service cannot be reached, when `exc` says so (kombu's and
    SQLAlchemy's connection errors are no `OSError`)."""
    from kombu.exceptions import OperationalError as BrokerError
    from redis.exceptions import ConnectionError as RedisDown
    from redis.exceptions import TimeoutError as RedisSlow
    from sqlalchemy.exc import OperationalError as StoreError

    if isinstance(exc, BrokerError | RedisDown | RedisSlow):  # redis-py's, unwrapped
        return f"cannot reach the broker: {exc}"
    if isinstance(exc, StoreError):
        first = (str(exc.orig or exc).strip().splitlines() or [""])[0]
        return f"cannot reach the store: {first}"
    return None


def read_store(url: str) -> SqlSessionStore:
    """The store at `url`, for a command that only reads it (`pending`, `decide`,
    `audit`): a SQLite file that does not exist is NOT_FOUND, not a new empty store
    (a mistyped path would otherwise read as "nothing pending")."""
    from interlock import SqlSessionStore

    check_store_exists(url)
    return SqlSessionStore(url)


def missing_sqlite_file(url: str) -> Path | None:
    """The file of a SQLite store URL when it does not exist (else None)."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    path = parsed.database or ""
    if parsed.get_backend_name() != "sqlite" or path in ("", ":memory:"):
        return None
    return None if path.startswith("file:") or Path(path).exists() else Path(path)


def check_store_exists(url: str) -> None:
    """NOT_FOUND when `url` is a SQLite file that is not there."""
    path = missing_sqlite_file(url)
    if path is not None:
        raise StatusError(
            Status.NOT_FOUND,
            f"no store at {path} ({redact_url(url)}): check --store or INTERLOCK_STORE_URL",
        )


app_option = click.option(
    "--app",
    envvar="INTERLOCK_APP",
    help="Module defining the registry, MODULE:OBJ. [env: INTERLOCK_APP]",
)
broker_option = click.option(
    "--broker",
    envvar="INTERLOCK_BROKER_URL",
    help="Broker URL (redis://, amqp://, memory://). [env: INTERLOCK_BROKER_URL; default redis://localhost:6379/0]",
)
store_option = click.option(
    "--store",
    envvar="INTERLOCK_STORE_URL",
    help="Store URL (sqlite:///..., postgresql+psycopg://...). [env: INTERLOCK_STORE_URL; default sqlite:///interlock.db]",
)


def settings_of(
    app: str | None = None, broker: str | None = None, store: str | None = None
) -> Settings:
    return Settings.from_env(app=app, broker_url=broker, store_url=store)


wait_option = click.option(
    "--wait",
    is_flag=True,
    help="Then wait for what follows on the queues and print each event as a JSON line.",
)
timeout_option = click.option(
    "--timeout",
    default=60.0,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    help="Seconds to wait for each event.",
)
burst_option = click.option(
    "--burst", is_flag=True, help="Serve what is queued, then exit once there is nothing to do."
)
idle_option = click.option(
    "--idle",
    default=1.0,
    show_default=True,
    type=click.FloatRange(min=0.1),
    help="With --burst: seconds with nothing to do before exiting.",
)


class _Waiter:
    """A queue of this command's own, bound to every event before anything is sent (so
    nothing it waits for can pass unseen), deleted at the end."""

    def __init__(
        self, settings: Settings, timeout: float, keep: Callable[[Any], bool] = lambda e: False
    ) -> None:
        from events.stream import EventStream

        self.timeout = timeout
        self.keep = keep
        self._kept: list[Any] = []
        self.connection = Connection(
            settings.broker_url,
            transport=settings.broker_transport,
            transport_options=settings.transport_options,
        )
        name = f"interlock.cli.{uuid.uuid4().hex[:12]}"
        self.events = EventStream.bind(self.connection, name, "#", temporary=True)

    def next(self, what: str, match: Callable[[Any], bool], *, quiet: bool = False) -> Any:
        """The next event that matches; printed. Events this command waits for later
        (see `keep`) that arrive first are kept for then: a resumed turn may end before
        `decision.accepted` is read. `quiet`: no "waiting for" line on stderr."""
        if not quiet:
            click.echo(f"waiting for {what} (up to {self.timeout:.0f}s)...", err=True)
        event = next((e for e in self._kept if match(e)), None)
        if event is not None:
            self._kept.remove(event)
        deadline = time.monotonic() + self.timeout
        while event is None:
            remaining = deadline - time.monotonic()
            try:
                if remaining <= 0:
                    raise TimeoutError
                found = self.events.next(remaining, match=lambda e: match(e) or self.keep(e))
            except TimeoutError:
                raise StatusError(
                    Status.DEADLINE_EXCEEDED,
                    f"no {what} within {self.timeout:.0f}s: are `interlock worker` and "
                    "`interlock resume-consumer` running on this broker and store?",
                ) from None
            if match(found):
                event = found
            else:
                self._kept.append(found)
        emit(event.model_dump(mode="json"))
        return event

    def turn_event(self, turn_id: str) -> Any:
        """The event that ends turn `turn_id`; a failed turn exits with an error."""
        ends = ("turn.interrupted", "turn.completed", "turn.failed")
        event = self.next(
            f"turn {turn_id}", lambda e: e.type in ends and getattr(e, "turn_id", None) == turn_id
        )
        if event.type == "turn.failed":
            raise StatusError(event.error.status, f"turn failed: {event.error.message}")
        if event.type == "turn.interrupted":
            click.echo(
                f"paused: answer with `interlock decide {event.snapshot_id} "
                f"--token {event.resume_token} --approve` (or --deny, --respond JSON)",
                err=True,
            )
        return event

    def turn_events(self, turn_ids: list[str]) -> list[Any]:
        """The event that ends each of `turn_ids`, printed as they come (`timeout`: at
        most between two of them); then a failure if any turn failed."""
        ends = ("turn.interrupted", "turn.completed", "turn.failed")
        waiting = set(turn_ids)
        found: list[Any] = []
        click.echo(
            f"waiting for {len(waiting)} turns to end (up to {self.timeout:.0f}s between two)...",
            err=True,
        )
        while waiting:
            event = self.next(
                f"{len(waiting)} more turns",
                lambda e: e.type in ends and getattr(e, "turn_id", None) in waiting,
                quiet=True,
            )
            waiting.discard(event.turn_id)
            found.append(event)
            if len(found) % PROGRESS_EVERY == 0 or not waiting:
                click.echo(f"{len(found)} of {len(turn_ids)} turns ended", err=True)
        paused = sum(e.type == "turn.interrupted" for e in found)
        failed = [e for e in found if e.type == "turn.failed"]
        if paused:
            click.echo(f"{paused} paused: list them with `interlock pending`", err=True)
        if failed:
            first = failed[0].error
            raise StatusError(
                first.status,
                f"{len(failed)} of {len(turn_ids)} turns failed; the first: {first.message}",
            )
        return found

    def close(self) -> None:
        try:
            self.events.close(delete=True)
        finally:
            self.connection.release()


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="interlock")
def main() -> None:
    """Interlock: agents that pause for a human and resume where they stopped.

    Start with `interlock demo`. In production run `interlock worker` and
    `interlock resume-consumer` (after `interlock migrate`, once, to create the store's
    tables), submit turns with `interlock submit`, list what waits with `interlock
    pending` and answer with `interlock decide`."""


# -- long-running processes ---------------------------------------------------------------


@main.command(short_help="Run a Celery worker for interlock.run_turn.")
@app_option
@broker_option
@store_option
@click.option(
    "--concurrency",
    "-c",
    default=2,
    show_default=True,
    type=click.IntRange(min=1),
    help="Worker processes.",
)
@click.option(
    "--pool",
    default="prefork",
    show_default=True,
    type=click.Choice(["prefork", "solo", "threads"]),
    help="Celery pool.",
)
@click.option(
    "--loglevel",
    "-l",
    default="INFO",
    show_default=True,
    help="Log level of the worker and its turns (DEBUG, INFO, WARNING, ERROR).",
)
@click.option(
    "--heartbeat-file",
    envvar="INTERLOCK_HEARTBEAT_FILE",
    help="File touched every 5 s from the worker's own loop while it serves (for health "
    "checks: `interlock health --heartbeat-file`). [env: INTERLOCK_HEARTBEAT_FILE]",
)
@burst_option
@idle_option
@clear_errors
def worker(
    app: str | None,
    broker: str | None,
    store: str | None,
    concurrency: int,
    pool: str,
    loglevel: str,
    heartbeat_file: str | None,
    burst: bool,
    idle: float,
) -> None:
    """Run a Celery worker for `interlock.run_turn` (a real `celery worker` process).

    With --burst it runs the turns queued, then exits once `interlock.turns` has been
    empty (and the worker idle) for --idle seconds: for tests and batch jobs."""
    from .burst import BURST_ENV
    from .loader import load_registry

    settings = Settings.from_env(
        app=app, broker_url=broker, store_url=store, heartbeat_file=heartbeat_file
    )
    load_registry(settings.app)  # fail here, clearly, rather than inside Celery
    emit(
        {
            "worker": "starting",
            "app": settings.app,
            "broker": redact_url(settings.broker_url),
            "store": redact_url(settings.store_url),
            "concurrency": concurrency,
            "pool": pool,
            "burst": burst,
        }
    )
    sys.stdout.flush()
    argv = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "workers.celery_app:app",
        "worker",
        "-Q",
        "interlock.turns",
        "-c",
        str(concurrency),
        "-P",
        pool,
        "-l",
        loglevel,
        "-n",
        f"interlock-{uuid.uuid4().hex[:8]}@%h",
        "--without-gossip",
        "--without-mingle",
    ]
    env = {**os.environ, **settings.to_env()}
    env.pop(BURST_ENV, None)
    if burst:
        env[BURST_ENV] = str(idle)
    os.execve(sys.executable, argv, env)


@main.command(
    "resume-consumer", short_help="Run the resume consumer: decisions in, resumed turns out."
)
@app_option
@broker_option
@store_option
@click.option(
    "--heartbeat-file",
    envvar="INTERLOCK_HEARTBEAT_FILE",
    help="File touched while the consumer serves (for health checks). "
    "[env: INTERLOCK_HEARTBEAT_FILE]",
)
@burst_option
@idle_option
@clear_errors
def resume_consumer(
    app: str | None,
    broker: str | None,
    store: str | None,
    heartbeat_file: str | None,
    burst: bool,
    idle: float,
) -> None:
    """Run the resume consumer: decisions in, resumed turns out.

    With --burst it handles the decisions queued, then exits once none has come for
    --idle seconds, printing how many it handled."""
    import logging

    from .app import create_app
    from .burst import BURST_CONNECT_RETRIES, drain
    from .consumer import ResumeConsumer, StopRequested
    from .maintenance import Maintenance

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    settings = Settings.from_env(
        app=app, broker_url=broker, store_url=store, heartbeat_file=heartbeat_file
    )
    celery_app = create_app(settings)
    consumer = ResumeConsumer(celery_app, heartbeat_file=settings.heartbeat_file)
    rt = consumer.rt
    rt.registry  # noqa: B018 - fail early on a bad --app
    maintenance = Maintenance(rt)
    maintenance.start(settings.relay_interval)  # at start-up, then periodically
    signal.signal(signal.SIGTERM, lambda *_: setattr(consumer, "should_stop", True))
    emit(
        {
            "resume_consumer": "starting",
            "app": settings.app,
            "broker": redact_url(settings.broker_url),
            "store": redact_url(settings.store_url),
            "burst": burst,
        }
    )
    sys.stdout.flush()
    try:
        if burst:
            # A batch job should not wait for a broker that is not there: a few
            # attempts (about 12 s), then UNAVAILABLE. Served, it retries for ever.
            consumer.connect_max_retries = BURST_CONNECT_RETRIES
            with contextlib.suppress(StopRequested):  # stopped before the broker answered
                drain(consumer, idle)
            emit({"resume_consumer": "drained", "handled": consumer.handled})
        else:
            consumer.run()
    finally:
        maintenance.stop()
        rt.close()


# -- one-shot commands -------------------------------------------------------------------


@main.command(short_help="Enqueue a turn (or a file of them).")
@app_option
@broker_option
@store_option
@click.option("--agent", "agent_name", required=True, help="Agent name in the registry.")
@click.option("--text", help="The user's message (or give --file).")
@click.option(
    "--file",
    "turn_file",
    type=click.File("r", encoding="utf-8"),
    help="Submit one turn per line of this file ('-': standard input): the line is the "
    'message, or a JSON object {"text": ..., "session_id": ...}. Every line is checked '
    "before any turn is sent.",
)
@click.option("--session", "session_id", help="Continue this session (default: a new one).")
@wait_option
@timeout_option
@clear_errors
def submit(
    app: str | None,
    broker: str | None,
    store: str | None,
    agent_name: str,
    text: str | None,
    turn_file: TextIO | None,
    session_id: str | None,
    wait: bool,
    timeout: float,
) -> None:
    """Enqueue a turn; prints {"turn_id", "session_id"}.

    With --wait, then prints the event that ends the turn: turn.interrupted (with the
    resume_token that `interlock decide` needs), turn.completed, or turn.failed (exit 1).

    With --file, one turn per line, each printed with its "line" number once sent; with
    --wait, then the event that ends each one, as they come (exit 1 if any failed)."""
    from .app import create_app, runtime_of
    from .turn_file import FileTurn, read_turns

    if text is None and turn_file is None:
        raise click.UsageError("give the message with --text, or a file of them with --file")
    if text is not None and turn_file is not None:
        raise click.UsageError("give --text or --file, not both")
    if text is not None and not text.strip():
        raise click.BadParameter("the message is empty", param_hint="--text")
    if turn_file is not None and session_id is not None:
        raise click.UsageError(
            '--session goes with --text; in --file, give a line {"text", "session_id"}'
        )
    if turn_file is not None:
        turns = read_turns(turn_file, name=turn_file.name)
    else:
        assert text is not None
        turns = [FileTurn(0, text, session_id)]
    settings = settings_of(app, broker, store)
    celery_app = create_app(settings)
    runtime_of(celery_app).registry.lookup_agent(agent_name)
    waiter = _Waiter(settings, timeout) if wait else None
    try:
        sent = _send_turns(celery_app, agent_name, turns, batch=turn_file is not None)
        if waiter is not None and turn_file is None:
            waiter.turn_event(sent[0])
        elif waiter is not None:
            waiter.turn_events(sent)
    finally:
        if waiter is not None:
            waiter.close()


def _send_turns(
    celery_app: Celery, agent_name: str, turns: list[FileTurn], *, batch: bool
) -> list[str]:
    """Enqueue each turn, printing it once sent (with its line in a batch); the turn ids.
    A batch reports its progress on stderr."""
    from .app import send_turn
    from .turns import new_turn_request

    sent: list[str] = []
    for turn in turns:
        session_id = turn.session_id or str(uuid.uuid4())
        request = new_turn_request(
            agent_name,
            AgentInput(message=Message(role="user", content=[Part(text=turn.text)])),
            session_id=session_id,
        )
        send_turn(celery_app, request)
        sent.append(request.turn_id)
        line = {"line": turn.line} if batch else {}
        emit({"turn_id": request.turn_id, "session_id": session_id, **line})
        if batch and (len(sent) % PROGRESS_EVERY == 0 or len(sent) == len(turns)):
            click.echo(f"submitted {len(sent)} of {len(turns)} turns", err=True)
    return sent


@main.command(short_help="List the open interrupts.")
@store_option
@click.option("--session", "session_id", help="Only this session.")
@click.option(
    "--limit", default=100, show_default=True, type=click.IntRange(min=1), help="At most this many."
)
@clear_errors
def pending(store: str | None, session_id: str | None, limit: int) -> None:
    """List the open interrupts, one JSON line each (newest first)."""
    from interlock import FinishReason, SnapshotStatus

    url = settings_of(store=store).store_url
    missing = missing_sqlite_file(url)
    if missing is not None:  # nothing has run on it: nothing waits (and none is made)
        click.echo(f"no open interrupts: no store at {missing} yet", err=True)
        return
    sql = read_store(url)
    try:
        snaps = sql.list_snapshots(
            session_id=session_id,
            status=SnapshotStatus.COMPLETED,
            finish_reason=FinishReason.INTERRUPTED,
            claimed=False,
            limit=limit,
        )
        for snap in snaps:
            message = snap.last_model_message
            emit(
                {
                    "snapshot_id": snap.snapshot_id,
                    "session_id": snap.session_id,
                    "agent": snap.agent,
                    "created_at": snap.created_at.isoformat(),
                    "expires_at": snap.expires_at.isoformat() if snap.expires_at else None,
                    "interrupts": [
                        {
                            "name": p.tool_request.name,
                            "ref": p.tool_request.ref,
                            "input": p.tool_request.input,
                            "payload": p.meta("interrupt"),
                        }
                        for p in (message.interrupts if message else [])
                        if p.tool_request
                    ],
                }
            )
        if not snaps:
            click.echo("no open interrupts", err=True)
    finally:
        sql.dispose()


@main.command(short_help="Answer a paused turn: approve, deny or respond.")
@click.argument("snapshot_id")
@broker_option
@store_option
@click.option(
    "--token",
    "resume_token",
    envvar="INTERLOCK_RESUME_TOKEN",
    required=True,
    help="The resume_token of the turn.interrupted event. [env: INTERLOCK_RESUME_TOKEN]",
)
@click.option(
    "--approve",
    is_flag=True,
    help='Restart each interrupt with {"approved": true} (a call that tool_approval holds: '
    "run it).",
)
@click.option(
    "--deny",
    is_flag=True,
    help='Restart each interrupt with {"approved": false} (a call that tool_approval holds: '
    "do not run it; the model reads --feedback as the reason).",
)
@click.option(
    "--respond",
    "respond_json",
    metavar="JSON",
    help="Respond to each interrupt with this tool output (the tool does not run).",
)
@click.option(
    "--ref",
    "refs",
    multiple=True,
    help="Answer this interrupt (repeatable). Default: every pending one, read from the store.",
)
@click.option("--feedback", default=None, help="Feedback sent with --approve/--deny.")
@click.option("--reviewer", default=None, help="Who decides (kept in the audit trail).")
@wait_option
@timeout_option
@clear_errors
def decide(
    snapshot_id: str,
    broker: str | None,
    store: str | None,
    resume_token: str,
    approve: bool,
    deny: bool,
    respond_json: str | None,
    refs: tuple[str, ...],
    feedback: str | None,
    reviewer: str | None,
    wait: bool,
    timeout: float,
) -> None:
    """Publish a decision on a paused turn; prints {"decision_id", "snapshot_id", "refs"}.

    The resume consumer checks it and publishes decision.accepted or decision.rejected.
    With --wait, then prints that outcome (a rejection exits 1) and, once accepted, the
    event that ends the resumed turn."""
    from events.publisher import Publisher
    from interlock import approve as approve_call
    from interlock import deny as deny_call
    from interlock import is_approval_gate
    from interlock.resume import pending_interrupts
    from schemas import Decision, RespondEntry, RestartEntry

    from .decisions import resume_turn_id

    if [approve, deny, respond_json is not None].count(True) != 1:
        raise click.UsageError("give exactly one of --approve, --deny, --respond JSON")
    verdict = "approve" if approve else "deny"
    output: Any = None
    if respond_json is not None:
        try:
            output = json.loads(respond_json)
        except ValueError as exc:
            raise click.BadParameter(f"not JSON: {exc}", param_hint="--respond") from None
    settings = settings_of(broker=broker, store=store)
    sql = read_store(settings.store_url)
    try:
        snap = sql.get_snapshot(snapshot_id)
    finally:
        sql.dispose()
    if snap is None:
        raise StatusError(Status.NOT_FOUND, f"snapshot {snapshot_id} not found in the store")
    pending = {
        p.tool_request.ref: p
        for p in pending_interrupts(snap.messages)
        if p.tool_request is not None and p.tool_request.ref is not None
    }
    names = {ref: p.tool_request.name for ref, p in pending.items() if p.tool_request}
    wanted = list(refs) or list(names)
    if not wanted:
        raise StatusError(
            Status.FAILED_PRECONDITION, f"snapshot {snapshot_id} has no pending interrupt"
        )
    unknown = [ref for ref in wanted if ref not in names]
    if unknown:  # refused here, before anything is sent
        raise StatusError(
            Status.INVALID_ARGUMENT,
            f"--ref {unknown[0]} is no pending interrupt of snapshot {snapshot_id} "
            f"(pending: {', '.join(names)})",
        )
    respond_entries: list[RespondEntry | Part] = []
    restart_entries: list[RestartEntry | Part] = []
    for ref in wanted:
        name = names.get(ref, "?")
        part = pending.get(ref)
        if respond_json is not None:
            respond_entries.append(RespondEntry(name=name, ref=ref, output=output))
        elif part is not None and is_approval_gate(part):
            # a call `tool_approval` holds: approve runs it, deny tells the model why not
            if verdict == "approve":
                restart_entries.append(approve_call(part))
            else:
                respond_entries.append(deny_call(part, feedback or "denied by reviewer"))
        else:
            resumed: dict[str, Any] = {"approved": verdict == "approve"}
            if feedback:
                resumed["feedback"] = feedback
            restart_entries.append(RestartEntry(name=name, ref=ref, resumed=resumed))
    decision_id = str(uuid.uuid4())
    decision = Decision(
        decision_id=decision_id,
        snapshot_id=snapshot_id,
        resume_token=resume_token,
        reviewer=reviewer,
        respond=respond_entries,
        restart=restart_entries,
    )
    resumed_turn = resume_turn_id(decision_id)
    ends = ("turn.interrupted", "turn.completed", "turn.failed")
    waiter = (
        _Waiter(settings, timeout, keep=lambda e: e.type in ends and e.turn_id == resumed_turn)
        if wait
        else None
    )
    try:
        with Connection(
            settings.broker_url,
            transport=settings.broker_transport,
            transport_options=settings.transport_options,
        ) as conn:
            Publisher(conn, timeout=timeout).publish_decision(decision)
        emit({"decision_id": decision_id, "snapshot_id": snapshot_id, "refs": wanted})
        if waiter is None:
            return
        outcome = waiter.next(
            f"the outcome of decision {decision_id}",
            lambda e: e.type.startswith("decision.") and e.decision_id == decision_id,
        )
        if outcome.type == "decision.rejected":
            raise StatusError(outcome.error.status, f"decision rejected: {outcome.error.message}")
        waiter.turn_event(resumed_turn)
    finally:
        if waiter is not None:
            waiter.close()


@main.command(short_help="The banking agent end to end; no server needed.")
@click.option("--approve", is_flag=True, help="Approve without asking.")
@click.option("--deny", is_flag=True, help="Deny without asking.")
@click.option("--text", default=DEMO_TEXT, show_default=True, help="What the user asks.")
@click.option(
    "--broker",
    default=None,
    help="Run against a running worker and resume consumer on this broker "
    "(default: everything in this process, no server needed).",
)
@click.option(
    "--store",
    default=None,
    help="Store URL: with --broker, the one the worker uses; without it, where the demo's "
    "own store is kept (default: a temporary SQLite file).",
)
@click.option("--in-process", is_flag=True, help="Skip the queues: call the agent directly.")
@click.option(
    "--timeout",
    default=60.0,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    help="Seconds to wait for each hop.",
)
@click.option(
    "--model",
    default=None,
    metavar="PROVIDER/MODEL",
    help="Run the banking agent on a real model: openai/gpt-4o-mini, "
    "googleai/gemini-flash-latest, anthropic/claude-haiku-4-5, ollama/llama3.1 "
    "(keys from OPENAI_API_KEY, GEMINI_API_KEY, ANTHROPIC_API_KEY; see docs/models.md). "
    "Default: the scripted model. With --broker, start the worker with "
    "INTERLOCK_BANKING_MODEL=PROVIDER/MODEL instead.",
)
@clear_errors
def demo(
    approve: bool,
    deny: bool,
    text: str,
    broker: str | None,
    store: str | None,
    in_process: bool,
    timeout: float,
    model: str | None,
) -> None:
    """Run the banking agent end to end: it pauses for approval, a human answers, it
    resumes. With no --broker, one process holds a broker, a worker, the resume consumer
    and a SQLite store."""
    from .demo import ask_human, run_in_process, run_on_queues

    if approve and deny:
        raise click.UsageError("give --approve or --deny, not both")
    decide_fn = ask_human(True if approve else False if deny else None)
    if in_process:
        out = run_in_process(text, decide_fn, model=model)
        emit({"finish_reason": out.finish_reason.value, "text": out.text})
        return
    result = run_on_queues(
        text, decide_fn, broker=broker, store=store, timeout=timeout, model=model
    )
    emit(result)
    if result.get("type") != "turn.completed":
        error = result.get("error") or {}
        raise StatusError(
            error.get("status") or Status.UNKNOWN,
            f"the demo ended with {result.get('type')}"
            + (f": {error['message']}" if error.get("message") else ""),
        )


@main.command(short_help="Create the store's tables (once per deployment).")
@store_option
@clear_errors
def migrate(store: str | None) -> None:
    """Create the store's tables if missing: snapshots, messages, outbox, decisions, turn
    journal and turn leases; erase resume tokens that an older release kept in the
    decision log."""
    from events.decision_log import DecisionLog
    from events.outbox import Outbox
    from interlock import SqlSessionStore
    from interlock.stores.sql_journal import SqlTurnJournal

    settings = settings_of(store=store)
    sql = SqlSessionStore(settings.store_url)
    try:
        Outbox(sql).close()
        erased = DecisionLog(sql).erase_tokens()
        SqlTurnJournal(sql)
        from sqlalchemy import inspect

        tables = sorted(
            t for t in inspect(sql.engine).get_table_names() if t.startswith("interlock_")
        )
    finally:
        sql.dispose()
    emit({"store": redact_url(settings.store_url), "tables": tables, "tokens_erased": erased})


@main.command(short_help="Check the broker, the store and a process's heartbeat.")
@broker_option
@store_option
@click.option(
    "--heartbeat-file",
    help="Also require this file (a worker's or a resume consumer's --heartbeat-file) to "
    "have been touched recently.",
)
@click.option("--max-age", default=30.0, show_default=True, help="Seconds, with --heartbeat-file.")
@clear_errors
def health(
    broker: str | None, store: str | None, heartbeat_file: str | None, max_age: float
) -> None:
    """Check the broker, the store and (optionally) a heartbeat file; exit 1 if any fails."""
    import time
    from pathlib import Path

    from sqlalchemy import text

    from interlock.stores.sql import make_engine

    settings = settings_of(broker=broker, store=store)
    report: dict[str, Any] = {}
    try:
        with Connection(settings.broker_url, connect_timeout=5) as conn:
            conn.ensure_connection(max_retries=1)
        report["broker"] = "ok"
    except Exception as exc:
        report["broker"] = f"error: {exc}"
    try:
        missing = missing_sqlite_file(settings.store_url)
        if missing is not None:  # connecting would make it: usable if it can be made
            if not os.access(missing.parent, os.W_OK):
                raise StatusError(
                    Status.NOT_FOUND, f"no store at {missing}, and {missing.parent} is not writable"
                )
        else:
            engine = make_engine(settings.store_url)  # the store's own URL options understood
            with engine.connect() as db:
                db.execute(text("SELECT 1"))
            engine.dispose()
        report["store"] = "ok"
    except Exception as exc:
        report["store"] = f"error: {exc}"
    if heartbeat_file:
        path = Path(heartbeat_file)
        age = time.time() - path.stat().st_mtime if path.exists() else None
        report["heartbeat_age"] = round(age, 1) if age is not None else None
        report["heartbeat"] = "ok" if age is not None and age <= max_age else "stale"
    emit(report)
    if any(v != "ok" for k, v in report.items() if k != "heartbeat_age"):
        sys.exit(1)


@main.command(short_help="Write or check the JSON Schemas of the queue messages.")
@click.option(
    "--out",
    "out_dir",
    default="docs/schemas",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Where the .schema.json files go.",
)
@click.option("--check", is_flag=True, help="Exit 1 if the files differ from the models.")
def schemas(out_dir: str, check: bool) -> None:
    """Write (or --check) the JSON Schema of every queue message."""
    from pathlib import Path

    from schemas.json_schema import message_schemas, render

    folder = Path(out_dir)
    stale, missing = [], []
    for name, schema in sorted(message_schemas().items()):
        path = folder / name
        text = render(schema)
        if check and not path.exists():
            missing.append(str(path))
        elif check:
            if path.read_text() != text:
                stale.append(str(path))
        else:
            folder.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    if missing:
        fail(f"no schema files in {folder} (run `make schemas`): missing " + ", ".join(missing))
    if stale:
        fail("schemas are out of date (run `make schemas`): " + ", ".join(stale))
    emit({"schemas": str(folder), "checked" if check else "written": len(message_schemas())})


@main.command(short_help="A session's interrupts, decisions and outcomes.")
@click.argument("session_id")
@store_option
@clear_errors
def audit(session_id: str, store: str | None) -> None:
    """Print a session's history of interrupts, decisions and outcomes, one JSON line
    each, oldest first."""
    from events.decision_log import DecisionLog

    from .audit import session_history

    sql = read_store(settings_of(store=store).store_url)
    try:
        entries = session_history(sql, DecisionLog(sql), session_id)
    finally:
        sql.dispose()
    if not entries:
        raise StatusError(Status.NOT_FOUND, f"no session {session_id} in the store")
    for entry in entries:
        emit(entry)
