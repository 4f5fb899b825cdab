"""The demo and the operator's commands: `demo`, `migrate`, `health`, `schemas`, `audit`."""

from __future__ import annotations

import os
import shlex
import stat
import time
from pathlib import Path
from typing import Any

import click

from ..settings import one_shot_store_url, redact_url
from .base import (
    Seconds,
    broker_option,
    check_columns,
    check_sqlite_folder,
    clear_errors,
    emit,
    error_line,
    fail,
    interlock_metadata,
    missing_sqlite_file,
    no_tables,
    not_in,
    reach_store,
    read_store,
    refuse_non_text,
    server_timeout,
    settings_of,
    shared_broker,
    shared_store,
    store_option,
    store_refusal,
    store_tables,
    store_url_of,
    unused,
)

__all__ = ["audit", "demo", "health", "migrate", "schemas"]

DEMO_TEXT = "Transfer $500 to my savings account."


@click.command(short_help="The banking agent end to end; no server needed.")
@click.option("--approve", is_flag=True, help="Approve without asking.")
@click.option("--deny", is_flag=True, help="Deny without asking.")
@click.option("--text", default=DEMO_TEXT, show_default=True, help="What the user asks.")
@click.option(
    "--broker",
    default=None,
    help="Run against a running worker and resume consumer on this broker "
    "(default: everything in this process, no server needed; INTERLOCK_BROKER_URL is "
    "not read, so that the demo runs anywhere).",
)
@click.option(
    "--store",
    default=None,
    help="Store URL: with --broker, the one the worker uses [env: INTERLOCK_STORE_URL; "
    "default sqlite:///interlock.db]; without it, where the demo's own store is kept "
    "(default: a temporary SQLite file).",
)
@click.option("--in-process", is_flag=True, help="Skip the queues: call the agent directly.")
@click.option(
    "--timeout",
    default=60.0,
    show_default=True,
    type=Seconds(min=0, min_open=True),
    help="Seconds to wait for each hop.",
)
@click.option(
    "--model",
    default=None,
    metavar="PROVIDER/MODEL",
    help="Run the banking agent on a real model: openai/gpt-4o-mini, "
    "googleai/gemini-flash-latest, anthropic/claude-haiku-4-5, ollama/llama3.1 "
    "(keys from OPENAI_API_KEY, GEMINI_API_KEY, ANTHROPIC_API_KEY; see docs/models.md). "
    "Default: INTERLOCK_BANKING_MODEL if set, else the scripted model. With --broker, "
    "start the worker with INTERLOCK_BANKING_MODEL=PROVIDER/MODEL instead. "
    "[env: INTERLOCK_BANKING_MODEL]",
)
@clear_errors
def demo(
    approve: bool,
    deny: bool,
    text: str,
    broker: str | None,
    store: str | None,
    in_process: bool,
    timeout: float,
    model: str | None,
) -> None:
    """Run the banking agent end to end: it pauses for approval, a human answers, it
    resumes. With no --broker, one process holds a broker, a worker, the resume consumer
    and a SQLite store.

    The question is asked on the terminal. Piped in, a line y or n (yes or no) answers each
    interrupt (an empty line declines); the end of input approves."""
    from interlock import Status, StatusError

    from ..demo import ask_human, run_in_process, run_on_queues

    if approve and deny:
        raise click.UsageError("give --approve or --deny, not both")
    if not text.strip():
        raise click.BadParameter("the message is empty", param_hint="--text")
    if in_process and (broker is not None or store is not None):
        raise click.UsageError("--in-process uses no queues and no store: drop --broker, --store")
    if broker is not None:
        try:
            shared_broker(settings_of(broker=broker, store=store))
        except StatusError as exc:
            if not broker.startswith("memory://"):
                raise
            raise StatusError(
                exc.status,
                f"{exc.message}; or leave --broker out: the demo then runs everything in "
                "this process, on a memory:// broker of its own",
            ) from None
    if store is not None:  # the embedded worker's and consumer's: checked before anything runs
        settings = shared_store(settings_of(store=store))
        reach_store(settings.store_url, settings.server_timeout)
    decide_fn = ask_human(True if approve else False if deny else None)
    if in_process:
        out = run_in_process(text, decide_fn, model=model)
        emit(  # the shape of the queued demo's last line
            {
                "type": "turn.completed",
                "finish_reason": out.finish_reason.value,
                "session_id": out.session_id,
                "snapshot_id": out.snapshot_id,
                "text": out.text,
            }
        )
        return
    result = run_on_queues(
        text, decide_fn, broker=broker, store=store, timeout=timeout, model=model
    )
    emit(result)
    if result.get("type") != "turn.completed":
        error = result.get("error") or {}
        raise StatusError(
            error.get("status") or Status.UNKNOWN,
            f"the demo ended with {result.get('type')}"
            + (f": {error['message']}" if error.get("message") else ""),
        )


@click.command(short_help="Create the store's tables (once per deployment).")
@store_option
@unused("--app")
@unused("--broker")
@clear_errors
def migrate(store: str | None) -> None:
    """Create the store's tables if missing: snapshots, messages, outbox, decisions, turn
    journal and turn leases, and the indexes a table an older release made lacks; erase
    resume tokens that an older release kept in the decision log. A table of one of
    these names that lacks columns Interlock needs (another program's) is named, and
    nothing is changed."""
    from events.decision_log import DecisionLog
    from events.outbox import Outbox
    from interlock import SqlSessionStore
    from interlock.stores.sql_journal import SqlTurnJournal

    settings = shared_store(settings_of(store=store))
    check_sqlite_folder(settings.store_url)
    sql = SqlSessionStore(
        one_shot_store_url(settings.store_url, settings.server_timeout), create_tables=False
    )
    try:
        check_columns(sql, settings.store_url)
        sql.create_tables()
        Outbox(sql).close()
        erased = DecisionLog(sql).erase_tokens()
        SqlTurnJournal(sql)
        indexes = sql.create_missing_indexes(*interlock_metadata())
        from sqlalchemy import inspect

        tables = sorted(
            t for t in inspect(sql.engine).get_table_names() if t.startswith("interlock_")
        )
    finally:
        sql.dispose()
    emit(
        {
            "store": redact_url(settings.store_url),
            "tables": tables,
            "tokens_erased": erased,
            "indexes_created": indexes,
        }
    )


@click.command(short_help="Check the broker, the store and a process's heartbeat.")
@broker_option
@store_option
@unused("--app")
@click.option(
    "--heartbeat-file",
    help="Also require this file (a worker's or a resume consumer's --heartbeat-file) to "
    "have been touched recently.",
)
@click.option(
    "--max-age",
    default=30.0,
    show_default=True,
    type=Seconds(min=0, min_open=True),
    help="Seconds, with --heartbeat-file.",
)
@clear_errors
def health(
    broker: str | None, store: str | None, heartbeat_file: str | None, max_age: float
) -> None:
    """Check the broker, the store and (optionally) a heartbeat file; exit 1 if any fails.

    The JSON line also counts the messages waiting on each of Interlock's queues
    (`queues`; null when the broker fails): a backlog on interlock.turns, or dead
    letters, show there."""
    from kombu.connection import Connection
    from sqlalchemy import text

    from events.publisher import TopologyConflict, declare, message_counts
    from interlock import Status, StatusError
    from interlock.stores.sql import make_engine

    settings = settings_of(broker=broker, store=store)
    report: dict[str, Any] = {}
    counts: dict[str, int] | None = None
    try:
        shared_broker(settings)  # one in this process alone is no broker of the others'
        within = settings.server_timeout  # a broker that never answers: one try, given up
        with Connection(
            settings.broker_url,
            connect_timeout=within,
            transport_options=settings.transport_options,
        ) as conn:
            conn.ensure_connection(max_retries=1, timeout=within)
            declare(conn)  # as workers do: one the broker holds declared otherwise shows
            counts = message_counts(conn)
        report["broker"] = "ok"
    except TopologyConflict as exc:
        report["broker"] = f"error: {Status.FAILED_PRECONDITION.value}: {exc}"
    except Exception as exc:
        known = error_line(exc)  # a refusal (UNAUTHENTICATED, ...) or an outage (UNAVAILABLE)
        said = _unusable(exc) if known is None else f"{known[0].value}: {known[1]}"
        report["broker"] = f"error: {said}"
    try:
        shared_store(settings)  # nor a SQLite database in memory a store of the others'
        missing = missing_sqlite_file(settings.store_url)
        if missing is not None:  # connecting would make it: usable if it can be made
            if not missing.parent.is_dir():
                raise StatusError(
                    Status.NOT_FOUND, f"no store at {missing}, and {missing.parent} does not exist"
                )
            if not os.access(missing.parent, os.W_OK):
                raise StatusError(
                    Status.NOT_FOUND, f"no store at {missing}, and {missing.parent} is not writable"
                )
        else:
            # the store's own URL options understood; a server that never answers given up on
            engine = make_engine(one_shot_store_url(settings.store_url, settings.server_timeout))
            try:
                with engine.connect() as db:
                    db.execute(text("SELECT 1"))
            finally:
                engine.dispose()
        report["store"] = "ok"
    except Exception as exc:
        known = store_refusal(exc)  # a refusal (NOT_FOUND, UNAUTHENTICATED), not an outage
        said = _unusable(exc) if known is None else f"{known[0].value}: {known[1]}"
        where = redact_url(settings.store_url)  # which store: the default may not be theirs
        report["store"] = f"error: {said}" + ("" if where in said else f" ({where})")
    report["queues"] = counts  # figures, not checks: null when the broker failed
    if heartbeat_file:
        report["heartbeat_age"], report["heartbeat"] = _heartbeat(Path(heartbeat_file), max_age)
    emit(report)
    failed = [f"{k} {v}" for k, v in report.items() if k not in _FIGURES and v != "ok"]
    if failed:
        fail(f"{Status.UNAVAILABLE.value}: unhealthy: " + "; ".join(failed))


_FIGURES = frozenset({"heartbeat_age", "queues"})
"""The keys of health's report that are figures, not checks that pass or fail."""

AHEAD_SLACK = 1.0
"""Seconds a heartbeat file may be dated ahead of this machine's clock and still count
(a file system that stamps times of its own, a little off)."""


def _heartbeat(path: Path, max_age: float) -> tuple[float | None, str]:
    """The age of the heartbeat file `path`, in seconds (None when it has none), and what
    it says: `ok`, `stale`, `missing`, or `error: STATUS: why` for a file that cannot tell
    (a folder, a time ahead of this machine's clock, one that cannot be read)."""
    from interlock import Status

    try:
        found = path.stat()
    except (FileNotFoundError, NotADirectoryError):
        return None, "missing"
    except OSError as exc:
        return None, (
            f"error: {Status.UNAVAILABLE.value}: cannot read the heartbeat file {path}: "
            f"{exc.strerror or exc}"
        )
    if not stat.S_ISREG(found.st_mode):
        kind = "a directory" if stat.S_ISDIR(found.st_mode) else "no regular file"
        return None, (
            f"error: {Status.INVALID_ARGUMENT.value}: the heartbeat file {path} is {kind}: "
            "check --heartbeat-file: it names the file a worker or a resume consumer touches"
        )
    age = time.time() - found.st_mtime
    if age < -AHEAD_SLACK:
        return round(age, 1), (
            f"error: {Status.FAILED_PRECONDITION.value}: the heartbeat file {path} is dated "
            f"{-age:.0f} s ahead of this machine's clock: it cannot say whether the process "
            "is alive; check the clocks of this machine and of the one that touches it"
        )
    return round(age, 1), "ok" if age <= max_age else "stale"


def _unusable(exc: Exception) -> str:
    """A failure that is no known refusal, with its status: its own where it has one
    (`StatusError`: its text starts with it), else UNAVAILABLE, as every command says."""
    from interlock import Status, StatusError
    from interlock.stores.failures import first_line as one_line

    said = one_line(exc)
    return said if isinstance(exc, StatusError) else f"{Status.UNAVAILABLE.value}: {said}"


SCHEMAS_DIR = "docs/schemas"
"""Where `make schemas` writes the schemas (`interlock schemas --out docs/schemas`)."""


def _makes_schemas(makefile: Path) -> bool:
    """Whether `makefile` has a `schemas` target, as Interlock's checkout has: where it
    does not, the hint is the command itself."""
    try:
        text = makefile.read_text(errors="replace")
    except OSError:
        return False
    return any(line.startswith("schemas:") for line in text.splitlines())


@click.command(short_help="Write or check the JSON Schemas of the queue messages.")
@click.option(
    "--out",
    "out_dir",
    default=SCHEMAS_DIR,
    show_default=True,
    type=click.Path(file_okay=False),
    help="Where the .schema.json files go.",
)
@click.option(
    "--check",
    is_flag=True,
    help="Exit 1 if the files differ from the models, one is missing, or a .schema.json "
    "file there is one no model writes.",
)
@clear_errors
def schemas(out_dir: str, check: bool) -> None:
    """Write (or --check) the JSON Schema of every queue message."""
    from interlock import Status
    from schemas.json_schema import message_schemas, render

    folder = Path(out_dir)
    wanted = message_schemas()
    if not check:
        for name, schema in sorted(wanted.items()):
            path = folder / name
            try:
                folder.mkdir(parents=True, exist_ok=True)
                path.write_text(render(schema))
            except OSError as exc:
                fail(
                    f"{Status.INVALID_ARGUMENT.value}: cannot write the schemas to {folder}: "
                    f"{exc.strerror or exc} ({exc.filename or path}); check --out"
                )
        emit({"schemas": str(folder), "written": len(wanted)})
        return
    missing, changed = [], []
    for name, schema in sorted(wanted.items()):
        path = folder / name
        if not path.exists():
            missing.append(str(path))
            continue
        try:
            current: str | None = path.read_text()
        except (OSError, UnicodeDecodeError):  # a folder, unreadable, not text
            current = None
        if current != render(schema):
            changed.append(str(path))
    extra = sorted(
        str(path)
        for path in (folder.glob("*.schema.json") if folder.is_dir() else [])
        if path.name not in wanted
    )
    write = (
        "make schemas"
        if Path(out_dir) == Path(SCHEMAS_DIR) and _makes_schemas(Path("Makefile"))
        else f"interlock schemas --out {shlex.quote(out_dir)}"
    )
    if len(missing) == len(wanted) and not extra:
        fail(f"{Status.NOT_FOUND.value}: no schema files in {folder}: run `{write}`")
    if missing or changed or extra:
        said = [f"missing {', '.join(missing)}"] if missing else []
        said += [f"different from the models: {', '.join(changed)}"] if changed else []
        found = [f"{'; '.join(said)} (run `{write}`)"] if said else []
        if extra:
            found.append(
                f"no model writes {', '.join(extra)} (delete {'it' if len(extra) == 1 else 'them'})"
            )
        fail(
            f"{Status.FAILED_PRECONDITION.value}: schemas are out of date in {folder}: "
            + "; ".join(found)
        )
    emit({"schemas": str(folder), "checked": len(wanted)})


@click.command(short_help="A session's interrupts, decisions and outcomes.")
@click.argument("session_id")
@store_option
@unused("--app")
@unused("--broker")
@clear_errors
def audit(session_id: str, store: str | None) -> None:
    """Print a session's history of interrupts, decisions and outcomes, one JSON line
    each, oldest first."""
    from events.decision_log import DecisionLog
    from interlock import Status, StatusError

    from ..audit import session_history

    refuse_non_text((("SESSION_ID", session_id),), ": no session id holds one")
    if not session_id.strip():
        raise StatusError(Status.INVALID_ARGUMENT, "SESSION_ID is empty: give a session id")
    url = store_url_of(store)
    sql = read_store(url, server_timeout())
    try:
        tables = store_tables(sql)
        empty = no_tables(tables, url)
        decisions = (
            DecisionLog(sql, create_tables=False) if "interlock_decision" in tables else None
        )
        entries = session_history(sql, decisions, session_id) if empty is None else []
    finally:
        sql.dispose()
    if not entries:
        raise StatusError(Status.NOT_FOUND, f"no session {session_id}{not_in(url, empty)}")
    for entry in entries:
        emit(entry)
