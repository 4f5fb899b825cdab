"""`interlock migrate` and `interlock health`, as an operator runs them."""

from __future__ import annotations

from pathlib import Path

from queue_helpers import run_cli
from sqlalchemy import create_engine, inspect

TABLES = [
    "interlock_decision",
    "interlock_journal",
    "interlock_message",
    "interlock_outbox",
    "interlock_snapshot",
    "interlock_turn_lease",
]


def test_migrate_creates_every_table_up_front(tmp_path: Path, pg_url: str) -> None:
    for url in (f"sqlite:///{tmp_path}/m.db?synchronous=normal", pg_url):
        result = run_cli("migrate", "--store", url, timeout=60)
        assert result.returncode == 0, result.describe()
        [line] = result.json_lines()
        assert line["tables"] == TABLES, line
        engine = create_engine(url.split("?")[0])
        try:
            names = sorted(
                t for t in inspect(engine).get_table_names() if t.startswith("interlock_")
            )
        finally:
            engine.dispose()
        assert names == TABLES
        again = run_cli("migrate", "--store", url, timeout=60)
        assert again.returncode == 0 and again.json_lines() == [line], "idempotent"


def test_health_reads_the_store_url_as_the_store_does(tmp_path: Path, redis_url: str) -> None:
    store = f"sqlite:///{tmp_path}/h.db?synchronous=normal"
    result = run_cli("health", "--broker", redis_url, "--store", store, timeout=60)
    assert result.returncode == 0, result.describe()
    assert result.json_lines() == [{"broker": "ok", "store": "ok"}]
    assert "Warning" not in result.stderr, result.stderr
    down = run_cli(
        "health",
        "--broker",
        redis_url,
        "--store",
        "postgresql+psycopg://nobody@127.0.0.1:1/x",
        timeout=60,
    )
    assert down.returncode == 1, down.describe()
    [report] = down.json_lines()
    assert report["broker"] == "ok" and report["store"].startswith("error: ")
