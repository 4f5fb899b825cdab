"""Reading events from a queue, as a dashboard or a test would."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from types import TracebackType

from kombu.connection import Connection
from kombu.entity import Queue
from kombu.message import Message as KombuMessage
from kombu.messaging import Consumer

from schemas import EventBase, event_adapter

from .topology import event_queue

__all__ = ["EventStream"]


class EventStream:
    """Events of one queue, parsed. `EventStream.bind(conn, name, "turn.*")` makes a
    queue of your own bound to `interlock.events` with that pattern."""

    def __init__(self, connection: Connection, queue: Queue) -> None:
        self.connection = connection
        self.queue = queue
        self._buffer: list[EventBase] = []
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
        self._buffer.append(event_adapter.validate_json(message.body))
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
        channel = self._consumer.channel
        try:
            self._consumer.cancel()
            if delete:
                self.queue.bind(channel).delete()
        finally:
            if channel is not None:
                channel.close()

    def next(
        self,
        timeout: float,
        match: Callable[[EventBase], bool] | None = None,
        types: Iterable[str] | None = None,
    ) -> EventBase:
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
