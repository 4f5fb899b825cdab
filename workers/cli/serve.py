"""The long-running commands: `interlock worker` and `interlock resume-consumer`."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import uuid
from dataclasses import replace
from typing import TYPE_CHECKING

import click

from ..settings import OUTBOX_RETENTION, Settings, redact_url
from .base import (
    app_option,
    broker_option,
    broker_refusal,
    burst_option,
    clear_errors,
    emit,
    error_line,
    idle_option,
    reach_store,
    settings_of,
    shared_broker,
    shared_store,
    store_option,
    unreachable,
)

if TYPE_CHECKING:
    from kombu.connection import Connection

    from interlock import Interlock

__all__ = ["resume_consumer", "worker"]


# -- long-running processes ---------------------------------------------------------------


def _check_store(url: str, burst: bool, who: str, seconds: float) -> None:
    """Open the store once before serving. In burst mode (a batch job) a store that
    cannot be reached or used is one line (UNAVAILABLE), at once. Served, the process
    starts anyway (the store may come up later) but says so on stderr, where a wrong
    URL (a database that does not exist, say) would otherwise show only when a turn or
    decision fails. A store reached whose tables are not Interlock's (lacking columns,
    as `interlock migrate` checks) ends the process either way (FAILED_PRECONDITION):
    waiting cannot mend them, and every turn or decision would fail on them. A server
    that takes the connection and does not answer within `seconds` (the server timeout)
    counts as one that cannot be reached, for this check only."""
    from interlock import Status

    try:
        reach_store(url, seconds)
    except Exception as exc:
        said = error_line(exc)
        if burst or said is None or said[0] is Status.FAILED_PRECONDITION:
            raise
        check = "" if "check --store" in said[1] else ": check --store or INTERLOCK_STORE_URL"
        click.echo(
            f"warning: {said[1]}; the {who} starts anyway, and what it serves waits and is "
            f"retried while the store cannot be used{check}",
            err=True,
        )


_DEFAULTS = Settings()


def _seconds(value: float) -> str:
    return "a week" if value == OUTBOX_RETENTION else f"{value:g} s"


_ENV_SHARED = (
    "INTERLOCK_SECRET (signs client-managed states; default: a random one per process), "
    f"INTERLOCK_VISIBILITY_TIMEOUT ({_seconds(_DEFAULTS.visibility_timeout)}: a message "
    "fetched and not acked by then is delivered again; set it alike for every client of "
    f"the Redis database), INTERLOCK_TURN_LEASE ({_seconds(_DEFAULTS.turn_lease)}: a "
    "running turn's lease, renewed every third)"
)

_WORKER_EPILOG = f"Also read from the environment: {_ENV_SHARED}. See docs/queues.md, Settings."

_CONSUMER_EPILOG = (
    f"Also read from the environment: {_ENV_SHARED}, INTERLOCK_RELAY_INTERVAL "
    f"({_seconds(_DEFAULTS.relay_interval)} between sweeps of the outbox and the "
    f"deadlines), INTERLOCK_OUTBOX_RETENTION ({_seconds(_DEFAULTS.outbox_retention)}: "
    "how long a published event's outbox row is kept). See docs/queues.md, Settings."
)


@click.command(short_help="Run a Celery worker for interlock.run_turn.", epilog=_WORKER_EPILOG)
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
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"], case_sensitive=False),
    help="Log level of the worker and its turns.",
)
@click.option(
    "--heartbeat-file",
    envvar="INTERLOCK_HEARTBEAT_FILE",
    help="File touched every 5 s from the worker's own loop while it serves (for health "
    "checks: `interlock health --heartbeat-file`). [env: INTERLOCK_HEARTBEAT_FILE]",
)
@click.option(
    "--task-events",
    "-E",
    is_flag=True,
    help="Send Celery's task events (task-received, task-succeeded, ...) for monitors such "
    "as Flower, as `celery worker -E` does. Off by default: they cost a publish per step.",
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
    task_events: bool,
    burst: bool,
    idle: float,
) -> None:
    """Run a Celery worker for `interlock.run_turn` (a real `celery worker` process).

    With --burst it runs the turns queued, then exits once `interlock.turns` has been
    empty (and the worker idle) for --idle seconds: for tests and batch jobs."""
    from ..burst import BURST_ENV
    from ..loader import load_registry
    from ..worker_report import REPORT_FD_ENV

    settings = shared_store(
        shared_broker(settings_of(app, broker, store, heartbeat_file, one_shot=False))
    )
    registry = load_registry(settings.app)  # fail here, clearly, rather than inside Celery
    _check_heartbeat(settings)
    if burst:  # a batch job: no broker or store, one line (UNAVAILABLE), turns kept queued
        _reach_broker(settings)
    _check_store(settings.store_url, burst, "worker", settings.server_timeout)
    _declare_first(settings, burst, "interlock.worker")
    # From the "starting" line on, Ctrl-C and SIGTERM wait for the Celery process this
    # one becomes (the mask survives the exec): it ends on them with the worker's last
    # line, as it does once serving (`workers.celery_main`).
    signal.pthread_sigmask(signal.SIG_BLOCK, _HANDED_OVER)
    emit(
        {
            "worker": "starting",
            "app": settings.app,
            "agents": _agents(registry, settings.app, "interlock.worker"),
            "broker": redact_url(settings.broker_url),
            "store": redact_url(settings.store_url),
            "concurrency": 1 if pool == "solo" else concurrency,  # solo runs one at a time
            "pool": pool,
            "task_events": task_events,
            "burst": burst,
        }
    )
    sys.stdout.flush()
    # Celery prints its banner and shutdown lines on stdout: they go with its log, so
    # that stdout holds JSON lines only, as for every command; the worker's last line
    # goes to a copy of stdout kept for it.
    report = os.dup(sys.stdout.fileno())
    os.set_inheritable(report, True)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    argv = [
        sys.executable,
        "-m",
        "workers.celery_main",  # Celery's command line; Ctrl-C and SIGTERM end it cleanly
        "-A",
        "workers.celery_app:app",
        "worker",
        "-Q",
        "interlock.turns",
        "-c",
        str(1 if pool == "solo" else concurrency),  # solo runs one at a time
        "-P",
        pool,
        "-l",
        loglevel,
        "-n",
        f"interlock-{uuid.uuid4().hex[:8]}@%h",
        "--without-gossip",
        "--without-mingle",
        *(["-E"] if task_events else []),
    ]
    env = {**os.environ, **settings.to_env()}
    env.pop(BURST_ENV, None)
    env[REPORT_FD_ENV] = str(report)
    if burst:
        env[BURST_ENV] = str(idle)
    try:
        os.execve(sys.executable, argv, env)
    finally:  # reached only when the exec failed
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _HANDED_OVER)


_HANDED_OVER = frozenset({signal.SIGINT, signal.SIGTERM})
"""The signals the worker's Celery process handles from its first moment."""


def _check_heartbeat(settings: Settings) -> None:
    """A heartbeat file that cannot be touched at start-up (its folder is missing, say)
    is a wrong setting: INVALID_ARGUMENT now, not a health check failing later."""
    from pathlib import Path

    from interlock import Status, StatusError

    from ..heartbeat import touch

    if settings.heartbeat_file:
        failed = touch(Path(settings.heartbeat_file))
        if failed is not None:
            raise StatusError(
                Status.INVALID_ARGUMENT,
                f"{failed}: check --heartbeat-file or INTERLOCK_HEARTBEAT_FILE",
            )


def _declare_first(settings: Settings, burst: bool, logger: str) -> None:
    """Declare the protocol's exchanges and queues before Celery starts, where the
    broker answers: one it holds declared otherwise ends the command here
    (FAILED_PRECONDITION), not a worker that runs and can publish no event. A broker
    that cannot be reached yet (the connection refused) is left to Celery, which waits
    for it (and the worker declares them once ready); one that refuses the login or the
    vhost ends the command (UNAUTHENTICATED, PERMISSION_DENIED), and so does one that
    does not answer within the server timeout (UNAVAILABLE, `_no_answer`). One that
    answers and refuses the declarations for now (Redis out of memory or read-only) is
    waited for as well, said in one line; in burst mode it ends the command
    (UNAVAILABLE)."""
    from events.publisher import TopologyConflict, declare
    from interlock import Status, StatusError
    from interlock.stores.failures import first_line as one_line

    with _startup_connection(settings) as conn:
        try:
            conn.ensure_connection(
                max_retries=1, interval_start=0.5, timeout=settings.server_timeout
            )
        except Exception as exc:
            refusal = broker_refusal(exc)  # a wrong password is not waited out
            if refusal is not None:
                raise StatusError(*refusal) from exc
            _no_answer(settings, exc)
            return
        try:
            declare(conn)
        except TopologyConflict as exc:
            raise StatusError(Status.FAILED_PRECONDITION, str(exc)) from exc
        except (*conn.connection_errors, *conn.channel_errors) as exc:
            refusal = broker_refusal(exc)
            if refusal is not None:
                raise StatusError(*refusal) from exc
            _no_answer(settings, exc)
            said = f"the broker refuses Interlock's declarations: {one_line(exc).rstrip('.')}"
            if burst:  # a batch job does not wait for the operator
                raise StatusError(Status.UNAVAILABLE, said) from exc
            line = f"{said}; starting, to try again until it takes them"
            click.echo(_log_line(logger, logging.WARNING, line), err=True)


def _startup_connection(settings: Settings) -> Connection:
    """A broker connection for the checks before serving, bounded as a command run by
    hand is (`Settings.one_shot`: on Redis, a socket timeout of `server_timeout` on
    connecting and on each reply). It is closed before serving starts: the connections
    that serve (Celery's, the consumer's) keep no such timeout, so their long blocking
    reads and their reconnecting through later outages are as before."""
    return replace(settings, one_shot=True).connection()


def _no_answer(settings: Settings, exc: BaseException) -> None:
    """UNAVAILABLE, naming the broker, when `exc` says that it did not answer within the
    server timeout (it took the connection and said nothing, or never took it): a
    process that started so would wait on it for good (a serving connection has no
    timeout on its replies), where it ends now, for a supervisor to start it again."""
    from interlock import Status, StatusError
    from interlock.stores.failures import first_line as one_line

    if not _timed_out(exc):
        return
    raise StatusError(
        Status.UNAVAILABLE,
        f"cannot reach the broker {redact_url(settings.broker_url)}: {one_line(exc)}: no "
        f"answer within {settings.server_timeout:g} s (INTERLOCK_SERVER_TIMEOUT)",
    ) from exc


def _timed_out(exc: BaseException) -> bool:
    """Whether `exc`, or an error it was raised from, is a timeout of the broker's
    client (redis-py's, or the socket's for py-amqp)."""
    from redis.exceptions import TimeoutError as RedisTimeout

    seen: BaseException | None = exc
    for _ in range(8):  # kombu wraps the client's error in its own
        if seen is None:
            return False
        if isinstance(seen, RedisTimeout | TimeoutError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


_LOG_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"
"""The resume consumer's log lines, and those the worker prints before Celery logs."""


def _log_line(name: str, level: int, message: str) -> str:
    """`message` as a line of _LOG_FORMAT (a timestamp, the logger, the level), for what
    is said before any logging is set up."""
    record = logging.LogRecord(name, level, __file__, 0, message, None, None)
    return logging.Formatter(_LOG_FORMAT).format(record)


def _agents(registry: Interlock, app: str | None, logger: str) -> list[str]:
    """The names of the agents `registry` defines, for the "starting" line; none is
    warned of on stderr: every turn and decision would be refused NOT_FOUND."""
    names = sorted(registry.agents)
    if not names:
        said = (
            f"the app {app} defines no agent: every turn and decision will be refused "
            "(NOT_FOUND); check --app or INTERLOCK_APP"
        )
        click.echo(_log_line(logger, logging.WARNING, said), err=True)
    return names


def _reach_broker(settings: Settings) -> None:
    """Connect once, with burst mode's few attempts (2, 4 and 6 s apart); a broker
    that cannot be reached raises kombu's OperationalError, one that refuses the login
    or the vhost, or does not answer within the server timeout, a StatusError at
    once."""
    from interlock import StatusError

    from ..burst import BURST_CONNECT_RETRIES

    with _startup_connection(settings) as conn:

        def retrying(exc: Exception, interval: float) -> None:
            refusal = broker_refusal(exc)  # a wrong password is not waited out
            if refusal is not None:
                raise StatusError(*refusal) from exc
            _no_answer(settings, exc)  # one wait, not one a try
            said = f"cannot reach the broker ({exc}); trying again in {interval:.0f} s"
            click.echo(_log_line("interlock.worker", logging.WARNING, said), err=True)

        conn.ensure_connection(
            retrying,
            max_retries=BURST_CONNECT_RETRIES,
            interval_start=2,
            interval_step=2,
            interval_max=6,
        )


@click.command(
    "resume-consumer",
    short_help="Run the resume consumer: decisions in, resumed turns out.",
    epilog=_CONSUMER_EPILOG,
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
    from interlock import Status, StatusError

    from ..app import create_app
    from ..burst import BURST_CONNECT_RETRIES, drain
    from ..consumer import ResumeConsumer, StopRequested
    from ..maintenance import Maintenance

    logging.basicConfig(level=logging.INFO, format=_LOG_FORMAT)
    settings = shared_store(
        shared_broker(settings_of(app, broker, store, heartbeat_file, one_shot=False))
    )
    celery_app = create_app(settings)
    consumer = ResumeConsumer(celery_app, heartbeat_file=settings.heartbeat_file)
    rt = consumer.rt
    rt.registry  # noqa: B018 - fail early on a bad --app
    _check_heartbeat(settings)
    _check_store(settings.store_url, burst, "resume consumer", settings.server_timeout)
    _declare_first(settings, burst, "interlock.consumer")
    maintenance = Maintenance(rt)
    maintenance.start(settings.relay_interval)  # at start-up, then periodically

    stopped: list[int] = []

    def stop(signum: int, _frame: object) -> None:
        """SIGTERM or a first Ctrl-C: finish the decision in hand, then stop (exit 0, as
        the worker does); a second Ctrl-C interrupts at once."""
        stopped.append(signum)
        consumer.should_stop = True
        if signum == signal.SIGINT:
            signal.signal(signal.SIGINT, signal.default_int_handler)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    emit(
        {
            "resume_consumer": "starting",
            "app": settings.app,
            "agents": _agents(rt.registry, settings.app, "interlock.consumer"),
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
            consumer.give_up_after = BURST_CONNECT_RETRIES  # the same for the store
            with contextlib.suppress(StopRequested):  # stopped before the broker answered
                drain(consumer, idle)
            if consumer.gave_up is not None:
                failing = consumer.gave_up
                reason = unreachable(failing) or f"{type(failing).__name__}: {failing}"
                raise StatusError(
                    Status.UNAVAILABLE,
                    f"{reason} ({consumer.failing} tries in a row failed, each decision "
                    f"requeued, and still queued; {consumer.handled} were handled)",
                )
            ended = "stopped" if stopped else "drained"
            emit({"resume_consumer": ended, "handled": consumer.handled})
        else:
            consumer.run()
            emit({"resume_consumer": "stopped", "handled": consumer.handled})
    finally:
        maintenance.stop()
        rt.close()
