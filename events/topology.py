"""The broker topology: one topic exchange for events, and the queues around it."""

from __future__ import annotations

from kombu.entity import Exchange, Queue

__all__ = [
    "DEAD_EXCHANGE",
    "DECISIONS",
    "DECISIONS_DEAD",
    "DECISIONS_EXCHANGE",
    "EVENTS",
    "INTERRUPTED",
    "TURNS",
    "TURNS_DEAD",
    "TURNS_QUEUE",
    "all_queues",
    "event_queue",
]

EVENTS = Exchange("interlock.events", type="topic", durable=True)
"""Every event, routed by its type (`turn.interrupted`, `decision.rejected`, ...)."""

DECISIONS_EXCHANGE = Exchange("interlock.decisions", type="direct", durable=True)
DEAD_EXCHANGE = Exchange("interlock.dead", type="direct", durable=True)

TURNS = "interlock.turns"
"""The Celery queue of `interlock.run_turn`."""

TURNS_QUEUE = Queue(TURNS, Exchange(TURNS, type="direct", durable=True), routing_key=TURNS)

INTERRUPTED = Queue("interlock.interrupted", EVENTS, routing_key="turn.interrupted", durable=True)
"""Paused turns waiting for a human: what a review dashboard reads."""

DECISIONS = Queue(
    "interlock.decisions", DECISIONS_EXCHANGE, routing_key="interlock.decisions", durable=True
)
"""Human decisions, read by the resume consumer. Publish to the exchange
`interlock.decisions` or to the default exchange, routing key `interlock.decisions`."""

DECISIONS_DEAD = Queue(
    "interlock.decisions.dead", DEAD_EXCHANGE, routing_key="interlock.decisions.dead", durable=True
)
"""Decisions that could not be parsed, kept with the reason."""

TURNS_DEAD = Queue(
    "interlock.turns.dead", DEAD_EXCHANGE, routing_key="interlock.turns.dead", durable=True
)
"""Messages on `interlock.turns` that are no task a worker can run (undecodable, not a
Celery task message, a task other than `interlock.run_turn`), kept with the reason."""


def event_queue(
    name: str, pattern: str = "#", *, durable: bool = True, auto_delete: bool = False
) -> Queue:
    """A queue of your own on the events exchange, bound with a topic pattern
    (`turn.*`, `decision.#`, `#`)."""
    return Queue(name, EVENTS, routing_key=pattern, durable=durable, auto_delete=auto_delete)


def all_queues() -> list[Queue]:
    """The queues Interlock declares."""
    return [TURNS_QUEUE, INTERRUPTED, DECISIONS, DECISIONS_DEAD, TURNS_DEAD]
