"""What the outbox, the decision log and the deadline sweeper need of the session
store whose database they share: a structural type, so that `events` knows the store
by its methods, not by its package. `interlock.SqlSessionStore` is one."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from sqlalchemy import MetaData
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.sql import ClauseElement

from schemas import Snapshot

__all__ = ["Rows", "SqlStore", "Statement"]


class Rows(Protocol):
    """What a hot statement returned, as the tables beside the store read it."""

    def scalar(self) -> Any: ...

    def mappings(self) -> list[dict[str, Any]]: ...


class Statement(Protocol):
    """A statement compiled once and then only bound (`SqlStore.fast`)."""

    def execute(self, conn: Connection, params: Mapping[str, Any] | None = None) -> Rows: ...

    def executemany(self, conn: Connection, rows: Sequence[Mapping[str, Any]]) -> Rows: ...


class SqlStore(Protocol):
    """A SQL session store, as the tables beside it use it."""

    @property
    def engine(self) -> Engine:
        """Reads and writes that need no write lock."""
        ...

    @property
    def metadata(self) -> MetaData:
        """The store's own tables (`interlock_snapshot`, ...)."""
        ...

    def writer(self, *, relaxed: bool = False) -> Engine:
        """The engine for write transactions; `relaxed` ones need not wait for the disk."""
        ...

    def create_all(self, tables: MetaData) -> None:
        """Create `tables` if missing, under the store's cross-process lock."""
        ...

    def add_save_hook(self, hook: Callable[[Connection, Snapshot, bool], None]) -> None:
        """Call `hook(conn, snapshot, created)` inside every snapshot save's transaction."""
        ...

    def fast(self, statement: ClauseElement) -> Statement:
        """`statement` compiled once per dialect, run straight on the driver's cursor."""
        ...
