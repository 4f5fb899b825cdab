"""`interlock demo`: the banking example's flow, shown hop by hop."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import click

from interlock import AgentOutput, Part, Status, StatusError, ToolResume

if TYPE_CHECKING:
    from celery import Celery

    from events.stream import EventStream

__all__ = ["ask_human", "confirm", "read_answer", "run_in_process", "show_interrupt"]

Decide = Callable[[Part], bool]

_WORKER_STOP_WAIT = 0.5
"""Seconds the demo waits for its embedded worker and resume consumer to stop before it
ends the process (both are idle by then, and are daemon threads)."""


def ask_human(approve: bool | None) -> Decide:
    """A decision function: the flag when given, else a question on the terminal."""

    def decide(part: Part) -> bool:
        if approve is not None:
            return approve
        if not sys.stdin.isatty():  # piped: a line per interrupt; end of input approves
            return piped_answer(sys.stdin.readline())
        return confirm("  Approve this transfer?")

    return decide


class BadAnswer(click.ClickException):
    """A piped answer the demo cannot read: exit 2 as for a usage error, without the
    usage banner (the flow has run up to the question by then)."""

    exit_code = 2

    def show(self, file: Any = None) -> None:
        """One line in the form of every command's errors: `error: STATUS: message`."""
        click.echo(f"error: {Status.INVALID_ARGUMENT.value}: {self.format_message()}", err=True)


def piped_answer(line: str) -> bool:
    """The answer of a `line` read from a pipe: "y" or "yes" approves; "n", "no" or an
    empty line declines (as Enter does at the terminal's `[y/N]`); the end of input
    ("") approves, since no one is there to ask (said so: `--deny` declines)."""
    if not line:
        click.echo("  (no terminal to ask: approving; pass --deny to decline)")
        return True
    value = line.strip().lower()
    if value in ("y", "yes", "n", "no", ""):
        shown = value or "n (an empty line)"
        click.echo(f"  Approve this transfer? {shown} (read from standard input)")
        return value.startswith("y")
    raise BadAnswer(f"answer y (yes) or n (no) on standard input, not {value!r}")


def confirm(question: str) -> bool:
    """Ask `question [y/N]` on the terminal; "y" or "yes" approves, "n", "no" or an
    empty line declines, anything else asks again. End of input is click's `Abort`,
    and Ctrl-C a `KeyboardInterrupt`, whenever it comes (see `read_answer`)."""
    while True:
        click.echo(f"{question} [y/N]: ", nl=False)
        line = read_answer()
        if not line:
            raise click.Abort
        value = line.strip().lower()
        if value in ("y", "yes", "n", "no", ""):
            return value.startswith("y")
        click.echo("Error: invalid input")


def read_answer() -> str:
    """One line of standard input ("" at its end). `input()` can miss a Ctrl-C that
    lands after its prompt is written and before its read starts, and then waits for a
    line that never comes; here the signal's wake-up byte ends the wait whenever the
    signal arrives, and Python's handler raises `KeyboardInterrupt` (main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return sys.stdin.readline()  # signals are only handled on the main thread
    sys.stdout.flush()
    woken, wake = os.pipe()
    os.set_blocking(wake, False)
    previous = signal.set_wakeup_fd(wake, warn_on_full_buffer=False)
    try:
        while True:
            ready = select.select([sys.stdin, woken], [], [])[0]
            if sys.stdin in ready:
                return sys.stdin.readline()
            os.read(woken, 512)  # another signal, handled by now: keep waiting
    finally:
        signal.set_wakeup_fd(previous)
        os.close(woken)
        os.close(wake)


def show_interrupt(part: Part) -> None:
    req = part.tool_request
    assert req is not None
    payload = part.meta("interrupt") or {}
    details = payload.get("details") or payload.get("message") or payload
    click.echo(f"⏸  interrupted: {req.name} (ref {req.ref}) asks: {details}")


def run_in_process(text: str, decide: Decide, *, model: str | None = None) -> AgentOutput:
    """The banking example's flow: run, answer every interrupt, resume until done.
    `model` (`provider/model`) runs it on a real model instead of the scripted one."""
    from examples.banking import ApprovalReply, transferMoney, using_model

    with using_model(model) as bankingAgent:
        click.echo(f"▶  user: {text}" + (f"  [{model}]" if model else ""))
        out = bankingAgent.run_text(text)
        while out.finish_reason == "interrupted":
            restarts = []
            for part in out.interrupts:
                show_interrupt(part)
                approved = decide(part)
                click.echo(f"   human: {'approve' if approved else 'deny'}")
                restarts.append(transferMoney.resume(part, ApprovalReply(approved=approved)))
            click.echo("▶  resume: restart transferMoney with the human's reply")
            out = bankingAgent.run(ToolResume(restart=restarts), session_id=out.session_id)
    click.echo(f"✔  {out.finish_reason.value}: {out.text}")
    return out


def _hop(text: str) -> None:
    click.echo(text)


def run_on_queues(
    text: str,
    decide: Decide,
    *,
    broker: str | None = None,
    store: str | None = None,
    timeout: float = 60.0,
    model: str | None = None,
) -> dict[str, Any]:
    """The banking flow through the queues: submit → turn.interrupted → decision →
    decision.accepted → turn.completed. With no `broker`, everything runs here: an
    in-memory broker, an embedded worker, the resume consumer and a SQLite store.
    `model` (`provider/model`, embedded only) runs the agent on a real model."""
    import tempfile
    import uuid
    from contextlib import ExitStack

    from events.publisher import Publisher
    from events.stream import EventStream
    from examples.banking import ai, using_model
    from interlock import AgentInput, Message
    from schemas import Decision, EventBase, RestartEntry, TurnInterrupted

    from .app import create_app, runtime_of, send_turn
    from .consumer import ResumeConsumer
    from .settings import NO_ANSWER_HINT, Settings, redact_url
    from .turns import new_turn_request

    if model is not None and broker is not None:
        raise StatusError(
            Status.INVALID_ARGUMENT,
            "--model runs the embedded demo's worker on that model; with --broker the worker "
            f"is elsewhere: start it with INTERLOCK_BANKING_MODEL={model} instead",
        )
    with ExitStack() as stack:
        embedded = broker is None
        if embedded:  # the embedded worker shares `ai`; a worker elsewhere has its own
            stack.enter_context(using_model(model))
            folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="interlock-demo-"))
            store = store or f"sqlite:///{folder}/interlock.db"
            broker = "memory://localhost/"
        settings = Settings.from_env(
            broker_url=broker,
            store_url=store,
            app="examples.banking:ai",
            one_shot=not embedded,  # a client of a broker elsewhere gives up on a silent one
        )
        app = create_app(settings, ai if embedded else None)
        rt = runtime_of(app)
        stack.callback(rt.close)
        conn = stack.enter_context(rt.connection())
        if not embedded:  # as kombu connects, but one try of a broker that never answers
            conn.ensure_connection(max_retries=1, timeout=settings.server_timeout)
        events = EventStream.bind(
            conn, f"interlock.demo.{uuid.uuid4().hex[:8]}", "#", temporary=True
        )
        stack.enter_context(_deleted_at_end(events))
        if embedded:
            shown = redact_url(settings.store_url)
            _hop(f"·  embedded: broker {broker}, store {shown}, worker and resume consumer")
            stack.enter_context(_embedded_worker(app))
            consumer = ResumeConsumer(app)
            thread = threading.Thread(target=consumer.run, daemon=True)
            thread.start()

            def stop_consumer() -> None:
                consumer.should_stop = True
                thread.join(_WORKER_STOP_WAIT)  # it looks every second; idle by now

            stack.callback(stop_consumer)

        # A broker elsewhere that takes a publish and does not answer is given up on after
        # the server timeout, as by `submit` and `decide`; the in-memory one never waits.
        within = None if embedded else settings.server_timeout
        session_id = str(uuid.uuid4())
        request = new_turn_request(
            "bankingAgent",
            AgentInput(message=Message(role="user", content=[Part(text=text)])),
            session_id=session_id,
        )
        send_turn(app, request, within=within)
        _hop(f"▶  submit: {text!r} → interlock.turns (turn {request.turn_id[:8]})")
        publisher = Publisher(conn, timeout=within)
        in_session = lambda e: e.session_id == session_id  # noqa: E731
        turn_types = {"turn.interrupted", "turn.completed", "turn.failed", "turn.expired"}

        def wait(what: str, match: Callable[[Any], bool], types: set[str]) -> EventBase:
            try:
                return events.next(timeout, match, types)
            except TimeoutError:
                where = (
                    "the embedded worker and resume consumer did not answer"
                    if embedded
                    else NO_ANSWER_HINT
                )
                raise StatusError(
                    Status.DEADLINE_EXCEEDED, f"no {what} within {timeout:.0f}s: {where}"
                ) from None

        event = wait("event of the turn", in_session, turn_types)
        while isinstance(event, TurnInterrupted):
            _hop(f"◀  turn.interrupted: snapshot {event.snapshot_id}")
            entries = []
            for item in event.interrupts:
                details = item.payload.get("details") or item.payload
                _hop(f"⏸  {item.name} (ref {item.ref[:8]}) asks: {details}")
                part = Part.model_validate(
                    {
                        "toolRequest": {"name": item.name, "ref": item.ref, "input": item.input},
                        "metadata": {"interrupt": item.payload},
                    }
                )
                approved = decide(part)
                _hop(f"   human: {'approve' if approved else 'deny'}")
                entries.append(
                    RestartEntry(name=item.name, ref=item.ref, resumed={"approved": approved})
                )
            decision = Decision(
                decision_id=str(uuid.uuid4()),
                snapshot_id=event.snapshot_id or "",
                resume_token=event.resume_token or "",
                reviewer="demo@localhost",
                restart=list(entries),
            )
            publisher.publish_decision(decision)
            _hop(f"▶  decision {decision.decision_id[:8]} → interlock.decisions")
            decision_id = decision.decision_id
            outcome = wait(
                "outcome of the decision",
                lambda e, d=decision_id: getattr(e, "decision_id", None) == d,  # type: ignore[misc]
                {"decision.accepted", "decision.rejected"},
            )
            _hop(f"◀  {outcome.type}")
            if outcome.type == "decision.rejected":
                return outcome.model_dump(mode="json")
            event = wait("event of the resumed turn", in_session, turn_types)
        result = event.model_dump(mode="json")
        if event.type == "turn.completed":
            _hop(f"✔  turn.completed: {_text(result)}")
        else:
            error = result.get("error")
            said = f": {error['status']}: {error['message']}" if error else ""
            _hop(f"✘  {event.type}{said}")
        ended = {
            "type": event.type,
            "finish_reason": result.get("finish_reason"),
            "session_id": session_id,
            "snapshot_id": event.snapshot_id,
            "text": _text(result),
        }
        return {**ended, "error": result["error"]} if result.get("error") else ended


@contextlib.contextmanager
def _deleted_at_end(events: EventStream) -> Iterator[None]:
    """Delete the demo's event queue and its binding at the end. When the demo fails
    (its broker failed, and its connection with it), a queue that cannot be deleted then
    is said on stderr, and the demo's own error stands."""
    try:
        yield
    except BaseException:
        try:
            events.close(True)
        except Exception:
            if events.connection.transport.driver_type == "redis":  # RabbitMQ: auto-delete
                click.echo(
                    f"the queue {events.queue.name} was not deleted: it collects every "
                    "event until it and its binding are removed (docs/operations.md, "
                    '"The command line")',
                    err=True,
                )
        raise
    events.close(True)


def _text(result: dict[str, Any]) -> str:
    """The text of an event's message (a real model may put reasoning before it)."""
    content = (result.get("message") or {}).get("content") or []
    return "".join(p.get("text") or "" for p in content if isinstance(p, dict))


@contextlib.contextmanager
def _embedded_worker(app: Celery) -> Iterator[None]:
    """A solo-pool Celery worker in a thread of this process, as celery's
    `contrib.testing.worker.start_worker` runs one, but quick to leave: the worker looks
    for the stop request only every 2 s, and this process is about to end, so it is told
    to stop and not waited for longer than that takes when it is idle."""
    from celery.contrib.testing.worker import TestWorkController, setup_app_for_worker
    from celery.worker import state

    setup_app_for_worker(app, "WARNING", None)
    worker = TestWorkController(
        app=app,
        concurrency=1,
        hostname=f"interlock-demo-{os.getpid()}@localhost",
        pool="solo",
        loglevel="WARNING",
        logfile=None,
        ready_callback=None,
        without_heartbeat=True,
        without_mingle=True,
        without_gossip=True,
    )
    thread = threading.Thread(target=worker.start, name="interlock-demo-worker", daemon=True)
    thread.start()
    worker.ensure_started()
    try:
        yield
    finally:
        state.should_terminate = 0
        thread.join(_WORKER_STOP_WAIT)
        if not thread.is_alive():  # else it still has to see the request, and stop
            state.should_terminate = None
