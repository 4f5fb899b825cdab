"""The worker's task consumer: a message on `interlock.turns` that is no task the worker
can run is kept on `interlock.turns.dead`, with the reason, instead of being dropped.

Celery acks or rejects such a message after logging it (an undecodable body, a body of
a content type it does not accept, such as pickle, a message without Celery's task
headers, a task it does not know): on Redis, and on RabbitMQ without a dead-letter
exchange, it is gone. This consumer first publishes it, as received, to the dead-letter
queue, logs that it kept it, then lets Celery go on as before (the ack or reject, its
signals) without Celery's own log line, which would say the message was discarded.
Messages that came from elsewhere (the worker's remote control) go Celery's way. If the
broker refuses the dead letter, the message is neither acked nor rejected: it stays the
broker's, and comes back when the worker reconnects (on Redis, after the visibility
timeout).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

from celery.exceptions import InvalidTaskError
from celery.worker.consumer import Consumer
from celery.worker.consumer import consumer as celery_consumer
from kombu.message import Message

from events.publisher import Publisher
from events.redis_transport import UNREADABLE
from events.topology import TURNS, TURNS_DEAD

from .app import runtime_of

__all__ = ["TaskConsumer"]

log = logging.getLogger("interlock.worker")


class TaskConsumer(Consumer):  # type: ignore[misc]
    """Celery's worker consumer, keeping what it cannot run (`worker_consumer`)."""

    def create_task_handler(self, promise: Any = celery_consumer.promise) -> Any:
        """Celery's handler of a task message, after a check of what Celery would
        trip on outside the errors it handles: a task message with no `id` header, or
        whose body is no `[args, kwargs, options]` list, would stop the worker (or
        restart its consumer over and over) and come back to stop the next one."""
        handle = super().create_task_handler(promise)

        def on_task_received(message: Message) -> Any:
            reason = _malformed(message) if _from_turns(message) else None
            if reason is not None:
                return self.on_invalid_task(None, message, InvalidTaskError(reason))
            return handle(message)

        return on_task_received

    def on_decode_error(self, message: Message, exc: Exception) -> None:
        headers = message.headers if isinstance(message.headers, dict) else {}
        wrong = headers.get(UNREADABLE)  # an item on the Redis list that is no message
        reason = (
            f"not a Celery task message: {wrong}"
            if isinstance(wrong, str)
            else f"the task message cannot be decoded: {exc}"
        )
        self._handle(message, reason, functools.partial(super().on_decode_error, message, exc))

    def on_unknown_message(self, body: Any, message: Message) -> None:
        reason = "not a Celery task message: it names no task"
        self._handle(message, reason, functools.partial(super().on_unknown_message, body, message))

    def on_unknown_task(self, body: Any, message: Message, exc: Exception) -> None:
        name = _header(message, "task")
        reason = f"unknown task {name!r}: this queue runs interlock.run_turn"
        celery = functools.partial(super().on_unknown_task, body, message, exc)
        self._handle(message, reason, celery)

    def on_invalid_task(self, body: Any, message: Message, exc: Exception) -> None:
        reason = f"invalid task message: {exc}"
        self._handle(
            message, reason, functools.partial(super().on_invalid_task, body, message, exc)
        )

    def _handle(self, message: Message, reason: str, celery: Callable[[], None]) -> None:
        """A message of `interlock.turns` is kept, then handed to Celery's handling (the
        ack or reject) with Celery's log line left out; a message it could not keep is
        left alone. Any other (the worker's remote-control messages share the
        decode-error callback) goes Celery's way at once."""
        if not _from_turns(message):
            celery()
        elif self._keep(message, reason):
            with _CELERY_LINES.dropped():
                celery()

    def _keep(self, message: Message, reason: str) -> bool:
        """Publish `message` to `interlock.turns.dead`; False when that failed."""
        raw = message.body
        body = raw if isinstance(raw, bytes) else str(raw).encode("utf-8", "surrogateescape")
        headers = message.headers if isinstance(message.headers, dict) else {}
        try:
            # A connection of its own, closed at once: this runs in the prefork parent,
            # whose children must not inherit an open broker connection.
            with runtime_of(self.app).connection() as connection:
                Publisher(connection).dead_letter(
                    body,
                    reason,
                    headers,
                    queue=TURNS_DEAD,
                    content_type=message.content_type,
                    content_encoding=message.content_encoding,
                )
        except Exception:
            log.exception(
                "could not keep an unrunnable message on %s (%s); it is left to the "
                "broker, to be delivered again",
                TURNS_DEAD.name,
                reason,
            )
            return False
        log.error("kept a message of interlock.turns on %s, not run: %s", TURNS_DEAD.name, reason)
        return True


class _CeleryLines(logging.Filter):
    """Leaves out, while `dropped()` is on in this thread, the lines Celery logs for a
    message it cannot run ("... ignored and discarded", "Received and deleted ..."):
    for a kept message they would be wrong. Its other lines (a failed ack, say) stay."""

    LINES = frozenset(
        {
            celery_consumer.MESSAGE_DECODE_ERROR,
            celery_consumer.UNKNOWN_FORMAT,
            celery_consumer.UNKNOWN_TASK_ERROR,
            celery_consumer.INVALID_TASK_ERROR,
        }
    )

    def __init__(self) -> None:
        super().__init__()
        self._on = threading.local()
        celery_consumer.logger.addFilter(self)

    @contextlib.contextmanager
    def dropped(self) -> Iterator[None]:
        self._on.value = True
        try:
            yield
        finally:
            self._on.value = False

    def filter(self, record: logging.LogRecord) -> bool:
        return not (getattr(self._on, "value", False) and record.msg in self.LINES)


_CELERY_LINES = _CeleryLines()


def _malformed(message: Message) -> str | None:
    """What makes a Celery (protocol 2) task message unrunnable beyond what Celery
    checks itself, or None. A body that cannot be decoded is left to Celery's check."""
    headers = message.headers
    if not isinstance(headers, dict) or "task" not in headers:
        return None  # no task message: Celery's own check says so
    task_id = headers.get("id")
    if not isinstance(task_id, str) or not task_id:
        return "the task message has no id header (a string)"
    try:
        body = message.payload  # decoded once: Celery reads the same, cached
    except Exception:
        return None
    if not (
        isinstance(body, list | tuple)
        and len(body) == 3
        and isinstance(body[0], list | tuple)
        and isinstance(body[1], dict)
        and isinstance(body[2], dict)
    ):
        return "the task body must be the JSON list [args, kwargs, options]: a list, two objects"
    return None


def _from_turns(message: Message) -> bool:
    """Whether `message` was sent to `interlock.turns` (its exchange, or the default
    exchange with that routing key)."""
    info = message.delivery_info if isinstance(message.delivery_info, dict) else {}
    return TURNS in (info.get("exchange"), info.get("routing_key"))


def _header(message: Message, key: str) -> Any:
    headers = message.headers
    return headers.get(key) if isinstance(headers, dict) else None
