"""Session stores: where snapshots live between turns.

`SqlSessionStore` is imported on first use, so that what needs no database (the
command line's help, a broker-only command, the in-memory store) does not load
SQLAlchemy."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .base import LatestSnapshotId, SessionStore, SnapshotHeads
from .memory import InMemorySessionStore

if TYPE_CHECKING:
    from .sql import SqlSessionStore

__all__ = [
    "InMemorySessionStore",
    "LatestSnapshotId",
    "SessionStore",
    "SnapshotHeads",
    "SqlSessionStore",
]


if not TYPE_CHECKING:  # to a type checker, the names above are all there is

    def __getattr__(name: str) -> Any:
        if name == "SqlSessionStore":
            from .sql import SqlSessionStore

            return SqlSessionStore
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
