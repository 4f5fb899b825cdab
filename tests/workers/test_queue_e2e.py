"""End to end on the queues, with real processes: `interlock worker` (Celery, prefork)
and `interlock resume-consumer` on a private redis-server (and on RabbitMQ), with a
PostgreSQL store. The test is the review dashboard: it reads events from queues of its
own and publishes decisions as plain JSON, as a program in another language would.

The worker and the consumer are started once for the module (per broker); each test
works on sessions of its own and binds its own event queue, so tests share no state.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import pickle
import re
import shlex
import shutil
import subprocess
import time
import uuid
import zlib
from collections.abc import Iterator
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any, cast

import pytest
from sqlalchemy import create_engine, text

from interlock import SqlSessionStore
from schemas import DecisionRejected, ErrorInfo, Status, TurnExpired, TurnInterrupted
from tests.queue_helpers import (
    AGENT,
    APP,
    Dashboard,
    QueueStack,
    celery_headers,
    cli_submit,
    dashboard_for,
    dead_reader,
    dead_turns_reader,
    decision,
    decisions_only_user,
    interrupted_reader,
    module_stack,
    put_on_turns,
    rabbitmq_vhost,
    run_cli,
    stream_queue,
)
from tests.services import eventually, service_unavailable

# -------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def redis_stack(tmp_path_factory: pytest.TempPathFactory, pg_admin: str) -> Iterator[QueueStack]:
    with module_stack(tmp_path_factory.mktemp("e2e-redis"), pg_admin) as stack:
        yield stack


@pytest.fixture(scope="module")
def rabbitmq_stack(tmp_path_factory: pytest.TempPathFactory, pg_admin: str) -> Iterator[QueueStack]:
    with (
        rabbitmq_vhost() as url,
        module_stack(tmp_path_factory.mktemp("e2e-rabbitmq"), pg_admin, url) as stack,
    ):
        yield stack


@pytest.fixture
def stack(request: pytest.FixtureRequest) -> QueueStack:
    """The Redis stack, or the one named by `parametrize("stack", [...], indirect=True)`."""
    backend = getattr(request, "param", "redis")
    found: QueueStack = request.getfixturevalue(f"{backend}_stack")
    return found


@pytest.fixture
def dash(stack: QueueStack, request: pytest.FixtureRequest) -> Iterator[Dashboard]:
    with dashboard_for(stack, request) as dashboard:
        yield dashboard


def text_of(event: Any) -> str:
    assert event.type == "turn.completed", event.model_dump_json()
    assert event.message is not None
    return str(event.message.text)


def txn_ids(answer: str) -> list[str]:
    return re.findall(r"txn-[0-9a-f]{12}", answer)


# -------------------------------------------------------------------------- happy path


@pytest.mark.parametrize("stack", ["redis", "rabbitmq"], indirect=True)
def test_happy_path_submit_interrupt_decide_complete(stack: QueueStack, dash: Dashboard) -> None:
    reader = interrupted_reader(stack.broker_url)  # the real interlock.interrupted queue
    try:
        submitted = cli_submit(stack, "Transfer $500 to savings")
        session_id = submitted["session_id"]
        body, _headers, content_type = reader.wait(
            lambda m: m.get("session_id") == session_id, f"turn.interrupted of {session_id}"
        )
    finally:
        reader.close()

    # turn.interrupted, as JSON on the wire
    assert content_type == "application/json"
    assert body["schema_version"] == 1
    assert body["type"] == "turn.interrupted"
    assert body["agent"] == AGENT
    assert body["turn_id"] == submitted["turn_id"]
    uuid.UUID(body["event_id"])
    assert datetime.fromisoformat(body["occurred_at"]).tzinfo is not None
    assert body["expires_at"] is None
    [item] = body["interrupts"]
    assert item["name"] == "transferMoney"
    assert item["input"] == {"amount": 500.0, "toAccount": "savings"}
    assert item["payload"] == {"action": "transferMoney", "details": "Transfer $500.00 to savings"}
    assert item["ref"]
    token = body["resume_token"]
    assert isinstance(token, str) and len(token) >= 16
    request = body["message"]["content"][0]["toolRequest"]
    assert body["message"]["role"] == "model"
    assert (request["name"], request["ref"]) == ("transferMoney", item["ref"])

    # the dashboard's own "#" queue got the same event
    seen = dash.turn_event(session_id)
    assert seen.event_id == body["event_id"]

    # a decision written by hand, as plain JSON, on the default exchange
    decision_id = str(uuid.uuid4())
    dash.publish_json(
        {
            "schema_version": 1,
            "decision_id": decision_id,
            "snapshot_id": body["snapshot_id"],
            "resume_token": token,
            "reviewer": "alice@example.com",
            "restart": [
                {"name": "transferMoney", "ref": item["ref"], "resumed": {"approved": True}}
            ],
        },
        exchange="",
    )
    accepted = dash.outcome(decision_id)
    assert accepted.type == "decision.accepted", accepted.model_dump_json()
    assert accepted.model_dump()["reviewer"] == "alice@example.com"
    assert (accepted.snapshot_id, accepted.session_id) == (body["snapshot_id"], session_id)
    assert accepted.agent == AGENT

    completed = dash.resumed_turn(accepted)
    answer = text_of(completed)
    assert completed.model_dump()["finish_reason"] == "stop"
    assert answer.startswith("Done: transferred $500.00 to savings, transaction txn-"), answer
    assert len(txn_ids(answer)) == 1
    assert completed.turn_id == accepted.turn_id  # the resumed turn is the accepted one
    assert completed.snapshot_id != body["snapshot_id"]

    # the token is kept only as a hash, and erased from the outbox once published (the
    # worker marks published rows sent in batches, a few milliseconds later)
    engine = create_engine(stack.store_url)

    def outbox_row_once_sent() -> Any:
        with engine.connect() as conn:
            return conn.execute(
                text("SELECT body, sent_at FROM interlock_outbox"
                     " WHERE event_id = :e AND sent_at IS NOT NULL"),
                {"e": body["event_id"]},
            ).first()  # fmt: skip

    try:
        with engine.connect() as conn:
            stored = conn.execute(
                text("SELECT resume_token_hash, resumed_by FROM interlock_snapshot"
                     " WHERE snapshot_id = :s"),
                {"s": body["snapshot_id"]},
            ).one()  # fmt: skip
        outbox = eventually(outbox_row_once_sent, "outbox row marked sent")
    finally:
        engine.dispose()
    assert stored.resume_token_hash == hashlib.sha256(token.encode()).hexdigest()
    assert stored.resumed_by == decision_id
    assert json.loads(outbox.body)["resume_token"] is None
    assert token not in outbox.body


# -------------------------------------------------------------------------- flows


def test_denial_ends_in_a_declined_answer(dash: Dashboard) -> None:
    paused = dash.paused("Transfer $75 to checking")
    done = dash.resolve(paused, approved=False)
    answer = text_of(done)
    assert answer == "The transfer of $75.00 to checking was declined.", answer
    assert "txn-" not in answer


def test_two_interrupts_answered_in_one_decision(dash: Dashboard) -> None:
    paused = dash.paused("Transfer $1 to alice and $2 to bob")
    alice, bob = paused.interrupts
    assert [alice.name, bob.name] == ["transferMoney", "transferMoney"]
    assert alice.input == {"amount": 1.0, "toAccount": "alice"}
    assert bob.input == {"amount": 2.0, "toAccount": "bob"}
    assert alice.ref != bob.ref

    body = decision(
        paused.snapshot_id,
        paused.resume_token,
        respond=[
            {
                "name": "transferMoney",
                "ref": alice.ref,
                "output": {"success": True, "transactionId": "manual-42"},
            }
        ],
        restart=[{"name": "transferMoney", "ref": bob.ref, "resumed": {"approved": True}}],
    )
    dash.publish_json(body)
    answer = text_of(dash.resumed_turn(dash.outcome(body["decision_id"])))
    # alice's transfer was answered without running the tool; bob's ran
    assert answer.startswith(
        "Done: transferred $1.00 to alice, transaction manual-42. "
        "Done: transferred $2.00 to bob, transaction txn-"
    ), answer
    assert len(txn_ids(answer)) == 1


def test_repausing_after_the_resume(dash: Dashboard) -> None:
    first = dash.paused("Transfer $1 to a then $2 to b")
    [one] = first.interrupts
    assert one.input == {"amount": 1.0, "toAccount": "a"}

    second = cast(TurnInterrupted, dash.resolve(first))
    assert second.type == "turn.interrupted", second.model_dump_json()
    assert second.snapshot_id != first.snapshot_id
    assert second.resume_token and second.resume_token != first.resume_token
    [two] = second.interrupts
    assert two.input == {"amount": 2.0, "toAccount": "b"}
    assert two.ref != one.ref

    # the first pause's token does not open the second one
    stale = dash.approve_all(second)
    stale["resume_token"] = first.resume_token
    dash.publish_json(stale)
    rejected = dash.outcome(stale["decision_id"])
    assert rejected.type == "decision.rejected"
    assert rejected.error.status == Status.PERMISSION_DENIED  # type: ignore[attr-defined]

    done = dash.resolve(second)
    answer = text_of(done)
    assert answer.startswith("Done: transferred $1.00 to a, transaction txn-"), answer
    assert "Done: transferred $2.00 to b, transaction txn-" in answer
    ids = txn_ids(answer)
    assert len(ids) == 2 and ids[0] != ids[1]


def test_message_to_a_paused_session_fails_and_keeps_the_pause(dash: Dashboard) -> None:
    paused = dash.paused("Transfer $5 to waiting")
    dash.submit("Transfer $6 to impatient", session_id=paused.session_id)
    failed = dash.turn_event(paused.session_id, exclude={paused.snapshot_id})
    assert failed.type == "turn.failed", failed.model_dump_json()
    wire = failed.model_dump(mode="json")
    assert wire["error"]["status"] == "FAILED_PRECONDITION"
    assert "answer the pending interrupts first" in wire["error"]["message"]
    assert paused.interrupts[0].ref in wire["error"]["message"]
    assert wire["snapshot_id"] is None  # refused before it ran: no snapshot of its own
    assert wire["last_snapshot_id"] == paused.snapshot_id  # where the session continues
    done = dash.resolve(paused)
    assert "transferred $5.00 to waiting" in text_of(done)


# -------------------------------------------------------------------------- topics


@pytest.mark.parametrize("stack", ["redis", "rabbitmq"], indirect=True)
def test_topic_patterns_get_every_matching_event(stack: QueueStack, dash: Dashboard) -> None:
    turns = stream_queue(dash.conn, "turn.*")
    decisions = stream_queue(dash.conn, "decision.#")
    try:
        paused = dash.paused("Transfer $9 to topics")
        done = dash.resolve(paused)
        assert done.type == "turn.completed"
        decision_event = dash.events(
            lambda e: e.type == "decision.accepted" and e.session_id == paused.session_id
        )
        assert len(decision_event) == 1

        # Every event of the flow has been published (the "#" queue saw it). A marker
        # published now on each pattern comes after all of them on every queue it
        # matches: read each queue up to its marker.
        marker = str(uuid.uuid4())
        dash.publish_event(TurnExpired(session_id=marker))
        dash.publish_event(
            DecisionRejected(
                session_id=marker, error=ErrorInfo(status=Status.CANCELLED, message="marker")
            )
        )
        got_turns = _read_until_marker(turns, marker, "turn.expired")
        got_decisions = _read_until_marker(decisions, marker, "decision.rejected")
    finally:
        turns.close(delete=True)
        decisions.close(delete=True)

    mine = {paused.session_id}
    assert [(e.type, e.snapshot_id) for e in _unique(got_turns) if e.session_id in mine] == [
        ("turn.interrupted", paused.snapshot_id),
        ("turn.completed", done.snapshot_id),
    ]
    assert all(e.type.startswith("turn.") for e in got_turns), [e.type for e in got_turns]
    assert [(e.type, e.event_id) for e in _unique(got_decisions) if e.session_id in mine] == [
        ("decision.accepted", decision_event[0].event_id)
    ]
    assert all(e.type.startswith("decision.") for e in got_decisions), [
        e.type for e in got_decisions
    ]


def _read_until_marker(stream: Any, marker: str, marker_type: str) -> list[Any]:
    got: list[Any] = []
    while True:
        event = stream.next(30)
        if event.session_id == marker:
            assert event.type == marker_type
            return got
        got.append(event)


def _unique(events: list[Any]) -> list[Any]:
    """Events once each (the outbox relay may publish one twice; ids tell)."""
    seen: set[str] = set()
    out = []
    for e in events:
        if e.event_id not in seen:
            seen.add(e.event_id)
            out.append(e)
    return out


@pytest.mark.parametrize("stack", ["redis", "rabbitmq"], indirect=True)
def test_a_body_kombu_cannot_decode_is_refused_on_both_brokers(
    stack: QueueStack, dash: Dashboard
) -> None:
    """kombu inflates a `compression` header's body as it builds the message, on AMQP as
    on Redis; one it cannot inflate reaches the consumer's decode-error path, which
    refuses and keeps it (kombu's own would ack and drop it)."""
    paused = dash.paused("Transfer $8 to corrupt")
    nonce = str(uuid.uuid4())
    body = zlib.compress(b"{}")[:-2]  # truncated
    dead = dead_reader(stack.broker_url)
    try:
        headers = {"compression": "application/x-gzip", "x-test-nonce": nonce}
        dash.publish_raw(body, "application/json", exchange="interlock.decisions", headers=headers)
        event = dash.wait(
            lambda e: e.type == "decision.rejected" and "cannot be decoded" in e.model_dump_json(),
            "decision.rejected for the corrupt body",
        )
        envelope, _, _ = dead.wait(
            lambda m: m.get("headers", {}).get("x-test-nonce") == nonce, "dead letter"
        )
    finally:
        dead.close()
    wire = event.model_dump(mode="json")
    assert (wire["decision_id"], wire["error"]["status"]) == (None, "INVALID_ARGUMENT")
    assert "truncated" in wire["error"]["message"]
    assert base64.b64decode(envelope["body_base64"]) == body
    done = dash.resolve(paused)
    assert done.type == "turn.completed", done.model_dump_json()


@pytest.mark.parametrize(
    ("encoding", "encode", "fault"),
    [
        ("ascii", "utf-8", "'ascii' codec can't decode byte 0xc3"),
        ("x-nonesuch", "utf-8", "unknown encoding: x-nonesuch"),
        ("latin-1", "latin-1", None),
    ],
    ids=["text-the-encoding-cannot-take", "unknown-encoding", "decoded-with-it"],
)
@pytest.mark.parametrize("stack", ["rabbitmq"], indirect=True)
def test_a_decision_in_a_content_encoding_on_rabbitmq(
    stack: QueueStack, dash: Dashboard, encoding: str, encode: str, fault: str | None
) -> None:
    """docs/queues.md: on RabbitMQ a `content_encoding` other than UTF-8 is decoded with
    it; text it cannot take is refused (INVALID_ARGUMENT, under the decision_id the body
    names) and kept, its dead letter marked `x-interlock-unreadable`. py-amqp keeps the
    bytes of a body it cannot decode and says nothing: such a decision used to be read
    as UTF-8, and accepted."""
    paused = dash.paused("Transfer $9 to an encoded reviewer")
    body = decision(paused.snapshot_id, paused.resume_token, reviewer="josé",
                    restart=[{"name": i.name, "ref": i.ref, "resumed": {"approved": True}}
                             for i in paused.interrupts])  # fmt: skip
    raw = json.dumps(body, ensure_ascii=False).encode(encode)
    nonce = str(uuid.uuid4())
    dead = dead_reader(stack.broker_url)
    try:
        producer: Any = dash.producer  # kombu's publish is untyped
        producer.publish(
            raw, exchange="interlock.decisions", routing_key="interlock.decisions",
            content_type="application/json", content_encoding=encoding,
            headers={"x-test-nonce": nonce, "x-sent-at": datetime(2023, 11, 14, 22, 13, 20),
                     "x-amount": Decimal("123.45")},
            delivery_mode=2,
        )  # fmt: skip
        outcome = dash.outcome(body["decision_id"])
        if fault is None:
            assert outcome.type == "decision.accepted", outcome.model_dump_json()
            assert outcome.model_dump()["reviewer"] == "josé"
            done = dash.resumed_turn(outcome)
            assert done.type == "turn.completed", done.model_dump_json()
            return
        envelope, _, _ = dead.wait(
            lambda m: m.get("headers", {}).get("x-test-nonce") == nonce, "dead letter"
        )
    finally:
        dead.close()
    wire = outcome.model_dump(mode="json")
    assert (wire["type"], wire["error"]["status"]) == ("decision.rejected", "INVALID_ARGUMENT")
    said = f"the body cannot be decoded (content encoding {encoding!r}): "
    assert wire["error"]["message"].startswith(f"not a decision: {said}"), wire
    assert fault in wire["error"]["message"], wire
    assert envelope["headers"]["x-interlock-unreadable"].startswith(said), envelope
    # typed AMQP headers as JSON (docs/queues.md): a timestamp as the events write times
    assert envelope["headers"]["x-sent-at"] == "2023-11-14T22:13:20Z", envelope
    assert envelope["headers"]["x-amount"] == "123.45", envelope
    assert envelope["decision_id"] == body["decision_id"] == wire["decision_id"], envelope
    assert envelope["event_id"] == wire["event_id"], envelope
    assert base64.b64decode(envelope["body_base64"]) == raw, "kept as sent"
    done = dash.resolve(paused)
    assert done.type == "turn.completed", done.model_dump_json()


@pytest.mark.parametrize("stack", ["redis", "rabbitmq"], indirect=True)
def test_a_message_no_worker_can_run_is_kept_on_both_brokers(
    stack: QueueStack, dash: Dashboard
) -> None:
    """On RabbitMQ as on Redis, Celery would drop these after logging them (acked, or
    rejected with no dead-letter exchange): they are kept on interlock.turns.dead."""
    dead = dead_turns_reader(stack.broker_url)
    sent: dict[str, tuple[bytes, str]] = {}
    try:
        for task, body, content_type in [
            ("interlock.nope", json.dumps([[], {}, {}]).encode(), "application/json"),
            ("interlock.run_turn", pickle.dumps(((), {}, {})), "application/x-python-serialize"),
        ]:
            nonce = str(uuid.uuid4())
            put_on_turns(stack, body, content_type, celery_headers(task, **{"x-test-nonce": nonce}))
            sent[nonce] = (body, content_type)
        for nonce, (body, content_type) in sent.items():

            def with_nonce(m: dict[str, Any], n: str = nonce) -> bool:
                return bool(m.get("headers", {}).get("x-test-nonce") == n)

            envelope, _, _ = dead.wait(with_nonce, "dead letter")
            assert base64.b64decode(envelope["body_base64"]) == body
            assert envelope["content_type"] == content_type
    finally:
        dead.close()
    paused = dash.paused("Transfer $9 to after-bad-tasks")
    assert dash.resolve(paused).type == "turn.completed"


# -------------------------------------------------------------------------- the CLI alone


def test_the_cli_alone_submits_waits_and_decides(stack: QueueStack) -> None:
    """`submit --wait` prints the turn.interrupted event, with the resume_token that
    `decide` needs; `decide --wait` prints the outcome and the resumed turn's end."""
    where = ["--broker", stack.broker_url, "--store", stack.store_url]
    submitted = run_cli(
        "submit", "--app", APP, "--agent", AGENT, "--text", "Transfer $42 to cli",
        "--wait", "--timeout", "60", *where,
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.describe()
    ids, paused = submitted.json_lines()
    assert paused["type"] == "turn.interrupted" and paused["turn_id"] == ids["turn_id"]
    assert f"--token {paused['resume_token']}" in submitted.stderr
    assert "sent: a worker runs it" not in submitted.stderr, "--wait says how it ended"
    quiet = run_cli("submit", "--app", APP, "--agent", AGENT, "--text", "hi", *where)
    assert quiet.returncode == 0, quiet.describe()
    assert [sorted(line) for line in quiet.json_lines()] == [["session_id", "turn_id"]]
    assert quiet.stderr == (
        "sent: a worker runs it (--wait prints how it ends: a pause with the resume_token "
        "that `interlock decide` takes)\n"
    ), "without --wait, how to learn the token"

    both = run_cli("decide", paused["snapshot_id"], "--token", paused["resume_token"],
                   "--approve", "--deny", *where)  # fmt: skip
    assert both.returncode == 2 and "exactly one of --approve, --deny" in both.stderr

    wrong = run_cli("decide", paused["snapshot_id"], "--token", "not-it", "--approve",
                    "--wait", *where)  # fmt: skip
    assert wrong.returncode == 1, wrong.describe()
    assert (
        f"PERMISSION_DENIED: resume_token does not match snapshot {paused['snapshot_id']}; "
        "nothing was sent" in wrong.stderr
    ), wrong.describe()
    assert wrong.json_lines() == [], "refused before anything is sent"

    # The hint of `submit --wait` runs as pasted: it repeats --broker and --store.
    [hint] = re.findall(r"`interlock (decide [^`]+)`", submitted.stderr)
    assert hint.endswith("--approve") and f"--store {stack.store_url}" in hint, hint
    decided = run_cli(*shlex.split(hint), "--reviewer", "cli@example.com", "--wait")
    assert decided.returncode == 0, decided.describe()
    sent, accepted, completed = decided.json_lines()
    assert accepted["type"] == "decision.accepted"
    assert accepted["decision_id"] == sent["decision_id"]
    assert completed["type"] == "turn.completed"
    assert completed["turn_id"] == accepted["turn_id"]
    answer = "".join(p.get("text") or "" for p in completed["message"]["content"])
    assert answer.startswith("Done: transferred $42.00 to cli, transaction txn-"), answer


def test_the_cli_approves_a_call_that_tool_approval_holds(stack: QueueStack) -> None:
    """`decide --approve` on a call that `tool_approval` holds runs it (`approve`): the
    tool then asks for its own confirmation, answered the same way. `--deny` on a held
    call does not run it; the model reads the reason."""
    where = ["--broker", stack.broker_url, "--store", stack.store_url]

    def submit(text: str) -> dict[str, Any]:
        result = run_cli("submit", "--app", APP, "--agent", "guardedBankingAgent",
                         "--text", text, "--wait", *where)  # fmt: skip
        assert result.returncode == 0, result.describe()
        paused = result.json_lines()[-1]
        assert paused["type"] == "turn.interrupted", paused
        return paused

    def decide(paused: dict[str, Any], *flags: str) -> dict[str, Any]:
        result = run_cli("decide", paused["snapshot_id"], "--token", paused["resume_token"],
                         *flags, "--wait", *where)  # fmt: skip
        assert result.returncode == 0, result.describe()
        return result.json_lines()[-1]

    held = submit("Transfer $8 to guarded")
    assert held["interrupts"][0]["payload"]["message"] == (
        "Tool not in approved list: transferMoney"
    )
    asks = decide(held, "--approve")
    assert asks["type"] == "turn.interrupted"
    assert asks["interrupts"][0]["payload"] == {
        "action": "transferMoney",
        "details": "Transfer $8.00 to guarded",
    }
    done = decide(asks, "--approve")
    answer = "".join(p.get("text") or "" for p in done["message"]["content"])
    assert answer.startswith("Done: transferred $8.00 to guarded, transaction txn-"), answer

    refused = decide(submit("Transfer $9 to nobody"), "--deny", "--feedback", "not today")
    assert refused["type"] == "turn.completed"
    assert "not today" in json.dumps(refused["message"]), refused


# -------------------------------------------------------------------- RabbitMQ refusals


@contextlib.contextmanager
def _queue_refuses(stack: QueueStack, queue: str) -> Iterator[None]:
    """While open, RabbitMQ turns away every message routed to `queue` (a length limit
    of 0 with `reject-publish`, as an operator's policy would)."""
    vhost = stack.broker_url.rsplit("/", 1)[1]
    ctl = shutil.which("rabbitmqctl")
    if not vhost or ctl is None:
        service_unavailable("needs a vhost of the test's own (rabbitmqctl)")
    name = f"refuse-{uuid.uuid4().hex[:8]}"
    definition = json.dumps({"max-length": 0, "overflow": "reject-publish"})
    pattern = f"^{re.escape(queue)}$"
    subprocess.run(
        [ctl, "set_policy", "-p", vhost, "--apply-to", "queues", name, pattern, definition],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    try:
        time.sleep(1)  # a policy takes effect asynchronously
        yield
    finally:
        subprocess.run([ctl, "clear_policy", "-p", vhost, name], capture_output=True, timeout=60)


@pytest.mark.parametrize("stack", ["rabbitmq"], indirect=True)
def test_rabbitmq_refusing_the_resume_keeps_the_decision(
    stack: QueueStack, dash: Dashboard
) -> None:
    """Publisher confirms: a resume RabbitMQ turns away is not taken for sent. The
    decision stays queued (tried again every second) and, once the queue takes tasks
    again, its resume runs, once."""
    paused = dash.paused("Transfer $61 to the full queue")
    body = dash.approve_all(paused)
    store = SqlSessionStore(stack.store_url)
    try:
        with _queue_refuses(stack, "interlock.turns"):
            dash.publish_json(body)
            accepted = dash.outcome(body["decision_id"])
            assert accepted.type == "decision.accepted", accepted.model_dump_json()
            time.sleep(3)
            snaps = store.list_snapshots(session_id=paused.session_id)
            assert [s.snapshot_id for s in snaps] == [paused.snapshot_id], "nothing ran"
            assert snaps[0].resumed_by == body["decision_id"], "the claim stays"
        done = dash.resumed_turn(accepted)
        assert done.type == "turn.completed", done.model_dump_json()
        assert {e.event_id for e in dash.outcomes(body["decision_id"])} == {accepted.event_id}
        assert len(store.list_snapshots(session_id=paused.session_id)) == 2, "it ran once"
    finally:
        store.dispose()


@pytest.mark.parametrize("stack", ["rabbitmq"], indirect=True)
def test_rabbitmq_refusing_an_event_keeps_it_in_the_outbox(
    stack: QueueStack, dash: Dashboard
) -> None:
    """An event RabbitMQ turns away (its inbox is full) is not marked sent: the outbox
    publishes it again, and the inbox gets it once it takes messages again."""
    with _queue_refuses(stack, "interlock.interrupted"):
        paused = dash.paused("Transfer $62 to the full inbox")  # our own queue took it
    reader = interrupted_reader(stack.broker_url)
    try:
        body, _headers, _type = reader.wait(
            lambda m: m.get("snapshot_id") == paused.snapshot_id,
            f"turn.interrupted of {paused.snapshot_id} on interlock.interrupted",
        )
    finally:
        reader.close()
    assert body["event_id"] == paused.event_id


@pytest.mark.parametrize("stack", ["rabbitmq"], indirect=True)
def test_rabbitmq_refusing_a_turn_is_said_as_a_refusal(
    stack: QueueStack, dash: Dashboard, tmp_path: Path
) -> None:
    """`submit` of a turn RabbitMQ turns away (interlock.turns at its length limit) says
    that the broker refused it, naming the turn and the queue, exit 1, nothing printed
    as sent; with `--file`, that none of the turns was sent. It used to say "cannot
    reach the broker:" and no more. Once the queue takes turns again, submit works."""
    batch = tmp_path / "turns.jsonl"
    batch.write_text("Transfer $1 to the full queue\nTransfer $2 to the full queue\n")
    common = ["--app", APP, "--agent", AGENT, "--broker", stack.broker_url,
              "--store", stack.store_url]  # fmt: skip
    with _queue_refuses(stack, "interlock.turns"):
        one = run_cli("submit", *common, "--text", "Transfer $3 to the full queue")
        many = run_cli("submit", *common, "--file", str(batch))
    for result in (one, many):
        assert result.returncode == 1, result.describe()
        assert result.stdout == "", "no turn was sent"
        last = result.stderr.splitlines()[-1]
        assert re.fullmatch(
            r"error: UNAVAILABLE: the broker refused turn \S+ to interlock\.turns: the queue "
            r"takes no more \(a length limit with reject-publish\?\); nothing was enqueued.*",
            last,
        ), result.describe()
    assert many.stderr.splitlines()[-1].endswith("(none of the 2 turns was sent)")
    after = run_cli("submit", *common, "--text", "Transfer $4 to savings", "--wait")
    assert after.returncode == 0, after.describe()
    assert [line.get("type") for line in after.json_lines()][-1] == "turn.interrupted"


@pytest.mark.parametrize("stack", ["rabbitmq"], indirect=True)
def test_decide_as_a_user_who_may_only_publish_decisions_is_refused(
    stack: QueueStack, dash: Dashboard
) -> None:
    """docs/operations.md, "Who may publish where": `decide` declares all of Interlock's
    exchanges and queues before it publishes, so a RabbitMQ user that may write to
    `interlock.decisions` alone is refused it (PERMISSION_DENIED, at once); nothing is
    sent, and the pause is still answerable."""
    paused = dash.paused("Transfer $63 to a narrow reviewer")
    with decisions_only_user(stack.broker_url) as narrow:
        result = run_cli("decide", paused.snapshot_id, "--token", paused.resume_token,
                         "--approve", "--broker", narrow, "--store", stack.store_url)  # fmt: skip
    assert result.returncode == 1, result.describe()
    assert result.stdout == "", "no decision id: nothing was sent"
    last = result.stderr.splitlines()[-1]
    assert last.startswith("error: PERMISSION_DENIED: "), result.describe()
    assert "ACCESS_REFUSED - access to exchange 'interlock.turns'" in last, result.describe()
    body = dash.approve_all(paused)  # the pause waits still, for an answer that can come
    dash.publish_json(body)
    accepted = dash.outcome(body["decision_id"])
    assert accepted.type == "decision.accepted", accepted.model_dump_json()
    done = dash.resumed_turn(accepted)
    assert done.type == "turn.completed", done.model_dump_json()


@pytest.mark.parametrize("stack", ["rabbitmq"], indirect=True)
def test_rabbitmq_refusing_a_decision_is_said_as_a_refusal(
    stack: QueueStack, dash: Dashboard
) -> None:
    """`decide` of a decision RabbitMQ turns away (interlock.decisions at its length
    limit) says the broker refused it, naming the queue, exit 1, no decision id printed;
    the pause is untouched and, once the queue takes messages again, `decide` answers
    it."""
    paused = dash.paused("Transfer $64 to a full inbox of decisions")
    decide = ["decide", paused.snapshot_id, "--token", paused.resume_token, "--approve",
              "--broker", stack.broker_url, "--store", stack.store_url]  # fmt: skip
    with _queue_refuses(stack, "interlock.decisions"):
        refused = run_cli(*decide)
    assert refused.returncode == 1, refused.describe()
    assert refused.stdout == "", "no decision id: nothing was sent"
    last = refused.stderr.splitlines()[-1]
    assert last.startswith("error: UNAVAILABLE: the broker refused the message to "), last
    assert "interlock.decisions" in last and "cannot reach" not in last, last
    after = run_cli(*decide, "--wait")
    assert after.returncode == 0, after.describe()
    assert [line.get("type") for line in after.json_lines()][-2:] == [
        "decision.accepted",
        "turn.completed",
    ], after.describe()
