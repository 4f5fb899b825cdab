"""A publish RabbitMQ turns away (publisher confirms: a queue at its length limit with
`overflow: reject-publish`) is not sent again at once: every try reaches the queues
that take it, so each would get another copy. The publisher raises `PublishRefused`
after one try; the outbox, or the decision's redelivery, tries again later."""

from __future__ import annotations

import pytest
from kombu.connection import Connection
from kombu.entity import Queue
from kombu.exceptions import OperationalError

from events.publisher import Publisher, PublishRefused
from events.topology import EVENTS
from schemas import FinishReason, TurnCompleted
from tests.queue_helpers import rabbitmq_vhost


def test_a_refused_event_is_tried_once_and_raises() -> None:
    with (
        rabbitmq_vhost() as url,
        Connection(url, transport_options={"confirm_publish": True}) as conn,
    ):
        publisher = Publisher(conn)
        publisher.publish_event(TurnCompleted(turn_id="t-0", finish_reason=FinishReason.STOP))
        full = Queue(
            "audit.full",
            exchange=EVENTS,
            routing_key="turn.completed",
            queue_arguments={"x-max-length": 0, "x-overflow": "reject-publish"},
        )
        watch = Queue("audit.watch", exchange=EVENTS, routing_key="#")
        with conn.channel() as channel:
            full.bind(channel).declare()
            watch.bind(channel).declare()
        event = TurnCompleted(turn_id="t-1", finish_reason=FinishReason.STOP)
        with pytest.raises(PublishRefused) as info:
            publisher.publish_event(event)
        assert str(info.value).endswith(
            "the broker refused the message to interlock.events (turn.completed): "
            "a queue it routes to takes no more"
        ), info.value  # (RabbitMQ's nack carries no reason of its own)
        assert isinstance(info.value, OperationalError), "the broker's trouble, not the turn's"
        with conn.channel() as channel:
            bound = watch.bind(channel)
            copies = []
            while (message := bound.get(no_ack=True)) is not None:
                copies.append(message.body)
        assert len(copies) == 1, f"{len(copies)} copies reached the queue that took it"
        assert event.event_id in copies[0]
        # Once the queue takes messages again, the same publisher goes on publishing.
        with conn.channel() as channel:
            full.bind(channel).delete()
        publisher.publish_event(TurnCompleted(turn_id="t-2", finish_reason=FinishReason.STOP))
