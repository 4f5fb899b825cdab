"""Helpers for tests of what happens around a store's transactions.

- `checked_at_commit(store)`: a table whose rows reference a missing parent through a
  deferred foreign key, so a transaction that inserts one fails at its COMMIT (on
  SQLite and PostgreSQL alike), not at the INSERT.
- `terminate_backends(pg_admin, database)`: end every server connection to a
  PostgreSQL database, as a restart or an administrator does.
- `database_url(request, tmp_path, name)`: a SQLite file or a fresh PostgreSQL
  database, as the test's `request.param` ("sqlite" or "postgresql") says.
- `query_plan(store, statement, params)`: how the database runs a statement, as text.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Column, ForeignKey, MetaData, Table, Text, create_engine, text
from sqlalchemy.pool import NullPool

from interlock import SqlSessionStore

__all__ = ["checked_at_commit", "database_url", "query_plan", "terminate_backends"]


def query_plan(store: SqlSessionStore, statement: str, params: Any) -> str:
    """The plan of `statement` (as the driver ran it, with its `params`): PostgreSQL's
    EXPLAIN, or SQLite's EXPLAIN QUERY PLAN, one line a step."""
    explain = "EXPLAIN" if store.engine.dialect.name == "postgresql" else "EXPLAIN QUERY PLAN"
    with store.engine.connect() as conn:
        plan = conn.exec_driver_sql(f"{explain} {statement}", params).all()
    return "\n".join(str(line[-1]) for line in plan)


def database_url(request: pytest.FixtureRequest, tmp_path: Path, name: str) -> str:
    """The URL of an empty database for a fixture parametrized over "sqlite" and
    "postgresql": the file `name` in `tmp_path`, or a fresh database (`pg_url`)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / name}"
    url: str = request.getfixturevalue("pg_url")
    return url


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


def terminate_backends(pg_admin: str, database: str | None) -> None:
    admin = create_engine(pg_admin, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    try:
        with admin.connect() as conn:
            ended = conn.execute(
                text(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                    " WHERE datname = :d AND pid <> pg_backend_pid()"
                ),
                {"d": database},
            ).scalar_one()
    finally:
        admin.dispose()
    assert ended >= 1
