"""The commands that send turns and answer them: `submit`, `pending`, `decide`."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, BinaryIO

import click

from ..console import Terminated
from ..settings import NO_CONSUMER_HINT, redact_url
from .base import (
    PROGRESS_EVERY,
    broker_option,
    clear_errors,
    emit,
    error_line,
    missing_sqlite_file,
    no_tables,
    reach_broker,
    read_store,
    refuse_non_text,
    server_timeout,
    settings_of,
    shared_broker,
    signals_deferred,
    store_option,
    store_read,
    store_tables,
    store_url_of,
    submit_store_option,
    terminable,
    timeout_option,
    unused,
    wait_option,
)
from .waiter import Waiter

if TYPE_CHECKING:
    from celery import Celery

    from interlock import Snapshot
    from interlock.stores.sql_journal import TurnEnding

    from ..turn_file import FileTurn

__all__ = ["decide", "pending", "submit"]


def login_name() -> str | None:
    """Who runs this command, as the system knows them (None when it cannot say)."""
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no user name in the environment or the password file
        return None


# -- one-shot commands -------------------------------------------------------------------


@click.command(short_help="Enqueue a turn (or a file of them).")
@click.option(
    "--app",
    envvar="INTERLOCK_APP",
    help="Module defining the registry, MODULE:OBJ; required: --agent is checked against "
    "it before anything is sent. [env: INTERLOCK_APP]",
)
@broker_option
@submit_store_option
@click.option("--agent", "agent_name", required=True, help="Agent name in the registry.")
@click.option("--text", help="The user's message (or give --file).")
@click.option(
    "--file",
    "turn_file",
    type=click.File("rb"),
    help="Submit one turn per line of this file ('-': standard input; UTF-8, a byte order "
    "mark allowed; lines end at a line feed): the line is the message, or a JSON "
    'object {"text": ..., "session_id": '
    '..., "turn_id": ...} (session_id, turn_id optional; a turn sent again with the same '
    "turn_id runs once, so a file cut short can be sent again). Every line is checked "
    "before any turn is sent.",
)
@click.option(
    "--session",
    "session_id",
    help="Continue this session; an id no turn has used yet starts a session of that id "
    "(default: a new one, its id made up).",
)
@click.option(
    "--turn-id",
    "turn_id",
    help="The turn's id (default: a new one): a turn sent again with the same id runs "
    "once, so a sender that is not sure the first went through may send it again. "
    "Without --session, it goes to a session named after it.",
)
@wait_option
@timeout_option
@clear_errors
@terminable
def submit(
    app: str | None,
    broker: str | None,
    store: str | None,
    agent_name: str,
    text: str | None,
    turn_file: BinaryIO | None,
    session_id: str | None,
    turn_id: str | None,
    wait: bool,
    timeout: float,
) -> None:
    """Enqueue a turn; prints {"turn_id", "session_id"}.

    With --wait, then prints the event that ends the turn: turn.interrupted (with the
    resume_token that `interlock decide` needs), turn.completed, or turn.failed (exit 1).

    With --file, one turn per line, each printed with its "line" number once sent; with
    --wait, then the event that ends each one, as they come (exit 1 if any failed). A
    batch that stops part-way says how many turns were sent and from which line on the
    rest were not."""
    from ..app import create_app, runtime_of
    from ..turn_file import FileTurn, file_lines, read_turns

    if text is None and turn_file is None:
        raise click.UsageError("give the message with --text, or a file of them with --file")
    if text is not None and turn_file is not None:
        raise click.UsageError("give --text or --file, not both")
    if text is not None and not text.strip():
        raise click.BadParameter("the message is empty", param_hint="--text")
    if session_id is not None and not session_id.strip():
        raise click.BadParameter(
            "the session id is empty (leave --session out for a new session)",
            param_hint="--session",
        )
    if turn_file is not None and session_id is not None:
        raise click.UsageError(
            '--session goes with --text; in --file, give a line {"text", "session_id"}'
        )
    if turn_file is not None and turn_id is not None:
        raise click.UsageError(
            '--turn-id goes with --text; in --file, give a line {"text", "turn_id"}'
        )
    if turn_id is not None and not turn_id.strip():
        raise click.BadParameter(
            "the turn id is empty (leave --turn-id out for a new one)", param_hint="--turn-id"
        )
    if turn_file is not None:
        # Standard input is a stream of click's, which may have no name.
        name = getattr(turn_file, "name", "<stdin>")
        name = "<stdin>" if name in ("-", "<stdin>", 0) else str(name)
        turns = read_turns(file_lines(turn_file.read(), name), name=name)
    else:
        assert text is not None
        _check_sendable(text, session_id, turn_id)
        turns = [FileTurn(0, text, session_id, turn_id)]
    settings = shared_broker(settings_of(app, broker, store))
    celery_app = create_app(settings)
    runtime_of(celery_app).registry.lookup_agent(agent_name)
    waiter = Waiter(settings, timeout) if wait else None
    try:
        given = [t.turn_id for t in turns if t.turn_id is not None]
        # Bound first, then read: a turn that ends after the read is announced to it.
        ended = (
            _ended_before(settings.store_url, given, settings.server_timeout)
            if waiter is not None
            else None
        )
        sent = _send_turns(celery_app, agent_name, turns, batch=turn_file is not None)
        if waiter is not None and turn_file is None and ended and sent[0] in ended:
            waiter.ended_before(sent[0], ended[sent[0]])  # no event will come for it
        elif waiter is not None and turn_file is None:
            waiter.turn_event(sent[0])
        elif waiter is not None:
            waiter.turn_events(sent, frozenset(given), ended)
        elif turn_file is None:
            click.echo(
                "sent: a worker runs it (--wait prints how it ends: a pause with the "
                "resume_token that `interlock decide` takes)",
                err=True,
            )
    finally:
        if waiter is not None:
            waiter.close()


def _ended_before(url: str, turn_ids: list[str], within: float) -> dict[str, TurnEnding] | None:
    """Which of `turn_ids` (the ids a file gives) ended before they are sent again, read
    from the store at `url`: those run once, so no event will announce them. None when
    the store cannot say (not there yet, no tables, unreachable: said on stderr; a
    server that does not answer is given up on after `within` seconds), so the wait
    cannot tell them from turns still to end."""
    from interlock.stores.sql_journal import ended_turns

    if not turn_ids:
        return None
    missing = missing_sqlite_file(url)
    if missing is not None:
        _unsaid(f"no store at {missing}: check --store or INTERLOCK_STORE_URL")
        return None
    try:
        sql = read_store(url, within)
    except Exception as exc:  # a URL the store's engine refuses
        _unread(url, exc)
        return None
    try:
        empty = no_tables(store_read(lambda: store_tables(sql), within), url)
        if empty is not None:
            _unsaid(empty)
            return None
        return store_read(lambda: ended_turns(sql, turn_ids), within)
    except Exception as exc:
        _unread(url, exc)
        return None
    finally:
        sql.dispose()


def _unread(url: str, exc: Exception) -> None:
    """Say why the store could not tell which turns ended before (or raise `exc` when it
    is no store's failure)."""
    said = error_line(exc)
    if said is None:
        raise exc
    _unsaid(f"could not read the store {redact_url(url)}: {said[1]}")


def _unsaid(why: str) -> None:
    """Say that the turns sent that ended before cannot be told, and `why`."""
    click.echo(
        f"cannot tell which of the turns sent had ended before ({why}); one that had "
        "is not announced again, and is waited for until --timeout",
        err=True,
    )


def _check_sendable(text: str, session_id: str | None, turn_id: str | None) -> None:
    """Refuse, before anything is sent, what a worker would refuse before the turn runs
    ("run_turn request contains ..."): a NUL character or a lone surrogate (which is
    how bytes that are no UTF-8 in an argument reach Python), and a turn id only
    Interlock gives."""
    from interlock import Status, StatusError

    from ..decisions import unstorable
    from ..resume_check import reserved, reserved_said

    for flag, value in (("--text", text), ("--session", session_id), ("--turn-id", turn_id)):
        bad = unstorable(value)
        if bad is not None:
            raise StatusError(
                Status.INVALID_ARGUMENT, f"{flag} contains {bad}: a worker would refuse the turn"
            )
    if turn_id is not None and reserved(turn_id):
        raise StatusError(Status.INVALID_ARGUMENT, f"--turn-id: {reserved_said(turn_id)}")


def _send_turns(
    celery_app: Celery, agent_name: str, turns: list[FileTurn], *, batch: bool
) -> list[str]:
    """Enqueue each turn, printing it once sent (with its line in a batch); the turn ids.
    A batch reports its progress on stderr, and, when it stops part-way, how far it
    got (`_cut_short`)."""
    sent: list[str] = []
    try:
        for turn in turns:
            # A stop between two turns, never inside one: a turn the broker took is
            # counted and printed before the stop, so "from line N" is all unsent.
            with signals_deferred():
                turn_id, session_id = _send_turn(celery_app, agent_name, turn)
                sent.append(turn_id)
                line = {"line": turn.line} if batch else {}
                emit({"turn_id": turn_id, "session_id": session_id, **line})
            if batch and (len(sent) % PROGRESS_EVERY == 0 or len(sent) == len(turns)):
                _progress(len(sent), len(turns))
    except BaseException as exc:
        if batch and len(sent) < len(turns):
            _cut_short(exc, turns, len(sent))
        raise
    return sent


def _send_turn(celery_app: Celery, agent_name: str, turn: FileTurn) -> tuple[str, str]:
    """Enqueue `turn`; its turn id and session id."""
    from interlock import AgentInput, Message, Part

    from ..app import send_turn
    from ..turn_file import session_for
    from ..turns import new_turn_request

    session_id = session_for(turn)
    request = new_turn_request(
        agent_name,
        AgentInput(message=Message(role="user", content=[Part(text=turn.text)])),
        session_id=session_id,
        turn_id=turn.turn_id,
    )
    send_turn(celery_app, request, within=server_timeout())
    return request.turn_id, session_id


def _progress(sent: int, total: int) -> None:
    click.echo(f"submitted {sent} of {total} turns", err=True)


def _cut_short(exc: BaseException, turns: list[FileTurn], sent: int) -> None:
    """A batch stopped by `exc` after `sent` turns: the progress line says how many
    went out, and so does the error (raised in its place, with the same status), or a
    line before it for Ctrl-C, SIGTERM, a closed output or an error that is no
    service's."""
    from interlock import StatusError

    if sent % PROGRESS_EVERY:  # else the last progress line says it already
        _progress(sent, len(turns))
    if sent == 0:
        total = len(turns)
        how_far = f"none of the {total} turns was sent" if total > 1 else "the turn was not sent"
    else:
        how_far = (
            f"{sent} of {len(turns)} turns sent, through line {turns[sent - 1].line}; "
            f"the rest, from line {turns[sent].line}, were not sent"
        )
    said = None
    if isinstance(exc, Exception) and not isinstance(exc, BrokenPipeError):
        said = error_line(exc)
    if said is None:
        click.echo(how_far, err=True)
        return
    raise StatusError(said[0], f"{said[1]} ({how_far})") from exc


@click.command(short_help="List the open interrupts.")
@store_option
@unused("--app")
@unused("--broker")
@click.option("--session", "session_id", help="Only this session.")
@click.option(
    "--limit", default=100, show_default=True, type=click.IntRange(min=1), help="At most this many."
)
@clear_errors
def pending(store: str | None, session_id: str | None, limit: int) -> None:
    """List the open interrupts, one JSON line each (newest first). When there are more
    than --limit, says so on stderr.

    The store keeps no resume token (only its hash): `interlock decide --token` takes
    the one in the pause's turn.interrupted event (on the queue interlock.interrupted;
    `submit --wait` prints it), and `interlock resend SNAPSHOT_ID` announces a pause
    again with a new one."""
    from interlock import FinishReason, SnapshotStatus

    refuse_non_text((("--session", session_id),), ": no session id holds one")
    url = store_url_of(store)
    within = server_timeout()
    missing = missing_sqlite_file(url)
    if missing is not None:  # nothing has run on it: nothing waits (and none is made)
        click.echo(
            f"no open interrupts: no store at {missing} yet (a typo? check --store or "
            "INTERLOCK_STORE_URL)",
            err=True,
        )
        return
    sql = read_store(url, within)
    try:
        empty = no_tables(store_tables(sql), url)
        if empty is not None:
            click.echo(f"no open interrupts: {empty}", err=True)
            return
        snaps = sql.list_snapshots(
            session_id=session_id,
            status=SnapshotStatus.COMPLETED,
            finish_reason=FinishReason.INTERRUPTED,
            claimed=False,
            limit=limit + 1,  # one more: whether the limit cut the list
        )
        for snap in snaps[:limit]:
            emit(_pending_row(snap))
        if not snaps:
            click.echo("no open interrupts", err=True)
        elif len(snaps) > limit:
            click.echo(
                f"showing the newest {limit}; more are pending: pass a larger --limit to see them",
                err=True,
            )
    finally:
        sql.dispose()


def _pending_row(snap: Snapshot) -> dict[str, Any]:
    """One open interrupt as `pending` prints it (no resume token: the store has none).
    `expired`: its deadline has passed, so an answer is refused, though the resume
    consumer's sweep has not marked it yet."""
    from interlock.resume import passed_deadline
    from schemas import wire_time

    message = snap.last_model_message
    return {
        "snapshot_id": snap.snapshot_id,
        "session_id": snap.session_id,
        "agent": snap.agent,
        "created_at": wire_time(snap.created_at, microseconds=True),
        "expires_at": wire_time(snap.expires_at, microseconds=True) if snap.expires_at else None,
        "expired": passed_deadline(snap) is not None,
        "interrupts": [
            {
                "name": p.tool_request.name,
                "ref": p.tool_request.ref,
                "input": p.tool_request.input,
                "payload": p.meta("interrupt"),
            }
            for p in (message.interrupts if message else [])
            if p.tool_request
        ],
    }


@click.command(short_help="Answer a paused turn: approve, deny or respond.")
@click.argument("snapshot_id")
@click.option(
    "--app",
    envvar="INTERLOCK_APP",
    help="Module defining the registry, MODULE:OBJ. Optional: given, the decision is "
    "checked as the resume consumer checks it (resume data and outputs against the tool's "
    "types) before it is sent. [env: INTERLOCK_APP]",
)
@broker_option
@store_option
@click.option(
    "--token",
    "resume_token",
    envvar="INTERLOCK_RESUME_TOKEN",
    required=True,
    help="The resume_token of the turn.interrupted event (`submit --wait` prints it; "
    "`interlock resend SNAPSHOT_ID` issues a new one). [env: INTERLOCK_RESUME_TOKEN]",
)
@click.option(
    "--approve",
    is_flag=True,
    help='Restart each interrupt with {"approved": true} (a call that tool_approval holds: '
    "run it).",
)
@click.option(
    "--deny",
    is_flag=True,
    help='Restart each interrupt with {"approved": false} (a call that tool_approval holds: '
    "do not run it; the model reads --feedback as the reason).",
)
@click.option(
    "--respond",
    "respond_json",
    metavar="JSON",
    help="Respond to each interrupt with this tool output (the tool does not run).",
)
@click.option(
    "--ref",
    "refs",
    multiple=True,
    help="Answer this interrupt (repeatable; every pending one must be named). Default: every "
    "pending one, read from the store.",
)
@click.option(
    "--feedback",
    default=None,
    help="Feedback sent with --approve/--deny (with --respond, put it in the JSON).",
)
@click.option(
    "--reviewer",
    envvar="INTERLOCK_REVIEWER",
    default=login_name,
    show_default="your login name",
    help="Who decides (kept in the audit trail; --reviewer '' sends none). "
    "[env: INTERLOCK_REVIEWER]",
)
@wait_option
@timeout_option
@clear_errors
@terminable
def decide(
    snapshot_id: str,
    app: str | None,
    broker: str | None,
    store: str | None,
    resume_token: str,
    approve: bool,
    deny: bool,
    respond_json: str | None,
    refs: tuple[str, ...],
    feedback: str | None,
    reviewer: str | None,
    wait: bool,
    timeout: float,
) -> None:
    """Publish a decision on a paused turn; prints {"decision_id", "snapshot_id", "refs"}.

    The resume consumer checks it and publishes decision.accepted or decision.rejected.
    With --wait, then prints that outcome (a rejection exits 1) and, once accepted, the
    event that ends the resumed turn. What the consumer would refuse for the snapshot (a
    wrong --token, a pause answered or expired) is refused before anything is sent."""
    from events.publisher import Publisher
    from interlock import StatusError

    from ..decisions import resume_turn_id
    from .decision_draft import draft_decision, nothing_sent

    if [approve, deny, respond_json is not None].count(True) != 1:
        raise click.UsageError("give exactly one of --approve, --deny, --respond JSON")
    if feedback is not None and respond_json is not None:
        raise click.UsageError(
            "--feedback goes with --approve or --deny; with --respond, put it in the JSON"
        )
    verdict = "respond" if respond_json is not None else "approve" if approve else "deny"
    output: Any = None
    if respond_json is not None:
        try:
            output = json.loads(respond_json)
        except ValueError as exc:
            raise click.BadParameter(f"not JSON: {exc}", param_hint="--respond") from None
    # What the resume consumer refuses at its first check, and no store can look up.
    refuse_non_text(
        (
            ("SNAPSHOT_ID", snapshot_id),
            ("--token", resume_token),
            ("--respond", output),
            ("--ref", list(refs)),
            ("--feedback", feedback),
            ("--reviewer", reviewer),
        ),
        "; nothing was sent",
    )
    with nothing_sent():
        settings = shared_broker(settings_of(app, broker, store))
    decision, wanted = draft_decision(
        settings,
        snapshot_id,
        resume_token,
        verdict=verdict,
        output=output,
        refs=refs,
        feedback=feedback,
        reviewer=reviewer,
    )
    decision_id = decision.decision_id
    resumed_turn = resume_turn_id(decision_id)
    ends = ("turn.interrupted", "turn.completed", "turn.failed")
    with nothing_sent():  # the events' queue, bound before the decision goes out
        waiter = (
            Waiter(settings, timeout, keep=lambda e: e.type in ends and e.turn_id == resumed_turn)
            if wait
            else None
        )
    try:
        with settings.connection() as conn:
            with nothing_sent():
                reach_broker(conn, settings.server_timeout)
            Publisher(conn, timeout=settings.server_timeout).publish_decision(decision)
        emit({"decision_id": decision_id, "snapshot_id": snapshot_id, "refs": wanted})
        if waiter is None:
            click.echo(
                "sent: the resume consumer checks it and publishes decision.accepted or "
                "decision.rejected (--wait shows which)",
                err=True,
            )
            return
        try:
            outcome = waiter.next(
                f"the outcome of decision {decision_id}",
                lambda e: e.type.startswith("decision.") and e.decision_id == decision_id,
                hint=NO_CONSUMER_HINT,
            )
        except (KeyboardInterrupt, Terminated):  # a stop says that the decision went out
            click.echo(
                f"the wait for the outcome of decision {decision_id} stopped; the decision "
                "was sent, and the resume consumer decides it",
                err=True,
            )
            raise
        if outcome.type == "decision.rejected":
            raise StatusError(outcome.error.status, f"decision rejected: {outcome.error.message}")
        waiter.turn_event(resumed_turn)
    finally:
        if waiter is not None:
            waiter.close()
