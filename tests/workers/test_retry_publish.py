"""A turn's retry while the broker is away: published once it is back, not left to the
visibility timeout. Real redis-server, stopped and started again on its port."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from celery.exceptions import Reject, Retry

from events.topology import TURNS
from interlock import AgentInput, Message, Part
from tests.queue_helpers import APP
from tests.services import RedisServer, start_redis
from workers import app as worker_app
from workers.app import RUN_TURN, create_app
from workers.burst import BURST_ENV
from workers.settings import Settings
from workers.turns import new_turn_request


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    started = start_redis(tmp_path / "redis")
    try:
        yield started
    finally:
        started.stop()


def _retry_store_failure(server: RedisServer, tmp_path: Path) -> None:
    """What the task does when its store fails: `_again`, inside a delivered task."""
    app = create_app(
        Settings(broker_url=server.url, store_url=f"sqlite:///{tmp_path}/s.db", app=APP)
    )
    task = app.tasks[RUN_TURN]
    said = AgentInput(message=Message(role="user", content=[Part(text="Transfer $5 to x")]))
    request = new_turn_request("bankingAgent", said).model_dump(mode="json")
    task.push_request(
        id="task-1",
        args=[request],
        kwargs={},
        retries=0,
        called_directly=False,
        is_eager=False,
        delivery_info={"exchange": "", "routing_key": TURNS},
    )
    try:
        worker_app._again(task, ConnectionRefusedError(111, "store refused"), 0)
    finally:
        task.pop_request()


def test_a_retry_is_published_once_the_broker_is_back(
    server: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store failed and the broker is away too: the retry cannot be published. The
    pool process tries again until the broker is back, and the retry is then on
    `interlock.turns`: the turn runs at once, where a requeue (the main process's, on
    the channel the broker's loss closed) left it among Redis' unacked until the
    visibility timeout."""
    monkeypatch.delenv(BURST_ENV, raising=False)
    monkeypatch.setattr(worker_app, "REPUBLISH_PAUSES", (0.5,) * 40)
    server.stop()
    back = threading.Timer(2.0, server.start)
    back.start()
    try:
        with pytest.raises(Retry):
            _retry_store_failure(server, tmp_path)
    finally:
        back.join(30)
    queued = redis.Redis.from_url(server.url).llen(TURNS)
    assert queued == 1, "the retry waits on interlock.turns"


def test_a_burst_worker_requeues_at_once(
    server: RedisServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A batch job does not wait for its broker: the message is requeued (rejected with
    requeue), as before; a served worker says each wait in a line."""
    monkeypatch.setenv(BURST_ENV, "1")
    server.stop()
    caplog.set_level(logging.WARNING, logger="interlock.worker")
    with pytest.raises(Reject) as info:
        _retry_store_failure(server, tmp_path)
    assert info.value.requeue is True
    waits = [r for r in caplog.records if "its retry could not be published" in r.getMessage()]
    assert waits == [], "no wait"
    monkeypatch.delenv(BURST_ENV)
    monkeypatch.setattr(worker_app, "REPUBLISH_PAUSES", (0.1, 0.1))
    with pytest.raises(Reject) as served:
        _retry_store_failure(server, tmp_path)
    assert served.value.requeue is True, "still away after the tries: requeued"
    waits = [r for r in caplog.records if "its retry could not be published" in r.getMessage()]
    assert len(waits) == 2, [r.getMessage() for r in waits]
    assert "trying again in 0 s" in waits[0].getMessage()
