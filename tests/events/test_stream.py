"""`EventStream`, the reader of `interlock.events` that the CLI's `--wait` and the demo
use, on real brokers: any program may publish to that exchange, so a message that is
no event of this release is skipped, never the end of the reader."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterator

import pytest
from kombu.connection import Connection
from kombu.messaging import Producer

from events.stream import EventStream
from events.topology import EVENTS
from schemas import TurnExpired
from tests.queue_helpers import rabbitmq_vhost

WAIT = 10.0


@pytest.fixture(params=["redis", "rabbitmq"])
def broker_url(request: pytest.FixtureRequest) -> Iterator[str]:
    if request.param == "redis":
        url: str = request.getfixturevalue("redis_url")
        yield url
        return
    with rabbitmq_vhost() as url:
        yield url


def test_messages_that_are_no_event_of_this_release_are_skipped(
    broker_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A type this release does not know (another program's, or a newer release's) is
    skipped quietly, as events.md asks of readers; a body that is no event is skipped
    with a warning naming what is wrong; the events around them are read in order."""
    foreign = {"schema_version": 1, "event_id": str(uuid.uuid4()), "type": "dash.note"}
    broken = {"schema_version": 1, "type": "turn.completed", "event_id": "x"}
    before, after = TurnExpired(agent="before"), TurnExpired(agent="after")
    with Connection(broker_url) as conn:
        stream = EventStream.bind(conn, f"test.stream.{uuid.uuid4().hex[:8]}", temporary=True)
        channel = conn.channel()
        try:
            producer = Producer(channel, exchange=EVENTS)  # one channel: delivered in order
            with caplog.at_level(logging.DEBUG, logger="interlock.events"):
                for body, key in [
                    (before.model_dump_json(), before.type),
                    (json.dumps(foreign), "dash.note"),
                    (b"\x00 not json", "turn.completed"),
                    (json.dumps(broken), "turn.completed"),
                    (after.model_dump_json(), after.type),
                ]:
                    producer.publish(
                        body, routing_key=key, content_type="application/json", retry=True
                    )
                seen = [stream.next(WAIT), stream.next(WAIT)]
        finally:
            channel.close()
            stream.close(True)
    assert [e.event_id for e in seen] == [before.event_id, after.event_id]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2, warnings
    assert all("is no Interlock event" in w for w in warnings), warnings
    assert any("turn.completed" in w for w in warnings), "names where the event is wrong"
    quiet = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert any("'dash.note'" in m for m in quiet), quiet


def test_deleting_a_queue_whose_connection_was_closed_says_so(broker_url: str) -> None:
    """`close(delete=True)` after the connection was closed raises ConnectionError naming
    the queue (which the CLI reports as a queue left behind), not an AttributeError from
    inside kombu; the queue and its binding are still there, and a new connection reads
    what was published since and deletes it."""
    name = f"test.stream.{uuid.uuid4().hex[:8]}"
    with Connection(broker_url) as conn:
        stream = EventStream.bind(conn, name)  # durable: it outlives its connection
    with pytest.raises(ConnectionError, match=f"before the queue {name} could be deleted"):
        stream.close(delete=True)
    event = TurnExpired(agent="kept")
    with Connection(broker_url) as conn:
        Producer(conn.default_channel, exchange=EVENTS).publish(
            event.model_dump_json(), routing_key=event.type, content_type="application/json"
        )
        again = EventStream.bind(conn, name)
        try:
            assert again.next(WAIT).event_id == event.event_id
        finally:
            again.close(delete=True)
