"""A started worker or resume consumer declares every exchange and queue of the
protocol, so a client can bind to `interlock.events`, or read `interlock.interrupted`,
before the first event is published (RabbitMQ refuses a binding to an exchange that
does not exist)."""

from __future__ import annotations

from pathlib import Path

import pytest
from amqp.exceptions import NotFound
from kombu.connection import Connection

from events.topology import DECISIONS_DEAD, EVENTS, INTERRUPTED
from tests.queue_helpers import APP, READY_TIMEOUT, Service, rabbitmq_vhost

MARKER = "declared Interlock's exchanges and queues"


def _missing(url: str) -> list[str]:
    """The protocol's names the broker does not know (passive declares)."""
    missing = []
    with Connection(url) as conn:
        for kind, name in (
            ("exchange", EVENTS.name),
            ("queue", INTERRUPTED.name),
            ("queue", DECISIONS_DEAD.name),
        ):
            with conn.channel() as channel:
                try:
                    if kind == "exchange":
                        channel.exchange_declare(name, "topic", durable=True, passive=True)
                    else:
                        channel.queue_declare(name, passive=True)
                except NotFound:
                    missing.append(f"{kind} {name}")
    return missing


@pytest.mark.parametrize("role", ["worker", "resume-consumer"])
def test_a_started_process_declares_the_topology(role: str, tmp_path: Path) -> None:
    with rabbitmq_vhost() as url:
        if url.endswith("/"):
            pytest.skip("rabbitmqctl could not make a fresh vhost")
        assert _missing(url) == [
            f"exchange {EVENTS.name}",
            f"queue {INTERRUPTED.name}",
            f"queue {DECISIONS_DEAD.name}",
        ], "a fresh vhost knows none of them"
        args = [role, "--app", APP, "--broker", url, "--store", f"sqlite:///{tmp_path}/i.db"]
        if role == "worker":
            args += ["--concurrency", "1"]
        service = Service(role, args, tmp_path / f"{role}.log")
        try:
            service.wait_for(MARKER, READY_TIMEOUT)
            assert _missing(url) == []
            with Connection(url) as conn, conn.channel() as channel:
                channel.queue_declare("dashboard.own", exclusive=True)
                channel.queue_bind("dashboard.own", EVENTS.name, "#")  # no 404
        finally:
            service.stop()
