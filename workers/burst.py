"""Burst mode (arq's `burst=True`): a worker or a resume consumer that serves what is
queued, then stops once it has had nothing to do for a while. For tests that need a
deterministic end, and for batch jobs that drain a queue and exit."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from typing import Any

from amqp.exceptions import ChannelError
from billiard.einfo import ExceptionInfo, ExceptionWithTraceback
from celery.exceptions import Reject
from celery.platforms import EX_FAILURE
from celery.worker import state
from celery.worker.request import Request
from kombu.connection import Connection
from kombu.mixins import ConsumerMixin

__all__ = [
    "BURST_ENV",
    "BurstGaveUp",
    "BurstRequest",
    "WorkerBurst",
    "burst_idle",
    "drain",
    "queue_depth",
]

BURST_ENV = "INTERLOCK_WORKER_BURST"
"""Set (to the idle seconds) for a `celery worker` that runs in burst mode."""

CHECK_EVERY = 0.2
"""Seconds between two looks at the queue and the worker's tasks."""

log = logging.getLogger("interlock.worker")


BURST_CONNECT_RETRIES = 3
"""Attempts to reach the broker that a worker or resume consumer in burst mode makes
after the first (2, 4 and 6 s apart for the consumer) before it gives up and exits 1:
a batch job should not wait for ever for a broker that is not there. The same count
of retries for a turn (or decision) whose store or broker fails while it serves."""


def burst_idle() -> float | None:
    """The idle seconds of a worker in burst mode (`BURST_ENV`), or None."""
    value = os.environ.get(BURST_ENV)
    return float(value) if value else None


class BurstGaveUp(Reject):  # type: ignore[misc]
    """A turn whose store or broker failed at each of a burst worker's tries (or that
    met an unexpected error at each): its task goes back on its queue (requeued), and
    the worker stops, exit 1 (`BurstRequest`), rather than backing off for a quarter of
    an hour as a served worker does. Its reason starts with the status: UNAVAILABLE, or
    INTERNAL for an unexpected error."""

    def __init__(self, reason: str | None = None, requeue: bool = True) -> None:
        super().__init__(reason, requeue)  # both, so that it crosses the pool's pipe


class BurstRequest(Request):  # type: ignore[misc]
    """The turn task's request in the worker's main process: a `BurstGaveUp` from the
    pool requeues the task, as Celery does for any `Reject(requeue=True)`, then says
    why in one line and stops the worker (a warm shutdown) with exit 1."""

    def on_failure(
        self, exc_info: ExceptionInfo, send_failed_event: bool = True, return_ok: bool = False
    ) -> None:
        super().on_failure(exc_info, send_failed_event=send_failed_event, return_ok=return_ok)
        exc = exc_info.exception
        if isinstance(exc, ExceptionWithTraceback):
            exc = exc.exc
        if isinstance(exc, BurstGaveUp):
            line = f"error: {exc.reason}; the worker stops\n"
            os.write(2, line.encode(errors="replace"))  # stderr, past Celery's redirection
            state.should_stop = EX_FAILURE


def queue_depth(channel: Any, queue: str) -> int:
    """How many messages wait in `queue` (not counting those delivered and unacked)."""
    declared: Any = channel.queue_declare(queue=queue, passive=True)
    return int(declared.message_count)


class WorkerBurst:
    """Stops this worker (a warm shutdown: running turns finish) once `queue` has been
    empty, and the worker has held no task (running, prefetched, or waiting for its
    retry's countdown), for `idle` seconds in a row."""

    def __init__(self, connection: Connection, queue: str, idle: float) -> None:
        self.connection = connection
        self.queue = queue
        self.idle = idle
        self._channel: Any = None
        self.drained = False
        """Set once the queue was found drained, as the worker is asked to stop."""
        self._thread = threading.Thread(target=self._watch, name="interlock-burst", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def busy(self) -> bool:
        held = state.active_requests or state.reserved_requests
        scheduled = getattr(state, "scheduled_requests", ())  # retries' countdowns (5.5+)
        return bool(held or scheduled) or self._waiting() > 0

    def _waiting(self) -> int:
        if self._channel is None:
            self._channel = self.connection.channel()
        try:
            return queue_depth(self._channel, self.queue)
        except ChannelError as exc:
            if str(exc.reply_code) != "404":
                raise
            self._drop_channel()  # AMQP closes a channel whose passive declare failed
            return 0  # Redis keeps no empty list: no trace of the queue is an empty one

    def _drop_channel(self) -> None:
        channel, self._channel = self._channel, None
        if channel is not None:
            with contextlib.suppress(Exception):
                channel.close()

    def _watch(self) -> None:
        quiet_since: float | None = None
        while True:
            time.sleep(CHECK_EVERY)
            try:
                busy = self.busy()
            except Exception:  # the broker, for a moment: look again on a new channel
                log.exception("burst: could not look at %s", self.queue)
                self._drop_channel()
                busy = True
            now = time.monotonic()
            if busy:
                quiet_since = None
            elif quiet_since is None:
                quiet_since = now
            elif now - quiet_since >= self.idle:
                if state.should_stop not in (None, False):  # stopping already (exit 1)
                    return
                log.info("burst: %s is drained; stopping", self.queue)
                self.drained = True
                self._drop_channel()
                os.kill(os.getpid(), signal.SIGTERM)
                return


def drain(consumer: ConsumerMixin, idle: float) -> None:
    """Serve `consumer` (the resume consumer) until no message has come for `idle`
    seconds, or a stop was asked for."""
    try:
        for _ in consumer.consume(timeout=idle, safety_interval=min(1.0, idle)):
            if consumer.should_stop:
                return
    except TimeoutError:  # kombu's consume: `idle` seconds with nothing to read
        return
