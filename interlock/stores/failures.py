"""Which errors of the SQL store say nothing of the turn that met them."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

__all__ = ["first_line", "is_schema_error", "is_store_failure", "retry_store_failures"]

T = TypeVar("T")


def first_line(exc: BaseException) -> str:
    """The first line of what `exc` says (of the driver's own error, for SQLAlchemy's,
    without its "Background on this error" link)."""
    orig = getattr(exc, "orig", None)
    text = str(orig if orig is not None else exc).strip()
    return (text.splitlines() or [type(exc).__name__])[0]


def is_store_failure(exc: BaseException) -> bool:
    """True for an error of the store itself: unreachable (refused, lost, timed out,
    the pool exhausted) or unusable (a file that is no database, a table missing or
    not permitted). The turn is then retried, not ended as failed. A value the database
    refuses or a constraint it enforces (`DataError`, `IntegrityError`) is the turn's
    own doing, and so its answer. (SQLAlchemy is imported here, not above, so that
    `first_line` costs no import of it.)"""
    from sqlalchemy.exc import DataError, DBAPIError, IntegrityError
    from sqlalchemy.exc import TimeoutError as PoolTimeout

    if isinstance(exc, DataError | IntegrityError):
        return False
    return isinstance(exc, DBAPIError | PoolTimeout)


_SQLITE_SCHEMA = re.compile(r"^no such (table|column): |\bhas no column named ")
"""SQLite's words for a table or a column that its database does not hold."""
_PG_SCHEMA = {"42P01", "42703"}
"""PostgreSQL's SQLSTATEs for the same: undefined_table, undefined_column."""


def is_schema_error(exc: BaseException) -> bool:
    """True for an error of a store that answered but whose database lacks a table or a
    column a statement names (tables another program made, or none made yet): no
    outage, and trying again cannot help. A connection that failed is no such error."""
    from sqlalchemy.exc import DBAPIError

    if not isinstance(exc, DBAPIError):
        return False
    orig = exc.orig
    if type(orig).__module__ == "sqlite3":
        return _SQLITE_SCHEMA.search(str(orig)) is not None
    return getattr(orig, "sqlstate", None) in _PG_SCHEMA  # psycopg's


def retry_store_failures(
    do: Callable[[], T],
    pauses: Sequence[float],
    on_retry: Callable[[Exception, float], None] | None = None,
    *,
    within: float | None = None,
) -> T:
    """`do()`, tried again after each of `pauses` (seconds) while it meets a store
    failure (`is_store_failure`; `on_retry(exc, pause)` first, to say so); the last
    try's failure, and any other error, is raised. For work that is safe to do again.
    A table or a column the database lacks (`is_schema_error`) is raised at once: it
    lasts until someone makes the store's tables right, and no wait ends it.
    `within`: no try starts once the tries so far took that many seconds (a server that
    does not answer, given up on after a timeout, is not waited for again)."""
    started = time.monotonic()
    for pause in pauses:
        try:
            return do()
        except Exception as exc:
            if not is_store_failure(exc) or is_schema_error(exc):
                raise
            if within is not None and time.monotonic() - started >= within:
                raise
            if on_retry is not None:
                on_retry(exc, pause)
            time.sleep(pause)
    return do()
