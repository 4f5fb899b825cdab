"""Helpers for tests of what happens around a store's transactions.

- `checked_at_commit(store)`: a table whose rows reference a missing parent through a
  deferred foreign key, so a transaction that inserts one fails at its COMMIT (on
  SQLite and PostgreSQL alike), not at the INSERT.
"""

from __future__ import annotations

from sqlalchemy import Column, ForeignKey, MetaData, Table, Text

from interlock import SqlSessionStore

__all__ = ["checked_at_commit"]


def checked_at_commit(store: SqlSessionStore) -> Table:
    """Created beside the store's tables; insert `{"parent": "missing"}` to make the
    transaction's COMMIT fail with an IntegrityError."""
    tables = MetaData()
    Table("t_parent", tables, Column("id", Text, primary_key=True))
    child = Table(
        "t_child",
        tables,
        Column("parent", Text, ForeignKey("t_parent.id", deferrable=True, initially="DEFERRED")),
    )
    store.create_all(tables)
    return child
