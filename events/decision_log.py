"""The decision log: one row per decision read, with its outcome. It makes the resume
consumer idempotent by `decision_id` and is the audit trail of who decided what."""

from __future__ import annotations

import json
import re
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    Column,
    DateTime,
    Index,
    MetaData,
    Table,
    Text,
    bindparam,
    insert,
    select,
    update,
)
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import IntegrityError

from schemas import EventBase, utcnow

from .store import SqlStore

__all__ = ["DecisionLog", "DecisionRecord", "decision_table", "without_token"]

decision_metadata = MetaData()
decision_table = Table(
    "interlock_decision",
    decision_metadata,
    Column("decision_id", Text, primary_key=True),
    Column("snapshot_id", Text, nullable=True),
    Column("session_id", Text, nullable=True),
    Column("reviewer", Text, nullable=True),
    Column("outcome", Text, nullable=False),
    Column("status", Text, nullable=True),
    Column("message", Text, nullable=True),
    Column("body", Text, nullable=False),
    Column("event_type", Text, nullable=False),
    Column("event_body", Text, nullable=False),
    Column("received_at", DateTime(timezone=True), nullable=False),
    Index("ix_interlock_decision_session", "session_id", "received_at"),
)


@dataclass(frozen=True)
class DecisionRecord:
    decision_id: str
    snapshot_id: str | None
    session_id: str | None
    reviewer: str | None
    outcome: str
    status: str | None
    message: str | None
    body: str
    event_type: str
    event_body: str
    received_at: datetime


_GET = select(decision_table).where(decision_table.c.decision_id == bindparam("p_id"))
_INSERT = insert(decision_table)
_WITH_TOKEN = select(decision_table.c.decision_id, decision_table.c.body).where(
    decision_table.c.body.contains('"resume_token"')
)
_SET_BODY = (
    update(decision_table)
    .where(decision_table.c.decision_id == bindparam("p_id"))
    .values(body=bindparam("p_body"))
)


class DecisionLog:
    def __init__(self, store: SqlStore, *, create_tables: bool = True) -> None:
        """The decision log in `store`'s database (its table made if missing, unless
        `create_tables` is False: a reader's)."""
        self.engine: Engine = store.engine
        self._get, self._insert = store.fast(_GET), store.fast(_INSERT)  # the consumer's hot path
        self._writer = store.writer()  # BEGIN IMMEDIATE on SQLite: writers queue
        if create_tables:
            store.create_all(decision_metadata)

    def get(self, decision_id: str, *, conn: Connection | None = None) -> DecisionRecord | None:
        """The record of `decision_id`, if any; on `conn` when given (a read sharing the
        caller's transaction)."""
        if conn is None:
            with self.engine.begin() as own:
                return self.get(decision_id, conn=own)
        rows = self._get.execute(conn, {"p_id": decision_id}).mappings()
        return _record(rows[0]) if rows else None

    def begin(self) -> AbstractContextManager[Connection]:
        """A write transaction on the log's database (`BEGIN IMMEDIATE` on SQLite), for a
        `record(..., conn=)` that must commit with other writes (the resume's claim)."""
        return self._writer.begin()

    def record(
        self,
        *,
        decision_id: str,
        body: str,
        event: EventBase,
        reviewer: str | None,
        session_id: str | None,
        conn: Connection | None = None,
    ) -> DecisionRecord | None:
        """Store the first outcome of `decision_id`. Returns the earlier record instead
        when another consumer got there first.

        With `conn` (a transaction from `begin()`), the row is written there and commits
        with it. A decision another consumer recorded first then raises `IntegrityError`
        instead, and the caller's transaction must roll back (on PostgreSQL it can run
        nothing more)."""
        error: Any = getattr(event, "error", None)
        values = {
            "decision_id": decision_id,
            "snapshot_id": event.snapshot_id,
            "session_id": session_id or event.session_id,
            "reviewer": reviewer,
            "outcome": "accepted" if event.type == "decision.accepted" else "rejected",
            "status": error.status.value if error is not None else "OK",
            "message": error.message if error is not None else None,
            "body": without_token(body),
            "event_type": event.type,
            "event_body": event.model_dump_json(),
            "received_at": utcnow(),
        }
        if conn is not None:
            self._insert.execute(conn, values)
            return None
        try:
            with self._writer.begin() as own:
                self._insert.execute(own, values)
        except IntegrityError:
            return self.get(decision_id)
        return None

    def erase_tokens(self) -> int:
        """Take the `resume_token` out of bodies kept before the log dropped it (rows
        written by an older release); returns how many rows changed. Idempotent."""
        with self._writer.begin() as conn:
            rows = conn.execute(_WITH_TOKEN).all()
            changed = [
                {"p_id": decision_id, "p_body": kept}
                for decision_id, body in rows
                if (kept := without_token(body)) != body
            ]
            if changed:
                conn.execute(_SET_BODY, changed)
        return len(changed)

    def for_session(self, session_id: str) -> list[DecisionRecord]:
        with self.engine.begin() as conn:
            rows = (
                conn.execute(
                    select(decision_table)
                    .where(decision_table.c.session_id == session_id)
                    .order_by(decision_table.c.received_at)
                )
                .mappings()
                .all()
            )
        return [_record(r) for r in rows]


_TOKEN_VALUE = re.compile(r'("resume_token"\s*:\s*)"(?:[^"\\]|\\.)*"', re.DOTALL)


def without_token(body: str) -> str:
    """A decision's text as the log keeps it: without its `resume_token`, a secret stored
    only as a hash (whoever reads the store must not learn a token from it, and use it on
    a pause still open). A body that is no JSON object is kept as it came; one that no
    JSON reader takes (nested too deeply, say) has every token's value replaced by null."""
    try:
        data = json.loads(body.removeprefix("\ufeff"))
    except (ValueError, RecursionError):
        return _TOKEN_VALUE.sub(r"\1null", body)
    if not isinstance(data, dict) or "resume_token" not in data:
        return body
    del data["resume_token"]
    return json.dumps(data)  # escaped: a lone surrogate stays the text "\\ud800"


def _record(row: Any) -> DecisionRecord:
    values = {k: row[k] for k in DecisionRecord.__dataclass_fields__}
    at = values["received_at"]
    if at.tzinfo is None:  # SQLite keeps no zone; we write UTC
        values["received_at"] = at.replace(tzinfo=UTC)
    return DecisionRecord(**values)
