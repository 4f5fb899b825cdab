"""The outbox: an event is written in the same transaction as its snapshot, then a
relay publishes it and marks it sent. Unsent rows go out again at start-up and
periodically, so a process dying between the two loses nothing (duplicates are
harmless: events carry ids)."""

from __future__ import annotations

import json
import logging
import threading
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
    insert,
    select,
    update,
)
from sqlalchemy.engine import Connection

from interlock import SqlSessionStore
from schemas import EventBase, Snapshot, utcnow

from .publisher import Publisher
from .snapshot_events import event_for_snapshot

__all__ = ["Outbox", "OutboxRelay", "outbox_metadata", "outbox_table"]

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


class Outbox:
    """The outbox table beside a `SqlSessionStore`; every snapshot the store saves for
    the first time gets its event written in the same transaction."""

    def __init__(self, store: SqlSessionStore) -> None:
        self.store = store
        self.engine = store.engine
        store.create_all(outbox_metadata)
        store.add_save_hook(self._on_save)

    def _on_save(self, conn: Connection, snapshot: Snapshot, created: bool) -> None:
        if not created:
            return
        event = event_for_snapshot(snapshot)
        if event is not None:
            self.add(conn, event)

    def add(self, conn: Connection, event: EventBase) -> None:
        """Write `event` as an unsent row, inside the caller's transaction."""
        conn.execute(
            insert(outbox_table).values(
                event_id=event.event_id,
                routing_key=event.type,
                body=event.model_dump_json(),
                created_at=utcnow(),
            )
        )

    def add_now(self, event: EventBase) -> None:
        """Write `event` in a transaction of its own."""
        with self.engine.begin() as conn:
            self.add(conn, event)

    def unsent(self, limit: int = 500) -> list[tuple[int, str, str]]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(outbox_table.c.id, outbox_table.c.routing_key, outbox_table.c.body)
                .where(outbox_table.c.sent_at.is_(None))
                .order_by(outbox_table.c.id)
                .limit(limit)
            ).all()
        return [(int(r[0]), str(r[1]), str(r[2])) for r in rows]

    def mark_sent(self, row_id: int, body: str) -> None:
        """Mark a row sent, erasing the plaintext resume token from it."""
        with self.engine.begin() as conn:
            conn.execute(
                update(outbox_table)
                .where(outbox_table.c.id == row_id)
                .values(sent_at=utcnow(), body=_erase_token(body))
            )

    def count_unsent(self) -> int:
        return len(self.unsent(limit=1_000_000))


def _erase_token(body: str) -> str:
    data: dict[str, Any] = json.loads(body)
    if data.get("resume_token"):
        data["resume_token"] = None
        return json.dumps(data)
    return body


class OutboxRelay:
    """Publishes unsent outbox rows in order. `flush()` once, or `start()` a thread."""

    def __init__(self, outbox: Outbox, publisher: Publisher) -> None:
        self.outbox = outbox
        self.publisher = publisher
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def flush(self, limit: int = 500) -> int:
        """Publish what is unsent; returns how many rows went out."""
        sent = 0
        with self._lock:
            for row_id, routing_key, body in self.outbox.unsent(limit):
                self.publisher.publish_raw_event(routing_key, body)
                self.outbox.mark_sent(row_id, body)
                sent += 1
        return sent

    def start(self, interval: float) -> None:
        """Flush now, then every `interval` seconds in a daemon thread."""

        def loop() -> None:
            while not self._stop.is_set():
                try:
                    self.flush()
                except Exception:
                    log.exception("outbox relay: publishing failed; will retry")
                self._stop.wait(interval)

        self._thread = threading.Thread(target=loop, name="interlock-outbox", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
