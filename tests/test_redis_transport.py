"""The Redis transport of workers and consumers: kombu's, with one redis client per
channel for its commands instead of one per command."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import redis
from kombu import Connection, Exchange, Queue

from events.publisher import Publisher
from events.redis_transport import Channel, Transport, transport_for
from events.topology import EVENTS
from workers.app import create_app
from workers.runtime import Runtime
from workers.settings import Settings


@pytest.fixture
def clients_built(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the `redis.Redis` clients built while a test runs."""
    built: list[int] = []
    init = redis.Redis.__init__

    def counting(self: redis.Redis, *args: Any, **kwargs: Any) -> None:
        built.append(1)
        init(self, *args, **kwargs)

    monkeypatch.setattr(redis.Redis, "__init__", counting)
    return built


def test_redis_urls_get_the_transport_others_keep_theirs() -> None:
    assert transport_for("redis://localhost:6379/0") == "events.redis_transport:Transport"
    assert transport_for("rediss://h:6380/1") == "events.redis_transport:Transport"
    assert transport_for("amqp://guest@localhost//") is None
    assert transport_for("memory://") is None
    redis_app = create_app(Settings(broker_url="redis://127.0.0.1:1/0"))
    assert redis_app.conf.broker_transport == "events.redis_transport:Transport"
    assert create_app(Settings(broker_url="memory://")).conf.broker_transport is None


def test_events_go_out_on_one_client(redis_url: str, clients_built: list[int]) -> None:
    """200 events through the topic exchange reach a queue bound by pattern; the
    channel builds its command client once, not once or more per event."""
    rt = Runtime(Settings(broker_url=redis_url))
    queue = Queue(f"test.transport.{uuid.uuid4().hex}", EVENTS, routing_key="turn.#")
    with rt.connection() as conn:
        assert isinstance(conn.default_channel, Channel)
        queue.bind(conn.default_channel).declare()
        publisher = Publisher(conn)
        publisher.publish_raw_event("turn.completed", '{"n": -1}')  # connects, declares
        before = len(clients_built)
        for n in range(200):
            publisher.publish_raw_event("turn.completed", f'{{"n": {n}}}')
        assert len(clients_built) - before <= 1
        received = []
        bound = queue.bind(conn.default_channel)
        while (message := bound.get(no_ack=True)) is not None:
            received.append(message.payload["n"])
        bound.delete()
    assert received == [-1, *range(200)], "every event, in order"


def test_a_new_pool_gets_a_new_client(redis_url: str, clients_built: list[int]) -> None:
    """After a reconnect kombu replaces the channel's pool: the client follows it."""
    with Connection(redis_url, transport=Transport) as conn:
        channel = conn.default_channel
        exchange = Exchange(f"test.direct.{uuid.uuid4().hex}", type="direct")
        queue = Queue(f"test.q.{uuid.uuid4().hex}", exchange, routing_key="k")
        bound = queue.bind(channel)
        bound.declare()
        producer = conn.Producer()
        producer.publish({"a": 1}, exchange=exchange, routing_key="k")
        first = channel._shared_client
        assert first is not None
        channel._pool = None  # what kombu does to a channel's pools on disconnect
        producer.publish({"a": 2}, exchange=exchange, routing_key="k")
        second = channel._shared_client
        assert second is not None and second[0] is not first[0] and second[1] is not first[1]
        assert [bound.get(no_ack=True).payload["a"] for _ in range(2)] == [1, 2]
        bound.delete()
