"""The resume consumer's accepting path, in process, on real stores (SQLite and
PostgreSQL) and a real Redis: the claim and the `decision.accepted` record commit in one
transaction; `decision.accepted` is published after that commit and the resume enqueued
after it (so no queue gets an event of the resumed turn before it), and a decision seen
again whose outcome was `accepted` has its outcome republished and its resume enqueued
again (the same turn). So a crash or a failing broker between the commit and the
enqueue loses nothing: the decision is not acked, comes back, and its turn is enqueued
then.

Every test drives `ResumeConsumer.handle` (or `on_message`, with a message read from the
real decisions queue), then reads what is really there: the rows in the database, the
tasks in `interlock.turns`, the outcome events on a queue bound to `decision.#`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from kombu.connection import Connection
from sqlalchemy import event as sqla_event
from sqlalchemy import text
from sqlalchemy.engine import Connection as DbConnection
from sqlalchemy.engine import Row
from sqlalchemy.exc import OperationalError

from events.decision_log import DecisionLog
from events.topology import DECISIONS, DECISIONS_DEAD, TURNS_QUEUE, event_queue
from examples.banking import ai
from schemas import EventBase, event_adapter
from tests.services import free_port
from workers.app import RUN_TURN, create_app, runtime_of
from workers.consumer import ResumeConsumer
from workers.settings import Settings

AGENT = "bankingAgent"
TIMEOUT = 30.0


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    url: str = request.getfixturevalue("pg_url")
    return url


class Rig:
    """Consumers on one store and one broker, interrupted turns to decide, and what the
    consumers left behind: tasks in `interlock.turns`, outcome events, database rows."""

    def __init__(self, broker_url: str, store_url: str) -> None:
        self.settings = Settings(broker_url=broker_url, store_url=store_url)
        self.consumers: list[ResumeConsumer] = []
        self.conn = Connection(broker_url)
        self.turns = self.conn.SimpleQueue(TURNS_QUEUE)
        self.decisions = self.conn.SimpleQueue(DECISIONS)
        self.dead = self.conn.SimpleQueue(DECISIONS_DEAD)
        self.turns.clear()
        self.decisions.clear()
        self.dead.clear()
        pattern = event_queue(f"test.outcomes.{uuid.uuid4()}", "decision.#")
        self.outcomes = self.conn.SimpleQueue(pattern)
        self.rt = runtime_of(self.consumer().app)

    def consumer(self, cls: type[ResumeConsumer] = ResumeConsumer) -> ResumeConsumer:
        consumer = cls(create_app(self.settings, ai))
        self.consumers.append(consumer)
        return consumer

    def paused(self, amount: int) -> dict[str, Any]:
        """A new interrupted turn; returns a decision approving it, as a dashboard sends."""
        out = self.rt.agent(AGENT).run_text(f"Transfer ${amount} to savings")
        [event] = [
            json.loads(body)
            for _, key, body in self.rt.outbox.unsent()
            if key == "turn.interrupted" and json.loads(body)["snapshot_id"] == out.snapshot_id
        ]
        return {
            "schema_version": 1,
            "decision_id": str(uuid.uuid4()),
            "snapshot_id": out.snapshot_id,
            "resume_token": event["resume_token"],
            "reviewer": "alice@example.com",
            "restart": [
                {"name": i["name"], "ref": i["ref"], "resumed": {"approved": True}}
                for i in event["interrupts"]
            ],
        }

    def enqueued(self) -> list[dict[str, Any]]:
        """The `run_turn` requests sent since the last call (taken off the queue)."""
        requests = []
        for message in _drain(self.turns):
            assert message.headers["task"] == RUN_TURN
            args, _kwargs, _embed = message.decode()
            requests.append(args[0])
        return requests

    def published(self) -> list[EventBase]:
        """The outcome events published since the last call."""
        return [event_adapter.validate_json(m.body) for m in _drain(self.outcomes)]

    def dead_letters(self) -> list[dict[str, Any]]:
        """The dead letters kept since the last call (their JSON)."""
        return [json.loads(m.body) for m in _drain(self.dead)]

    def claimed_by(self, snapshot_id: str) -> str | None:
        snapshot = self.rt.store.get_snapshot(snapshot_id)
        assert snapshot is not None
        return snapshot.resumed_by

    def rows(self, decision_id: str) -> Sequence[Row[Any]]:
        with self.rt.store.engine.connect() as conn:
            return conn.execute(
                text("SELECT outcome, event_body FROM interlock_decision WHERE decision_id = :d"),
                {"d": decision_id},
            ).all()

    def close(self) -> None:
        self.outcomes.consumer.queues[0].delete()
        for simple in (self.outcomes, self.turns, self.decisions, self.dead):
            simple.close()
        self.conn.release()
        for consumer in self.consumers:
            consumer.rt.close()
            consumer.connection.release()


def _drain(simple: Any) -> list[Any]:
    messages: list[Any] = []
    while True:
        try:
            message = simple.get_nowait()
        except simple.Empty:
            return messages
        message.ack()
        messages.append(message)


@pytest.fixture
def rig(redis_url: str, store_url: str) -> Iterator[Rig]:
    with contextlib.closing(Rig(redis_url, store_url)) as made:
        yield made


def raw(body: dict[str, Any]) -> bytes:
    return json.dumps(body).encode()


# ------------------------------------------------------------------ one transaction


class _DatabaseFailsAfterTheClaim(DecisionLog):
    """A decision log whose database fails on the record written in a caller's
    transaction, after checking that the claim was made in that same transaction."""

    def record(self, **kw: Any) -> Any:
        conn: DbConnection | None = kw.get("conn")
        if conn is None:
            return super().record(**kw)
        claim = text("SELECT resumed_by FROM interlock_snapshot WHERE snapshot_id = :s")
        assert conn.execute(claim, {"s": kw["event"].snapshot_id}).scalar() == kw["decision_id"]
        raise OperationalError("INSERT INTO interlock_decision", {}, OSError("disk I/O error"))


def test_claim_and_accepted_record_commit_together(rig: Rig) -> None:
    """A failure between the claim and the record leaves neither: the snapshot is not
    claimed, nothing is recorded, enqueued or published. The decision, delivered again,
    is then accepted as if for the first time."""
    body = rig.paused(5)
    broken = rig.consumer()
    broken.rt.__dict__["decisions"] = _DatabaseFailsAfterTheClaim(broken.rt.store)
    with pytest.raises(OperationalError, match="disk I/O error"):
        broken.handle(raw(body), "application/json", {})
    assert rig.claimed_by(body["snapshot_id"]) is None
    assert rig.rows(body["decision_id"]) == []
    assert rig.enqueued() == []
    assert rig.published() == []

    event = rig.consumer().handle(raw(body), "application/json", {})
    assert event.type == "decision.accepted", event.model_dump_json()
    assert rig.claimed_by(body["snapshot_id"]) == body["decision_id"]
    assert [row.outcome for row in rig.rows(body["decision_id"])] == ["accepted"]
    [request] = rig.enqueued()
    assert request["claimed_by"] == request["decision_id"] == body["decision_id"]
    assert [e.model_dump() for e in rig.published()] == [event.model_dump()]


def test_enqueued_resume_shows_its_ids_not_its_input(rig: Rig) -> None:
    """Celery puts a task's `argsrepr` in its headers, for worker logs and monitoring
    tools. The resume's names the turn, agent and snapshot, and carries none of the
    reviewer's answer (the arguments themselves still do)."""
    body = rig.paused(6)
    body["restart"][0]["resumed"] = {"approved": True, "note": "secret-reviewer-note"}
    rig.consumer().handle(raw(body), "application/json", {})
    [message] = _drain(rig.turns)
    [request], _kwargs, _embed = message.decode()
    summary = message.headers["argsrepr"]
    assert summary == (
        f"(turn={request['turn_id']} agent={AGENT} snapshot={body['snapshot_id']} resume)"
    )
    assert "secret-reviewer-note" not in summary
    assert "secret-reviewer-note" in json.dumps(request)
    assert message.headers["kwargsrepr"] == "{}"


def test_rejected_decision_claims_nothing(rig: Rig) -> None:
    """A decision that breaks a rule is recorded as rejected and claims nothing; the
    snapshot it named is then accepted for another decision."""
    body = rig.paused(6)
    wrong = {**body, "decision_id": str(uuid.uuid4()), "resume_token": "not-the-token"}
    consumer = rig.consumer()
    event = consumer.handle(raw(wrong), "application/json", {})
    assert event.type == "decision.rejected", event.model_dump_json()
    assert event.model_dump()["error"]["status"] == "PERMISSION_DENIED"
    assert event.model_dump()["session_id"] is not None  # from the one snapshot read
    assert rig.claimed_by(body["snapshot_id"]) is None
    assert [row.outcome for row in rig.rows(wrong["decision_id"])] == ["rejected"]
    assert rig.enqueued() == []
    assert consumer.handle(raw(body), "application/json", {}).type == "decision.accepted"
    # answered now: a wrong token is still PERMISSION_DENIED (rule 3 comes first), in
    # the same words, which tell one who lacks the token nothing of the pause's state
    late = {**body, "decision_id": str(uuid.uuid4()), "resume_token": "not-the-token"}
    refused = consumer.handle(raw(late), "application/json", {}).model_dump(mode="json")
    assert refused["error"] == event.model_dump(mode="json")["error"]
    assert refused["error"]["status"] == "PERMISSION_DENIED"


def test_a_decision_near_the_limit_is_still_its_resume_once_logged(rig: Rig) -> None:
    """A decision just within 1 MiB, its text not all ASCII: the log keeps it without
    its token and escaped, which can take it past the limit. The worker's check that a
    resume task is its decision's own reads that copy; it used to refuse it as
    unreadable (PERMISSION_DENIED), leaving the pause claimed for good. So did the
    consumer, enqueueing the resume again for a decision delivered twice."""
    from schemas import MAX_DECISION_BYTES, TurnRequest
    from workers.resume_check import check_task

    body = rig.paused(6)
    body["reviewer"] = "Zoë Ångström " * 20
    body["note"] = ""
    size = len(json.dumps(body, ensure_ascii=False).encode())
    body["note"] = "n" * (MAX_DECISION_BYTES - 40 - size)
    sent = json.dumps(body, ensure_ascii=False).encode()
    assert len(sent) <= MAX_DECISION_BYTES
    consumer = rig.consumer()
    assert consumer.handle(sent, "application/json", {}).type == "decision.accepted"
    with rig.rt.store.engine.connect() as conn:
        logged = conn.execute(
            text("SELECT body FROM interlock_decision WHERE decision_id = :d"),
            {"d": body["decision_id"]},
        ).scalar_one()
    assert len(logged.encode()) > MAX_DECISION_BYTES, "the test's premise: it grew"
    [request] = rig.enqueued()
    checked = check_task(rig.rt, TurnRequest.model_validate(request))
    assert checked.refused is None, checked.refused
    assert checked.paused is not None and checked.paused.snapshot_id == body["snapshot_id"]
    again = consumer.handle(sent, "application/json", {})  # delivered twice
    assert again.type == "decision.accepted"
    assert rig.enqueued() == [request], "its resume enqueued again, the same task"


def test_the_decision_log_keeps_no_resume_token(rig: Rig) -> None:
    """The token is a secret stored only as a hash: the log keeps each decision without
    it, accepted or refused, so reading the store does not give a pause's token. What the
    reviewer answered stays readable, and a redelivered accepted decision still enqueues
    its resume from the kept body."""
    body = rig.paused(8)
    token = body["resume_token"]
    typo = {
        **body,
        "decision_id": str(uuid.uuid4()),
        "restart": [{**body["restart"][0], "ref": "no-such-ref"}],
    }
    consumer = rig.consumer()
    rejected = consumer.handle(raw(typo), "application/json", {}).model_dump(mode="json")
    assert rejected["error"]["status"] == "INVALID_ARGUMENT", rejected
    assert consumer.handle(raw(body), "application/json", {}).type == "decision.accepted"
    with rig.rt.store.engine.connect() as conn:
        kept = conn.execute(text("SELECT decision_id, body FROM interlock_decision")).all()
    assert {row.decision_id for row in kept} == {typo["decision_id"], body["decision_id"]}
    for row in kept:
        assert token not in row.body
        stored = json.loads(row.body)
        assert "resume_token" not in stored
        assert stored["reviewer"] == "alice@example.com"
        assert stored["restart"][0]["resumed"] == {"approved": True}
    [first] = rig.enqueued()
    consumer.handle(raw(body), "application/json", {})  # redelivered: enqueued again
    assert [r["turn_id"] for r in rig.enqueued()] == [first["turn_id"]]


def test_a_decision_the_checks_cannot_process_keeps_its_one_outcome(rig: Rig) -> None:
    """A decision whose content made the checks raise is rejected with INTERNAL and that
    is its outcome: the same decision_id sent again, even with a valid body, gets the
    same event again, not a second evaluation; nothing was claimed."""
    body = rig.paused(9)
    consumer = rig.consumer()
    consumer.unprocessable(raw(body), {}, ValueError("the checks broke"))
    [first] = rig.published()
    wire = first.model_dump(mode="json")
    assert (first.type, wire["error"]["status"]) == ("decision.rejected", "INTERNAL")
    assert "the checks broke" in wire["error"]["message"]
    assert [row.outcome for row in rig.rows(body["decision_id"])] == ["rejected"]
    [letter] = rig.dead_letters()  # kept, naming its decision and that outcome
    assert (letter["decision_id"], letter["event_id"]) == (body["decision_id"], first.event_id)
    assert letter["reason"] == wire["error"]["message"]
    again = consumer.handle(raw(body), "application/json", {})
    assert again.event_id == first.event_id
    assert [e.event_id for e in rig.published()] == [first.event_id]
    assert rig.dead_letters() == [], "a readable copy is answered, not kept"
    assert rig.claimed_by(body["snapshot_id"]) is None
    assert rig.enqueued() == []


def test_answers_nested_too_deeply_to_send_on_are_invalid_argument(rig: Rig) -> None:
    """Resume data nested past what the turn's JSON can carry: refused for its parts
    (INVALID_ARGUMENT, recorded with its snapshot), not an error of the consumer; the
    pause is then answered."""
    body = rig.paused(10)
    deep: Any = 1
    for _ in range(500):
        deep = [deep]
    nested = {**body, "decision_id": str(uuid.uuid4())}
    nested["restart"] = [{**body["restart"][0], "resumed": {"approved": True, "deep": deep}}]
    consumer = rig.consumer()
    event = consumer.handle(raw(nested), "application/json", {})
    wire = event.model_dump(mode="json")
    assert (event.type, wire["error"]["status"]) == ("decision.rejected", "INVALID_ARGUMENT")
    assert "cannot be sent on as JSON" in wire["error"]["message"], wire
    assert event.snapshot_id == body["snapshot_id"]
    assert [row.outcome for row in rig.rows(nested["decision_id"])] == ["rejected"]
    assert consumer.handle(raw(body), "application/json", {}).type == "decision.accepted"


def test_claim_lost_to_another_decision_is_rejected_and_recorded(rig: Rig) -> None:
    """Two decisions for one snapshot: the second fails the claim (rule 6). It is
    recorded as rejected, in a transaction of its own, and the first keeps the claim."""
    first = rig.paused(7)
    second = {**first, "decision_id": str(uuid.uuid4())}
    consumer = rig.consumer()
    assert consumer.handle(raw(first), "application/json", {}).type == "decision.accepted"
    rig.enqueued()
    event = consumer.handle(raw(second), "application/json", {})
    wire = event.model_dump(mode="json")
    assert event.type == "decision.rejected", wire
    assert wire["error"]["status"] == "FAILED_PRECONDITION", wire
    assert "already resumed" in wire["error"]["message"], wire
    assert rig.claimed_by(first["snapshot_id"]) == first["decision_id"]
    assert [row.outcome for row in rig.rows(second["decision_id"])] == ["rejected"]
    assert rig.enqueued() == []


def test_a_decision_costs_one_read_and_one_write_transaction(rig: Rig) -> None:
    """Accepted or rejected, a new decision is read in one transaction (its log entry
    and its snapshot, read once) and written in one (claim and record, or the record)."""
    consumer = rig.consumer()
    answers_nothing = {**rig.paused(12), "restart": []}  # rule 5: the agent is loaded
    consumer.handle(raw(answers_nothing), "application/json", {})  # and its tables made
    kinds: list[str] = []

    def on_begin(conn: DbConnection) -> None:
        write = conn.get_execution_options().get("interlock_write", False)
        kinds.append("write" if write else "read")

    sqla_event.listen(consumer.rt.store.engine, "begin", on_begin)
    accepted = rig.paused(13)
    wrong = {**rig.paused(14), "resume_token": "not-the-token"}
    for body, outcome in ((accepted, "decision.accepted"), (wrong, "decision.rejected")):
        kinds.clear()
        assert consumer.handle(raw(body), "application/json", {}).type == outcome
        assert kinds == ["read", "write"], (outcome, kinds)


# ------------------------------------------------------------------ seen again


def test_redelivered_accepted_decision_enqueues_the_same_turn_again(rig: Rig) -> None:
    """A decision whose outcome was `accepted`, delivered again: the very turn request
    of the first delivery is enqueued again (same turn id: workers run it once), and the
    first outcome event is published again. Once the turn has failed and released the
    snapshot, nothing is enqueued any more: only the outcome goes out again."""
    body = rig.paused(8)
    consumer = rig.consumer()
    first = consumer.handle(raw(body), "application/json", {})
    assert first.type == "decision.accepted", first.model_dump_json()
    [request] = rig.enqueued()
    assert request["turn_id"] == f"resume:{body['decision_id']}"
    assert [e.model_dump() for e in rig.published()] == [first.model_dump()]

    for again in (consumer, rig.consumer()):  # the same process, or another one
        repeated = again.handle(raw(body), "application/json", {})
        assert repeated.model_dump() == first.model_dump()
        assert rig.enqueued() == [request]
        assert [e.model_dump() for e in rig.published()] == [first.model_dump()]
    assert len(rig.rows(body["decision_id"])) == 1

    rig.rt.store.release(body["snapshot_id"], body["decision_id"])  # as a failed turn does
    assert consumer.handle(raw(body), "application/json", {}).model_dump() == first.model_dump()
    assert rig.enqueued() == []
    assert [e.model_dump() for e in rig.published()] == [first.model_dump()]


def test_send_task_failure_keeps_the_claim_and_the_retry_enqueues(rig: Rig) -> None:
    """The broker refuses the resume (nothing listens where the consumer sends tasks).
    `decision.accepted` went out before it (the claim and the record are committed); the
    claim and the record stay, and the decision is requeued, not acked. Its next
    delivery, to a consumer that can send, publishes the same event again, enqueues the
    resume and acks."""
    body = rig.paused(9)
    failing = rig.consumer()
    failing.app.conf.broker_write_url = f"redis://127.0.0.1:{free_port()}/0"
    healthy = rig.consumer()
    rig.rt.publisher.publish_decision(body)

    failing.on_message(rig.decisions.get(timeout=TIMEOUT))
    assert failing.handled == 0  # requeued, not acked
    assert rig.claimed_by(body["snapshot_id"]) == body["decision_id"]
    [row] = rig.rows(body["decision_id"])
    assert row.outcome == "accepted"
    assert rig.enqueued() == []
    [accepted] = rig.published()  # before the resume, which the broker refused
    assert accepted.type == "decision.accepted"
    assert accepted.model_dump_json() == row.event_body

    message = rig.decisions.get(timeout=TIMEOUT)  # the same decision, back on the queue
    assert json.loads(message.body)["decision_id"] == body["decision_id"]
    healthy.on_message(message)
    assert healthy.handled == 1
    [request] = rig.enqueued()
    assert request["decision_id"] == body["decision_id"]
    assert request["snapshot_id"] == body["snapshot_id"]
    [event] = rig.published()
    assert event.model_dump() == accepted.model_dump()  # the same event, event_id and all
    with pytest.raises(rig.decisions.Empty):  # acked: gone for good
        rig.decisions.get(timeout=1)


# ------------------------------------------------------------------ two consumers


class _Gated(ResumeConsumer):
    """Evaluates, then waits for the other consumer before claiming and recording."""

    gate: threading.Barrier

    def _accept(self, *args: Any) -> EventBase:
        self.gate.wait(TIMEOUT)
        return super()._accept(*args)


@pytest.mark.parametrize("second", ["same body", "another snapshot"])
def test_two_consumers_racing_on_one_decision_id_publish_one_outcome(rig: Rig, second: str) -> None:
    """The same decision_id, handled by two consumers at once; both evaluate it as new,
    then claim and record at the same moment. One wins; the other's transaction rolls
    back (its claim too: with "another snapshot", that snapshot stays unclaimed) and it
    publishes the winner's outcome. One outcome event (by id), one row, one claim."""
    one = rig.paused(10)
    two = one if second == "same body" else {**rig.paused(11), "decision_id": one["decision_id"]}
    gate = threading.Barrier(2)
    consumers = [rig.consumer(_Gated), rig.consumer(_Gated)]
    results: dict[int, EventBase | BaseException] = {}

    def run(i: int, body: dict[str, Any]) -> None:
        consumer = consumers[i]
        assert isinstance(consumer, _Gated)
        consumer.gate = gate
        try:
            results[i] = consumer.handle(raw(body), "application/json", {})
        except BaseException as exc:  # reported below
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i, b)) for i, b in enumerate((one, two))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT)
    events = [r for r in results.values() if isinstance(r, EventBase)]
    assert len(events) == 2, results
    winner = events[0]
    assert events[1].model_dump() == winner.model_dump()  # the same event, its id included
    assert winner.type == "decision.accepted", winner.model_dump_json()
    published = rig.published()
    assert len(published) == 2
    assert {e.model_dump_json() for e in published} == {winner.model_dump_json()}
    [row] = rig.rows(one["decision_id"])
    assert row.event_body == winner.model_dump_json()

    snapshots = {one["snapshot_id"], two["snapshot_id"]}
    assert rig.claimed_by(str(winner.snapshot_id)) == one["decision_id"]
    for loser in snapshots - {winner.snapshot_id}:
        assert rig.claimed_by(loser) is None
    requests = rig.enqueued()
    assert 1 <= len(requests) <= 2  # the loser may enqueue the winner's turn again
    assert all(r == requests[0] for r in requests)
    assert requests[0]["snapshot_id"] == winner.snapshot_id


def test_each_decision_read_leaves_one_line_in_the_log(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    """An operator sees what became of every decision without reading the queues:
    accepted (and the turn it resumes as), rejected (and why), or unreadable (and kept
    on the dead-letter queue); a decision_id sent again says that its first outcome went
    out again."""
    body = rig.paused(7)
    wrong = {**body, "decision_id": str(uuid.uuid4()), "resume_token": "not-the-token"}
    consumer = rig.consumer()
    sent_in_turn = (wrong, body, {"hello": 1}, wrong, body)
    for sent in map(json.dumps, sent_in_turn):
        rig.rt.publisher.publish_decision(sent)
        message = rig.decisions.get(timeout=10)
        with caplog.at_level(logging.INFO, logger="interlock.consumer"):
            consumer.on_message(message)
    lines = [r.getMessage() for r in caplog.records if r.name == "interlock.consumer"]
    request, again = rig.enqueued()  # the repeat enqueues the same turn: it runs once
    assert again["turn_id"] == request["turn_id"]
    sid = body["snapshot_id"]
    wrong_token = (
        f"PERMISSION_DENIED: resume_token does not match snapshot {sid}: send the one its "
        "latest turn.interrupted event carries (`interlock resend` announces an open pause "
        "again with a new one)"
    )
    assert lines == [
        f"decision {wrong['decision_id']} rejected (snapshot {sid}): {wrong_token}",
        f"decision {body['decision_id']} accepted: snapshot {body['snapshot_id']} resumes "
        f"as turn {request['turn_id']}",
        "kept an unreadable decision on interlock.decisions.dead: schema_version is "
        "missing; this consumer reads 1",
        "decision (without an id) rejected (snapshot None): INVALID_ARGUMENT: "
        "schema_version is missing; this consumer reads 1",
        f"decision {wrong['decision_id']} rejected again (decided before) (snapshot "
        f"{sid}): {wrong_token}",
        f"decision {body['decision_id']} accepted again (decided before): snapshot "
        f"{body['snapshot_id']} resumes as turn {request['turn_id']}",
    ], lines
    assert consumer.handled == 5
    # Its resumed turn failed and gave the pause back: sent again, the decision's outcome
    # goes out again, and the line says that the turn has run (nothing enqueued).
    rig.rt.store.release(body["snapshot_id"], body["decision_id"])
    caplog.clear()
    rig.rt.publisher.publish_decision(json.dumps(body))
    with caplog.at_level(logging.INFO, logger="interlock.consumer"):
        consumer.on_message(rig.decisions.get(timeout=10))
    assert rig.enqueued() == []
    assert [r.getMessage() for r in caplog.records if r.name == "interlock.consumer"][-1] == (
        f"decision {body['decision_id']} accepted again (decided before): snapshot "
        f"{body['snapshot_id']} resumed as turn {request['turn_id']}, which has run"
    )
