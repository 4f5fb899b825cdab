"""The bare-Celery two-hop baseline of `bench.queue_cycle`: the same shape as an
interrupt-and-resume cycle, with no agent, no store and no validation.

    task A (bench.a) ──publishes {"kind": "first"}──▶ [bench.baseline.events] ──▶ the bench
    the bench ──replies──▶ [bench.baseline.replies...] ──▶ reply consumer ──enqueues──▶ task B
    task B (bench.b) ──publishes {"kind": "done"}──▶ [bench.baseline.events] ──▶ the bench

The app has the settings of Interlock's (workers/app.py): JSON only, acks late, reject
on worker lost, prefetch multiplier 1, results ignored, the same transport options; it
runs as a real `celery worker` (prefork, concurrency 2, the same flags as
`interlock worker`). The reply consumer is a kombu `ConsumerMixin`, in one of two
places, each reading a queue of its own:

- a thread of the benchmark's process (`ConsumerThread`), the baseline as specified ("a
  consumer thread enqueues task B"); its cycles use `bench.baseline.replies.thread` and
  `bench.baseline.events.thread`;
- a process of its own, like the resume consumer (`bench.baseline.replies` and
  `bench.baseline.events`):

    BENCH_BROKER_URL=redis://... celery -A bench.queue_baseline:app worker \
        -Q bench.baseline.tasks -c 2 -P prefork --without-gossip --without-mingle
    python -m bench.queue_baseline consumer --broker redis://...
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from celery import Celery
from kombu.connection import Connection
from kombu.entity import Exchange, Queue
from kombu.message import Message as KombuMessage
from kombu.messaging import Consumer
from kombu.mixins import ConsumerMixin

from workers.app import delivery_config
from workers.settings import Settings

__all__ = [
    "EVENTS",
    "EVENTS_THREAD",
    "QUEUES",
    "REPLIES",
    "REPLIES_THREAD",
    "TASKS",
    "ConsumerThread",
    "ReplyConsumer",
    "app",
    "make_app",
]

TASKS = "bench.baseline.tasks"
EVENTS = "bench.baseline.events"
REPLIES = "bench.baseline.replies"
REPLIES_THREAD = "bench.baseline.replies.thread"
EVENTS_THREAD = "bench.baseline.events.thread"

TASKS_QUEUE = Queue(TASKS, Exchange(TASKS, type="direct", durable=True), routing_key=TASKS)
EVENTS_QUEUE = Queue(EVENTS, durable=True)
REPLIES_QUEUE = Queue(REPLIES, durable=True)
REPLIES_THREAD_QUEUE = Queue(REPLIES_THREAD, durable=True)
EVENTS_THREAD_QUEUE = Queue(EVENTS_THREAD, durable=True)
QUEUES = (TASKS_QUEUE, EVENTS_QUEUE, REPLIES_QUEUE, EVENTS_THREAD_QUEUE, REPLIES_THREAD_QUEUE)

RETRY_POLICY: dict[str, Any] = {
    "max_retries": 10,
    "interval_start": 0.1,
    "interval_step": 0.5,
    "interval_max": 3.0,
}


def make_app(broker_url: str) -> Celery:
    """The baseline's Celery app: Interlock's settings, two tasks that publish."""
    settings = Settings(broker_url=broker_url)
    app = Celery("bench_baseline", broker=broker_url, set_as_current=False)
    app.conf.update(
        delivery_config(settings),
        task_default_queue=TASKS,
        task_queues=[TASKS_QUEUE],
        task_routes={"bench.a": {"queue": TASKS}, "bench.b": {"queue": TASKS}},
    )

    def publish(kind: str, cycle_id: str, events: str) -> None:
        body = json.dumps({"kind": kind, "cycle_id": cycle_id})
        with app.producer_or_acquire() as producer:
            producer.publish(
                body,
                exchange="",
                routing_key=events,
                content_type="application/json",
                content_encoding="utf-8",
                delivery_mode=2,
                retry=True,
                retry_policy=RETRY_POLICY,
            )

    @app.task(name="bench.a")  # type: ignore[untyped-decorator]
    def task_a(cycle_id: str, events: str = EVENTS) -> None:
        publish("first", cycle_id, events)

    @app.task(name="bench.b")  # type: ignore[untyped-decorator]
    def task_b(cycle_id: str, events: str = EVENTS) -> None:
        publish("done", cycle_id, events)

    return app


app = make_app(os.environ.get("BENCH_BROKER_URL", "memory://localhost/"))
"""The worker's app (`celery -A bench.queue_baseline:app`), on `BENCH_BROKER_URL`."""


class ReplyConsumer(ConsumerMixin):
    """Reads the bench's replies and enqueues task B for each; acks after enqueueing."""

    def __init__(
        self,
        app: Celery,
        queue: Queue = REPLIES_QUEUE,
        events: str = EVENTS,
        *,
        announce: bool = True,
    ) -> None:
        self.app = app
        self.queue = queue
        self.events = events
        self.announce = announce
        self.ready = threading.Event()
        self.connection = Connection(
            app.conf.broker_url, transport_options=app.conf.broker_transport_options
        )

    def get_consumers(self, consumer_cls: Callable[..., Consumer], channel: Any) -> list[Consumer]:
        return [
            consumer_cls(
                queues=[self.queue],
                on_message=self.on_message,
                prefetch_count=1,
                no_ack=False,
                accept=["json"],
            )
        ]

    def on_consume_ready(self, connection: Any, channel: Any, consumers: Any, **kw: Any) -> None:
        self.ready.set()
        if self.announce:  # what the benchmark waits for in the process's log
            print("baseline consumer ready", flush=True)

    def on_message(self, message: KombuMessage) -> None:
        body = message.body
        data = json.loads(body.decode() if isinstance(body, bytes) else body)
        self.app.send_task("bench.b", args=[data["cycle_id"], self.events])
        message.ack()


class ConsumerThread:
    """The reply consumer as a thread of the calling process, on `REPLIES_THREAD`."""

    def __init__(self, broker_url: str, *, ready_timeout: float = 30.0) -> None:
        self.consumer = ReplyConsumer(
            make_app(broker_url), REPLIES_THREAD_QUEUE, EVENTS_THREAD, announce=False
        )
        self._thread = threading.Thread(
            target=self.consumer.run, name="baseline-reply-consumer", daemon=True
        )
        self._thread.start()
        if not self.consumer.ready.wait(ready_timeout):
            self.stop()
            raise RuntimeError(f"the baseline's consumer thread not ready in {ready_timeout}s")

    def cpu_seconds(self) -> float | None:
        """User + system CPU seconds of the thread so far (Linux /proc; None elsewhere)."""
        tid = self._thread.native_id
        try:
            stat = Path(f"/proc/self/task/{tid}/stat").read_text()
        except OSError:
            return None
        fields = stat[stat.rindex(")") + 2 :].split()  # state, ppid, ..., utime(11), stime(12)
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> None:
        self.consumer.should_stop = True
        self._thread.join(timeout=10)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.queue_baseline")
    parser.add_argument("role", choices=["consumer"])
    parser.add_argument("--broker", required=True)
    args = parser.parse_args(argv)
    consumer = ReplyConsumer(make_app(args.broker))
    signal.signal(signal.SIGTERM, lambda *_: setattr(consumer, "should_stop", True))
    consumer.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
