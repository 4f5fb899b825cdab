"""The resume consumer while its database is away, on a real PostgreSQL database and a
real Redis: a decision delivered then is requeued, not lost, not dead-lettered and not
answered; delivered again once the database is back, it is accepted once.

The database is taken away for real: it stops accepting connections and the ones open
on it (the consumer's pooled connections among them) are terminated. The consumer's
`on_message` is driven with messages read from the real decisions queue.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from typing import Any, cast

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError
from sqlalchemy.pool import NullPool, QueuePool

from events.topology import DECISIONS_DEAD
from tests.services import eventually
from tests.workers.test_consumer_commit import Rig

REQUEUED_TIMEOUT = 10.0
"""Seconds to wait for a requeued decision to be readable again (it takes milliseconds)."""

_BACKENDS = "SELECT count(*) FROM pg_stat_activity WHERE datname = :d AND pid <> pg_backend_pid()"
_TERMINATE = (
    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
    " WHERE datname = :d AND pid <> pg_backend_pid()"
)


@pytest.fixture
def rig(redis_url: str, pg_url: str) -> Iterator[Rig]:
    with contextlib.closing(Rig(redis_url, pg_url)) as made:
        yield made


@pytest.fixture
def dead(rig: Rig) -> Iterator[Any]:
    """`interlock.decisions.dead`, emptied first."""
    simple = rig.conn.SimpleQueue(DECISIONS_DEAD)
    simple.clear()
    yield simple
    simple.close()


@contextlib.contextmanager
def database_away(admin_url: str, url: str) -> Iterator[int]:
    """For the block, the database of `url` refuses new connections and those open on it
    are gone; yields how many were terminated. Connections are allowed again at exit,
    whatever happened in the block."""
    name = make_url(url).database
    assert name
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    quoted = admin.dialect.identifier_preparer.quote_identifier(name)

    def backends() -> int:
        with admin.connect() as conn:
            return int(conn.execute(text(_BACKENDS), {"d": name}).scalar_one())

    try:
        with admin.connect() as conn:
            conn.execute(text(f"ALTER DATABASE {quoted} ALLOW_CONNECTIONS false"))
            terminated = int(conn.execute(text(_TERMINATE), {"d": name}).scalar_one())
        eventually(lambda: backends() == 0, f"end of the connections to {name}")
        with pytest.raises(OperationalError, match="not currently accepting connections"):
            create_engine(url, poolclass=NullPool).connect().close()
        yield terminated
    finally:
        with admin.connect() as conn:
            conn.execute(text(f"ALTER DATABASE {quoted} ALLOW_CONNECTIONS true"))
        admin.dispose()


def test_decision_delivered_while_the_database_is_away_is_requeued_then_accepted(
    rig: Rig, dead: Any, pg_admin: str, pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The database goes away with a valid decision on the queue. Delivered then, the
    decision raises nothing out of `on_message`, is not acked, gets no outcome event, is
    not dead-lettered, claims and records nothing, and is back on the queue. Delivered
    again once the database is back, it is accepted: one outcome, one claim, one row in
    the decision log, one resumed turn enqueued, and the message acked."""
    body = rig.paused(15)
    consumer = rig.consumer()
    # The consumer has read the store before: its pool holds connections to lose.
    assert consumer.rt.store.get_snapshot(body["snapshot_id"]) is not None
    assert consumer.rt.decisions.get(body["decision_id"]) is None
    assert cast(QueuePool, consumer.rt.store.engine.pool).checkedin() >= 1
    rig.rt.publisher.publish_decision(body)
    message = rig.decisions.get(timeout=REQUEUED_TIMEOUT)

    with database_away(pg_admin, pg_url) as terminated:
        assert terminated >= 1
        with caplog.at_level(logging.WARNING, logger="interlock.consumer"):
            consumer.on_message(message)  # the store fails: requeued, nothing raised
        assert consumer.handled == 0
        said = [r for r in caplog.records if r.name == "interlock.consumer"]
        assert [(r.levelno, r.exc_info is None) for r in said] == [(logging.WARNING, True)]
        assert said[0].getMessage().startswith("decision could not be processed (")
        assert said[0].getMessage().endswith("); requeueing it")
        assert rig.published() == []
        with pytest.raises(dead.Empty):
            dead.get_nowait()
        assert rig.enqueued() == []
        again = rig.decisions.get(timeout=REQUEUED_TIMEOUT)  # back on the queue
        assert json.loads(again.body) == body

    assert rig.claimed_by(body["snapshot_id"]) is None
    assert rig.rows(body["decision_id"]) == []

    consumer.on_message(again)
    assert consumer.handled == 1
    [event] = rig.published()
    assert event.type == "decision.accepted", event.model_dump_json()
    assert event.decision_id == body["decision_id"]  # type: ignore[attr-defined]
    assert rig.claimed_by(body["snapshot_id"]) == body["decision_id"]
    [row] = rig.rows(body["decision_id"])
    assert row.outcome == "accepted"
    assert row.event_body == event.model_dump_json()
    [request] = rig.enqueued()
    assert request["decision_id"] == request["claimed_by"] == body["decision_id"]
    assert request["snapshot_id"] == body["snapshot_id"]
    with pytest.raises(rig.decisions.Empty):  # acked: gone for good
        rig.decisions.get_nowait()
    with pytest.raises(dead.Empty):
        dead.get_nowait()


def test_a_consumer_that_may_give_up_stops_after_failures_in_a_row_keeping_the_decision(
    rig: Rig, dead: Any, pg_admin: str, pg_url: str
) -> None:
    """A batch job's consumer (`resume-consumer --burst`) gives up once the store has
    failed `give_up_after` + 1 deliveries in a row, instead of requeueing for ever: it
    stops, says why (`gave_up`), and the decision is still queued, with no outcome."""
    from workers.burst import drain

    body = rig.paused(16)
    consumer = rig.consumer()
    consumer.give_up_after = 1
    rig.rt.publisher.publish_decision(body)
    with database_away(pg_admin, pg_url):
        drain(consumer, idle=30)  # returns long before the idle time: it gave up
    assert isinstance(consumer.gave_up, OperationalError), consumer.gave_up
    assert consumer.failing == 2 and consumer.handled == 0
    assert rig.published() == []
    with pytest.raises(dead.Empty):
        dead.get_nowait()
    consumer.connection.release()  # its channel's unacked message goes back to the queue
    again = rig.decisions.get(timeout=REQUEUED_TIMEOUT)
    assert json.loads(again.body) == body
    assert rig.claimed_by(body["snapshot_id"]) is None


def test_upkeep_says_a_dropped_store_connection_in_one_line(
    pg_url: str,
    pg_admin: str,
    caplog: pytest.LogCaptureFixture,
    redis_url: str,
) -> None:
    """The consumer's upkeep (deadlines, the outbox) meets connections the server
    dropped: one WARNING line naming the store's error, no traceback (that is for bugs),
    and the next round works again."""
    from examples.banking import ai
    from tests.sql_helpers import terminate_backends
    from workers.maintenance import Maintenance
    from workers.runtime import Runtime
    from workers.settings import Settings

    runtime = Runtime(Settings(broker_url=redis_url, store_url=pg_url), ai)
    upkeep = Maintenance(runtime)
    try:
        upkeep.run_once()  # the pool holds connections now
        with caplog.at_level(logging.INFO, logger="interlock.maintenance"):
            terminate_backends(pg_admin, make_url(pg_url).database)
            upkeep.start(0.05)  # reused at once: too recent for the pool to ping them
            eventually(
                lambda: any(r.levelno == logging.WARNING for r in caplog.records),
                "a WARNING from the upkeep",
                REQUEUED_TIMEOUT,
            )
        said = [r for r in caplog.records if r.name == "interlock.maintenance"]
        warned = [r for r in said if r.levelno == logging.WARNING]
        assert warned and all(r.exc_info is None for r in said), [r.getMessage() for r in said]
        assert warned[0].getMessage().startswith("maintenance failed (OperationalError: ")
        assert not [r for r in said if r.levelno >= logging.ERROR]
    finally:
        upkeep.stop()
        runtime.close()
