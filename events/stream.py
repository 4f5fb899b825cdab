"""Reading events from a queue, as a dashboard or a test would."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable
from types import TracebackType

from kombu.connection import Connection
from kombu.entity import Queue
from kombu.message import Message as KombuMessage
from kombu.messaging import Consumer
from pydantic import ValidationError

from schemas import EVENT_TYPES, Event, event_adapter

from .topology import event_queue

__all__ = ["EventStream"]

log = logging.getLogger("interlock.events")

_REASONS_WARNED = 20
"""A reader warns of at most this many reasons for skipping a message; then it is quiet."""


class EventStream:
    """Events of one queue, parsed. `EventStream.bind(conn, name, "turn.*")` makes a
    queue of your own bound to `interlock.events` with that pattern."""

    def __init__(self, connection: Connection, queue: Queue) -> None:
        self.connection = connection
        self.queue = queue
        self._buffer: list[Event] = []
        self._skipped: set[str] = set()
        self._consumer = Consumer(
            connection.channel(), queues=[queue], on_message=self._on_message, accept=["json"]
        )
        self._consumer.qos(prefetch_count=50)
        self._consumer.consume()

    @classmethod
    def bind(
        cls, connection: Connection, name: str, pattern: str = "#", *, temporary: bool = False
    ) -> EventStream:
        """`temporary`: not durable, deleted when its consumer goes (on AMQP)."""
        queue = event_queue(name, pattern, durable=not temporary, auto_delete=temporary)
        return cls(connection, queue)

    def _on_message(self, message: KombuMessage) -> None:
        """Keep the message's event. Any program may publish to `interlock.events`, and a
        newer release may add event types: a message of a type this release does not
        know is skipped, as events.md asks of readers, and one that is no event at all
        is skipped with a warning (the first time for each reason); neither stops the
        reader."""
        try:
            self._buffer.append(event_adapter.validate_json(message.body))
        except ValidationError as exc:
            kind = _type_of(message.body)
            if kind is not None and kind not in EVENT_TYPES:
                log.debug("skipped an event of a type this reader does not know: %r", kind)
            else:
                error = exc.errors(include_url=False)[0]
                why = f"{'.'.join(str(p) for p in error['loc']) or 'the body'}: {error['msg']}"
                first = why not in self._skipped and len(self._skipped) < _REASONS_WARNED
                if first:  # a warning per reason, not per message
                    self._skipped.add(why)
                log.log(
                    logging.WARNING if first else logging.DEBUG,
                    "skipped a message on %s that is no Interlock event (%s)%s",
                    self.queue.name,
                    why,
                    "; others like it are skipped quietly" if first else "",
                )
        message.ack()

    def __enter__(self) -> EventStream:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self, delete: bool = False) -> None:
        """Stop reading; with `delete`, delete the queue and its bindings too. A queue
        whose connection was closed first cannot be deleted: ConnectionError says so."""
        channel = self._consumer.channel
        try:
            self._consumer.cancel()
            if delete:
                if getattr(channel, "connection", None) is None:  # closed with its connection
                    raise ConnectionError(
                        f"the connection to the broker was closed before the queue "
                        f"{self.queue.name} could be deleted"
                    )
                self.queue.bind(channel).delete()
        finally:
            if channel is not None:
                channel.close()

    def next(
        self,
        timeout: float,
        match: Callable[[Event], bool] | None = None,
        types: Iterable[str] | None = None,
    ) -> Event:
        """The next event that matches (others are dropped), or TimeoutError."""
        wanted = set(types) if types is not None else None
        deadline = time.monotonic() + timeout
        while True:
            while self._buffer:
                event = self._buffer.pop(0)
                if (wanted is None or event.type in wanted) and (match is None or match(event)):
                    return event
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no matching event within {timeout:.0f}s")
            try:
                self.connection.drain_events(timeout=min(remaining, 1.0))
            except TimeoutError:
                continue


def _type_of(body: bytes | str) -> str | None:
    """The `type` a message's JSON object names, if it names one."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return None
    kind = data.get("type") if isinstance(data, dict) else None
    return kind if isinstance(kind, str) else None
