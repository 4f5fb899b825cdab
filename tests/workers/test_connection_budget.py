"""How many PostgreSQL connections a resume consumer and a worker hold, on a real
PostgreSQL database and a real Redis: each thread of theirs holds at most one at a time
(docs/operations.md, "Connections"), also on the first decision a consumer handles and
the first resume a worker runs, when the decision log's table is checked or made.

A pool keeps what it opened: a thread that checked out a second connection while it held
one leaves a connection the process keeps, idle, for as long as it runs, one more than
the budget the documentation gives, and one a database that allows the process a single
connection refuses at every try (the decision is requeued for ever)."""

from __future__ import annotations

import contextlib
import json
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import event
from sqlalchemy.engine import Engine

from examples.banking import ai
from tests.workers.test_consumer_commit import Rig
from workers.app import create_app, runtime_of
from workers.turns import run_task


class HeldPerThread:
    """The most connections of `engine`'s pool that one thread held at once."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._lock = threading.Lock()
        self._holder: dict[int, int] = {}  # pool record -> the thread that checked it out
        self._held: Counter[int] = Counter()
        self.most = 0
        self.checkouts = 0
        event.listen(engine, "checkout", self._out)
        event.listen(engine, "checkin", self._in)

    def _out(self, _dbapi: Any, record: Any, _proxy: Any) -> None:
        me = threading.get_ident()
        with self._lock:
            self._holder[id(record)] = me
            self._held[me] += 1
            self.checkouts += 1
            self.most = max(self.most, self._held[me])

    def _in(self, _dbapi: Any, record: Any) -> None:
        with self._lock:
            thread = self._holder.pop(id(record), None)
            if thread is not None:
                self._held[thread] -= 1

    def close(self) -> None:
        event.remove(self.engine, "checkout", self._out)
        event.remove(self.engine, "checkin", self._in)


@pytest.fixture
def rig(redis_url: str, pg_url: str) -> Iterator[Rig]:
    with contextlib.closing(Rig(redis_url, pg_url)) as made:
        yield made


def test_a_consumers_first_decision_holds_one_connection_at_a_time(rig: Rig) -> None:
    """A consumer that has handled no decision yet builds its decision log (its table
    checked, or made) as it handles the first: before it opens the read of the log and
    the snapshot, not while that read holds a connection."""
    body = rig.paused(25)
    consumer = rig.consumer()
    assert "decisions" not in consumer.rt.__dict__  # a fresh process's runtime
    held = HeldPerThread(consumer.rt.store.engine)
    try:
        outcome = consumer.handle(json.dumps(body).encode(), "application/json", {})
    finally:
        held.close()
    assert outcome.type == "decision.accepted", outcome.model_dump_json()
    assert held.checkouts >= 3  # the log's table, the read, the claim
    assert held.most == 1


def test_a_workers_first_resume_holds_one_connection_at_a_time(rig: Rig) -> None:
    """A worker process checks a resume against the decision log before it runs it; the
    first resume it runs builds the log (its table checked, or made) before that read
    opens, so no thread of the worker holds two connections at once."""
    body = rig.paused(35)
    accepted = rig.consumer().handle(json.dumps(body).encode(), "application/json", {})
    assert accepted.type == "decision.accepted", accepted.model_dump_json()
    [request] = rig.enqueued()

    worker = runtime_of(create_app(rig.settings, ai))
    try:
        assert "decisions" not in worker.__dict__
        held = HeldPerThread(worker.store.engine)
        try:
            result = run_task(worker, (request,), {})
        finally:
            held.close()
    finally:
        worker.close()
    assert result["finish_reason"] == "stop", result
    assert held.most == 1
