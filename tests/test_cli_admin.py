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
    missing = run_cli("health", "--broker", redis_url, "--store", store, timeout=60)
    assert missing.returncode == 0, missing.describe()  # it can be made where it is
    assert missing.json_lines() == [{"broker": "ok", "store": "ok"}]
    assert not (tmp_path / "h.db").exists(), "health makes no store"
    nowhere = f"sqlite:///{tmp_path}/no/such/dir/h.db"
    bad = run_cli("health", "--broker", redis_url, "--store", nowhere, timeout=60)
    assert bad.returncode == 1, bad.describe()
    [report] = bad.json_lines()
    assert report["store"].startswith(f"error: NOT_FOUND: no store at {tmp_path}/no/such/dir/h.db")
    assert run_cli("migrate", "--store", store, timeout=60).returncode == 0
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


def test_decide_wait_keeps_a_turn_event_that_comes_first(redis_url: str) -> None:
    """The consumer enqueues the resume before it publishes `decision.accepted`: the
    resumed turn's event may come first. `decide --wait` keeps it for when it asks."""
    from kombu.connection import Connection

    from events.publisher import Publisher
    from schemas import DecisionAccepted, FinishReason, Message, Part, TurnCompleted
    from workers.cli.waiter import Waiter
    from workers.decisions import resume_turn_id
    from workers.settings import Settings

    turn_id = resume_turn_id("d-1")
    ends = ("turn.interrupted", "turn.completed", "turn.failed")
    waiter = Waiter(
        Settings(broker_url=redis_url), 10.0, keep=lambda e: e.type in ends and e.turn_id == turn_id
    )
    try:
        answer = Message(role="model", content=[Part(text="done")])
        done = TurnCompleted(turn_id=turn_id, finish_reason=FinishReason.STOP, message=answer)
        other = TurnCompleted(turn_id="another", finish_reason=FinishReason.STOP, message=answer)
        accepted = DecisionAccepted(decision_id="d-1", turn_id=turn_id)
        with Connection(redis_url) as conn:
            publisher = Publisher(conn)
            for event in (other, done, accepted):
                publisher.publish_event(event)
        got = waiter.next("the outcome", lambda e: e.type.startswith("decision."))
        assert got.event_id == accepted.event_id
        assert waiter.turn_event(turn_id).event_id == done.event_id
    finally:
        waiter.close()


def test_every_command_and_option_says_what_it_is_for() -> None:
    """`--help` of each command describes the command and every option it takes."""
    import click

    from workers.cli import main

    assert isinstance(main, click.Group)
    bare: list[str] = []
    for name, command in main.commands.items():
        if not (command.help or "").strip():
            bare.append(name)
        for param in command.params:
            if isinstance(param, click.Option) and not (param.help or "").strip():
                bare.append(f"{name} {param.opts[0]}")
    assert bare == [], f"commands and options with no help text: {bare}"
    result = run_cli("pending", "--help", timeout=60)
    assert result.returncode == 0 and "At most this many" in result.stdout, result.describe()
    listed = run_cli("--help", timeout=60)
    commands = listed.stdout.split("Commands:")[1].strip().splitlines()
    assert len(commands) == len(main.commands), listed.describe()
    cut = [line for line in commands if line.rstrip().endswith("...")]
    assert cut == [], f"summaries cut short in `interlock --help`: {cut}"
    assert "interlock migrate" in listed.stdout, "the first step of a deployment"


def test_numbers_that_cannot_work_are_usage_errors(tmp_path: Path) -> None:
    for args, flag in (
        (["decide", "s", "--token", "t", "--approve", "--timeout", "-1"], "--timeout"),
        (["submit", "--agent", "a", "--text", "hi", "--timeout", "0"], "--timeout"),
        (["demo", "--timeout", "0"], "--timeout"),
        (["worker", "--concurrency", "0"], "--concurrency"),
    ):
        result = run_cli(*args, cwd=tmp_path, timeout=60)
        assert result.returncode == 2, result.describe()
        assert f"Invalid value for '{flag}'" in result.stderr, result.describe()


def test_schemas_check_names_missing_files(tmp_path: Path) -> None:
    result = run_cli("schemas", "--check", "--out", str(tmp_path / "none"), timeout=60)
    assert result.returncode == 1, result.describe()
    assert result.stderr.startswith(f"error: no schema files in {tmp_path}/none"), result.stderr


def test_migrate_erases_tokens_an_older_release_kept(tmp_path: Path, pg_url: str) -> None:
    """Decision-log rows written before the log dropped the resume token still hold it:
    `migrate` takes it out (what the reviewer answered stays) and says how many."""
    import json

    from sqlalchemy import insert, select

    from events.decision_log import decision_table
    from schemas import utcnow

    token = "tok-" + "x" * 28
    body = {"decision_id": "d-old", "resume_token": token, "reviewer": "alice", "restart": []}
    for url in (f"sqlite:///{tmp_path}/t.db", pg_url):
        assert run_cli("migrate", "--store", url, timeout=60).returncode == 0
        engine = create_engine(url)
        try:
            with engine.begin() as conn:
                conn.execute(
                    insert(decision_table).values(
                        decision_id="d-old",
                        outcome="accepted",
                        status="OK",
                        body=json.dumps(body),
                        event_type="decision.accepted",
                        event_body="{}",
                        received_at=utcnow(),
                    )
                )
            result = run_cli("migrate", "--store", url, timeout=60)
            assert result.returncode == 0, result.describe()
            assert result.json_lines()[0]["tokens_erased"] == 1
            with engine.connect() as conn:
                [kept] = conn.execute(select(decision_table.c.body)).scalars().all()
            assert token not in kept
            assert json.loads(kept) == {k: v for k, v in body.items() if k != "resume_token"}
            again = run_cli("migrate", "--store", url, timeout=60)
            assert again.json_lines()[0]["tokens_erased"] == 0
        finally:
            engine.dispose()
