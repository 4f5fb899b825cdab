"""Times on the wire: aware UTC, written in RFC 3339 with a "Z"."""

from __future__ import annotations

from datetime import UTC, datetime

__all__ = ["utcnow", "wire_time"]


def utcnow() -> datetime:
    return datetime.now(UTC)


def wire_time(when: datetime, *, microseconds: bool = False) -> str:
    """`when` in RFC 3339, in UTC with a "Z", as the events write it (a naive time is
    taken to be UTC, as SQLite hands them back). With `microseconds` always with its
    six digits, so that such strings sort as the times do; otherwise only when it has
    some, as pydantic writes an event's times."""
    aware = when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)
    spec = "microseconds" if microseconds else "auto"
    return aware.isoformat(timespec=spec).replace("+00:00", "Z")
