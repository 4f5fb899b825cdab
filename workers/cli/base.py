"""What every `interlock` command shares: the options, the JSON output and the one-line
errors. The runtime, kombu, redis and SQLAlchemy are imported where they are used, here
and in each command's module: a command's `--help` loads none of them."""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, TypeVar

import click

from ..console import Terminated, stop
from ..settings import Settings, one_shot_store_url, redact_url

if TYPE_CHECKING:
    from kombu.connection import Connection
    from sqlalchemy import MetaData

    from interlock import SqlSessionStore, Status

__all__: list[str] = []

EXIT_BROKEN_PIPE = 141
"""The exit code of a command whose output was closed by its reader (128 + SIGPIPE)."""
PROGRESS_EVERY = 100
"""A batch (`submit --file`) reports its progress on stderr every this many turns."""
F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")
READ_PAUSES = (0.2, 0.5, 1.0)
"""Seconds between the tries of a command's read of the store that met a store failure
(`store_read`)."""


def emit(data: dict[str, Any]) -> None:
    """Print one JSON line."""
    click.echo(json.dumps(data, default=str))


def fail(message: str, code: int = 1) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def clear_errors(fn: F) -> F:
    """Turn Interlock errors into a one-line message and exit code 1. A reader that
    closed our output (`| head`) ends the command quietly (exit 141, as SIGPIPE would);
    Ctrl-C ends it with "interrupted" (exit 130), and SIGTERM, where the command is
    `terminable`, with "terminated" (exit 143)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except BrokenPipeError:
            # Nothing more can be printed; keep Python from failing once more at exit.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(EXIT_BROKEN_PIPE)
        except (KeyboardInterrupt, click.exceptions.Abort):  # Abort: Ctrl-C at a prompt
            stop(signal.SIGINT)
        except Terminated:
            stop(signal.SIGTERM)
        except Exception as exc:
            said = error_line(exc)
            if said is None:
                raise
            fail(f"{said[0].value}: {said[1]}")

    return wrapper  # type: ignore[return-value]


def refuse_non_text(values: tuple[tuple[str, Any], ...], consequence: str) -> None:
    """Refuse, before anything is read or sent, an argument (`values`: its name and
    value, a string or JSON) that holds what no text can: a lone surrogate, which is how
    bytes that are no UTF-8 in an argument reach Python, or a NUL character. Neither a
    store nor the resume consumer takes one; `consequence` ends the error line."""
    from interlock import Status, StatusError

    from ..decisions import unstorable

    for name, value in values:
        bad = unstorable(value)
        if bad is not None:
            raise StatusError(Status.INVALID_ARGUMENT, f"{name} contains {bad}{consequence}")


def error_line(exc: Exception) -> tuple[Status, str] | None:
    """The status and one-line message that say `exc`, an Interlock error or one of a
    service that cannot be reached or used; None for any other (a bug: its traceback
    is shown)."""
    from interlock import InterlockError, Status, status_of
    from interlock.stores.failures import is_schema_error

    if isinstance(exc, InterlockError):
        return status_of(exc), getattr(exc, "message", str(exc))
    refusal = broker_refusal(exc)
    if refusal is not None:
        return refusal
    if isinstance(exc, OSError):
        return Status.UNAVAILABLE, str(exc)
    refusal = store_refusal(exc)
    if refusal is not None:
        return refusal
    reason = unreachable(exc)
    if reason is not None and is_schema_error(exc):  # reached: waiting cannot help
        return Status.FAILED_PRECONDITION, reason
    return None if reason is None else (Status.UNAVAILABLE, reason)


_AMQP_METHOD = re.compile(r"^\(\d+, \d+\): ")
"""py-amqp's prefix of an error: the class and method ids of the AMQP method refused."""


def broker_refusal(exc: BaseException) -> tuple[Status, str] | None:
    """The status and line of a broker that answered and refused us (a wrong user or
    password, a vhost that does not exist or that the user may not use, a Redis
    database number the server does not have), found along `exc`'s causes; None for
    anything else. Trying again cannot help: the operator must fix the URL or the
    broker's users."""
    from amqp.exceptions import AccessRefused, NotAllowed
    from redis.exceptions import AuthenticationError, AuthorizationError, NoPermissionError

    from interlock import Status
    from interlock.stores.failures import first_line as one_line

    seen: BaseException | None = exc
    for _ in range(8):  # causes and contexts: kombu wraps some errors, not all
        if seen is None:
            return None
        said = _AMQP_METHOD.sub("", one_line(seen))  # "(0, 0): " names no AMQP method
        if isinstance(seen, AuthenticationError) or (
            isinstance(seen, AccessRefused) and "login" in said.lower()
        ):
            return Status.UNAUTHENTICATED, (
                f"the broker refused the login: {said}; check the user and password "
                "of --broker or INTERLOCK_BROKER_URL"
            )
        if isinstance(seen, AccessRefused | NotAllowed | AuthorizationError | NoPermissionError):
            return Status.PERMISSION_DENIED, (
                f"the broker refused access: {said}; check the vhost (or database) of "
                "--broker or INTERLOCK_BROKER_URL and the user's permissions there"
            )
        if "DB index is out of range" in said:
            return Status.INVALID_ARGUMENT, (
                f"the broker has no such database: {said}; check the number that ends "
                "--broker or INTERLOCK_BROKER_URL (Redis has 16, 0 to 15, unless its "
                "`databases` setting says otherwise)"
            )
        seen = seen.__cause__ or seen.__context__
    return None


_NO_DATABASE = re.compile(r'database "(?P<name>[^"]+)" does not exist')
_NO_LOGIN = re.compile(r'role "[^"]+" does not exist|password authentication failed')


def store_refusal(exc: BaseException) -> tuple[Status, str] | None:
    """The status and line of a PostgreSQL server that answered and refused the store's
    URL (a database that does not exist: NOT_FOUND; an unknown user or a wrong
    password: UNAUTHENTICATED); None for anything else. Trying again cannot help: the
    operator must fix the URL, or make the database."""
    from sqlalchemy.exc import DBAPIError

    from interlock import Status
    from interlock.stores.failures import first_line as one_line

    if not isinstance(exc, DBAPIError):
        return None
    said = one_line(exc)
    where = "" if _STORE_IN_USE.url is None else f" ({redact_url(_STORE_IN_USE.url)})"
    missing = _NO_DATABASE.search(said)
    if missing is not None:
        name = missing["name"]
        return Status.NOT_FOUND, (
            f"the store's database {name!r} does not exist on its server{where}: make it "
            f"(`createdb {name}`, then `interlock migrate`), or check --store or "
            "INTERLOCK_STORE_URL"
        )
    if _NO_LOGIN.search(said):
        return Status.UNAUTHENTICATED, (
            f"the store's server refused the login: {said}{where}; check the user and "
            "password of --store or INTERLOCK_STORE_URL"
        )
    return None


def terminable(fn: F) -> F:
    """While `fn` runs, SIGTERM raises `Terminated` (which `clear_errors` ends with exit
    143) instead of ending the process on the spot, skipping its `finally` blocks; it and
    Ctrl-C wait for the end of a `signals_deferred` block. In the main thread only
    (signals go there); elsewhere `fn` runs as it is. (The console script handles both
    alike while the command line starts: `workers.console`.)"""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if threading.current_thread() is not threading.main_thread():
            return fn(*args, **kwargs)
        previous = {  # one the process was started with ignored stays so (`main`)
            signum: signal.signal(signum, _on_signal)
            for signum in (signal.SIGTERM, signal.SIGINT)
            if signal.getsignal(signum) is not signal.SIG_IGN
        }
        try:
            return fn(*args, **kwargs)
        finally:  # None: a handler not set from Python (the default, as a rule)
            for signum, handler in previous.items():
                signal.signal(signum, signal.SIG_DFL if handler is None else handler)

    wrapper.terminable = True  # type: ignore[attr-defined]  # (`_start_command`)
    return wrapper  # type: ignore[return-value]


class _Deferral:
    on = False
    pending: int | None = None  # the signal that came meanwhile


_DEFERRAL = _Deferral()


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Within, SIGTERM and Ctrl-C (in a `terminable` command) take effect when the block
    ends: raised inside code that makes its own error of any exception (pydantic's
    serializers), they would come out as another error, with a traceback. For short
    steps only: sending one turn."""
    _DEFERRAL.on = True
    try:
        yield
    finally:
        _DEFERRAL.on = False
        signum, _DEFERRAL.pending = _DEFERRAL.pending, None
        if signum is not None:
            _raise_for(signum)


def _on_signal(signum: int, frame: FrameType | None) -> None:
    if _DEFERRAL.on:
        _DEFERRAL.pending = _DEFERRAL.pending or signum
        return
    _raise_for(signum)


def _raise_for(signum: int) -> None:
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Terminated


def unreachable(exc: Exception) -> str | None:
    """One line saying which service cannot be reached or used, when `exc` says so
    (kombu's and SQLAlchemy's errors are no `OSError`)."""
    from kombu.exceptions import OperationalError as BrokerError
    from redis.exceptions import ConnectionError as RedisDown
    from redis.exceptions import ResponseError as RedisSaidNo
    from redis.exceptions import TimeoutError as RedisSlow
    from sqlalchemy.exc import DBAPIError
    from sqlalchemy.exc import OperationalError as StoreError

    from events.publisher import PublishRefused
    from interlock.stores.failures import first_line as one_line
    from interlock.stores.failures import is_schema_error

    if isinstance(exc, PublishRefused):  # reached, and it said no
        return str(exc)
    if isinstance(exc, BrokerError | RedisDown | RedisSlow):  # redis-py's, unwrapped
        return f"cannot reach the broker: {exc}"
    if isinstance(exc, RedisSaidNo):  # reached, and it cannot take it now (full, read-only)
        return f"the broker refused the command: {exc}"
    if isinstance(exc, DBAPIError):
        first = one_line(exc)
        where = "" if _STORE_IN_USE.url is None else f" ({redact_url(_STORE_IN_USE.url)})"
        if is_schema_error(exc):  # SQLite says so as an OperationalError: reached all the same
            return f"cannot use the store: {first}{where}: {NOT_INTERLOCKS_TABLES}"
        if isinstance(exc, StoreError):
            return f"cannot reach the store: {first}{where}"
        # A file that is no database, a table not permitted: the store is unusable.
        return f"cannot use the store: {first}{where}"
    return None


NOT_INTERLOCKS_TABLES = (
    "its tables are not those Interlock makes; run `interlock migrate`, which makes "
    "those missing and names those that lack columns"
)
"""The end of the line of a store whose database lacks a table or a column."""


class _StoreInUse:
    """The store URL of this process's command, once its settings are read: a store's
    error names no URL of its own, and the one-line error should say which store."""

    url: str | None = None


_STORE_IN_USE = _StoreInUse()


def store_read(read: Callable[[], T], within: float) -> T:
    """`read()`, a read of the store, tried again when the store fails (a connection the
    server dropped mid-read, a restart): it changes nothing, so another try is safe. No
    try starts once the tries so far took `within` seconds (the server timeout): a
    server that does not answer is not waited for again. The last failure is raised; a
    table or a column the database lacks at once (`error_line` says FAILED_PRECONDITION,
    pointing at `interlock migrate`): no wait mends it."""
    from interlock.stores.failures import retry_store_failures

    return retry_store_failures(read, READ_PAUSES, within=within)


def read_store(url: str, seconds: float) -> SqlSessionStore:
    """The store at `url`, for a command that only reads it (`pending`, `decide`,
    `audit`): it makes nothing, neither a file nor a table. A SQLite file that does not
    exist is NOT_FOUND. A server that does not answer within `seconds` is UNAVAILABLE
    (`one_shot_store_url`)."""
    from interlock import SqlSessionStore, Status, StatusError

    path = missing_sqlite_file(url)
    if path is not None:
        raise StatusError(
            Status.NOT_FOUND,
            f"no store at {path} ({redact_url(url)}): check --store or INTERLOCK_STORE_URL",
        )
    return SqlSessionStore(one_shot_store_url(url, seconds), create_tables=False)


def store_tables(sql: SqlSessionStore) -> set[str]:
    """The names of the tables the database of `sql` holds."""
    from sqlalchemy import inspect

    return set(inspect(sql.engine).get_table_names())


def no_tables(tables: set[str], url: str) -> str | None:
    """Why the store at `url`, whose database holds `tables` (`store_tables`), holds
    nothing yet (no snapshot table: no worker or `migrate` has run on it), else None."""
    if "interlock_snapshot" in tables:
        return None
    return f"the store at {redact_url(url)} has no Interlock tables (check --store or " + (
        "INTERLOCK_STORE_URL; `interlock migrate` makes them)"
    )


def reach_broker(conn: Connection, within: float) -> None:
    """Connect `conn` with about two seconds of tries, as Celery's `send_task` does for
    `submit`: a command a person runs says at once that the broker cannot be reached
    (UNAVAILABLE) rather than waiting through an outage in silence. No try starts once
    the tries so far took `within` seconds (the server timeout, which bounds each try
    of a `one_shot` connection): a broker that takes the connection and never answers
    is given up on after one try."""
    from events.publisher import RETRY_POLICY

    conn.ensure_connection(
        **{**RETRY_POLICY, "max_retries": 3, "interval_max": 1.0}, timeout=within
    )


def not_in(url: str, empty: str | None) -> str:
    """How a "not found" ends for the store at `url`: why it holds nothing (`empty`, from
    `no_tables`), else which store was read, for a lookup that found no row there."""
    if empty is not None:
        return f": {empty}"
    return f" in the store at {redact_url(url)} (check --store or INTERLOCK_STORE_URL)"


def check_sqlite_folder(url: str) -> None:
    """NOT_FOUND, naming it, when the folder of a SQLite store that is not there yet
    does not exist (SQLite would say only "unable to open database file")."""
    from interlock import Status, StatusError

    path = missing_sqlite_file(url)
    if path is not None and not path.parent.is_dir():
        raise StatusError(
            Status.NOT_FOUND,
            f"no folder {path.parent} for the store {path}: make it, or check --store or "
            "INTERLOCK_STORE_URL",
        )


def reach_store(url: str, seconds: float | None = None) -> None:
    """Open the store at `url` once (making its tables if missing), before a command
    that serves from it starts: a store that cannot be reached or used (a file that is
    no database) raises SQLAlchemy's error, which `clear_errors` says in one line, and
    one whose tables lack columns FAILED_PRECONDITION (`check_columns`), before
    anything is made. `seconds`: a server that does not answer within them is given up
    on (`one_shot_store_url`); None waits as the long-running processes do."""
    from interlock import SqlSessionStore

    check_sqlite_folder(url)
    sql = SqlSessionStore(
        url if seconds is None else one_shot_store_url(url, seconds), create_tables=False
    )
    try:
        check_columns(sql, url)
        sql.create_tables()
    finally:
        sql.dispose()


def interlock_metadata() -> tuple[MetaData, ...]:
    """The tables Interlock makes in a store: the store's, the outbox, the decision log,
    the turn journal and leases."""
    from events.decision_log import decision_metadata
    from events.outbox import outbox_metadata
    from interlock import SqlSessionStore
    from interlock.stores.sql_journal import journal_metadata

    return (SqlSessionStore.metadata, outbox_metadata, decision_metadata, journal_metadata)


def check_columns(sql: SqlSessionStore, url: str) -> None:
    """FAILED_PRECONDITION naming each table of Interlock's (the store's, the outbox,
    the decision log, the turn journal and leases) that the store at `url` holds
    without columns Interlock needs (another program's, or an old one), and the columns
    it lacks: nothing Interlock does there could work. Reads only."""
    from interlock import Status, StatusError

    lacking = sql.lacking_columns(*interlock_metadata())
    if not lacking:
        return
    one = len(lacking) == 1
    raise StatusError(
        Status.FAILED_PRECONDITION,
        f"the store at {redact_url(url)} holds "
        + ("a table" if one else "tables")
        + " named as Interlock's but lacking columns it needs: "
        + "; ".join(f"{name} lacks {', '.join(cols)}" for name, cols in lacking.items())
        + f"; nothing was changed: rename or drop {'it' if one else 'them'}, or "
        "check --store or INTERLOCK_STORE_URL",
    )


def missing_sqlite_file(url: str) -> Path | None:
    """The file of a SQLite store URL when it does not exist (else None)."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    path = parsed.database or ""
    if parsed.get_backend_name() != "sqlite" or path in ("", ":memory:"):
        return None
    return None if path.startswith("file:") or Path(path).exists() else Path(path)


app_option = click.option(
    "--app",
    envvar="INTERLOCK_APP",
    help="Module defining the registry, MODULE:OBJ (MODULE alone: MODULE:ai); required: "
    "it defines the agents and tools. [env: INTERLOCK_APP]",
)
broker_option = click.option(
    "--broker",
    envvar="INTERLOCK_BROKER_URL",
    help="Broker URL (redis://, amqp://). [env: INTERLOCK_BROKER_URL; default redis://localhost:6379/0]",
)
store_option = click.option(
    "--store",
    envvar="INTERLOCK_STORE_URL",
    help="Store URL (sqlite:///..., postgresql+psycopg://...). [env: INTERLOCK_STORE_URL; default sqlite:///interlock.db]",
)
submit_store_option = click.option(
    "--store",
    envvar="INTERLOCK_STORE_URL",
    help="The workers' store; read only with --wait, for turns sent with ids of their own "
    "(--turn-id, or a --file's turn_id), to tell those that ended before (not announced "
    "again); --wait's decide hint repeats it. [env: INTERLOCK_STORE_URL; default "
    "sqlite:///interlock.db]",
)


def unused(flag: str) -> Callable[[F], F]:
    """`flag` (`--app`, `--broker`) on a command that does not use it: accepted and
    ignored, not listed, so that one set of flags (`--app --broker --store`) serves
    every command that talks to the queues or the store."""
    return click.option(
        flag,
        hidden=True,
        expose_value=False,
        help="Not used by this command; accepted so that one set of flags serves all.",
    )


def settings_of(
    app: str | None = None,
    broker: str | None = None,
    store: str | None = None,
    heartbeat_file: str | None = None,
    *,
    one_shot: bool = True,
) -> Settings:
    """The settings of a command: the environment's, its flags (non-None) winning.
    `one_shot`: a command run by hand, which gives up on a server that does not answer
    (`Settings.one_shot`); the long-running ones pass False."""
    settings = Settings.from_env(
        app=app,
        broker_url=broker,
        store_url=store,
        heartbeat_file=heartbeat_file,
        one_shot=one_shot,
    )
    _STORE_IN_USE.url = settings.store_url
    return settings


def store_url_of(store: str | None) -> str:
    """The store URL of a command that reads only the store (`pending`, `audit`): its
    flag, else `INTERLOCK_STORE_URL`, else the default; checked. The other variables
    are not read (but `INTERLOCK_SERVER_TIMEOUT`, by `server_timeout`), so a value there
    that this command does not use cannot stop it."""
    from ..settings import DEFAULT_STORE, check_store_url

    url = store if store is not None else os.environ.get("INTERLOCK_STORE_URL") or DEFAULT_STORE
    check_store_url(url)
    _STORE_IN_USE.url = url
    return url


def server_timeout() -> float:
    """The server timeout of a command that reads only the store (`pending`, `audit`):
    `INTERLOCK_SERVER_TIMEOUT`, checked, else the default (`Settings.server_timeout`)."""
    from ..settings import server_timeout_from_env

    return server_timeout_from_env()


def shared_broker(settings: Settings) -> Settings:
    """`settings`, for a command that talks to other processes through the broker: an
    in-process broker (`memory://`) would lose what it sends, so it is refused."""
    from interlock import Status, StatusError

    if settings.broker_url.startswith("memory://"):
        raise StatusError(
            Status.INVALID_ARGUMENT,
            "a memory:// broker lives inside one process: nothing sent there reaches a "
            "worker or a resume consumer; use redis://HOST:6379/0 or amqp://HOST:5672//",
        )
    return settings


def shared_store(settings: Settings) -> Settings:
    """`settings`, for a command whose store other processes read: a SQLite database in
    memory lives inside one process (each worker process would have its own, which no
    resume consumer sees), so it is refused."""
    from interlock import Status, StatusError

    if in_memory_sqlite(settings.store_url):
        raise StatusError(
            Status.INVALID_ARGUMENT,
            f"the store {redact_url(settings.store_url)} is a SQLite database in memory: it lives "
            "inside one process, and no other process (the worker's, the resume "
            "consumer) sees it; give a file (sqlite:///interlock.db) or a PostgreSQL URL",
        )
    return settings


def in_memory_sqlite(url: str) -> bool:
    """Whether a store URL names a SQLite database in memory (`sqlite://`,
    `sqlite:///:memory:`, a `file:` URI with `mode=memory`)."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return False
    path = parsed.database or ""
    return path in ("", ":memory:") or (
        path.startswith("file:") and ("mode=memory" in path or parsed.query.get("mode") == "memory")
    )


class Seconds(click.FloatRange):
    """A number of seconds within a range, and finite: `nan` and `inf` parse as floats
    and pass every comparison a range makes, but no wait or age can be either."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        seconds = super().convert(value, param, ctx)
        if not math.isfinite(seconds):
            self.fail(f"{seconds} is not a finite number of seconds.", param, ctx)
        return seconds


wait_option = click.option(
    "--wait",
    is_flag=True,
    help="Then wait for what follows on the queues and print each event as a JSON line.",
)
timeout_option = click.option(
    "--timeout",
    default=60.0,
    show_default=True,
    type=Seconds(min=0, min_open=True),
    help="Seconds to wait for each event.",
)
burst_option = click.option(
    "--burst", is_flag=True, help="Serve what is queued, then exit once there is nothing to do."
)
idle_option = click.option(
    "--idle",
    default=1.0,
    show_default=True,
    type=Seconds(min=0.1),
    help="With --burst: seconds with nothing to do before exiting.",
)
