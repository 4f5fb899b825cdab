"""Publishing events and decisions, with retries."""

from __future__ import annotations

import base64
import contextlib
import json
import math
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from amqp.exceptions import MessageNacked
from kombu.connection import Connection
from kombu.entity import Exchange, Queue
from kombu.exceptions import OperationalError
from kombu.messaging import Producer

from schemas import DeadLetter, Decision, EventBase, wire_time

from .topology import DECISIONS, DECISIONS_DEAD, EVENTS, all_queues

__all__ = [
    "RETRY_POLICY",
    "PublishRefused",
    "Publisher",
    "TopologyConflict",
    "declare",
    "message_counts",
]

RETRY_POLICY: dict[str, Any] = {
    "max_retries": 10,
    "interval_start": 0.1,
    "interval_step": 0.5,
    "interval_max": 3.0,
}


class PublishRefused(OperationalError):
    """RabbitMQ turned a published message away (publisher confirms: a `nack`, as from
    a queue at its length limit with `overflow: reject-publish`). Not tried again at
    once, as kombu would (it takes a nack for a lost connection and reconnects): the
    queues that took the message got it at each try. The caller tries again later (the
    outbox publishes the event again; the resume consumer requeues its decision)."""


class TopologyConflict(Exception):
    """The broker holds an exchange or queue of the protocol declared otherwise than
    Interlock declares it (RabbitMQ's PRECONDITION_FAILED: another queue type, other
    arguments, not durable): it refuses Interlock's declaration, and with it every
    publish and consume that declares it. An operator's to fix: nothing retried helps."""


def declare(connection: Connection) -> None:
    """Declare the exchanges, queues and bindings (idempotent). Raises
    `TopologyConflict` when the broker holds one of them declared otherwise."""
    channel = connection.channel()
    try:
        for queue in all_queues():
            queue.bind(channel).declare()
    except Exception as exc:
        if getattr(exc, "code", None) != _PRECONDITION_FAILED:
            raise
        said = str(getattr(exc, "reply_text", None) or exc)
        raise TopologyConflict(
            f"the broker refuses Interlock's exchanges and queues: {said}. Delete what it "
            "names (Interlock declares it again; docs/queues.md) or declare it as Interlock does"
        ) from exc
    finally:
        with contextlib.suppress(Exception):  # a refused declaration closed the channel
            channel.close()


def message_counts(connection: Connection) -> dict[str, int]:
    """How many messages wait on each of Interlock's queues, by name: those ready to be
    read, not those a process has taken and not yet acked. Each queue is declared as
    `declare` does (a passive declaration would not do: on Redis an empty queue does
    not exist)."""
    channel = connection.channel()
    try:
        return {
            queue.name: queue.bind(channel).queue_declare().message_count for queue in all_queues()
        }
    finally:
        with contextlib.suppress(Exception):
            channel.close()


_PRECONDITION_FAILED = 406
"""AMQP's reply code for a declaration that does not match what the broker holds."""


def give_up_after(
    seconds: float | None, started: float | None = None
) -> Callable[[Exception, float], None] | None:
    """An errback for kombu's `ensure` (and Celery's `retry_policy`), called before each
    retry, `interval` seconds ahead: it lets none start once the tries since `started`
    (a `time.monotonic()`; by default now) would pass `seconds`, and raises the last
    failure instead. A server that takes a try and never answers holds each try for the
    socket's timeout, and kombu would make all its retries. None for no bound."""
    if seconds is None:
        return None
    since = time.monotonic() if started is None else started

    def within(exc: Exception, interval: float) -> None:
        if time.monotonic() - since + interval >= seconds:
            raise exc

    return within


class Publisher:
    """Publishes JSON messages on one connection; reconnects and retries on failure.
    `timeout` bounds each publish (seconds, all its tries included: connecting,
    declaring, sending and reconnecting): no try starts once the tries so far took
    that long, and the last failure is raised (a command run by hand gives its server
    timeout). By default a publish has ten retries at kombu's intervals."""

    def __init__(
        self,
        connection: Connection,
        *,
        declare_topology: bool = True,
        timeout: float | None = None,
    ) -> None:
        self.connection = connection
        self._producer: Producer | None = None
        self._declared = not declare_topology
        self._timeout = timeout

    def _publish(self, body: str, exchange: Exchange, routing_key: str, **kw: Any) -> None:
        started = time.monotonic()
        if not self._declared:
            if self._timeout is None:
                self.connection.ensure_connection(max_retries=RETRY_POLICY["max_retries"])
            else:
                self.connection.ensure_connection(**RETRY_POLICY, timeout=self._timeout)
            declare(self.connection)
            self._declared = True
        if self._producer is None:
            self._producer = Producer(self.connection)
        producer = self._producer

        def send() -> None:
            try:
                producer.publish(
                    body,
                    exchange=exchange,
                    routing_key=routing_key,
                    content_type="application/json",
                    content_encoding="utf-8",
                    delivery_mode=2,
                    **kw,
                )
            except MessageNacked as exc:
                raise PublishRefused(
                    f"the broker refused the message to {exchange.name or 'the default exchange'}"
                    f" ({routing_key}): {str(exc) or 'a queue it routes to takes no more'}"
                ) from exc

        # Lost connections are retried (reconnecting); a refusal is not (see PublishRefused).
        errback = give_up_after(self._timeout, started)
        self.connection.ensure(producer, send, errback=errback, **RETRY_POLICY)()

    def publish_event(self, event: EventBase) -> None:
        """Publish an event on `interlock.events`, routed by its type."""
        self.publish_raw_event(event.type, event.model_dump_json())

    def publish_raw_event(self, routing_key: str, body: str) -> None:
        # `declare`: declared again on every new connection. A reconnect gives kombu a
        # fresh transport, and on Redis an exchange's type lives only in the client:
        # undeclared, `interlock.events` would route as a direct exchange, and queues
        # bound with patterns (`#`, `turn.*`) would silently get nothing.
        self._publish(
            body, EVENTS, routing_key, headers={"event_type": routing_key}, declare=[EVENTS]
        )

    def publish_decision(self, decision: Decision | dict[str, Any] | str) -> None:
        """Publish a decision on `interlock.decisions`."""
        if isinstance(decision, Decision):
            body = decision.model_dump_json(exclude_none=True)
        elif isinstance(decision, dict):
            body = json.dumps(decision)
        else:
            body = decision
        self._publish(body, DECISIONS.exchange, DECISIONS.routing_key)

    def dead_letter(
        self,
        body: bytes,
        reason: str,
        headers: dict[str, Any],
        *,
        queue: Queue = DECISIONS_DEAD,
        **fields: str | None,
    ) -> None:
        """Keep an unreadable message on a dead-letter queue (by default
        `interlock.decisions.dead`), with the reason, as a `DeadLetter`; `fields` are
        its optional ids (`decision_id`, `event_id`, `turn_id`, `content_type`, ...)."""
        assert queue.exchange is not None
        letter = DeadLetter(
            reason=reason,
            headers={str(k): _json_value(v) for k, v in headers.items()},
            **fields,
            body=body.decode("utf-8", errors="replace"),
            body_base64=base64.b64encode(body).decode(),
        )
        self._publish(
            letter.to_wire(),
            queue.exchange,
            queue.routing_key,
            headers={"x-reason": reason[:500]},
        )

    def close(self) -> None:
        if self._producer is not None:
            self._producer.release()
            self._producer = None


def _json_value(value: Any) -> Any:
    """A message header's value as JSON: strings, numbers, booleans, null, lists and
    objects as they are; bytes as UTF-8 text (invalid bytes replaced); an AMQP timestamp
    as RFC 3339 in UTC with a "Z", as the events write times; anything else (a decimal)
    as its text."""
    if isinstance(value, datetime):  # py-amqp gives a timestamp as a naive UTC time
        return wire_time(value)
    if value is None or isinstance(value, str | bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8", errors="replace")
    if isinstance(value, list | tuple):
        return [_json_value(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _json_value(v) for k, v in value.items()}
    return str(value)
