"""Settings from the environment, each overridable by a command-line flag. kombu, the
Redis transport and the runtime are imported where they are used: a command's `--help`,
which reads the defaults here, loads none of them."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

if TYPE_CHECKING:
    from kombu.connection import Connection

    from interlock import StatusError

OUTBOX_RETENTION = 7 * 24 * 3600.0
"""`events.outbox.RETENTION` (a week), said again here so that reading the settings
does not load SQLAlchemy; a test holds the two equal."""
PRUNE_BATCH = 500
"""Sessions `interlock prune` deletes per write transaction, by default: the write lock
(SQLite) and the rows locked (PostgreSQL) are held for one batch, not the whole run.
Here, not in `workers.retention`, so that the command line loads no SQLAlchemy."""
PRUNE_BATCH_MAX = 10_000
"""The most sessions a batch takes: a statement binds a batch's ids (three values a
session for their leases), and PostgreSQL takes at most 65,535 values a statement,
SQLite 32,766 (by default)."""

__all__ = [
    "NO_ANSWER_HINT",
    "NO_CONSUMER_HINT",
    "NO_WORKER_HINT",
    "Settings",
    "check_broker_url",
    "check_store_url",
    "one_shot_store_url",
    "redact_url",
    "server_timeout_from_env",
]

DEFAULT_BROKER = "redis://localhost:6379/0"
DEFAULT_STORE = "sqlite:///interlock.db"
DEFAULT_TURN_LEASE = 20.0
"""Seconds a worker's hold on a running turn lasts unrenewed (renewed every third): how
long a turn whose worker died waits before another worker takes it over."""
DEFAULT_SERVER_TIMEOUT = 5.0
"""Seconds a command run by hand waits for the broker or the store to answer."""
SERVER_TIMEOUT_LEAST = 2.0
"""The shortest `INTERLOCK_SERVER_TIMEOUT` taken: libpq counts its `connect_timeout` in
whole seconds, 2 at least; and a Redis connection of `--wait` reads the reply of a
blocking wait the server ends within a second (kombu's `brpop_timeout`), which must come
well within it."""
NO_ANSWER_HINT = (
    "are `interlock worker` and `interlock resume-consumer` running on this broker and store? "
    "What was sent stays queued until they are"
)
"""What a client waiting in vain for a decision's outcome and its turn asks (`decide
--wait`, `demo --broker`)."""
NO_WORKER_HINT = (
    "is `interlock worker` running on this broker and store? What was sent stays queued, "
    "and runs once one is"
)
"""What a client waiting in vain for a turn's end asks (`submit --wait`): a turn needs a
worker, not the resume consumer."""
NO_CONSUMER_HINT = (
    "is `interlock resume-consumer` running on this broker and store? The decision stays "
    "queued, and is decided once one is"
)
"""What a client waiting in vain for a decision's outcome asks (`decide --wait`)."""


def _invalid(message: str) -> StatusError:
    """INVALID_ARGUMENT, saying `message`."""
    from interlock import Status, StatusError

    return StatusError(Status.INVALID_ARGUMENT, message)


def _seconds(name: str, default: float, *, whole: bool = False, least: float = 0.0) -> float:
    """A positive number of seconds from the variable `name` (`default` when unset or
    empty), `least` or more where given; anything else is a clear INVALID_ARGUMENT
    naming the variable."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    kind = "a whole number" if whole else "a number"
    try:
        value = int(raw) if whole else float(raw)
    except ValueError:
        value = -1
    if not value > 0 or value == float("inf"):
        raise _invalid(f"{name} must be {kind} of seconds greater than 0, got {raw!r}")
    if value < least:
        raise _invalid(f"{name} must be {kind} of seconds, {least:g} or more, got {raw!r}")
    return value


def server_timeout_from_env() -> float:
    """`INTERLOCK_SERVER_TIMEOUT`, checked (`Settings.server_timeout`), for a command
    that reads no other setting but the store's URL (`pending`, `audit`)."""
    return _seconds("INTERLOCK_SERVER_TIMEOUT", DEFAULT_SERVER_TIMEOUT, least=SERVER_TIMEOUT_LEAST)


@dataclass(frozen=True)
class Settings:
    """Where the broker and the store are, and which module defines the registry."""

    broker_url: str = DEFAULT_BROKER
    store_url: str = DEFAULT_STORE
    app: str | None = None
    secret: str | None = None
    visibility_timeout: int = 3600
    relay_interval: float = 5.0
    turn_lease: float = DEFAULT_TURN_LEASE
    heartbeat_file: str | None = None
    outbox_retention: float = OUTBOX_RETENTION
    server_timeout: float = DEFAULT_SERVER_TIMEOUT
    """Seconds a `one_shot` command waits for a broker or store that does not answer."""
    one_shot: bool = False
    """A command run by hand (`submit`, `decide`, `health`, ...), not the worker or the
    resume consumer: its broker connections give up on a broker that does not answer
    within `server_timeout` (connecting, then each reply), and it connects to the store
    with `one_shot_store_url`. A long-running process waits for a slow server instead."""

    @classmethod
    def from_env(cls, **overrides: Any) -> Settings:
        """Read `INTERLOCK_*` variables; non-None `overrides` (flags) win."""
        env = os.environ
        base = cls(
            broker_url=env.get("INTERLOCK_BROKER_URL") or DEFAULT_BROKER,  # empty: unset
            store_url=env.get("INTERLOCK_STORE_URL") or DEFAULT_STORE,
            app=env.get("INTERLOCK_APP") or None,
            secret=env.get("INTERLOCK_SECRET") or None,
            visibility_timeout=int(_seconds("INTERLOCK_VISIBILITY_TIMEOUT", 3600, whole=True)),
            relay_interval=_seconds("INTERLOCK_RELAY_INTERVAL", 5.0),
            turn_lease=_seconds("INTERLOCK_TURN_LEASE", DEFAULT_TURN_LEASE),
            heartbeat_file=env.get("INTERLOCK_HEARTBEAT_FILE") or None,
            outbox_retention=_seconds("INTERLOCK_OUTBOX_RETENTION", OUTBOX_RETENTION),
            server_timeout=server_timeout_from_env(),
        )
        settings = replace(base, **{k: v for k, v in overrides.items() if v is not None})
        settings.check_urls()
        return settings

    def check_urls(self) -> None:
        """INVALID_ARGUMENT, naming the URL, when the broker URL names no kombu transport
        or the store URL is no SQLite or PostgreSQL URL SQLAlchemy can load (nothing is
        connected)."""
        check_broker_url(self.broker_url)
        check_store_url(self.store_url)

    def to_env(self) -> dict[str, str]:
        """These settings as `INTERLOCK_*` variables, for a child process."""
        env = {
            "INTERLOCK_BROKER_URL": self.broker_url,
            "INTERLOCK_STORE_URL": self.store_url,
            "INTERLOCK_VISIBILITY_TIMEOUT": str(self.visibility_timeout),
            "INTERLOCK_RELAY_INTERVAL": str(self.relay_interval),
            "INTERLOCK_TURN_LEASE": str(self.turn_lease),
            "INTERLOCK_OUTBOX_RETENTION": str(self.outbox_retention),
            "INTERLOCK_SERVER_TIMEOUT": str(self.server_timeout),
        }
        if self.app:
            env["INTERLOCK_APP"] = self.app
        if self.secret:
            env["INTERLOCK_SECRET"] = self.secret
        if self.heartbeat_file:
            env["INTERLOCK_HEARTBEAT_FILE"] = self.heartbeat_file
        return env

    @property
    def broker_transport(self) -> str | None:
        """The kombu transport of the broker: Redis URLs get the one of
        `events.redis_transport` (kombu's, reusing its redis client); None lets kombu
        choose by the URL's scheme."""
        from events.redis_transport import transport_for

        return transport_for(self.broker_url)

    def connection(self, *, restore_held: bool = False) -> Connection:
        """A new (lazy) broker connection with the transport and the options every client
        of the broker shares. With `restore_held` (on Redis), a message it takes and
        never acks comes back as soon as its reader is found gone, not after the
        visibility timeout (`events.redis_pop.HELD`): for a consumer that waits again
        after each message, not for a Celery worker."""
        from kombu.connection import Connection

        options = self.transport_options
        if restore_held and self.broker_transport is not None:
            options = {**options, "restore_held": True}
        return Connection(
            self.broker_url, transport=self.broker_transport, transport_options=options
        )

    @property
    def transport_options(self) -> dict[str, Any]:
        """Options every kombu/Celery client of the broker must share; for a `one_shot`
        command, also the bounds on the wait for a broker that does not answer."""
        options: dict[str, Any] = {"visibility_timeout": self.visibility_timeout}
        redis = self.broker_url.startswith(("redis://", "rediss://", "redis+socket://"))
        amqp = self.broker_url.startswith(("amqp://", "amqps://", "pyamqp://"))
        if self.one_shot and redis:
            # redis-py waits without end by default, for the connection and for every
            # reply: a server that takes the connection and says nothing would hold the
            # command for good. The blocking wait of `--wait` (BLMOVE or BRPOP, ended by
            # the server within kombu's `brpop_timeout`, 1 s) is read once its socket
            # has the reply, and it comes well within the bound (SERVER_TIMEOUT_LEAST).
            options["socket_connect_timeout"] = self.server_timeout
            options["socket_timeout"] = self.server_timeout
        if self.one_shot and amqp:
            # py-amqp's bound on the connection and its handshake (kombu's default: 5 s)
            options["connect_timeout"] = self.server_timeout
        if redis:
            # kombu restores unacked messages past the timeout in sweeps, by default every
            # 10 s x 10 (100 s) in a worker: a short timeout would redeliver a dead
            # worker's turn ~100 s late. Sweep every timeout/2 (at the default 3600 s,
            # that is kombu's 10 s x 10).
            every = max(1, min(10, self.visibility_timeout // 2))
            options["unacked_restore_interval"] = every
            options["unacked_restore_throttle"] = max(
                1, min(10, self.visibility_timeout // (2 * every))
            )
        if self.broker_url.startswith("memory://"):
            options["polling_interval"] = 0.05  # in-process: poll often, it costs nothing
        if amqp:
            # Publisher confirms: a publish returns once RabbitMQ has taken the message, and
            # one it turns away (a full queue, say) raises. Without them the outbox would
            # mark a refused event sent, and the consumer ack a decision whose resume was
            # dropped.
            options["confirm_publish"] = True
        return options


def check_broker_url(url: str) -> None:
    """A broker URL's scheme must name a kombu transport (`redis://`, `amqp://`,
    `memory://`, ...), its port be a port, and a Redis URL's database a number; each
    URL of a failover list (`URL;URL`) alike."""
    from kombu.transport import resolve_transport

    if ";" in url:  # kombu's failover list: each URL in turn
        for one in url.split(";"):
            check_broker_url(one.strip())
        return
    scheme, sep, _ = url.partition("://")
    name = scheme.partition("+")[0]
    try:
        if not sep or not name:
            raise KeyError(name)
        resolve_transport(name)
    except (KeyError, ImportError) as exc:
        reason = "is not a URL" if not sep else f"names no broker transport kombu has ({exc})"
        raise _invalid(_bad_broker(url, reason)) from None
    parts = urlsplit(url)
    try:
        parts.port  # noqa: B018 - raises for a port that is no number or out of range
    except ValueError as exc:
        raise _invalid(_bad_broker(url, f"has a bad port: {exc}")) from None
    database = parts.path.strip("/")
    if name in ("redis", "rediss") and scheme == name and database and not database.isdigit():
        raise _invalid(_bad_broker(url, f"names Redis database {database!r}, which is no number"))


def _bad_broker(url: str, reason: str) -> str:
    return (
        f"broker URL {redact_url(url)!r} {reason}: use redis://HOST:6379/0 or "
        "amqp://USER:PASSWORD@HOST:5672// (memory:// serves one process alone, as "
        "`interlock demo` without --broker: no command that talks to workers takes it)"
    )


STORE_BACKENDS = ("sqlite", "postgresql")
"""The databases `SqlSessionStore` runs on."""


def check_store_url(url: str) -> None:
    """A store URL must be a SQLite or PostgreSQL URL whose dialect and driver SQLAlchemy
    can load (`sqlite:///...`, `postgresql+psycopg://...`)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    use = "use sqlite:///interlock.db or postgresql+psycopg://USER@HOST/DB"
    try:
        parsed = make_url(url)
        backend = parsed.get_backend_name()
        dialect = parsed.get_dialect() if backend in STORE_BACKENDS else None
    except (ArgumentError, NoSuchModuleError, ImportError) as exc:
        raise _invalid(
            f"store URL {redact_url(url)!r} is not a database URL SQLAlchemy can use ({exc}): "
            + use
        ) from None
    try:
        if dialect is not None:
            dialect.import_dbapi()  # the driver the URL names (psycopg2, asyncpg, ...)
    except ImportError as exc:
        raise _invalid(
            f"store URL {redact_url(url)!r} names the driver {parsed.get_driver_name()!r}, "
            f"which is not installed ({exc}): {use}"
        ) from None
    if backend == "postgres":  # the short scheme of libpq and Heroku; SQLAlchemy has none
        raise _invalid(
            f"store URL {redact_url(url)!r}: write postgresql+psycopg:// in place of "
            "postgres:// (SQLAlchemy does not take the short name)"
        )
    if backend not in STORE_BACKENDS:
        raise _invalid(
            f"store URL {redact_url(url)!r}: the store runs on SQLite or PostgreSQL, "
            f"not {backend}: {use}"
        )


def one_shot_store_url(url: str, seconds: float) -> str:
    """The store URL a command run by hand connects with: a PostgreSQL URL is given
    libpq's `connect_timeout` of `seconds` (whole seconds, rounded up; at least 2, as
    libpq counts it), so that a server that takes the connection and never answers ends
    the command (psycopg would wait about two minutes, then the command tries again),
    unless the URL gives its own. Other URLs are returned as they are (SQLite waits for
    no server). For connecting only; the URL said in messages stays the one given."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if parsed.get_backend_name() != "postgresql" or "connect_timeout" in parsed.query:
        return url
    whole = max(2, math.ceil(seconds))
    bounded = parsed.update_query_dict({"connect_timeout": str(whole)})
    return bounded.render_as_string(hide_password=False)


def redact_url(url: str) -> str:
    """`url` with its secrets hidden, for messages and output: the password of its user
    (`redis://:***@host`) and the value of a query parameter that holds one
    (`?password=***`, `?sslpassword=***`; `is_secret_parameter`); the rest as given. Each
    URL of a failover list (`URL;URL`) alike."""
    parts = url.split(";")
    if len(parts) > 1 and all("://" in part for part in parts):
        return ";".join(redact_url(part) for part in parts)
    head, sep, rest = url.partition("://")
    if not sep:
        return url
    # The user's part ends at the last "@" before the query (a password may hold "@"; a
    # query's value may too); the query begins at the first "?" after it.
    at = rest.rfind("@", 0, _query_start(rest, 0))
    query = _query_start(rest, at + 1)
    where, sep, params = rest[:query], rest[query : query + 1], rest[query + 1 :]
    if at >= 0:
        auth, host = where[:at], where[at + 1 :]
        user, colon, _ = auth.partition(":")
        where = f"{user}:***@{host}" if colon else where
    hidden = "&".join(_hide_secret(param) for param in params.split("&"))
    return f"{head}://{where}{sep}{hidden}"


def _query_start(rest: str, start: int) -> int:
    """Where the query of the URL part `rest` starts (its "?"), looking from `start`; the
    end of `rest` when it has none."""
    found = rest.find("?", start)
    return len(rest) if found < 0 else found


def _hide_secret(param: str) -> str:
    """A query parameter (`name=value`), its value hidden when the name says it is a
    secret."""
    from interlock.stores.secrets import is_secret_parameter

    name, equals, _ = param.partition("=")
    if equals and is_secret_parameter(unquote(name)):
        return f"{name}=***"
    return param
