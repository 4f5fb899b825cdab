"""The outbox: an event is written in the same transaction as its snapshot, then a
relay publishes it and marks it sent. Unsent rows go out again at start-up and
periodically, so a process dying between the two loses nothing (duplicates are
harmless: events carry ids).

A relay publishes the rows its own process wrote as soon as it flushes (found by their
event ids: a row whose transaction rolled back is simply not there). Rows of other
processes it sweeps only once they are `SWEEP_GRACE` seconds old, and at most once per
`SWEEP_INTERVAL`: a live process publishes its own rows within milliseconds, so the
sweep takes what a dead (or stuck) one left instead of racing the live ones and
publishing their events twice.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Index,
    Integer,
    MetaData,
    Table,
    Text,
    bindparam,
    insert,
    select,
    update,
)
from sqlalchemy.engine import Connection

from interlock import SqlSessionStore
from schemas import EventBase, Snapshot, utcnow

from .publisher import Publisher
from .snapshot_events import event_for_snapshot

__all__ = [
    "SWEEP_GRACE",
    "SWEEP_INTERVAL",
    "Outbox",
    "OutboxRelay",
    "outbox_metadata",
    "outbox_table",
]

log = logging.getLogger("interlock.outbox")

outbox_metadata = MetaData()
outbox_table = Table(
    "interlock_outbox",
    outbox_metadata,
    Column(
        "id", BigInteger().with_variant(Integer(), "sqlite"), primary_key=True, autoincrement=True
    ),
    Column("event_id", Text, nullable=False, unique=True),
    Column("routing_key", Text, nullable=False),
    Column("body", Text, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("sent_at", DateTime(timezone=True), nullable=True),
    Index("ix_interlock_outbox_unsent", "sent_at", "id"),
)


_OUT = outbox_table.c
_INSERT = insert(outbox_table)
_SELECT = select(_OUT.id, _OUT.routing_key, _OUT.body)
_UNSENT = _SELECT.where(_OUT.sent_at.is_(None)).order_by(_OUT.id).limit(bindparam("p_limit"))
_UNSENT_BEFORE = (
    _SELECT.where(_OUT.sent_at.is_(None), _OUT.created_at <= bindparam("p_before"))
    .order_by(_OUT.id)
    .limit(bindparam("p_limit"))
)
_MINE = (
    select(_OUT.id, _OUT.routing_key, _OUT.body, _OUT.event_id, _OUT.sent_at)
    .where(_OUT.event_id.in_(bindparam("p_ids", expanding=True)))
    .order_by(_OUT.id)
)
_MARK_SENT = (
    update(outbox_table)
    .where(_OUT.id == bindparam("p_id"))
    .values(sent_at=bindparam("p_at"), body=bindparam("p_body"))
)

SWEEP_GRACE = 2.0
"""Seconds a row stays its writer's to publish before another process's sweep takes it
(a live writer publishes within milliseconds of its commit). Clocks of the machines
sharing a store should agree to well within this."""

SWEEP_INTERVAL = 1.0
"""A relay's `flush()` sweeps the whole table at most this often (its own rows go out
on every flush)."""

_FORGET_AFTER = 60.0
"""Seconds after which a row written here but never seen committed is left to sweeps."""

_MAX_MINE = 10_000
"""At most this many ids of rows written here are remembered (older ones: sweeps)."""


class Outbox:
    """The outbox table beside a `SqlSessionStore`; every snapshot the store saves for
    the first time gets its event written in the same transaction."""

    def __init__(self, store: SqlSessionStore) -> None:
        self.store = store
        self.engine = store.engine
        store.create_all(outbox_metadata)
        store.add_save_hook(self._on_save)
        self._mine: dict[str, float] = {}  # event ids this process wrote, not yet published
        self._mine_lock = threading.Lock()

    def _on_save(self, conn: Connection, snapshot: Snapshot, created: bool) -> None:
        if not created:
            return
        event = event_for_snapshot(snapshot)
        if event is not None:
            self.add(conn, event)

    def add(self, conn: Connection, event: EventBase) -> None:
        """Write `event` as an unsent row, inside the caller's transaction."""
        conn.execute(
            _INSERT,
            {
                "event_id": event.event_id,
                "routing_key": event.type,
                "body": event.model_dump_json(),
                "created_at": utcnow(),
            },
        )
        with self._mine_lock:
            self._mine[event.event_id] = time.monotonic()
            if len(self._mine) > _MAX_MINE:
                del self._mine[next(iter(self._mine))]

    def add_now(self, event: EventBase) -> None:
        """Write `event` in a transaction of its own."""
        with self.store.writer().begin() as conn:
            self.add(conn, event)

    def unsent(self, limit: int = 500) -> list[tuple[int, str, str]]:
        with self.engine.connect() as conn:
            rows = conn.execute(_UNSENT, {"p_limit": limit}).all()
        return [(int(r[0]), str(r[1]), str(r[2])) for r in rows]

    def unsent_before(self, age: float, limit: int = 500) -> list[tuple[int, str, str]]:
        """Unsent rows written at least `age` seconds ago, oldest first."""
        before = utcnow() - timedelta(seconds=age)
        with self.engine.connect() as conn:
            rows = conn.execute(_UNSENT_BEFORE, {"p_before": before, "p_limit": limit}).all()
        return [(int(r[0]), str(r[1]), str(r[2])) for r in rows]

    def unsent_mine(self) -> list[tuple[int, str, str, str]]:
        """The unsent rows this process wrote, once their transactions committed, oldest
        first, as (id, routing key, body, event id): `forget` them once published. An id
        not found (its transaction rolled back, or is still open in another thread) is
        looked for again at the next call, for a while, then left to sweeps."""
        with self._mine_lock:
            if not self._mine:
                return []
            ids = list(self._mine)
        with self.engine.connect() as conn:
            rows = conn.execute(_MINE, {"p_ids": ids}).all()
        found = {str(r[3]) for r in rows}
        unsent = [(int(r[0]), str(r[1]), str(r[2]), str(r[3])) for r in rows if r[4] is None]
        now = time.monotonic()
        gone = [i for i in ids if i not in found and now - self._mine.get(i, now) > _FORGET_AFTER]
        self.forget([*(str(r[3]) for r in rows if r[4] is not None), *gone])
        return unsent

    def forget(self, event_ids: Iterable[str]) -> None:
        """Stop tracking these rows written here (published, or left to sweeps)."""
        with self._mine_lock:
            for event_id in event_ids:
                self._mine.pop(event_id, None)

    def mark_sent(self, row_id: int, body: str) -> None:
        """Mark a row sent, erasing the plaintext resume token from it."""
        self.mark_sent_many([(row_id, body)])

    def mark_sent_many(self, rows: Sequence[tuple[int, str]]) -> None:
        """Mark rows sent (one transaction), erasing the plaintext resume tokens."""
        if not rows:
            return
        at = utcnow()
        params = [
            {"p_id": row_id, "p_at": at, "p_body": _erase_token(body)} for row_id, body in rows
        ]
        with self.store.writer().begin() as conn:
            conn.execute(_MARK_SENT, params)


def _erase_token(body: str) -> str:
    data: dict[str, Any] = json.loads(body)
    if data.get("resume_token"):
        data["resume_token"] = None
        return json.dumps(data)
    return body


class OutboxRelay:
    """Publishes unsent outbox rows in order (`flush()`; the resume consumer's
    maintenance calls it periodically)."""

    def __init__(
        self,
        outbox: Outbox,
        publisher: Publisher,
        *,
        sweep_interval: float = SWEEP_INTERVAL,
        sweep_grace: float = SWEEP_GRACE,
    ) -> None:
        self.outbox = outbox
        self.publisher = publisher
        self.sweep_interval = sweep_interval
        self.sweep_grace = sweep_grace
        self._swept_at: float | None = None
        self._lock = threading.Lock()

    def flush(self, limit: int = 500) -> int:
        """Publish the rows this process wrote; then, at most once per `sweep_interval`,
        every other unsent row at least `sweep_grace` seconds old (what a process that
        died before publishing left). Returns how many rows went out."""
        with self._lock:
            mine = self.outbox.unsent_mine()
            sent = self._publish([row[:3] for row in mine], [row[3] for row in mine])
            now = time.monotonic()
            if self._swept_at is None or now - self._swept_at >= self.sweep_interval:
                self._swept_at = now
                sent += self._publish(self.outbox.unsent_before(self.sweep_grace, limit))
        return sent

    def _publish(
        self, rows: Sequence[tuple[int, str, str]], event_ids: Sequence[str] | None = None
    ) -> int:
        """Publish `rows` in order; mark those that went out sent, also when a later one
        fails (and stop tracking them: what did not go out stays this process's to
        retry at its next flush)."""
        done = 0
        try:
            for _row_id, routing_key, body in rows:
                self.publisher.publish_raw_event(routing_key, body)
                done += 1
        finally:
            self.outbox.mark_sent_many([(row[0], row[2]) for row in rows[:done]])
            if event_ids is not None:
                self.outbox.forget(event_ids[:done])
        return done
