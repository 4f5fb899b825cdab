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
from tests.services import service_unavailable

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
            service_unavailable("rabbitmqctl could not make a fresh vhost")
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


def test_a_queue_declared_otherwise_stops_every_command_with_a_clear_error(
    tmp_path: Path,
) -> None:
    """A dashboard (re)declared `interlock.interrupted` as a quorum queue: RabbitMQ then
    refuses Interlock's declaration of it, and every publish and consume that declares
    it. The worker and the resume consumer stop at once, exit 1, with one line naming
    the queue (not a worker that runs and publishes nothing, nor a consumer reconnecting
    every second); `interlock health` says it too."""
    from kombu.entity import Queue

    from tests.queue_helpers import run_cli

    with rabbitmq_vhost() as url:
        if url.endswith("/"):
            service_unavailable("rabbitmqctl could not make a fresh vhost")
        with Connection(url) as conn, conn.channel() as channel:
            quorum = {"x-queue-type": "quorum"}
            Queue(INTERRUPTED.name, durable=True, queue_arguments=quorum).bind(channel).declare()
        store = f"sqlite:///{tmp_path}/i.db"
        said = "error: FAILED_PRECONDITION: the broker refuses Interlock's exchanges and queues"
        for role in (["worker", "--concurrency", "1"], ["resume-consumer"]):
            ran = run_cli(*role, "--app", APP, "--broker", url, "--store", store, timeout=60)
            assert ran.returncode == 1, ran.describe()
            assert said in ran.stderr, ran.describe()
            assert "'x-queue-type' for queue 'interlock.interrupted'" in ran.stderr
            assert "Traceback" not in ran.stderr, ran.describe()
        health = run_cli("health", "--broker", url, "--store", store)
        assert health.returncode == 1, health.describe()
        assert "broker error: FAILED_PRECONDITION: the broker refuses" in health.stderr


def test_a_worker_that_meets_the_conflict_once_ready_stops(tmp_path: Path) -> None:
    """`interlock worker` checks the topology before Celery starts; a conflict the broker
    shows only later (it did not answer then) is met by the worker's own declaration
    once ready: a bare `celery worker` of the app stops there, exit 1, with the line."""
    import subprocess
    import sys

    from kombu.entity import Queue

    from tests.queue_helpers import child_env

    with rabbitmq_vhost() as url:
        if url.endswith("/"):
            service_unavailable("rabbitmqctl could not make a fresh vhost")
        with Connection(url) as conn, conn.channel() as channel:
            quorum = {"x-queue-type": "quorum"}
            Queue(INTERRUPTED.name, durable=True, queue_arguments=quorum).bind(channel).declare()
        store = f"sqlite:///{tmp_path}/i.db"
        env = child_env(INTERLOCK_APP=APP, INTERLOCK_BROKER_URL=url, INTERLOCK_STORE_URL=store)
        argv = [sys.executable, "-m", "celery", "-A", "workers.celery_app:app", "worker"]
        argv += ["-Q", "interlock.turns", "-P", "solo", "--without-gossip", "--without-mingle"]
        ran = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)
        assert ran.returncode == 1, ran.stderr[-3000:]
        said = "error: FAILED_PRECONDITION: the broker refuses Interlock's exchanges and queues"
        assert said in ran.stderr and "; the worker stops" in ran.stderr, ran.stderr[-3000:]
        assert "'x-queue-type' for queue 'interlock.interrupted'" in ran.stderr


def test_the_docs_topology_table_says_each_exchange_type_and_key() -> None:
    """docs/queues.md's table gives, for every queue Interlock declares, the exchange,
    its type and the routing key it is bound with, so that a client in another language
    can declare them exactly as Interlock does (a declare that differs is refused)."""
    from events.topology import all_queues

    docs = Path(__file__).resolve().parents[2] / "docs" / "queues.md"
    rows = {
        cells[0].strip(" `"): cells[1]
        for line in docs.read_text().splitlines()
        if line.startswith("| `interlock.")
        for cells in [line.strip("|").split("|")]
    }
    for queue in all_queues():
        exchange = queue.exchange
        assert queue.name in rows, f"{queue.name} is not in the table"
        said = rows[queue.name]
        if exchange.type == "topic":
            assert f"bound to `{exchange.name}` with `{queue.routing_key}`" in said, said
            assert rows[exchange.name].strip() == "topic exchange", rows[exchange.name]
        else:
            expected = f"exchange `{exchange.name}`, {exchange.type}, key `{queue.routing_key}`"
            assert expected in said, f"{queue.name}: {said!r} lacks {expected!r}"
