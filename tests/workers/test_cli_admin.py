"""`interlock migrate` and `interlock health`, as an operator runs them."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from kombu.connection import Connection
from kombu.messaging import Producer
from sqlalchemy import create_engine, inspect, text

from events.topology import all_queues
from tests.queue_helpers import APP, child_env, interlock_bin, rabbitmq_vhost, run_cli
from tests.services import free_port, start_redis
from workers.settings import redact_url

ROOT = Path(__file__).resolve().parents[2]

TABLES = [
    "interlock_decision",
    "interlock_journal",
    "interlock_message",
    "interlock_outbox",
    "interlock_snapshot",
    "interlock_turn_lease",
]


QUEUES = [
    "interlock.turns",
    "interlock.interrupted",
    "interlock.decisions",
    "interlock.decisions.dead",
    "interlock.turns.dead",
]
NONE_WAITING = dict.fromkeys(QUEUES, 0)
"""What `health` counts on a broker where no message waits."""


def counted(report: dict[str, object]) -> dict[str, object]:
    """`report` with its `queues` checked (a count for each queue; other tests' messages
    may wait on a broker shared with them) and set to NONE_WAITING."""
    queues = report["queues"]
    assert isinstance(queues, dict) and list(queues) == QUEUES, report
    assert all(type(n) is int and n >= 0 for n in queues.values()), report
    return report | {"queues": NONE_WAITING}


THEIR_SNAPSHOTS = "CREATE TABLE interlock_snapshot (snapshot_id TEXT, x INTEGER)"
"""A table of another program's under an Interlock name, lacking Interlock's columns."""


def database_of(backend: str, tmp_path: Path, request: pytest.FixtureRequest, *tables: str) -> str:
    """The URL of a database of `backend` (a SQLite file, or a fresh PostgreSQL database)
    holding `tables` (CREATE TABLE statements), as another program made them."""
    url = (
        f"sqlite:///{tmp_path / 'theirs.db'}"
        if backend == "sqlite"
        else request.getfixturevalue("pg_url")
    )
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            for table in tables:
                conn.execute(text(table))
    finally:
        engine.dispose()
    return url


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


def test_migrate_adds_the_indexes_a_store_made_by_an_older_release_lacks(
    tmp_path: Path, pg_url: str
) -> None:
    """A journal made before its index on session_id came, and a snapshot table before
    its index of the open pauses: a process that starts on them leaves them so
    (building an index blocks the table's writes), `migrate` builds them and says so,
    and once only."""
    from interlock import SqlSessionStore
    from interlock.stores.sql_journal import SqlTurnJournal

    indexes = {
        "ix_interlock_journal_session": "interlock_journal",
        "ix_interlock_snapshot_open": "interlock_snapshot",
    }

    def held() -> set[str]:
        found = inspect(engine)
        return {str(ix["name"]) for table in indexes.values() for ix in found.get_indexes(table)}

    for url in (f"sqlite:///{tmp_path}/old.db", pg_url):
        assert run_cli("migrate", "--store", url, timeout=60).returncode == 0
        engine = create_engine(url)
        try:
            with engine.begin() as conn:
                for index in indexes:
                    conn.execute(text(f"DROP INDEX {index}"))  # as an older release made it
            sql = SqlSessionStore(url)
            SqlTurnJournal(sql)
            sql.dispose()
            assert not held() & set(indexes), "a process's start builds no index"
            result = run_cli("migrate", "--store", url, timeout=60)
            assert result.returncode == 0, result.describe()
            made = result.json_lines()[0]["indexes_created"]
            assert sorted(made) == sorted(indexes), result.describe()
            assert set(indexes) <= held()
            again = run_cli("migrate", "--store", url, timeout=60)
            assert again.json_lines()[0]["indexes_created"] == [], again.describe()
        finally:
            engine.dispose()


def test_health_reads_the_store_url_as_the_store_does(tmp_path: Path, redis_url: str) -> None:
    store = f"sqlite:///{tmp_path}/h.db?synchronous=normal"
    missing = run_cli("health", "--broker", redis_url, "--store", store, timeout=60)
    assert missing.returncode == 0, missing.describe()  # it can be made where it is
    [report] = missing.json_lines()
    assert counted(report) == {"broker": "ok", "store": "ok", "queues": NONE_WAITING}
    assert not (tmp_path / "h.db").exists(), "health makes no store"
    nowhere = f"sqlite:///{tmp_path}/no/such/dir/h.db"
    bad = run_cli("health", "--broker", redis_url, "--store", nowhere, timeout=60)
    assert bad.returncode == 1, bad.describe()
    [report] = bad.json_lines()
    assert report["store"].startswith(f"error: NOT_FOUND: no store at {tmp_path}/no/such/dir/h.db")
    assert (
        bad.stderr.strip()
        .splitlines()[-1]
        .startswith(
            f"error: UNAVAILABLE: unhealthy: store error: NOT_FOUND: no store at {tmp_path}"
        )
    ), bad.stderr
    assert run_cli("migrate", "--store", store, timeout=60).returncode == 0
    result = run_cli("health", "--broker", redis_url, "--store", store, timeout=60)
    assert result.returncode == 0, result.describe()
    [report] = result.json_lines()
    assert counted(report) == {"broker": "ok", "store": "ok", "queues": NONE_WAITING}
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
    assert report["broker"] == "ok" and report["store"].startswith("error: UNAVAILABLE: ")
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"no database here\n" * 100)
    wrong = run_cli("health", "--broker", redis_url, "--store", f"sqlite:///{garbage}")
    assert wrong.returncode == 1, wrong.describe()
    [report] = wrong.json_lines()
    assert report["store"] == f"error: UNAVAILABLE: file is not a database (sqlite:///{garbage})"
    nobody = f"redis://127.0.0.1:{free_port()}/0"
    unreachable = run_cli("health", "--broker", nobody, "--store", store, timeout=60)
    assert unreachable.returncode == 1, unreachable.describe()
    [report] = unreachable.json_lines()
    assert report["broker"].startswith("error: UNAVAILABLE: cannot reach the broker: "), report
    assert report["store"] == "ok"


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
        (["worker", "--loglevel", "LOUD"], "--loglevel"),
        (["health", "--max-age", "-5"], "--max-age"),
        (["health", "--max-age", "nan"], "--max-age"),
        (["health", "--max-age", "inf"], "--max-age"),
        (["submit", "--agent", "a", "--text", "hi", "--timeout", "nan"], "--timeout"),
        (["worker", "--burst", "--idle", "inf"], "--idle"),
    ):
        result = run_cli(*args, cwd=tmp_path, timeout=60)
        assert result.returncode == 2, result.describe()
        assert f"Invalid value for '{flag}'" in result.stderr, result.describe()
    for value in ("nan", "inf", "NaN", "1e999"):  # no age is either: each check would pass
        result = run_cli("health", "--max-age", value, cwd=tmp_path, timeout=60)
        assert result.returncode == 2, result.describe()
        assert result.stderr.strip().splitlines()[-1] == (
            f"Error: Invalid value for '--max-age': {float(value)} is not a finite number "
            "of seconds."
        ), result.describe()


def test_schemas_check_names_missing_files(tmp_path: Path) -> None:
    result = run_cli("schemas", "--check", "--out", str(tmp_path / "none"), timeout=60)
    assert result.returncode == 1, result.describe()
    assert result.stderr == (
        f"error: NOT_FOUND: no schema files in {tmp_path}/none: run "
        f"`interlock schemas --out {tmp_path}/none`\n"
    ), result.describe()


def test_schemas_check_names_each_file_amiss_and_the_command_that_writes_them(
    tmp_path: Path,
) -> None:
    """One file missing is named as such (not "no schema files"); a .schema.json file no
    model writes (a message renamed or dropped) fails the check, named; the hint is the
    command that writes the folder checked: `make schemas` for docs/schemas only, where
    a Makefile has that target (a checkout of Interlock's)."""
    import shlex

    from schemas.json_schema import message_schemas

    out = tmp_path / "my schemas"
    write = f"interlock schemas --out {shlex.quote(str(out))}"
    assert run_cli("schemas", "--out", str(out), timeout=60).returncode == 0
    (out / "decision.schema.json").unlink()
    one = run_cli("schemas", "--check", "--out", str(out), timeout=60)
    assert one.returncode == 1, one.describe()
    assert one.stderr == (
        f"error: FAILED_PRECONDITION: schemas are out of date in {out}: missing "
        f"{out}/decision.schema.json (run `{write}`)\n"
    ), one.describe()
    assert run_cli("schemas", "--out", str(out), timeout=60).returncode == 0
    (out / "turn.renamed.schema.json").write_text("{}\n")
    (out / "notes.json").write_text("{}\n")  # no schema: not the check's
    extra = run_cli("schemas", "--check", "--out", str(out), timeout=60)
    assert extra.returncode == 1, extra.describe()
    assert extra.stderr == (
        f"error: FAILED_PRECONDITION: schemas are out of date in {out}: no model writes "
        f"{out}/turn.renamed.schema.json (delete it)\n"
    ), extra.describe()
    (out / "turn.renamed.schema.json").unlink()
    ok = run_cli("schemas", "--check", "--out", str(out), timeout=60)
    assert ok.returncode == 0, ok.describe()
    assert ok.json_lines() == [{"schemas": str(out), "checked": len(message_schemas())}]
    assert run_cli("schemas", cwd=tmp_path, timeout=60).returncode == 0  # docs/schemas
    event = tmp_path / "docs" / "schemas" / "event.schema.json"
    event.write_text(event.read_text() + "\n")
    (event.parent / "decision.schema.json").unlink()
    said = (
        "error: FAILED_PRECONDITION: schemas are out of date in docs/schemas: missing "
        "docs/schemas/decision.schema.json; different from the models: "
        "docs/schemas/event.schema.json (run `{}`)\n"
    )
    stale = run_cli("schemas", "--check", cwd=tmp_path, timeout=60)  # no checkout
    assert stale.returncode == 1, stale.describe()
    assert stale.stderr == said.format("interlock schemas --out docs/schemas"), stale.describe()
    (tmp_path / "Makefile").write_text((ROOT / "Makefile").read_text())  # a checkout's
    stale = run_cli("schemas", "--check", cwd=tmp_path, timeout=60)
    assert stale.returncode == 1, stale.describe()
    assert stale.stderr == said.format("make schemas"), stale.describe()


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


def test_a_closed_output_ends_a_command_quietly(tmp_path: Path) -> None:
    """`interlock ... | head` that stops reading: no "UNAVAILABLE: Broken pipe" that
    reads like a broker outage, and the exit status SIGPIPE would give."""
    read, write = os.pipe()
    os.close(read)  # the reader has gone before anything is printed
    try:
        proc = subprocess.run(
            [interlock_bin(), "migrate", "--store", f"sqlite:///{tmp_path}/p.db"],
            stdout=write,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            env=child_env(),
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write)
    assert proc.returncode == 141, proc.stderr
    assert proc.stderr == "", proc.stderr
    assert (tmp_path / "p.db").exists(), "the command did its work; only its output was lost"


def test_ctrl_c_ends_a_waiting_command_with_130(tmp_path: Path, redis_url: str) -> None:
    """Ctrl-C while `submit --wait` waits (no worker on this broker): one line, the
    shell's exit status for SIGINT, no "Aborted!" and no traceback."""
    proc = subprocess.Popen(
        [
            interlock_bin(), "submit", "--app", "examples.banking:ai", "--agent", "bankingAgent",
            "--text", "hi", "--wait", "--broker", redis_url,
            "--store", f"sqlite:///{tmp_path}/w.db",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env=child_env(),
        text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        sent = proc.stdout.readline()  # the turn is out; it waits for its event now
        assert '"turn_id"' in sent, sent
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert err.splitlines()[-1] == "interrupted", err
    assert "Traceback" not in err and "Aborted" not in err, err


def test_health_says_a_heartbeat_file_is_missing(tmp_path: Path, redis_url: str) -> None:
    store = f"sqlite:///{tmp_path}/h.db"
    result = run_cli(
        "health", "--broker", redis_url, "--store", store,
        "--heartbeat-file", str(tmp_path / "never.alive"), timeout=60,
    )  # fmt: skip
    assert result.returncode == 1, result.describe()
    [report] = result.json_lines()
    assert (report["heartbeat"], report["heartbeat_age"]) == ("missing", None), report
    last = result.stderr.strip().splitlines()[-1]
    assert last == "error: UNAVAILABLE: unhealthy: heartbeat missing", result.stderr


def test_health_takes_no_heartbeat_dated_ahead_of_its_clock_nor_a_folder(
    tmp_path: Path, redis_url: str
) -> None:
    """A heartbeat file touched in the future (clocks apart, a file set by hand) would
    look fresh for as long as it is ahead, whatever the process does; a folder's time
    can be set but it is no heartbeat file. Each is an error naming the file, where
    both counted as `ok`."""
    where = ["--broker", redis_url, "--store", f"sqlite:///{tmp_path}/h.db"]
    ahead = tmp_path / "ahead.alive"
    ahead.touch()
    later = time.time() + 3600
    os.utime(ahead, (later, later))
    result = run_cli("health", *where, "--heartbeat-file", str(ahead), timeout=60)
    assert result.returncode == 1, result.describe()
    [report] = result.json_lines()
    said = (
        rf"error: FAILED_PRECONDITION: the heartbeat file {re.escape(str(ahead))} is dated "
        r"(?:35\d\d|3600) s ahead of this machine's clock: it cannot say whether the process is "
        "alive; check the clocks of this machine and of the one that touches it"
    )
    assert re.fullmatch(said, report["heartbeat"]), report
    assert -3600 <= report["heartbeat_age"] < -3500, report
    last = result.stderr.strip().splitlines()[-1]
    assert re.fullmatch(f"error: UNAVAILABLE: unhealthy: heartbeat {said}", last), last
    folder = tmp_path / "folder.alive"
    folder.mkdir()
    result = run_cli("health", *where, "--heartbeat-file", str(folder), timeout=60)
    assert result.returncode == 1, result.describe()
    said = (
        f"error: INVALID_ARGUMENT: the heartbeat file {folder} is a directory: check "
        "--heartbeat-file: it names the file a worker or a resume consumer touches"
    )
    [report] = result.json_lines()
    assert counted(report) == (
        {
            "broker": "ok",
            "store": "ok",
            "queues": NONE_WAITING,
            "heartbeat_age": None,
            "heartbeat": said,
        }
    ), result.describe()
    assert result.stderr.strip() == f"error: UNAVAILABLE: unhealthy: heartbeat {said}"
    fresh = tmp_path / "fresh.alive"
    fresh.touch()
    result = run_cli("health", *where, "--heartbeat-file", str(fresh), timeout=60)
    assert result.returncode == 0, result.describe()
    [report] = result.json_lines()
    assert report["heartbeat"] == "ok" and 0 <= report["heartbeat_age"] < 30, report


def test_health_refuses_what_lives_in_one_process_and_names_the_store_that_fails(
    tmp_path: Path, redis_url: str
) -> None:
    """A memory:// broker and a SQLite database in memory answer every check, yet no
    worker or consumer shares them: each is an error (INVALID_ARGUMENT), where both were
    `ok`. A store that fails is named by its URL, its password hidden."""
    where = ["--store", f"sqlite:///{tmp_path}/h.db"]
    result = run_cli("health", "--broker", "memory://", *where, timeout=60)
    assert result.returncode == 1, result.describe()
    said = (
        "error: INVALID_ARGUMENT: a memory:// broker lives inside one process: nothing sent "
        "there reaches a worker or a resume consumer; use redis://HOST:6379/0 or "
        "amqp://HOST:5672//"
    )
    expected = {"broker": said, "store": "ok", "queues": None}
    assert result.json_lines() == [expected], result.describe()
    assert result.stderr.strip() == f"error: UNAVAILABLE: unhealthy: broker {said}"
    result = run_cli("health", "--broker", redis_url, "--store", "sqlite://", timeout=60)
    assert result.returncode == 1, result.describe()
    [report] = result.json_lines()
    assert counted(report) == {
        "broker": "ok",
        "store": "error: INVALID_ARGUMENT: the store sqlite:// is a SQLite database in "
        "memory: it lives inside one process, and no other process (the worker's, the "
        "resume consumer) sees it; give a file (sqlite:///interlock.db) or a PostgreSQL URL",
        "queues": NONE_WAITING,
    }, report
    down = f"postgresql+psycopg://nobody:s3cret@127.0.0.1:{free_port()}/x"
    result = run_cli("health", "--broker", redis_url, "--store", down, timeout=60)
    assert result.returncode == 1, result.describe()
    [report] = result.json_lines()
    assert report["store"].startswith("error: UNAVAILABLE: connection failed: "), report
    assert report["store"].endswith(f" ({redact_url(down)})"), report
    assert "nobody:***@" in report["store"], report
    assert "s3cret" not in result.stdout + result.stderr, result.describe()
    assert result.stderr.strip().endswith(f" ({redact_url(down)})"), result.describe()


def test_a_broken_app_module_is_one_line(tmp_path: Path) -> None:
    """An --app module that raises, has a syntax error, or lacks the attribute: one
    line saying which and where, as for a module that is not there."""
    (tmp_path / "raises.py").write_text("x = 1\nraise RuntimeError('boom at import')\n")
    (tmp_path / "badsyntax.py").write_text("def f(:\n    pass\n")
    (tmp_path / "noai.py").write_text("from interlock import Interlock\nother = Interlock()\n")
    (tmp_path / "needs.py").write_text("x = 1\nimport no_such_dependency_xyz\n")
    cases = [
        ("needs", "INVALID_ARGUMENT: app module 'needs' failed to import: ModuleNotFoundError: "
         "No module named 'no_such_dependency_xyz' (", "needs.py, line 2)"),
        (":ai", "INVALID_ARGUMENT: --app ':ai' names no module: pass MODULE:OBJ", "banking:ai)"),
        ("nosuch_app_module", "NOT_FOUND: cannot import app module 'nosuch_app_module'", ""),
        ("raises", "INVALID_ARGUMENT: app module 'raises' failed to import: "
         "RuntimeError: boom at import (", "raises.py, line 2)"),
        ("badsyntax", "INVALID_ARGUMENT: app module 'badsyntax' failed to import: SyntaxError:",
         "badsyntax.py, line 1)"),
        ("noai", "INVALID_ARGUMENT: app module 'noai' has no attribute 'ai'", "registry"),
        ("noai:nope", "INVALID_ARGUMENT: app module 'noai' has no attribute 'nope'", ""),
    ]  # fmt: skip
    for app, start, end in cases:
        result = run_cli(
            "submit", "--app", app, "--agent", "a", "--text", "hi",
            "--broker", "redis://127.0.0.1:1/0", "--store", f"sqlite:///{tmp_path}/a.db",
            cwd=tmp_path, timeout=60,
        )  # fmt: skip
        assert result.returncode == 1, result.describe()
        [line] = result.stderr.splitlines()
        assert line.startswith(f"error: {start}"), line
        assert line.endswith(end), line


def test_demo_with_no_worker_on_its_broker_says_what_to_start(
    tmp_path: Path, redis_url: str
) -> None:
    result = run_cli(
        "demo", "--approve", "--broker", redis_url, "--store", f"sqlite:///{tmp_path}/d.db",
        "--timeout", "2", timeout=60,
    )  # fmt: skip
    assert result.returncode == 1, result.describe()
    assert result.stderr.splitlines()[-1] == (
        "error: DEADLINE_EXCEEDED: no event of the turn within 2s: are `interlock worker` "
        "and `interlock resume-consumer` running on this broker and store? What was sent "
        "stays queued until they are"
    ), result.describe()


def test_demo_in_process_takes_no_broker_or_store(tmp_path: Path) -> None:
    for flag, value in (("--broker", "redis://127.0.0.1:1/0"), ("--store", "sqlite:///x.db")):
        result = run_cli("demo", "--in-process", flag, value, cwd=tmp_path, timeout=60)
        assert result.returncode == 2, result.describe()
        assert "--in-process uses no queues and no store" in result.stderr, result.describe()


def test_a_store_that_is_no_database_is_one_line_for_every_command_that_reads_it(
    tmp_path: Path,
) -> None:
    """Pointed at a file that is no database, each command says so in one line (exit 1)
    and leaves the file alone, where each used to print SQLAlchemy's traceback."""
    wrong = tmp_path / "wrong.db"
    wrong.write_bytes(b"no database here\n" * 100)
    store = ["--store", f"sqlite:///{wrong}"]
    for args in (
        ["pending"],
        ["audit", "some-session"],
        ["migrate"],
        ["prune", "--older-than", "1d"],
    ):
        result = run_cli(*args, *store)
        assert result.returncode == 1, result.describe()
        assert result.stderr.strip() == (
            f"error: UNAVAILABLE: cannot use the store: file is not a database (sqlite:///{wrong})"
        ), result.describe()
    assert wrong.read_bytes() == b"no database here\n" * 100


def test_an_empty_store_flag_is_refused_by_every_command_that_reads_it(tmp_path: Path) -> None:
    """`--store ""` (say, `--store "$STORE"` with nothing in it) is a wrong URL for the
    commands that read only the store, as for the others; the default store is not
    read in its place. An empty variable is unset, as documented."""
    said = "error: INVALID_ARGUMENT: store URL '' is not a database URL SQLAlchemy can use"
    for args in (
        ["pending"],
        ["audit", "some-session"],
        ["migrate"],
        ["submit", "--text", "x"],
        ["prune", "--older-than", "1d"],
    ):
        extra = ["--agent", "bankingAgent", "--broker", "redis://127.0.0.1:1/0"]
        result = run_cli(
            *args, *(extra if args[0] == "submit" else []), "--store", "", cwd=tmp_path
        )
        assert result.returncode == 1, result.describe()
        assert result.stderr.strip().startswith(said), result.describe()
    unset = run_cli("pending", env=child_env(INTERLOCK_STORE_URL=""), cwd=tmp_path)
    assert unset.returncode == 0, unset.describe()
    assert unset.stderr.strip() == (
        "no open interrupts: no store at interlock.db yet (a typo? check --store or "
        "INTERLOCK_STORE_URL)"
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_the_commands_that_read_the_store_make_no_table_in_a_database_without_one(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """`pending`, `audit`, `decide` and `prune` pointed at a database that holds no
    Interlock tables (the wrong one, or one nothing has run on yet) say so, and leave it
    as it was: they used to create the store's tables in it."""
    url = database_of(backend, tmp_path, request, "CREATE TABLE theirs (x INTEGER)")
    says = "has no Interlock tables (check --store or INTERLOCK_STORE_URL"
    broker = ["--broker", f"redis://127.0.0.1:{free_port()}/0"]  # never reached
    listed = run_cli("pending", "--store", url)
    assert listed.returncode == 0 and listed.stdout == "", listed.describe()
    assert f"no open interrupts: the store at {redact_url(url)} {says}" in listed.stderr
    audited = run_cli("audit", "some-session", "--store", url)
    assert audited.returncode == 1, audited.describe()
    assert "error: NOT_FOUND: no session some-session: the store at" in audited.stderr
    decided = run_cli("decide", "snap-1", "--token", "t", "--approve", "--store", url, *broker)
    assert decided.returncode == 1, decided.describe()
    assert "error: NOT_FOUND: snapshot snap-1 not found: the store at" in decided.stderr
    assert says in audited.stderr and says in decided.stderr
    assert decided.stderr.rstrip().endswith("; nothing was sent"), decided.describe()
    pruned = run_cli("prune", "--older-than", "1d", "--store", url)
    assert pruned.returncode == 0 and pruned.json_lines()[0]["sessions"] == 0, pruned.describe()
    assert f"nothing to prune: the store at {redact_url(url)} {says}" in pruned.stderr
    engine = create_engine(url)
    try:
        assert inspect(engine).get_table_names() == ["theirs"]
    finally:
        engine.dispose()


def test_decide_wait_with_no_consumer_says_what_it_waited_for(tmp_path: Path) -> None:
    """Its own broker: the decision it sends stays there, read by no other test."""
    from events.tokens import hash_token
    from examples.banking import bankingAgent
    from interlock import SqlSessionStore

    url = f"sqlite:///{tmp_path / 's.db'}"
    store = SqlSessionStore(url)
    try:
        paused = bankingAgent.with_store(store).run_text("Transfer $5 to savings")
        assert paused.snapshot_id is not None
        with store.writer().begin() as conn:  # the token a worker would have issued
            assert store.replace_token_hash_in(conn, paused.snapshot_id, hash_token("t"))
    finally:
        store.dispose()
    broker = start_redis(tmp_path / "redis")
    try:
        result = run_cli(
            "decide", paused.snapshot_id, "--token", "t", "--approve", "--wait",
            "--timeout", "1", "--broker", broker.url, "--store", url, timeout=60,
        )  # fmt: skip
    finally:
        broker.stop()
    assert result.returncode == 1, result.describe()
    [decision_id] = [line["decision_id"] for line in result.json_lines()]
    assert result.stderr.splitlines()[-1] == (
        f"error: DEADLINE_EXCEEDED: no outcome of decision {decision_id} within 1s: is "
        "`interlock resume-consumer` running on this broker and store? The decision stays "
        "queued, and is decided once one is"
    ), result.describe()


def test_a_store_whose_folder_or_server_is_not_there_is_said_in_one_line(
    tmp_path: Path,
) -> None:
    """`migrate` names the missing folder (SQLite says only "unable to open database
    file"); `health` says the folder does not exist, and a PostgreSQL server that is
    not there in one line, without SQLAlchemy's hints and links."""
    store = tmp_path / "nope" / "x.db"
    made = run_cli("migrate", "--store", f"sqlite:///{store}")
    assert made.returncode == 1, made.describe()
    assert made.stderr.strip() == (
        f"error: NOT_FOUND: no folder {store.parent} for the store {store}: make it, or "
        "check --store or INTERLOCK_STORE_URL"
    )
    assert not store.parent.exists()
    broker = ["--broker", f"redis://127.0.0.1:{free_port()}/0"]
    checked = run_cli("health", "--store", f"sqlite:///{store}", *broker)
    [report] = checked.json_lines()
    assert report["store"] == (
        f"error: NOT_FOUND: no store at {store}, and {store.parent} does not exist "
        f"(sqlite:///{store})"
    )
    down = f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/x"
    checked = run_cli("health", "--store", down, *broker)
    assert checked.returncode == 1, checked.describe()
    [report] = checked.json_lines()
    assert report["store"].startswith("error: UNAVAILABLE: connection failed: "), report
    assert "\n" not in report["store"] and "sqlalche.me" not in report["store"], report
    assert len(checked.stderr.strip().splitlines()) == 1, checked.describe()


def test_a_store_in_memory_is_refused_where_other_processes_would_read_it(
    tmp_path: Path,
) -> None:
    """A SQLite database in memory lives inside one process: a worker, a resume consumer
    or a migration given one would keep what no other process sees. Refused, before any
    broker is tried, naming the URL and what to give instead; no file is made."""
    flags = ["--app", "examples.banking:ai", "--broker", "redis://127.0.0.1:1/0"]
    for store in ("sqlite://", "sqlite:///:memory:", "sqlite:///file:mem?mode=memory&uri=true"):
        for args in (
            ["worker", *flags, "--store", store],
            ["resume-consumer", *flags, "--store", store],
            ["migrate", "--store", store],
        ):
            result = run_cli(*args, cwd=tmp_path, timeout=60)
            assert result.returncode == 1, result.describe()
            assert result.stderr.startswith(
                f"error: INVALID_ARGUMENT: the store {store} is a SQLite database in memory"
            ), result.describe()
            assert "give a file (sqlite:///interlock.db) or a PostgreSQL URL" in result.stderr
            assert "broker" not in result.stderr, "refused before the broker is tried"
    assert list(tmp_path.iterdir()) == []


def test_a_commands_store_read_waits_out_a_dropped_connection(pg_url: str, pg_admin: str) -> None:
    """`decide` and `resend` read the store before they publish: a connection the server
    dropped a moment ago (too recent for the pool to ping) fails that read once, and it
    is tried again rather than ending the command with UNAVAILABLE."""
    from sqlalchemy import make_url

    from interlock import SqlSessionStore
    from tests.sql_helpers import terminate_backends
    from workers.cli.base import read_store, store_read
    from workers.settings import DEFAULT_SERVER_TIMEOUT

    SqlSessionStore(pg_url).close()  # its tables, as a worker makes them
    sql = read_store(pg_url, DEFAULT_SERVER_TIMEOUT)
    try:
        assert sql.get_snapshot("warm") is None  # the pool holds a connection now
        terminate_backends(pg_admin, make_url(pg_url).database)
        tries: list[int] = []

        def read() -> object:
            tries.append(1)
            return sql.get_snapshot("nothing-here")

        assert store_read(read, DEFAULT_SERVER_TIMEOUT) is None
        assert len(tries) == 2, "the first try met the dropped connection"
    finally:
        sql.dispose()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_commands_store_read_does_not_wait_on_a_table_that_lacks_a_column(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A snapshot table made by another program, lacking Interlock's columns: no wait
    mends that, so the read is tried once and the error comes out at once (it used to
    be tried again for about 1.7 s), saying FAILED_PRECONDITION and pointing at
    `interlock migrate`; a dropped connection is still tried again (above)."""
    from sqlalchemy.exc import DBAPIError

    from interlock import Status
    from workers.cli.base import error_line, read_store, store_read
    from workers.settings import DEFAULT_SERVER_TIMEOUT

    url = database_of(backend, tmp_path, request, THEIR_SNAPSHOTS)
    sql = read_store(url, DEFAULT_SERVER_TIMEOUT)
    tries: list[int] = []

    def read() -> object:
        tries.append(1)
        return sql.get_snapshot("nothing-here")

    try:
        with pytest.raises(DBAPIError) as info:
            store_read(read, DEFAULT_SERVER_TIMEOUT)
    finally:
        sql.dispose()
    assert len(tries) == 1, "a lacking column lasts: not tried again"
    said = error_line(info.value)
    assert said is not None and said[0] is Status.FAILED_PRECONDITION, said
    assert said[1].startswith("cannot use the store: "), said
    assert said[1].endswith(
        "run `interlock migrate`, which makes those missing and names those that lack columns"
    ), said

    decided = run_cli(
        "decide", "snap-1", "--token", "t", "--approve", "--store", url,
        "--broker", f"redis://127.0.0.1:{free_port()}/0", timeout=60,
    )  # fmt: skip
    assert decided.returncode == 1, decided.describe()
    assert decided.stderr.startswith("error: FAILED_PRECONDITION: cannot use the store: "), (
        decided.describe()
    )
    assert f"({redact_url(url)}): its tables are not those Interlock makes" in decided.stderr


def test_every_command_that_reads_the_store_lists_the_flag() -> None:
    """The commands that read or write the store list --store; `submit` says when it
    reads it (the workers store the turns)."""
    shown = " ".join(run_cli("submit", "--help").stdout.split())
    assert (
        "--store TEXT The workers' store; read only with --wait, for turns sent with ids" in shown
    )
    for command in ("worker", "resume-consumer", "pending", "decide", "resend", "audit", "prune"):
        assert "--store" in run_cli(command, "--help").stdout, command
    ran = run_cli("submit", "--store", "sqlite:///x.db", "--agent", "a", "--text", "")
    assert ran.returncode == 2 and "the message is empty" in ran.stderr, ran.describe()


def test_one_set_of_flags_serves_every_command(tmp_path: Path) -> None:
    """`--app --broker --store` are taken by every command that talks to the queues or
    the store; a command that does not use one accepts it and does not list it."""
    from click.testing import CliRunner

    from workers.cli import main

    flags = ["--app", "examples.banking:ai", "--broker", "redis://127.0.0.1:1/0"]
    flags += ["--store", f"sqlite:///{tmp_path}/f.db"]
    runner = CliRunner()
    for command in (
        "worker",
        "resume-consumer",
        "submit",
        "pending",
        "decide",
        "resend",
        "audit",
        "migrate",
        "health",
        "prune",
    ):
        result = runner.invoke(main, [command, *flags, "--help"])
        assert result.exit_code == 0, (command, result.output)
    assert "--app" not in runner.invoke(main, ["pending", "--help"]).output
    assert "--broker" not in runner.invoke(main, ["audit", "--help"]).output
    ran = run_cli("pending", *flags, timeout=60)
    assert ran.returncode == 0 and ran.stdout == "", ran.describe()
    made = run_cli("migrate", *flags, timeout=60)
    assert made.returncode == 0 and made.json_lines()[0]["tables"] == TABLES, made.describe()


def test_the_commands_that_need_the_app_say_it_is_required() -> None:
    """`--app` can come from INTERLOCK_APP, so click does not require it; the help of
    every command that cannot run without it says so."""
    for command in ("worker", "resume-consumer", "submit"):
        shown = " ".join(run_cli(command, "--help").stdout.split())
        assert "MODULE:OBJ" in shown and "required" in shown, (command, shown)
    ran = run_cli("worker", "--broker", "redis://127.0.0.1:1/0")
    assert ran.returncode == 1, ran.describe()
    assert "no app given: pass --app MODULE:OBJ" in ran.stderr, ran.describe()


def test_the_serving_commands_name_the_variables_they_read_without_a_flag() -> None:
    """`worker --help` and `resume-consumer --help` name each INTERLOCK_* variable
    `Settings.from_env` reads that no flag of theirs shows, with its default as read
    from `Settings`; docs/queues.md lists the same variables."""
    import inspect as source

    from workers.settings import Settings

    read = set(re.findall(r'"(INTERLOCK_[A-Z_]+)"', source.getsource(Settings.from_env)))
    flagged = {"INTERLOCK_BROKER_URL", "INTERLOCK_STORE_URL", "INTERLOCK_APP"}
    flagged.add("INTERLOCK_HEARTBEAT_FILE")
    defaults = Settings()
    docs = (ROOT / "docs" / "queues.md").read_text()
    for command, wanted in (
        ("worker", {"INTERLOCK_SECRET", "INTERLOCK_VISIBILITY_TIMEOUT", "INTERLOCK_TURN_LEASE"}),
        ("resume-consumer", read - flagged),
    ):
        shown = " ".join(run_cli(command, "--help").stdout.split())
        named = set(re.findall(r"INTERLOCK_[A-Z_]+", shown.split("Also read from")[-1]))
        assert named == wanted, (command, named)
        assert f"INTERLOCK_VISIBILITY_TIMEOUT ({defaults.visibility_timeout} s:" in shown
        assert f"INTERLOCK_TURN_LEASE ({defaults.turn_lease:g} s:" in shown
        assert all(f"| `{name}` |" in docs for name in named), command


def test_a_store_url_the_server_refuses_is_said_as_a_refusal_not_an_outage(
    pg_admin: str, tmp_path: Path
) -> None:
    """A PostgreSQL server that answers but has no such database (NOT_FOUND: make it) or
    no such user (UNAUTHENTICATED) is a mistake in the URL, not an outage: each command
    that reads the store says which, with the way out, in one line."""
    import uuid

    from sqlalchemy.engine import make_url

    name = f"interlock_absent_{uuid.uuid4().hex[:8]}"
    absent = make_url(pg_admin).set(database=name).render_as_string(hide_password=False)
    broker = ["--broker", f"redis://127.0.0.1:{free_port()}/0"]  # never reached
    server = start_redis(tmp_path / "redis")  # the burst worker reaches its broker first
    try:
        worker = ["worker", "--burst", "--app", "examples.banking:ai", "--broker", server.url]
        runs = [
            run_cli(*args, "--store", absent, timeout=60)
            for args in (
                ["pending"],
                ["audit", "some-session"],
                ["decide", "snap-1", "--token", "t", "--approve", *broker],
                worker,
            )
        ]
    finally:
        server.stop()
    for ran in runs:
        assert ran.returncode == 1, ran.describe()
        sent = "; nothing was sent" if ran.args[0] == "decide" else ""
        assert ran.stderr.strip().splitlines()[-1] == (
            f"error: NOT_FOUND: the store's database '{name}' does not exist on its server "
            f"({redact_url(absent)}): make it (`createdb {name}`, then `interlock migrate`), "
            f"or check --store or INTERLOCK_STORE_URL{sent}"
        ), ran.describe()
    checked = run_cli("health", "--store", absent, *broker)
    assert checked.returncode == 1, checked.describe()
    assert checked.json_lines()[0]["store"].startswith(
        f"error: NOT_FOUND: the store's database '{name}' does not exist"
    ), checked.describe()
    stranger = make_url(pg_admin).set(username=f"nobody_{name}", password=None)
    refused = run_cli("pending", "--store", stranger.render_as_string(hide_password=False))
    assert refused.returncode == 1, refused.describe()
    assert "error: UNAUTHENTICATED: the store's server refused the login: " in refused.stderr
    assert "check the user and password of --store" in refused.stderr, refused.describe()


def test_decide_and_resend_name_the_store_where_a_snapshot_is_not(tmp_path: Path) -> None:
    """A snapshot id the store does not hold: NOT_FOUND, naming the store that was read
    (the default one may not be the workers'), before any broker is reached."""
    url = f"sqlite:///{tmp_path / 'here.db'}"
    assert run_cli("migrate", "--store", url).returncode == 0
    broker = ["--broker", f"redis://127.0.0.1:{free_port()}/0"]  # never reached
    for args in (["decide", "nosuch", "--token", "t", "--approve"], ["resend", "nosuch"]):
        ran = run_cli(*args, "--store", url, *broker, timeout=60)
        assert ran.returncode == 1, ran.describe()
        sent = "; nothing was sent" if args[0] == "decide" else ""
        assert ran.stderr.strip() == (
            f"error: NOT_FOUND: snapshot nosuch not found in the store at {url} "
            f"(check --store or INTERLOCK_STORE_URL){sent}"
        ), ran.describe()


def test_a_store_url_naming_a_driver_not_installed_is_one_line(tmp_path: Path) -> None:
    """`postgresql+psycopg2://` is the spelling most guides give; with psycopg (3)
    installed and psycopg2 not, each command said so in a traceback (and `health` as
    UNAVAILABLE). The URL is wrong, not the server: INVALID_ARGUMENT, before anything
    connects."""
    import importlib.util

    absent = [d for d in ("psycopg2", "pg8000", "asyncpg") if importlib.util.find_spec(d) is None]
    assert absent, "every driver is installed: nothing to show"
    for driver in absent[:2]:
        url = f"postgresql+{driver}://postgres@127.0.0.1:1/nowhere"
        said = (
            f"error: INVALID_ARGUMENT: store URL '{url}' names the driver '{driver}', which "
            f"is not installed (No module named '{driver}'): use sqlite:///interlock.db or "
            "postgresql+psycopg://USER@HOST/DB"
        )
        for args in (["pending"], ["migrate"], ["health", "--broker", "redis://127.0.0.1:1/0"]):
            result = run_cli(*args, "--store", url, cwd=tmp_path)
            assert result.returncode == 1, result.describe()
            assert result.stderr.strip() == said, result.describe()
            assert result.stdout == "", result.describe()
    assert list(tmp_path.iterdir()) == []


def test_a_redis_database_the_server_lacks_is_a_wrong_url_not_an_outage(
    tmp_path: Path, redis_url: str
) -> None:
    """Redis has databases 0 to 15 by default: /99 reaches the server, which refuses the
    database. That is the URL's fault (INVALID_ARGUMENT), not a broker that is down
    (UNAVAILABLE, which a script would wait out)."""
    base = redis_url.rsplit("/", 1)[0]
    broker = ["--broker", f"{base}/99", "--store", f"sqlite:///{tmp_path / 's.db'}"]
    said = "INVALID_ARGUMENT: the broker has no such database: DB index is out of range; "
    app = ["--app", "examples.banking:ai"]
    submit = run_cli("submit", "--agent", "bankingAgent", "--text", "hi", *app, *broker)
    assert submit.returncode == 1, submit.describe()
    assert submit.stderr.strip().startswith(f"error: {said}"), submit.describe()
    health = run_cli("health", *broker)
    assert health.returncode == 1, health.describe()
    assert f'"broker": "error: {said}' in health.stdout, health.describe()
    assert "Traceback" not in submit.stderr + health.stderr


def test_schemas_to_a_folder_that_cannot_be_made_is_one_line(tmp_path: Path) -> None:
    """`--out` under a file (or anywhere not writable) was a traceback; `--check` of a
    folder where a schema's name is a folder reports it out of date."""
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    result = run_cli("schemas", "--out", str(blocker / "schemas"))
    assert result.returncode == 1, result.describe()
    assert result.stderr.strip() == (
        f"error: INVALID_ARGUMENT: cannot write the schemas to {blocker / 'schemas'}: "
        f"Not a directory ({blocker / 'schemas'}); check --out"
    ), result.describe()
    out = tmp_path / "out"
    assert run_cli("schemas", "--out", str(out)).returncode == 0
    (out / "decision.schema.json").unlink()
    (out / "decision.schema.json").mkdir()
    checked = run_cli("schemas", "--check", "--out", str(out))
    assert checked.returncode == 1, checked.describe()
    assert checked.stderr.startswith("error: FAILED_PRECONDITION: schemas are out of date")
    assert str(out / "decision.schema.json") in checked.stderr, checked.describe()
    assert "Traceback" not in checked.stderr


def snapshot_lacks() -> list[str]:
    """The columns Interlock's snapshot table has and theirs (`snapshot_id`, `x`) lacks."""
    from interlock.stores.sql import metadata

    snapshots = metadata.tables["interlock_snapshot"]
    return [c.name for c in snapshots.columns if c.name != "snapshot_id"]


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_migrate_refuses_tables_of_interlocks_names_that_lack_its_columns(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Tables named as Interlock's but made by another program: `migrate` names each
    and the columns it lacks (FAILED_PRECONDITION) and changes nothing, where it used to
    report success; a command that then reads the store says it reached it and cannot
    use it, pointing at `migrate`, not that it cannot reach it."""
    from events.outbox import outbox_table

    url = database_of(
        backend,
        tmp_path,
        request,
        THEIR_SNAPSHOTS,
        "CREATE TABLE interlock_outbox (id INTEGER, sent_at TEXT)",
    )
    theirs = create_engine(url)
    try:
        made = run_cli("migrate", "--store", url, timeout=60)
        assert made.returncode == 1, made.describe()
        snapshot = snapshot_lacks()
        outbox = [c.name for c in outbox_table.columns if c.name not in ("id", "sent_at")]
        assert made.stderr.strip() == (
            f"error: FAILED_PRECONDITION: the store at {redact_url(url)} holds tables named "
            "as Interlock's but lacking columns it needs: interlock_snapshot lacks "
            f"{', '.join(snapshot)}; interlock_outbox lacks {', '.join(outbox)}; nothing was "
            "changed: rename or drop them, or check --store or INTERLOCK_STORE_URL"
        ), made.describe()
        assert made.stdout == "", made.describe()
        found = inspect(theirs)
        assert sorted(found.get_table_names()) == ["interlock_outbox", "interlock_snapshot"]
        assert [c["name"] for c in found.get_columns("interlock_snapshot")] == [
            "snapshot_id",
            "x",
        ]
        with theirs.begin() as conn:
            conn.execute(text("DROP TABLE interlock_outbox"))
        listed = run_cli("pending", "--store", url, timeout=60)
        assert listed.returncode == 1, listed.describe()
        said = (
            "no such column: interlock_snapshot.seq"
            if backend == "sqlite"
            else "column interlock_snapshot.seq does not exist"
        )
        assert listed.stderr.strip() == (
            f"error: FAILED_PRECONDITION: cannot use the store: {said} ({redact_url(url)}): "
            "its tables are not those Interlock makes; run `interlock migrate`, which makes "
            "those missing and names those that lack columns"
        ), listed.describe()
        again = run_cli("migrate", "--store", url, timeout=60)
        assert again.returncode == 1, again.describe()
        assert again.stderr.strip().endswith(
            f"holds a table named as Interlock's but lacking columns it needs: "
            f"interlock_snapshot lacks {', '.join(snapshot)}; nothing was changed: rename or "
            "drop it, or check --store or INTERLOCK_STORE_URL"
        ), again.describe()
        assert inspect(theirs).get_table_names() == ["interlock_snapshot"]
    finally:
        theirs.dispose()
    down = f"postgresql+psycopg://nobody@127.0.0.1:{free_port()}/x"  # not reached: as before
    unreached = run_cli("pending", "--store", down, timeout=60)
    assert unreached.returncode == 1, unreached.describe()
    assert unreached.stderr.startswith(
        "error: UNAVAILABLE: cannot reach the store: connection failed: "
    ), unreached.describe()
    assert unreached.stderr.strip().endswith(f"({down})"), unreached.describe()


@pytest.mark.parametrize("command", ["worker", "resume-consumer"])
@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_served_process_refuses_tables_of_interlocks_names_that_lack_its_columns(
    backend: str, command: str, tmp_path: Path, redis_url: str, request: pytest.FixtureRequest
) -> None:
    """The worker and the resume consumer run `migrate`'s check of the columns before
    they serve: on tables named as Interlock's but made by another program (or an old
    release) they exit 1, served as in burst mode, naming each table and the columns it
    lacks, and make nothing, where they started and failed at every turn or decision."""
    url = database_of(backend, tmp_path, request, THEIR_SNAPSHOTS)
    theirs = create_engine(url)
    try:
        extra = ["--pool", "solo"] if command == "worker" else []
        flags = ["--app", APP, "--broker", redis_url, "--store", url]
        started = run_cli(command, *extra, *flags, timeout=45)
        assert started.returncode == 1, started.describe()
        assert started.stderr.strip().splitlines()[-1] == (
            f"error: FAILED_PRECONDITION: the store at {redact_url(url)} holds a table named "
            "as Interlock's but lacking columns it needs: interlock_snapshot lacks "
            f"{', '.join(snapshot_lacks())}; nothing was changed: rename or drop it, or check "
            "--store or INTERLOCK_STORE_URL"
        ), started.describe()
        assert started.stdout == "", "it never started: " + started.describe()
        assert "Traceback" not in started.stderr, started.describe()
        assert inspect(theirs).get_table_names() == ["interlock_snapshot"], "nothing made"
    finally:
        theirs.dispose()


@pytest.mark.parametrize("broker", ["redis", "rabbitmq"])
def test_health_counts_the_messages_waiting_on_each_queue(broker: str, tmp_path: Path) -> None:
    """`queues` counts what waits on each of Interlock's queues: a backlog of turns, or
    dead letters, shows there. Counts are figures, not checks: health still passes. A
    broker that cannot be reached has none (null)."""
    store = f"sqlite:///{tmp_path}/h.db"
    with contextlib.ExitStack() as stack:
        if broker == "redis":  # its own: no other test's message waits there
            server = start_redis(tmp_path / "redis")
            stack.callback(server.stop)
            url = server.url
        else:
            url = stack.enter_context(rabbitmq_vhost())
        empty = run_cli("health", "--broker", url, "--store", store, timeout=60)
        assert empty.returncode == 0, empty.describe()
        assert empty.json_lines() == [{"broker": "ok", "store": "ok", "queues": NONE_WAITING}]
        waiting = {"interlock.turns": 3, "interlock.decisions.dead": 2, "interlock.decisions": 1}
        with Connection(url) as conn:
            producer = Producer(conn.default_channel)
            for name, count in waiting.items():
                queue = next(q for q in all_queues() if q.name == name)
                for n in range(count):
                    producer.publish(
                        {"n": n}, exchange=queue.exchange, routing_key=queue.routing_key,
                        serializer="json", retry=True,
                    )  # fmt: skip
        counted = run_cli("health", "--broker", url, "--store", store, timeout=60)
        assert counted.returncode == 0, counted.describe()
        assert counted.json_lines() == [
            {"broker": "ok", "store": "ok", "queues": NONE_WAITING | waiting}
        ]
    nobody = f"redis://127.0.0.1:{free_port()}/0"
    down = run_cli("health", "--broker", nobody, "--store", store, timeout=60)
    assert down.returncode == 1, down.describe()
    [report] = down.json_lines()
    assert report["queues"] is None and report["broker"].startswith("error: UNAVAILABLE"), report
