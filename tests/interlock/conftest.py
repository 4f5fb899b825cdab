"""Fixtures of the runtime's tests: a SQLite file store (modules that need another kind
define their own `store`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from interlock import SqlSessionStore


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "store.db"


@pytest.fixture
def store(db: Path) -> Iterator[SqlSessionStore]:
    sql = SqlSessionStore(f"sqlite:///{db}")
    try:
        yield sql
    finally:
        sql.close()
