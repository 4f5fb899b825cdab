"""Nothing lost, nothing twice: fault injection against real processes.

Every scenario runs `interlock worker` and `interlock resume-consumer` processes (with
`--app tests.fault_app:ai`, see tests/fault_app.py) on a private redis-server (appendonly, so it
can be restarted with its data) and a private PostgreSQL database, then breaks
something: SIGKILLs a worker's process group mid-turn, SIGKILLs the consumer with
decisions queued, restarts Redis mid-batch, sends 20 answers to one interrupt at once,
fuzzes the decisions queue, forges tokens, lets a deadline pass.

And every scenario ends by COUNTING (`account`): each submitted turn reached completed,
failed or expired, exactly once per turn id (snapshots in the store, events seen);
each decision has one outcome (repeats of it allowed, never a different one) and one
row in the decision log; no tool side effect happened twice (rows in `fault_effects`,
keyed by the tool's `ctx.idempotency_key`, against attempts in `fault_attempts`).

The services run with a short visibility timeout (VT) for every client of the broker,
so a killed worker's unacked turn comes back within seconds, and a short turn lease.
Wrong tokens and forged decisions are also covered by test_queue_bad_input.py; the
fault tests add what those do not.

kombu's own Redis transport pops a message (BRPOP) and records it as unacked with a
second command, so a message popped by a process that dies in between is gone. Ours
pops and records in one server-side step (events/redis_pop.py), so the consumer killed
here loses nothing; tests/events/test_redis_pop.py kills a reader at the worst instant.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import itertools
import json
import os
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar, cast

import psycopg
import pytest
import redis
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from kombu.connection import Connection
from kombu.messaging import Producer
from psycopg.rows import namedtuple_row

from events.publisher import Publisher
from events.stream import EventStream
from events.topology import event_queue
from schemas import MAX_DECISION_BYTES, EventBase, TurnExpired
from tests.fault_app import AGENT, Plan, conninfo, create_tables
from tests.queue_helpers import (
    Dashboard,
    Service,
    child_env,
    dead_reader,
    decision,
    report_logs_on_failure,
    run_cli,
)
from tests.services import (
    RedisServer,
    create_pg_database,
    drop_pg_database,
    eventually,
    start_redis,
)
from workers.settings import Settings

APP_SPEC = "tests.fault_app:ai"
ROOT = Path(__file__).resolve().parents[2]
VT = 4
"""INTERLOCK_VISIBILITY_TIMEOUT (seconds), shared by workers, consumers and clients."""
LEASE = 8
"""INTERLOCK_TURN_LEASE: longer than any tool here runs; a busy turn is retried after
LEASE/2, which stays within VT."""
RELAY = 0.5
"""INTERLOCK_RELAY_INTERVAL: how often the consumer expires deadlines and relays."""
READY = 60.0
HOP = 30.0
"""Seconds for one ordinary hop."""
RECOVERY = 90.0
"""Seconds for a hop that waits out a crash (visibility timeout, lease, restart)."""

TRANSPORT = Settings(broker_url="redis://", visibility_timeout=VT).transport_options
"""The broker options every client shares (`Settings.transport_options`)."""
FINAL = ("turn.completed", "turn.failed", "turn.expired")
ENDINGS = {("completed", "stop"), ("failed", "failed"), ("expired", "expired")}
"""(status, finish_reason) of a snapshot a turn ended with."""
T = TypeVar("T")


# ------------------------------------------------------------------------ the stack


class FaultStack:
    """Workers and consumers that a test may start, stop and kill, on one redis-server
    and one PostgreSQL database. `check_alive` fails only for a process that died
    without the test killing it."""

    def __init__(self, directory: Path, redis: RedisServer, store_url: str) -> None:
        self.directory = directory
        self.redis = redis
        self.broker_url = redis.url
        self.store_url = store_url
        self.workers: list[Service] = []
        self.consumers: list[Service] = []
        self.retired: set[int] = set()
        self._n = itertools.count(1)

    def env(self) -> dict[str, str]:
        path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
        return child_env(
            PYTHONPATH=path,
            INTERLOCK_VISIBILITY_TIMEOUT=str(VT),
            INTERLOCK_TURN_LEASE=str(LEASE),
            INTERLOCK_RELAY_INTERVAL=str(RELAY),
            FAULT_APP_DB_URL=self.store_url,
        )

    def _start(self, kind: str, args: list[str], marker: str) -> Service:
        common = ["--app", APP_SPEC, "--broker", self.broker_url, "--store", self.store_url]
        name = f"{kind}-{next(self._n)}"
        service = Service(
            name, [*args[:1], *common, *args[1:]], self.directory / f"{name}.log", env=self.env()
        )
        (self.workers if kind == "worker" else self.consumers).append(service)
        service.wait_for(marker, READY)
        return service

    def start_worker(self, concurrency: int = 1) -> Service:
        args = ["worker", "--concurrency", str(concurrency), "--pool", "prefork", "-l", "INFO"]
        return self._start("worker", args, " ready.")

    def start_consumer(self) -> Service:
        return self._start("consumer", ["resume-consumer"], "Connected to ")

    def kill(self, service: Service) -> None:
        """SIGKILL the process group (a prefork worker's children included)."""
        self.retired.add(id(service))
        service.kill()

    def stop(self, service: Service) -> None:
        self.retired.add(id(service))
        service.stop()

    def expected(self, services: list[Service] | None = None) -> list[Service]:
        every = services if services is not None else self.workers + self.consumers
        return [s for s in every if id(s) not in self.retired]

    @property
    def worker(self) -> Service:
        return self.expected(self.workers)[-1]

    @property
    def consumer(self) -> Service:
        return self.expected(self.consumers)[-1]

    def check_alive(self) -> None:
        for service in self.expected():
            if not service.alive:
                raise AssertionError(
                    f"{service.name} died (exit {service.proc.returncode}):\n{service.tail()}"
                )

    def logs(self, chars: int = 6000) -> str:
        return "\n".join(
            f"===== {s.name} ({'running' if s.alive else f'exit {s.proc.returncode}'}), "
            f"{s.log}\n{s.tail(chars)}"
            for s in self.workers + self.consumers
        )

    def baseline(self) -> None:
        """Redis up, and exactly one worker and one consumer running."""
        if not self.redis.ping():
            self.redis.start()
        for group, start in (
            (self.workers, self.start_worker),
            (self.consumers, self.start_consumer),
        ):
            live = self.expected(group)
            for extra in live[:-1]:
                self.stop(extra)
            if not live or not live[-1].alive:
                start()

    def close(self) -> None:
        for service in self.workers + self.consumers:
            service.stop()


@pytest.fixture(scope="module")
def fault_stack(tmp_path_factory: pytest.TempPathFactory, pg_admin: str) -> Iterator[FaultStack]:
    directory = tmp_path_factory.mktemp("faults")
    with contextlib.ExitStack() as cleanup:
        redis = start_redis(directory / "redis", appendonly=True)
        cleanup.callback(redis.stop)
        store_url = create_pg_database(pg_admin)
        cleanup.callback(drop_pg_database, pg_admin, store_url)
        create_tables(store_url)
        stack = FaultStack(directory, redis, store_url)
        cleanup.callback(stack.close)
        yield stack


# ------------------------------------------------------------------------ clients


@dataclass(frozen=True)
class Submitted:
    tag: str
    session_id: str
    turn_id: str
    plan: Plan


class Submitter:
    """Enqueues turns of `faultAgent` as a Python backend would."""

    def __init__(self, stack: FaultStack) -> None:
        from workers.app import create_app

        self.app = create_app(
            Settings(
                broker_url=stack.broker_url,
                store_url=stack.store_url,
                app=APP_SPEC,
                visibility_timeout=VT,
            )
        )
        self.turns: dict[str, Submitted] = {}

    def __call__(self, **plan: Any) -> Submitted:
        from interlock import AgentInput, Message, Part
        from interlock.journal import session_for_turn
        from workers.app import send_turn
        from workers.turns import new_turn_request

        named = plan.pop("named_session", True)
        full = Plan(tag=plan.pop("tag", None) or f"t-{uuid.uuid4().hex[:12]}", **plan)
        session_id = str(uuid.uuid4())
        request = new_turn_request(
            AGENT,
            AgentInput(message=Message(role="user", content=[Part(text=full.model_dump_json())])),
            session_id=session_id if named else None,
        )
        if not named:  # the worker names the session after the turn, on every run of it
            session_id = session_for_turn(request.turn_id)
        send_turn(self.app, request)
        turn = Submitted(full.tag, session_id, request.turn_id, full)
        self.turns[session_id] = turn
        return turn

    def text(self, text: str, session_id: str | None = None) -> str:
        """The `Dashboard.submit` interface: `text` is a JSON plan."""
        assert session_id is None
        return self(**json.loads(text)).session_id

    def close(self) -> None:
        self.app.close()


class FaultDashboard(Dashboard):
    """A dashboard that outlives a broker restart: on a connection error it connects
    again and reads on from its own queue (which Redis kept, appendonly)."""

    def __init__(self, stack: FaultStack, submit: Submitter) -> None:
        super().__init__(stack, submit.text, transport_options=TRANSPORT)
        self.submitter = submit

    def _errors(self) -> tuple[type[BaseException], ...]:
        return (OSError, *self.conn.connection_errors, *self.conn.channel_errors)

    def _pump(self, timeout: float) -> None:
        try:
            super()._pump(timeout)
        except Exception as exc:
            if not isinstance(exc, self._errors()):
                raise
            self.reconnect()

    def reconnect(self, timeout: float = 60.0) -> None:
        for release in (self.producer.release, self.conn.release):
            with contextlib.suppress(Exception):
                release()
        deadline = time.monotonic() + timeout
        while True:
            time.sleep(0.3)
            conn = Connection(self.stack.broker_url, transport_options=TRANSPORT)
            try:
                conn.ensure_connection(max_retries=1)
                self.stream = EventStream(conn, self.stream.queue)
            except Exception:
                conn.release()
                if time.monotonic() > deadline:
                    raise
                continue
            self.conn, self.producer = conn, Producer(conn)
            return

    def publish_reliably(self, body: dict[str, Any]) -> None:
        """Publish a decision, connecting again as long as the broker is away."""
        deadline = time.monotonic() + RECOVERY
        while True:
            try:
                self.publish_json(body)
                return
            except Exception as exc:
                if not isinstance(exc, self._errors()) or time.monotonic() > deadline:
                    raise
                self.reconnect()

    def unique(self, match: Callable[[EventBase], bool] = lambda e: True) -> list[EventBase]:
        """Events read so far, once each (the outbox relay may publish one twice)."""
        seen: dict[str, EventBase] = {}
        for event in self.history:
            if match(event):
                seen.setdefault(event.event_id, event)
        return list(seen.values())

    def final(self, session_id: str, timeout: float = HOP) -> EventBase:
        """The session's final turn event (completed, failed, expired)."""
        return self.wait(
            lambda e: e.session_id == session_id and e.type in FINAL,
            f"final event of session {session_id}",
            timeout,
        )

    def paused_turn(self, timeout: float = HOP, **plan: Any) -> Paused:
        turn = self.submitter(approval=True, **plan)
        return self.pause_of(turn, timeout)

    def pause_of(self, turn: Submitted, timeout: float = HOP) -> Paused:
        event = self.wait(
            lambda e: e.session_id == turn.session_id and e.type.startswith("turn."),
            f"turn.interrupted of {turn.tag}",
            timeout,
        )
        assert event.type == "turn.interrupted", event.model_dump_json()
        return Paused(turn, event)


@dataclass(frozen=True)
class Paused:
    turn: Submitted
    event: Any

    @property
    def snapshot_id(self) -> str:
        return str(self.event.snapshot_id)

    @property
    def token(self) -> str:
        return str(self.event.resume_token)

    @property
    def ref(self) -> str:
        return str(self.event.interrupts[0].ref)

    def approve(self, approved: bool = True, **kw: Any) -> dict[str, Any]:
        """A decision that restarts `charge` with {"approved": approved}."""
        return decision(
            self.snapshot_id,
            self.token,
            restart=[{"name": "charge", "ref": self.ref, "resumed": {"approved": approved}}],
            **kw,
        )


@pytest.fixture
def stack(fault_stack: FaultStack, request: pytest.FixtureRequest) -> FaultStack:
    fault_stack.baseline()
    report_logs_on_failure(fault_stack, request)
    return fault_stack


@pytest.fixture
def submit(stack: FaultStack) -> Iterator[Submitter]:
    submitter = Submitter(stack)
    try:
        yield submitter
    finally:
        submitter.close()


@pytest.fixture
def dash(stack: FaultStack, submit: Submitter) -> Iterator[FaultDashboard]:
    dashboard = FaultDashboard(stack, submit)
    try:
        yield dashboard
    finally:
        with contextlib.suppress(Exception):
            dashboard.close()
    stack.check_alive()


# ------------------------------------------------------------------------ the database


class Ledger:
    """Counts in the test's PostgreSQL database: tool attempts and effects, model calls,
    snapshots, decisions, the outbox."""

    def __init__(self, store_url: str) -> None:
        self.info = conninfo(store_url)

    def rows(self, sql: str, *params: Any) -> list[Any]:
        with psycopg.connect(self.info, autocommit=True, row_factory=namedtuple_row) as conn:
            return conn.execute(sql, params).fetchall()

    def value(self, sql: str, *params: Any) -> Any:
        return self.rows(sql, *params)[0][0]

    def attempts(self, tag: str) -> int:
        return int(self.value("SELECT count(*) FROM fault_attempts WHERE tag = %s", tag))

    def effects(self, tag: str) -> int:
        return int(self.value("SELECT count(*) FROM fault_effects WHERE tag = %s", tag))

    def model_calls(self, tag: str, step: int) -> int:
        return int(
            self.value(
                "SELECT count(*) FROM fault_model_calls WHERE tag = %s AND step = %s", tag, step
            )
        )

    def snapshots(self, session_id: str) -> list[Any]:
        return self.rows(
            "SELECT snapshot_id, parent_id, turn_id, status, finish_reason, resumed_by,"
            " expires_at FROM interlock_snapshot WHERE session_id = %s ORDER BY seq",
            session_id,
        )

    def snapshot(self, snapshot_id: str) -> Any:
        [row] = self.rows(
            "SELECT snapshot_id, turn_id, status, finish_reason, resumed_by, expires_at,"
            " resume_token_hash FROM interlock_snapshot WHERE snapshot_id = %s",
            snapshot_id,
        )
        return row

    def decisions(self, *decision_ids: str) -> list[Any]:
        return self.rows(
            "SELECT decision_id, snapshot_id, session_id, reviewer, outcome, status"
            " FROM interlock_decision WHERE decision_id = ANY(%s)",
            list(decision_ids),
        )

    def unsent(self) -> int:
        return int(self.value("SELECT count(*) FROM interlock_outbox WHERE sent_at IS NULL"))

    def wait(self, found: Callable[[], T], what: str, timeout: float = HOP) -> T:
        return eventually(found, what, timeout)


@pytest.fixture
def db(stack: FaultStack) -> Ledger:
    return Ledger(stack.store_url)


# ------------------------------------------------------------------------ counting


@dataclass
class Tally:
    """What `account` found, for a scenario's own assertions."""

    final: dict[str, Any] = field(default_factory=dict)
    """Session id -> its last snapshot row."""
    outcomes: dict[str, str] = field(default_factory=dict)
    """Decision id -> decision.accepted / decision.rejected."""


def account(
    dash: FaultDashboard,
    db: Ledger,
    turns: list[Submitted],
    decisions: Sequence[str] = (),
    *,
    timeout: float = HOP,
    reevaluated: bool = False,
) -> Tally:
    """Every submitted turn reached completed, failed or expired, once per turn id, and
    its events were seen; every decision has one outcome event (the same one published
    again, maybe; with `reevaluated`, where a consumer died before recording a decision,
    also a new event of the same outcome) and one row in the decision log; no side
    effect happened twice."""
    tally = Tally()
    for turn in turns:
        dash.final(turn.session_id, timeout)
        snaps = db.snapshots(turn.session_id)
        per_turn = Counter(s.turn_id for s in snaps)
        assert all(n == 1 for n in per_turn.values()), (turn.tag, per_turn)
        assert turn.turn_id in per_turn, (turn.tag, snaps)
        last = snaps[-1]
        kinds = {(s.status, s.finish_reason) for s in snaps}
        assert kinds <= {*ENDINGS, ("completed", "interrupted")}, (turn.tag, snaps)
        assert (last.status, last.finish_reason) in ENDINGS, (turn.tag, snaps)
        for snap in snaps:  # a pause that a turn went on from was claimed by its decision
            went_on = [c for c in snaps if c.parent_id == snap.snapshot_id and c.status != "failed"]
            assert not went_on or snap.resumed_by is not None, (turn.tag, snaps)

        def in_session(e: EventBase, s: str = turn.session_id) -> bool:
            return e.session_id == s

        seen = dash.unique(in_session)
        by_snapshot = Counter(e.snapshot_id for e in seen if e.type.startswith("turn."))
        for snap in snaps:  # each snapshot's event went out, once (unique ids)
            want = 1 if snap.status != "expired" else 2  # turn.interrupted, turn.expired
            assert by_snapshot[snap.snapshot_id] == want, (turn.tag, snap, seen)
        ended = {s.snapshot_id for s in snaps if (s.status, s.finish_reason) in ENDINGS}
        finals = [e.snapshot_id for e in seen if e.type in FINAL]
        assert sorted(cast(list[str], finals)) == sorted(ended), (turn.tag, finals, snaps)
        assert db.effects(turn.tag) <= 1, turn.tag
        tally.final[turn.session_id] = last
    for decision_id in decisions:
        events = dash.outcomes(decision_id)
        assert events, f"no outcome for decision {decision_id}"
        event_types = {e.type for e in events}
        assert len(event_types) == 1, (decision_id, events)
        if not reevaluated:
            assert len({e.event_id for e in events}) == 1, (decision_id, events)
        [row] = db.decisions(decision_id)
        assert row.outcome == next(iter(event_types)).removeprefix("decision."), (row, events)
        tally.outcomes[decision_id] = next(iter(event_types))
    return tally


def charged_key(event: Any) -> str:
    """The idempotency key a completed turn's answer names."""
    text = str(event.message.text)
    return str(json.loads(text.split(": ", 1)[1])["key"])


# ------------------------------------------------------------------------ worker crashes


@pytest.mark.slow
@pytest.mark.parametrize("moment", ["tool-running", "tool-returned", "tool-running-no-session"])
def test_worker_killed_mid_turn(
    stack: FaultStack, dash: FaultDashboard, submit: Submitter, db: Ledger, moment: str
) -> None:
    """SIGKILL the worker (main process and prefork children) while the tool runs (its
    effect done, its journal entry not written), or right after it returned (journaled)
    while the model's next step runs. A new worker finishes the turn; the journaled
    model step and tool call are not done again; the effect happened once. A turn sent
    with no session named goes on in the session its first run began (the key of a
    call depends on it)."""
    if moment.startswith("tool-running"):
        turn = submit(sleep=120, named_session=not moment.endswith("no-session"))
        # the effect, not just the attempt: the tool records them in two transactions
        db.wait(lambda: db.effects(turn.tag) == 1, "the tool's side effect")
    else:
        turn = submit(after=120)
        db.wait(lambda: db.model_calls(turn.tag, 1) == 1, "the model's answering step")
    victim = stack.worker
    stack.kill(victim)
    assert db.effects(turn.tag) == 1  # the side effect happened before the crash
    assert db.snapshots(turn.session_id) == []  # the turn had not ended

    stack.start_worker()
    done = dash.final(turn.session_id, RECOVERY)
    assert done.type == "turn.completed", done.model_dump_json()

    key = charged_key(done)
    assert db.value("SELECT key FROM fault_effects WHERE tag = %s", turn.tag) == key
    assert db.effects(turn.tag) == 1
    assert db.model_calls(turn.tag, 0) == 1  # the tool call was replayed, not asked again
    if moment.startswith("tool-running"):
        # not journaled: the tool ran again, with the same idempotency key (the call's
        # ref was replayed), so the outside system kept one effect
        assert db.attempts(turn.tag) == 2
        keys = db.rows("SELECT DISTINCT key FROM fault_attempts WHERE tag = %s", turn.tag)
        assert [k.key for k in keys] == [key]
        assert db.model_calls(turn.tag, 1) == 1
    else:
        assert db.attempts(turn.tag) == 1  # journaled: not run again
        assert db.model_calls(turn.tag, 1) == 2  # the step that was cut short ran again
    account(dash, db, [turn])


@pytest.mark.slow
def test_turn_outliving_the_visibility_timeout_runs_once(
    stack: FaultStack, dash: FaultDashboard, submit: Submitter, db: Ledger
) -> None:
    """Two workers; a tool that runs longer than the visibility timeout. Redis hands the
    unacked turn to the other worker meanwhile; the lease keeps it from running twice
    at once, and once the turn has ended the second delivery does nothing."""
    second = stack.start_worker()
    first = stack.expected(stack.workers)[0]
    runtime = VT + 3.0  # past the visibility timeout (4 s), within the lease (8 s)
    turn = submit(sleep=runtime)
    db.wait(lambda: db.attempts(turn.tag) == 1, "tool attempt")
    done = dash.final(turn.session_id, RECOVERY)
    assert done.type == "turn.completed", done.model_dump_json()

    # the second delivery came, and was turned away (busy, then already ended)
    ended = f"turn {turn.turn_id} already ended"
    deadline = time.monotonic() + RECOVERY
    while ended not in (logs := first.output() + second.output()):
        assert time.monotonic() < deadline, stack.logs()
        time.sleep(0.2)
    assert f"turn {turn.turn_id} is running elsewhere" in logs, stack.logs()

    assert db.attempts(turn.tag) == 1
    assert db.effects(turn.tag) == 1
    assert db.model_calls(turn.tag, 0) == 1
    snaps = db.snapshots(turn.session_id)
    assert [(s.turn_id, s.status, s.finish_reason) for s in snaps] == [
        (turn.turn_id, "completed", "stop")
    ]
    account(dash, db, [turn])
    stack.stop(second)


# ------------------------------------------------------------------------ consumer crash


@pytest.mark.slow
def test_consumer_killed_with_decisions_queued(
    stack: FaultStack, dash: FaultDashboard, db: Ledger
) -> None:
    """50 paused turns, 50 decisions queued while the consumer is down; the consumer is
    SIGKILLed after about 10 of them and started again. All 50 are decided once and
    resume once; each side effect happens once.

    The decisions the consumer had taken at the kill (the one being processed, and any
    popped off the queue a moment before) are recorded as unacked in the same step as
    the pop (events/redis_pop.py): Redis hands them out again after the visibility
    timeout. No decision is sent twice by the dashboard."""
    stack.stop(stack.consumer)
    turns = [dash.submitter(approval=True) for _ in range(50)]
    paused = [dash.pause_of(t) for t in turns]
    bodies = [p.approve(reviewer=f"r{i}@example.com") for i, p in enumerate(paused)]
    for body in bodies:
        dash.publish_json(body)

    victim = stack.start_consumer()
    dash.wait_until(
        lambda: len(dash.unique(lambda e: e.type == "decision.accepted")) >= 10 or None,
        "10 decision.accepted",
    )
    stack.kill(victim)
    before = len(dash.unique(lambda e: e.type == "decision.accepted"))
    assert before < 50, "the consumer finished before it was killed: nothing was tested"
    stack.start_consumer()

    ids = [b["decision_id"] for b in bodies]
    deadline = time.monotonic() + RECOVERY
    while missing := [b for b in bodies if not dash.outcomes(b["decision_id"])]:
        assert time.monotonic() < deadline, f"no outcome for {len(missing)} decisions"
        dash._pump(0.5)
    tally = account(dash, db, [p.turn for p in paused], ids, timeout=RECOVERY, reevaluated=True)
    assert set(tally.outcomes.values()) == {"decision.accepted"}
    accepted = dash.unique(lambda e: e.type == "decision.accepted")
    assert len({e.model_dump()["decision_id"] for e in accepted}) == 50
    for p, body in zip(paused, bodies, strict=True):
        assert db.snapshot(p.snapshot_id).resumed_by == body["decision_id"]
        assert tally.final[p.turn.session_id].status == "completed"
        assert db.attempts(p.turn.tag) == 1
        assert db.effects(p.turn.tag) == 1
    assert len(db.decisions(*ids)) == 50


# ------------------------------------------------------------------------ Redis restart


@pytest.mark.slow
def test_redis_restarted_mid_batch(
    stack: FaultStack, dash: FaultDashboard, submit: Submitter, db: Ledger
) -> None:
    """20 turns pause; 5 are approved, and while the first of them is inside its answering
    step (4 resumed turns queued behind it) Redis is killed, and started again 3 s later
    on the same port with its appendonly data. The turn that ends while Redis is away
    publishes once it is back; the worker, the consumer and the dashboard reconnect; the
    other 15 are approved afterwards. Every turn completes once; the outbox is empty.

    Redis is killed when no message is being delivered, so the test shows reconnecting,
    not the pop: reads pop and record a message as unacked in one script
    (events/redis_pop.py), which the server's append-only file (fsynced at every write
    here) keeps whole or not at all."""
    slow = submit(approval=True, after=2.0)
    rest = [submit(approval=True, after=0.2) for _ in range(19)]
    turns = [slow, *rest]
    paused = {t.session_id: dash.pause_of(t) for t in turns}
    answered: dict[str, str] = {}

    def answer(turn: Submitted) -> None:
        body = paused[turn.session_id].approve()
        answered[turn.session_id] = body["decision_id"]
        dash.publish_reliably(body)

    answer(slow)
    db.wait(lambda: db.model_calls(slow.tag, 1) == 1, "the slow turn's answering step")
    for turn in rest[:4]:
        answer(turn)
    dash.wait_until(lambda: all(dash.outcomes(i) for i in answered.values()) or None, "5 outcomes")
    assert not dash.events(lambda e: e.type in FINAL and e.session_id in paused)

    stack.redis.kill()  # the worker is inside the slow step; nothing is being delivered
    time.sleep(3.0)  # the slow turn ends meanwhile: its event cannot go out yet
    stack.redis.start()
    assert db.snapshots(slow.session_id)[-1].finish_reason == "stop"
    for turn in rest[4:]:
        answer(turn)

    dash.wait_until(
        lambda: (
            len(dash.unique(lambda e: e.type in FINAL and e.session_id in paused)) == 20 or None
        ),
        "all 20 turns ended",
        RECOVERY,
    )
    tally = account(dash, db, turns, list(answered.values()), timeout=RECOVERY)
    assert set(tally.outcomes.values()) == {"decision.accepted"}
    for turn in turns:
        assert tally.final[turn.session_id].status == "completed"
        assert db.attempts(turn.tag) == 1
        assert db.effects(turn.tag) == 1
    db.wait(lambda: db.unsent() == 0, "an empty outbox", RECOVERY)


@pytest.mark.slow
def test_redis_out_of_memory_holds_the_services_until_it_has_room(
    stack: FaultStack, dash: FaultDashboard, submit: Submitter, db: Ledger
) -> None:
    """Redis at its `maxmemory` (with the default `noeviction`) refuses every command that
    may add data, the worker's and the consumer's reads among them. Neither process
    stops: each logs the refusal and tries again, as for a broker that went away, and
    once Redis has room the paused turns are answered and complete, once each."""
    turns = [submit(approval=True) for _ in range(3)]
    paused = {t.session_id: dash.pause_of(t) for t in turns}
    worker, consumer = stack.worker, stack.consumer
    said = {s.name: len(s.output()) for s in (worker, consumer)}
    client = redis.Redis(host="127.0.0.1", port=stack.redis.port)
    try:
        client.config_set("maxmemory", 1)  # below what Redis uses already: full
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            client.lpush("test:probe", "x")

        def refused(service: Service) -> bool:
            return "OutOfMemoryError" in service.output()[said[service.name] :]

        for service in (worker, consumer):  # each waits on its queue a second at a time
            eventually(functools.partial(refused, service), f"{service.name} refused", HOP)
        time.sleep(3.0)  # refused again and again meanwhile: still there
        stack.check_alive()
        told = consumer.output()[said[consumer.name] :]  # a line a refusal, no traceback
        assert "connection to the broker lost (OutOfMemoryError: " in told, told[-3000:]
        assert "Traceback" not in told, told[-3000:]
    finally:
        client.config_set("maxmemory", 0)
        client.close()
    decisions = []
    for turn in turns:
        body = paused[turn.session_id].approve()
        decisions.append(body["decision_id"])
        dash.publish_reliably(body)
    tally = account(dash, db, turns, decisions, timeout=RECOVERY)
    assert set(tally.outcomes.values()) == {"decision.accepted"}
    for turn in turns:
        assert tally.final[turn.session_id].status == "completed"
        assert db.effects(turn.tag) == 1
    stack.check_alive()


def test_events_published_across_a_reconnect_reach_pattern_queues(tmp_path: Path) -> None:
    """A publisher whose broker went away reconnects (kombu gives it a new transport)
    and must declare the topic exchange again: on Redis its type lives in the client,
    and undeclared it routes as a direct exchange, so `#` and `turn.*` queues would get
    nothing. (Found by the restart test: every event a worker published while Redis was
    away, and after, was lost for pattern subscribers.)"""
    redis = start_redis(tmp_path / "redis", appendonly=True)
    try:
        reader = Connection(redis.url, transport_options=TRANSPORT)
        streams = {
            p: EventStream(reader, event_queue(f"t.{p}.{uuid.uuid4()}", p)) for p in ("#", "turn.*")
        }
        queues = {p: stream.queue for p, stream in streams.items()}
        publisher = Publisher(Connection(redis.url, transport_options=TRANSPORT))
        publisher.publish_event(TurnExpired(session_id="before"))
        redis.kill()
        threading.Timer(1.5, redis.start).start()
        publisher.publish_event(TurnExpired(session_id="while-away"))  # retried until back
        publisher.publish_event(TurnExpired(session_id="after"))
        with contextlib.suppress(Exception):
            reader.release()
        reader = Connection(redis.url, transport_options=TRANSPORT)
        for pattern, queue in queues.items():
            stream = EventStream(reader, queue)
            got = [stream.next(HOP).session_id for _ in range(3)]
            assert got == ["before", "while-away", "after"], (pattern, got)
        reader.release()
        publisher.close()
        publisher.connection.release()
    finally:
        redis.stop()


# ------------------------------------------------------------------------ reviewers' race


def test_twenty_reviewers_race_for_one_interrupt(
    stack: FaultStack, dash: FaultDashboard, db: Ledger
) -> None:
    """20 decisions (distinct ids) for the same interrupt, published at once from 20
    threads to two consumers: one accepted, 19 FAILED_PRECONDITION, one effect. The
    audit trail shows all 20 with reviewer and status."""
    stack.start_consumer()  # two consumers: the claim is really contended
    paused = dash.paused_turn()
    bodies = [paused.approve(reviewer=f"reviewer{i}@example.com") for i in range(20)]
    gate = threading.Barrier(len(bodies))
    errors: list[BaseException] = []

    def publish(body: dict[str, Any]) -> None:
        try:
            with Connection(stack.broker_url, transport_options=TRANSPORT) as conn:
                producer = Producer(conn)
                payload = json.dumps(body).encode()
                gate.wait(timeout=30)
                producer.publish(
                    payload,
                    exchange="interlock.decisions",
                    routing_key="interlock.decisions",
                    content_type="application/json",
                    content_encoding="utf-8",
                    delivery_mode=2,
                )
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=publish, args=(b,)) for b in bodies]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors

    ids = [b["decision_id"] for b in bodies]
    dash.wait_until(lambda: all(dash.outcomes(i) for i in ids) or None, "20 outcomes")
    tally = account(dash, db, [paused.turn], ids)
    kinds = Counter(tally.outcomes.values())
    assert kinds == {"decision.accepted": 1, "decision.rejected": 19}, kinds
    [winner] = [i for i in ids if tally.outcomes[i] == "decision.accepted"]
    for i in ids:
        if i != winner:
            wire = dash.outcomes(i)[0].model_dump(mode="json")
            assert wire["error"]["status"] == "FAILED_PRECONDITION", wire
    assert db.snapshot(paused.snapshot_id).resumed_by == winner
    assert db.attempts(paused.turn.tag) == 1
    assert db.effects(paused.turn.tag) == 1

    # the audit trail: the interrupt, the 20 decisions, the answer
    result = run_cli("audit", paused.turn.session_id, "--store", stack.store_url)
    assert result.returncode == 0, result.describe()
    lines = result.json_lines()
    kinds_seen = [line["kind"] for line in lines]
    assert kinds_seen.count("interrupted") == 1 and kinds_seen.count("completed") == 1, lines
    [interrupted] = [line for line in lines if line["kind"] == "interrupted"]
    assert interrupted["snapshot_id"] == paused.snapshot_id
    assert interrupted["interrupts"][0]["name"] == "charge"
    assert interrupted["resumed_by"] == winner
    decided = [line for line in lines if line["kind"] == "decision"]
    assert sorted(d["decision_id"] for d in decided) == sorted(ids)
    assert {d["reviewer"] for d in decided} == {b["reviewer"] for b in bodies}
    assert Counter((d["outcome"], d["status"]) for d in decided) == {
        ("accepted", "OK"): 1,
        ("rejected", "FAILED_PRECONDITION"): 19,
    }
    assert all(d["restart"][0]["ref"] == paused.ref for d in decided)
    stack.stop(stack.consumer)


# ------------------------------------------------------------------------ forged decisions


def test_forged_decisions_are_permission_denied(
    stack: FaultStack, dash: FaultDashboard, db: Ledger
) -> None:
    """What test_queue_bad_input.py does not try: the stored hash used as the token,
    near misses of the real token, a token of a snapshot already resumed. None resumes
    anything; the real answers still work afterwards."""
    mine = dash.paused_turn()
    other = dash.paused_turn()
    stored_hash = db.snapshot(mine.snapshot_id).resume_token_hash
    assert stored_hash == hashlib.sha256(mine.token.encode()).hexdigest()
    near = [
        stored_hash,
        mine.token + " ",
        " " + mine.token,
        mine.token[:-1],
        mine.token + "A",
        mine.token.swapcase(),
        mine.token.encode().hex(),
        other.token,
    ]
    forged = []
    for token in near:
        body = mine.approve()
        body["resume_token"] = token
        forged.append(body)
    crossed = other.approve()  # another snapshot's id with my token
    crossed["resume_token"] = mine.token
    forged.append(crossed)
    for body in forged:
        dash.publish_json(body)
    for body in forged:
        event = dash.outcome(body["decision_id"])
        assert event.type == "decision.rejected", event.model_dump_json()
        assert event.error.status == "PERMISSION_DENIED", event.model_dump_json()  # type: ignore[attr-defined]
    for p in (mine, other):
        assert db.snapshot(p.snapshot_id).resumed_by is None
        assert db.attempts(p.turn.tag) == 0

    # the real answers go through; then a resumed snapshot's token opens nothing
    real = [mine.approve(), other.approve()]
    for body in real:
        dash.publish_json(body)
    replay = mine.approve()  # right token, a new id: the snapshot is no longer waiting
    dash.publish_json(replay)
    outcome = dash.outcome(replay["decision_id"])
    assert outcome.error.status == "FAILED_PRECONDITION", outcome.model_dump_json()  # type: ignore[attr-defined]
    ids = [b["decision_id"] for b in [*forged, *real, replay]]
    tally = account(dash, db, [mine.turn, other.turn], ids)
    assert [tally.outcomes[b["decision_id"]] for b in real] == ["decision.accepted"] * 2
    for p in (mine, other):
        assert db.effects(p.turn.tag) == 1


# ------------------------------------------------------------------------ deadlines


def test_deadline_expires_the_turn_end_to_end(
    stack: FaultStack, dash: FaultDashboard, db: Ledger
) -> None:
    """An interrupt with expires_in=2 s: the consumer's sweeper marks it expired and
    turn.expired goes out; a decision sent afterwards is FAILED_PRECONDITION."""
    paused = dash.paused_turn(expires_in=2)
    event = paused.event
    assert event.expires_at is not None
    assert abs((event.expires_at - event.occurred_at) - timedelta(seconds=2)) < timedelta(seconds=1)
    expired = dash.wait(
        lambda e: e.type == "turn.expired" and e.session_id == paused.turn.session_id,
        "turn.expired",
    )
    assert expired.snapshot_id == paused.snapshot_id
    assert expired.turn_id == paused.turn.turn_id
    assert db.snapshot(paused.snapshot_id).status == "expired"

    late = paused.approve(reviewer="late@example.com")
    dash.publish_json(late)
    outcome = dash.outcome(late["decision_id"])
    assert outcome.type == "decision.rejected", outcome.model_dump_json()
    assert outcome.error.status == "FAILED_PRECONDITION", outcome.model_dump_json()  # type: ignore[attr-defined]
    assert "expired" in outcome.error.message  # type: ignore[attr-defined]
    tally = account(dash, db, [paused.turn], [late["decision_id"]])
    assert tally.final[paused.turn.session_id].status == "expired"
    assert db.attempts(paused.turn.tag) == 0
    assert db.effects(paused.turn.tag) == 0

    result = run_cli("audit", paused.turn.session_id, "--store", stack.store_url)
    assert result.returncode == 0, result.describe()
    lines = result.json_lines()
    assert [line["kind"] for line in lines] == ["interrupted", "expired", "decision"], lines
    assert lines[0]["interrupts"] and lines[0]["expires_at"] == lines[1]["at"], lines
    assert lines[2]["reviewer"] == "late@example.com"
    assert (lines[2]["outcome"], lines[2]["status"]) == ("rejected", "FAILED_PRECONDITION")


# ------------------------------------------------------------------------ fuzzing


JSON_LEAF = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=40),
)
NASTY_TEXT = st.one_of(
    st.text(max_size=60),
    st.text(st.characters(codec="utf-8"), min_size=1, max_size=30),
    st.sampled_from(["", " ", "\x00", "a\x00b", "\ud800", "x\udfff", "\u202e", "🂡" * 30]),
    st.integers(min_value=0, max_value=600).map(lambda n: "x" * n),
)
JSON_JUNK = st.recursive(
    st.one_of(JSON_LEAF, NASTY_TEXT),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=12,
)
CONTENT_TYPES = [
    "application/json",
    "application/json; charset=utf-8",
    "text/plain",
    "application/octet-stream",  # ("" cannot be sent: kombu makes it application/data)
    "application/xml",
    "application/x-python-serialize",
    "application/x-msgpack",
    "image/png",
    "text/json; charset=latin-1",
]
SIZES = [
    MAX_DECISION_BYTES - 1,
    MAX_DECISION_BYTES,
    MAX_DECISION_BYTES + 1,
    3 * MAX_DECISION_BYTES // 2,
]


@dataclass
class Fuzzed:
    body: bytes
    content_type: str
    data: Any = None
    """The JSON value sent, when it was JSON."""

    def __repr__(self) -> str:
        return f"Fuzzed({self.content_type!r}, {len(self.body)} bytes: {self.body[:300]!r})"


@st.composite
def hostile(draw: st.DrawFn, targets: list[Paused]) -> Fuzzed:
    """A decision for one of `targets`, mutated; or junk."""
    kind = draw(st.sampled_from(["mutated"] * 6 + ["junk", "bytes", "sized"]))
    if kind == "bytes":
        return Fuzzed(draw(st.binary(max_size=300)), draw(st.sampled_from(CONTENT_TYPES)))
    if kind == "junk":
        data = draw(JSON_JUNK)
        return Fuzzed(json.dumps(data).encode(), "application/json", data)

    target = draw(st.sampled_from(targets))
    body: dict[str, Any] = target.approve(
        approved=draw(st.booleans()), decision_id=f"fuzz-{uuid.uuid4()}"
    )
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        what = draw(
            st.sampled_from(
                [
                    "decision_id",
                    "snapshot_id",
                    "resume_token",
                    "reviewer",
                    "restart",
                    "respond",
                    "schema_version",
                    "extra",
                    "drop",
                ]
            )
        )
        if what == "decision_id":
            body["decision_id"] = draw(
                st.one_of(
                    JSON_LEAF.filter(lambda v: not isinstance(v, str)),
                    st.just(""),
                    st.just("x" * 201),
                    NASTY_TEXT.map(lambda t: f"fuzz-{uuid.uuid4()}-{t}"),
                )
            )
        elif what == "snapshot_id":
            other = draw(st.sampled_from(targets))
            body["snapshot_id"] = draw(st.one_of(st.just(other.snapshot_id), NASTY_TEXT, JSON_LEAF))
        elif what == "resume_token":
            other = draw(st.sampled_from(targets))
            body["resume_token"] = draw(
                st.one_of(st.just(other.token), NASTY_TEXT, JSON_LEAF, st.just(target.token))
            )
        elif what == "reviewer":
            body["reviewer"] = draw(st.one_of(NASTY_TEXT, JSON_JUNK))
        elif what in ("restart", "respond"):
            entry = {
                "name": draw(st.one_of(st.just("charge"), NASTY_TEXT)),
                "ref": draw(st.one_of(st.just(target.ref), NASTY_TEXT, JSON_LEAF)),
                "resumed" if what == "restart" else "output": draw(JSON_JUNK),
            }
            body[what] = draw(st.one_of(JSON_JUNK, st.just([entry]), st.just([entry, entry])))
        elif what == "schema_version":
            body["schema_version"] = draw(
                st.one_of(st.sampled_from([0, 2, "1", 1.0, True, None, [1]]), JSON_LEAF)
            )
        elif what == "extra":
            body[draw(st.text(max_size=12))] = draw(JSON_JUNK)
        else:
            body.pop(draw(st.sampled_from(sorted(body))), None)

    ascii_only = draw(st.booleans())

    def encode(value: dict[str, Any]) -> bytes:
        text = json.dumps(value, ensure_ascii=ascii_only)
        return text.encode("utf-8", errors="surrogatepass")  # a lone surrogate: bad UTF-8

    if kind == "sized":  # pad an extra field to an exact size around the 1 MiB limit
        size = draw(st.sampled_from(SIZES))
        body["padding"] = ""
        body["padding"] = "p" * max(0, size - len(encode(body)))
    content_type = draw(st.sampled_from(["application/json"] * 4 + CONTENT_TYPES))
    return Fuzzed(encode(body), content_type, body)


def readable_id(message: Fuzzed) -> str | None:
    """The decision id an outcome must carry (docs/queues.md, the first check): the
    message's own when it is JSON (up to 8 MiB, past the 1 MiB limit too) and names a
    usable id (whatever its content type), else null. Bytes that are no UTF-8 elsewhere
    in it do not hide the id (the consumer then scans the text for it); one in the id
    itself makes it no id the sender sent: null (read as a lone surrogate, as the
    consumer reads it)."""
    if len(message.body) > 8 * MAX_DECISION_BYTES:
        return None
    try:
        data = json.loads(message.body.decode("utf-8", errors="surrogateescape"))
    except (ValueError, RecursionError):
        return None
    found = data.get("decision_id") if isinstance(data, dict) else None
    if isinstance(found, str) and 0 < len(found) <= 200 and "\x00" not in found:
        try:
            return found if found.encode("utf-8") else None
        except UnicodeEncodeError:  # a lone surrogate: not text
            return None
    return None


def test_text_no_database_can_keep_is_refused_before_the_claim(
    stack: FaultStack, dash: FaultDashboard, db: Ledger
) -> None:
    """A lone surrogate, escaped in valid JSON ("\\ud800"), is no text: PostgreSQL and
    JSON encoders refuse it. In a decision it is INVALID_ARGUMENT and dead-lettered, like
    NUL. (Found by fuzzing: in a respond output it was accepted, claimed, and the resumed
    turn then died saving its snapshot: no turn event, the decision "accepted" for
    nothing.)"""
    paused = dash.paused_turn()
    output = paused.approve()
    del output["restart"]
    output["respond"] = [{"name": "charge", "ref": paused.ref, "output": {"note": "a\ud800"}}]
    resumed = paused.approve()
    resumed["restart"][0]["resumed"]["why"] = "\udfff"
    bad_id = paused.approve(decision_id=f"fuzz-{uuid.uuid4()}-\ud800")
    dead = dead_reader(stack.broker_url)
    try:
        for body in (output, resumed, bad_id):
            dash.publish_json(body, headers={"x-fuzz-nonce": str(body["decision_id"])})
        for body in (output, resumed):
            event = dash.outcome(body["decision_id"])
            wire = event.model_dump(mode="json")
            assert wire["error"]["status"] == "INVALID_ARGUMENT", wire
            assert "lone surrogate" in wire["error"]["message"], wire
        dash.consumer_barrier()
        [nameless] = dash.outcomes(None)
        assert "lone surrogate" in nameless.model_dump()["error"]["message"]
        for body in (output, resumed, bad_id):

            def tagged(m: dict[str, Any], n: str = str(body["decision_id"])) -> bool:
                return bool(m["headers"].get("x-fuzz-nonce") == n)

            dead.wait(tagged, "a dead letter")
    finally:
        dead.close()
    assert db.snapshot(paused.snapshot_id).resumed_by is None
    good = paused.approve()
    dash.publish_json(good)
    ids = [output["decision_id"], resumed["decision_id"], good["decision_id"]]
    tally = account(dash, db, [paused.turn], ids)
    assert tally.outcomes[good["decision_id"]] == "decision.accepted"
    assert db.effects(paused.turn.tag) == 1


@pytest.mark.slow
def test_fuzzing_the_decisions_queue(stack: FaultStack, dash: FaultDashboard, db: Ledger) -> None:
    """Random and mutated decisions, one at a time, each followed by a sentinel: each
    message gets exactly one outcome before the sentinel's (or is dead-lettered and
    rejected), the consumer never dies, and a decision resumes only the snapshot whose
    token it carries. At the end the consumer still answers a valid decision."""
    targets = [dash.paused_turn() for _ in range(3)]
    bystander = dash.paused_turn()  # never targeted
    tokens = {t.snapshot_id: t.token for t in targets}
    accepted: dict[str, list[str]] = {}  # snapshot id -> the decisions that resumed it
    dead = dead_reader(stack.broker_url)
    sent: list[tuple[str, Fuzzed, EventBase]] = []

    @settings(
        max_examples=60,
        deadline=None,
        database=None,
        suppress_health_check=[
            HealthCheck.function_scoped_fixture,
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
        ],
    )
    @given(message=hostile(targets))
    @example(  # a byte that is no UTF-8 beside a readable decision_id: the id is named
        message=Fuzzed(
            b'{"schema_version": 1, "decision_id": "fuzz-no-utf8", "snapshot_id": '
            b'"\xed\xa0\x80", "reviewer": "reviewer@example.com", "restart": []}',
            "application/json",
        )
    )
    @example(  # a byte that is no UTF-8 in the decision_id itself: null
        message=Fuzzed(
            b'{"schema_version": 1, "decision_id": "fuzz-\xed\xa0\x80", "snapshot_id": '
            b'"s", "reviewer": "reviewer@example.com", "restart": []}',
            "application/json",
        )
    )
    def one_message(message: Fuzzed) -> None:
        nonce = str(uuid.uuid4())
        dash.producer.publish(
            message.body,
            exchange="interlock.decisions",
            routing_key="interlock.decisions",
            content_type=message.content_type,
            content_encoding="binary",
            headers={"x-fuzz-nonce": nonce},
            delivery_mode=2,
        )
        start = len(dash.history)
        sentinel = decision(f"sentinel-{uuid.uuid4()}", "x", restart=[])
        dash.publish_json(sentinel)
        end_event = dash.outcome(sentinel["decision_id"])
        end = next(i for i, e in enumerate(dash.history) if e is end_event)
        got = [
            e
            for e in dash.history[start:end]
            if e.type.startswith("decision.")
            and not str(getattr(e, "decision_id", "") or "").startswith("sentinel-")
        ]
        assert len(got) == 1, (message, got)
        [event] = got
        sent.append((nonce, message, event))
        wire = event.model_dump(mode="json")
        assert wire["decision_id"] == readable_id(message), (message, wire)
        if event.type == "decision.accepted":
            # only with the token of the snapshot it names; once per snapshot, unless
            # the resume it started failed (which releases the pause)
            data = message.data
            assert isinstance(data, dict), message
            assert tokens.get(data["snapshot_id"]) == data["resume_token"], (message, wire)
            assert event.snapshot_id == data["snapshot_id"]
            earlier = accepted.setdefault(str(event.snapshot_id), [])
            if earlier:
                session = str(event.session_id)
                assert any(s.status == "failed" for s in db.snapshots(session)), (earlier, wire)
            earlier.append(wire["decision_id"])
        else:
            assert wire["error"]["status"] in {
                "INVALID_ARGUMENT",
                "NOT_FOUND",
                "PERMISSION_DENIED",
                "FAILED_PRECONDITION",
                "INTERNAL",
            }, wire
        stack.check_alive()

    try:
        one_message()
        # every message rejected as unreadable was kept on the dead-letter queue
        unreadable = {
            nonce
            for nonce, _, event in sent
            if event.type == "decision.rejected"
            and event.model_dump(mode="json")["error"]["status"] in {"INVALID_ARGUMENT", "INTERNAL"}
            and event.snapshot_id is None
        }
        for nonce in unreadable:

            def tagged(m: dict[str, Any], n: str = nonce) -> bool:
                return bool(m.get("headers", {}).get("x-fuzz-nonce") == n)

            dead.wait(tagged, "a dead letter")
        lettered = {m[0].get("headers", {}).get("x-fuzz-nonce") for m in dead.seen}
        for nonce, message, event in sent:
            if nonce in lettered:
                assert event.type == "decision.rejected", (message, event)
    finally:
        dead.close()

    # still serving: a valid decision for the untouched bystander goes through
    assert stack.consumer.alive
    body = bystander.approve()
    dash.publish_json(body)
    assert dash.outcome(body["decision_id"]).type == "decision.accepted"

    # only the snapshots a valid decision named were resumed, by that decision
    finished = [t.turn for t in targets if t.snapshot_id in accepted] + [bystander.turn]
    ids = [body["decision_id"], *itertools.chain(*accepted.values())]
    tally = account(dash, db, finished, ids)
    assert db.snapshot(bystander.snapshot_id).resumed_by == body["decision_id"]
    for target in targets:
        resumed_by = db.snapshot(target.snapshot_id).resumed_by
        if target.snapshot_id not in accepted:
            assert resumed_by is None, target
        elif tally.final[target.turn.session_id].status == "failed":
            assert resumed_by is None, target  # a failed resume released its pause
        else:
            assert resumed_by == accepted[target.snapshot_id][-1], (target, accepted)
    for target in targets:
        assert db.effects(target.turn.tag) <= 1
        if target.snapshot_id not in accepted:
            assert db.attempts(target.turn.tag) == 0
