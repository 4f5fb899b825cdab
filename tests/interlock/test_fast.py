"""`FastStatement` on SQLite and PostgreSQL: the same rows and row counts as SQLAlchemy's
own execution, the same events and errors, and a clear refusal of what it cannot run."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import (
    Column,
    DateTime,
    Integer,
    MetaData,
    Table,
    Text,
    bindparam,
    create_engine,
    event,
    insert,
    select,
    update,
)
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError

from interlock.stores.fast import FastStatement

tables = MetaData()
thing = Table(
    "fast_thing",
    tables,
    Column("id", Text, primary_key=True),
    Column("n", Integer, nullable=False),
    Column("at", DateTime(timezone=True), nullable=True),
)
defaulted = Table(
    "fast_defaulted",
    tables,
    Column("id", Text, primary_key=True),
    Column("n", Integer, default=7),
)

T0 = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)


@pytest.fixture(params=["sqlite", "postgresql"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    url = (
        f"sqlite:///{tmp_path / 'fast.db'}"
        if request.param == "sqlite"
        else request.getfixturevalue("pg_url")
    )
    eng = create_engine(url)
    tables.create_all(eng)
    try:
        yield eng
    finally:
        eng.dispose()


def rows_both_ways(engine: Engine, stmt: Any, params: dict[str, Any]) -> tuple[Any, Any]:
    with engine.connect() as conn:
        ours = FastStatement(stmt).execute(conn, params).all()
        theirs = [tuple(r) for r in conn.execute(stmt, params).all()]
    return ours, theirs


def test_rows_and_counts_match_sqlalchemy(engine: Engine) -> None:
    add = FastStatement(insert(thing))
    with engine.begin() as conn:
        assert add.execute(conn, {"id": "a", "n": 1, "at": T0}).rowcount == 1
        many = [{"id": f"m{i}", "n": i, "at": T0 + timedelta(seconds=i)} for i in range(5)]
        assert add.executemany(conn, many).rowcount == 5
    by_n = select(thing).where(thing.c.n >= bindparam("p_n")).order_by(thing.c.id)
    ours, theirs = rows_both_ways(engine, by_n, {"p_n": 2})
    assert ours == theirs
    assert [r[0] for r in ours] == ["m2", "m3", "m4"]
    assert all(isinstance(r[2], datetime) for r in ours), "results go through the type"

    # the same name bound twice (a datetime: its bind processor runs once per value)
    touch = (
        update(thing)
        .where(thing.c.at < bindparam("p_at"))
        .values(at=bindparam("p_at"), n=thing.c.n + 10)
    )
    later = T0 + timedelta(seconds=3)
    with engine.begin() as conn:
        assert FastStatement(touch).execute(conn, {"p_at": later}).rowcount == 4  # a, m0..m2
    with engine.connect() as conn:
        result = FastStatement(select(thing.c.id, thing.c.n)).execute(conn)
        got = dict(result.all())
        assert result.keys == ("id", "n")
    assert got == {"a": 11, "m0": 10, "m1": 11, "m2": 12, "m3": 3, "m4": 4}


def test_mappings_first_and_scalar(engine: Engine) -> None:
    with engine.begin() as conn:
        FastStatement(insert(thing)).execute(conn, {"id": "x", "n": 5, "at": None})
    one = FastStatement(select(thing).where(thing.c.id == bindparam("p_id")))
    with engine.connect() as conn:  # no explicit transaction: begun as SQLAlchemy would
        assert one.execute(conn, {"p_id": "x"}).mappings() == [{"id": "x", "n": 5, "at": None}]
        assert one.execute(conn, {"p_id": "nope"}).first() is None
        count = FastStatement(select(thing.c.n).where(thing.c.id == bindparam("p_id")))
        assert count.execute(conn, {"p_id": "x"}).scalar() == 5
        assert count.execute(conn, {"p_id": "nope"}).scalar() is None
    assert FastStatement.of(one.statement) is FastStatement.of(one.statement)


def test_cursor_events_see_every_statement(engine: Engine) -> None:
    seen: list[tuple[str, Any, bool]] = []
    after: list[str] = []

    def before(_c: Any, _cur: Any, statement: str, params: Any, _ctx: Any, many: bool) -> None:
        seen.append((statement.split()[0], params, many))

    event.listen(engine, "before_cursor_execute", before)
    event.listen(engine, "after_cursor_execute", lambda *a: after.append(a[2].split()[0]))
    with engine.begin() as conn:
        FastStatement(insert(thing)).executemany(conn, [{"id": "e", "n": 1, "at": None}])
        FastStatement(select(thing.c.n)).execute(conn)
    assert [(s, many) for s, _p, many in seen] == [("INSERT", True), ("SELECT", False)]
    assert after == ["INSERT", "SELECT"]


def test_echo_logs_the_statement_and_its_parameters(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    """`echo=True` shows what SQLAlchemy's own execution shows: the SQL, then the
    parameters (also of an executemany), or that they are hidden."""
    logger = "sqlalchemy.engine.Engine"
    fast = FastStatement(insert(thing))
    engine.echo = True
    try:
        with caplog.at_level("INFO", logger=logger), engine.begin() as conn:
            fast.execute(conn, {"id": "echoed-1", "n": 41, "at": None})
            fast.executemany(conn, [{"id": f"echoed-{i}", "n": i, "at": None} for i in (2, 3)])
        lines = [r.getMessage() for r in caplog.records if r.name == logger]
        inserts = [i for i, line in enumerate(lines) if line.startswith("INSERT INTO fast_thing")]
        assert len(inserts) == 2, lines
        first, many = lines[inserts[0] + 1], lines[inserts[1] + 1]
        assert first.startswith("[compiled once]") and "'echoed-1'" in first and "41" in first
        assert many.startswith("[compiled once]") and "'echoed-3'" in many, many
        hidden = create_engine(engine.url, echo=True, hide_parameters=True)
        caplog.clear()
        try:
            with caplog.at_level("INFO", logger=logger), hidden.begin() as conn:
                fast.execute(conn, {"id": "secret-1", "n": 1, "at": None})
        finally:
            hidden.dispose()
        assert "secret-1" not in caplog.text
        assert "[SQL parameters hidden due to hide_parameters=True]" in caplog.text
    finally:
        engine.echo = False


def test_driver_errors_are_sqlalchemys(engine: Engine) -> None:
    add = FastStatement(insert(thing))
    with engine.begin() as conn:
        add.execute(conn, {"id": "dup", "n": 1, "at": None})
    with pytest.raises(IntegrityError), engine.begin() as conn:
        add.execute(conn, {"id": "dup", "n": 2, "at": None})
    with engine.connect() as conn:  # the failed transaction changed nothing
        assert FastStatement(select(thing.c.n)).execute(conn).all() == [(1,)]


def test_refuses_what_it_cannot_run(engine: Engine) -> None:
    expanding = select(thing).where(thing.c.id.in_(bindparam("p_ids", expanding=True)))
    with engine.connect() as conn:
        with pytest.raises(ValueError, match="expanded at execution"):
            FastStatement(expanding).execute(conn, {"p_ids": ["a"]})
        with pytest.raises(ValueError, match="column defaults"):
            FastStatement(insert(defaulted)).execute(conn, {"id": "d"})
        odd = select(thing.c.n).where(thing.c.id == bindparam("p id%"))
        with pytest.raises(ValueError, match="need escaping"):
            FastStatement(odd).execute(conn, {"p id%": "a"})


def test_a_schema_translate_map_goes_through_sqlalchemy(engine: Engine) -> None:
    """The map renames tables as SQLAlchemy compiles: honoured, not compiled away."""
    schema = "main" if engine.dialect.name == "sqlite" else "public"
    mapped = engine.execution_options(schema_translate_map={None: schema})
    seen: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda *a: seen.append(a[2]))
    with mapped.begin() as conn:
        FastStatement(insert(thing)).execute(conn, {"id": "t", "n": 2, "at": T0})
        FastStatement(insert(thing)).executemany(conn, [{"id": "u", "n": 3, "at": None}])
        bump = update(thing).where(thing.c.n >= bindparam("p_n")).values(n=thing.c.n + 1)
        assert FastStatement(bump).execute(conn, {"p_n": 2}).rowcount == 2
        result = FastStatement(select(thing.c.id, thing.c.at).order_by(thing.c.id)).execute(conn)
    assert result.all() == [("t", result.all()[0][1]), ("u", None)]
    assert isinstance(result.all()[0][1], datetime)
    assert result.keys == ("id", "at")
    assert all(f"{schema}." in statement for statement in seen), seen


def test_reads_keep_the_statements_postgresql_has_prepared(pg_url: str) -> None:
    """psycopg forgets a connection's prepared statements (`DEALLOCATE ALL`) whenever a
    transaction on it rolls back. The runtime's own reads (the outbox sweep, the
    decision log, the journal) end theirs with a commit, so the pooled connection that
    the next turn takes keeps its hot statements prepared."""
    from events.decision_log import DecisionLog
    from events.outbox import Outbox
    from interlock import SqlSessionStore
    from interlock.stores.sql_journal import SqlTurnJournal

    store = SqlSessionStore(pg_url)
    outbox, decisions, journal = Outbox(store), DecisionLog(store), SqlTurnJournal(store)

    def prepared() -> int:
        with store.engine.begin() as conn:
            return int(
                conn.exec_driver_sql("SELECT count(*) FROM pg_prepared_statements").scalar_one()
            )

    try:
        for _ in range(8):  # psycopg prepares a statement on its fifth execution
            store.get_snapshot("no-such-snapshot")
        warm = prepared()
        assert warm > 0, "get_snapshot's statements are prepared"
        for read in (
            lambda: outbox.unsent(),
            lambda: outbox.unsent_before(0.0),
            lambda: decisions.get("no-such-decision"),
            lambda: decisions.for_session("no-such-session"),
            lambda: journal.load("s", "no-such-turn"),
            lambda: journal.holder("no-such-turn"),
        ):
            read()
            assert prepared() >= warm, "a read dropped the prepared statements"
    finally:
        outbox.close()
        store.close()
