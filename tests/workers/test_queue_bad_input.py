"""Bad decisions against a real resume consumer: each is answered with one
`decision.rejected` of the right status, unreadable ones are kept on
`interlock.decisions.dead` with the reason, nothing stops the consumer, and the paused
turn a rejected decision aimed at can still be answered afterwards."""

from __future__ import annotations

import base64
import bz2
import gzip
import json
import uuid
import zlib
from collections.abc import Callable, Iterator
from typing import Any, cast

import pytest
import redis

from schemas import MAX_DECISION_BYTES, DecisionRejected, Status
from tests.queue_helpers import (
    Dashboard,
    QueueStack,
    dashboard_for,
    dead_reader,
    decision,
    module_stack,
)
from tests.services import eventually


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, pg_admin: str) -> Iterator[QueueStack]:
    with module_stack(tmp_path_factory.mktemp("bad-input"), pg_admin) as queue_stack:
        yield queue_stack


@pytest.fixture
def dash(stack: QueueStack, request: pytest.FixtureRequest) -> Iterator[Dashboard]:
    with dashboard_for(stack, request) as dashboard:
        yield dashboard


def rejected(dash: Dashboard, body: dict[str, Any], status: Status, *words: str) -> Any:
    """Publish `body`; its one outcome must be decision.rejected with `status`."""
    dash.publish_json(body)
    event = cast(DecisionRejected, dash.outcome(body["decision_id"]))
    assert event.type == "decision.rejected", event.model_dump_json()
    assert event.error.status == status, event.model_dump_json()
    for word in words:
        assert word in event.error.message, event.model_dump_json()
    assert event.model_dump()["reviewer"] == body.get("reviewer")
    return event


def still_answerable(dash: Dashboard, paused: Any) -> None:
    """Nothing was lost: the paused turn takes a valid decision and completes."""
    done = dash.resolve(paused)
    assert done.type == "turn.completed", done.model_dump_json()
    assert "txn-" in done.message.text  # type: ignore[attr-defined]


def restart_all(paused: Any) -> list[dict[str, Any]]:
    return [
        {"name": i.name, "ref": i.ref, "resumed": {"approved": True}} for i in paused.interrupts
    ]


# -------------------------------------------------------------------------- rules 2-6


def test_wrong_resume_token_is_permission_denied(dash: Dashboard) -> None:
    paused = dash.paused("Transfer $10 to wrong-token")
    body = decision(paused.snapshot_id, "not-the-token", restart=restart_all(paused))
    event = rejected(dash, body, Status.PERMISSION_DENIED, "resume_token")
    assert (event.snapshot_id, event.decision_id) == (paused.snapshot_id, body["decision_id"])
    assert (event.agent, event.session_id) == ("bankingAgent", paused.session_id)
    missing = decision(paused.snapshot_id, None, restart=restart_all(paused))
    missing.pop("resume_token")
    rejected(
        dash,
        missing,
        Status.PERMISSION_DENIED,
        f"the decision has no resume_token for snapshot {paused.snapshot_id}: send the one "
        "its turn.interrupted event carries",
    )
    still_answerable(dash, paused)


def test_token_of_another_snapshot_is_permission_denied(dash: Dashboard) -> None:
    paused = dash.paused("Transfer $11 to mine")
    other = dash.paused("Transfer $12 to other")
    body = decision(paused.snapshot_id, other.resume_token, restart=restart_all(paused))
    rejected(dash, body, Status.PERMISSION_DENIED)
    still_answerable(dash, paused)
    still_answerable(dash, other)


def test_wrong_ref_is_invalid_argument(dash: Dashboard) -> None:
    paused = dash.paused("Transfer $13 to wrong-ref")
    body = decision(
        paused.snapshot_id,
        paused.resume_token,
        restart=[{"name": "transferMoney", "ref": "no-such-ref", "resumed": {"approved": True}}],
    )
    rejected(dash, body, Status.INVALID_ARGUMENT, "no-such-ref")
    still_answerable(dash, paused)


def test_restart_input_must_equal_the_interrupted_one(dash: Dashboard) -> None:
    paused = dash.paused("Transfer $14 to modified")
    [item] = paused.interrupts
    changed = decision(
        paused.snapshot_id,
        paused.resume_token,
        restart=[
            {
                "name": item.name,
                "ref": item.ref,
                "input": {"amount": 14000, "toAccount": "modified"},
                "resumed": {"approved": True},
            }
        ],
    )
    rejected(dash, changed, Status.INVALID_ARGUMENT, "input")
    # the same input, in another key order and 14 for 14.0, is accepted
    same = decision(
        paused.snapshot_id,
        paused.resume_token,
        restart=[
            {
                "name": item.name,
                "ref": item.ref,
                "input": {"toAccount": "modified", "amount": 14},
                "resumed": {"approved": True},
            }
        ],
    )
    dash.publish_json(same)
    done = dash.resumed_turn(dash.outcome(same["decision_id"]))
    assert done.type == "turn.completed"
    assert "transferred $14.00 to modified" in done.message.text  # type: ignore[attr-defined]


def test_a_null_restart_input_means_the_stored_one(dash: Dashboard) -> None:
    """A client that writes every field sends `"input": null`: the stored input is
    used, as when the field is absent."""
    paused = dash.paused("Transfer $17 to nulls")
    [item] = paused.interrupts
    body = decision(
        paused.snapshot_id,
        paused.resume_token,
        restart=[
            {"name": item.name, "ref": item.ref, "input": None, "resumed": {"approved": True}}
        ],
    )
    dash.publish_json(body)
    done = dash.resumed_turn(dash.outcome(body["decision_id"]))
    assert done.type == "turn.completed", done.model_dump_json()
    assert "transferred $17.00 to nulls" in done.message.text  # type: ignore[attr-defined]


def test_null_fields_count_as_absent(dash: Dashboard) -> None:
    """A client that writes every field (Go's encoding/json writes a nil slice as null)
    sends `"respond": null` beside its restarts: the decision is read as without it. A
    null token is no token: PERMISSION_DENIED, not a malformed decision."""
    paused = dash.paused("Transfer $19 to go-client")
    no_token = decision(paused.snapshot_id, None, restart=restart_all(paused))
    no_token.update(resume_token=None, respond=None, reviewer=None)
    event = rejected(dash, no_token, Status.PERMISSION_DENIED, "resume_token")
    assert event.snapshot_id == paused.snapshot_id
    body = decision(paused.snapshot_id, paused.resume_token, restart=restart_all(paused))
    body.update(respond=None, reviewer=None)
    dash.publish_json(body)
    done = dash.resumed_turn(dash.outcome(body["decision_id"]))
    assert done.type == "turn.completed", done.model_dump_json()
    assert "transferred $19.00 to go-client" in done.message.text  # type: ignore[attr-defined]


def test_a_decision_with_a_byte_order_mark_is_read(dash: Dashboard) -> None:
    paused = dash.paused("Transfer $18 to marked")
    body = decision(paused.snapshot_id, paused.resume_token, restart=restart_all(paused))
    raw = "\ufeff".encode() + json.dumps(body).encode()
    dash.publish_raw(raw, "application/json", exchange="interlock.decisions")
    done = dash.resumed_turn(dash.outcome(body["decision_id"]))
    assert done.type == "turn.completed", done.model_dump_json()


def test_partial_answer_is_invalid_argument(dash: Dashboard) -> None:
    paused = dash.paused("Transfer $15 to first and $16 to second")
    first, second = paused.interrupts
    body = decision(
        paused.snapshot_id,
        paused.resume_token,
        restart=[{"name": first.name, "ref": first.ref, "resumed": {"approved": True}}],
    )
    rejected(dash, body, Status.INVALID_ARGUMENT, second.ref)
    still_answerable(dash, paused)


def test_unknown_snapshot_is_not_found(dash: Dashboard) -> None:
    body = decision(f"no-such-snapshot-{uuid.uuid4()}", "token", restart=[])
    event = rejected(dash, body, Status.NOT_FOUND)
    assert event.snapshot_id == body["snapshot_id"]
    assert (event.agent, event.session_id) == (None, None), "no snapshot: neither is known"


def test_a_snapshot_that_did_not_pause_is_failed_precondition(dash: Dashboard) -> None:
    """The turn that answered a pause ended `stop`: a decision naming its snapshot is
    refused for what that snapshot is, with the token of the pause or with none."""
    paused = dash.paused("Transfer $16 to finished")
    done = dash.resolve(paused)
    assert done.type == "turn.completed"
    for token in (paused.resume_token, "any"):
        body = decision(done.snapshot_id, token, restart=restart_all(paused))
        event = rejected(dash, body, Status.FAILED_PRECONDITION, "is not interrupted")
        assert event.snapshot_id == done.snapshot_id


def test_double_decision_one_accepted_one_failed_precondition(dash: Dashboard) -> None:
    paused = dash.paused("Transfer $17 to double")
    approve = dash.approve_all(paused, approved=True)
    deny = dash.approve_all(paused, approved=False)
    dash.publish_json(approve)
    dash.publish_json(deny)
    first, second = dash.outcome(approve["decision_id"]), dash.outcome(deny["decision_id"])
    assert first.type == "decision.accepted", first.model_dump_json()
    assert second.type == "decision.rejected", second.model_dump_json()
    assert second.error.status == Status.FAILED_PRECONDITION  # type: ignore[attr-defined]
    assert "already resumed" in second.error.message  # type: ignore[attr-defined]
    done = dash.resumed_turn(first)
    assert "transferred $17.00 to double" in done.message.text  # type: ignore[attr-defined]

    # exactly one outcome each, and exactly one resumed turn
    dash.consumer_barrier()
    dash.worker_barrier()
    assert len(dash.outcomes(approve["decision_id"])) == 1
    assert len(dash.outcomes(deny["decision_id"])) == 1
    turns = {
        e.event_id
        for e in dash.events(lambda e: e.session_id == paused.session_id)
        if e.type.startswith("turn.")
    }
    assert len(turns) == 2  # the pause and the one completion


def test_repeated_decision_id_gets_its_first_outcome_again(dash: Dashboard) -> None:
    paused = dash.paused("Transfer $18 to repeated")
    body = dash.approve_all(paused)
    dash.publish_json(body)
    first = dash.outcome(body["decision_id"])
    assert first.type == "decision.accepted"
    dash.resumed_turn(first)

    dash.publish_json(body)  # redelivered, or sent twice by the dashboard
    again = dash.outcome(body["decision_id"], nth=2)
    assert again.model_dump() == first.model_dump()  # the same event, same event_id

    dash.worker_barrier()  # had a second resume been enqueued, it has run by now
    completions = {
        e.event_id
        for e in dash.events(lambda e: e.session_id == paused.session_id)
        if e.type == "turn.completed"
    }
    assert len(completions) == 1


def test_repeated_rejected_decision_id_is_not_evaluated_again(dash: Dashboard) -> None:
    paused = dash.paused("Transfer $19 to repeated-rejection")
    body = decision(paused.snapshot_id, "wrong", restart=restart_all(paused))
    first = rejected(dash, body, Status.PERMISSION_DENIED)
    # the same decision_id, now with the right token: still the first outcome
    dash.publish_json({**body, "resume_token": paused.resume_token})
    again = dash.outcome(body["decision_id"], nth=2)
    assert again.model_dump() == first.model_dump()
    still_answerable(dash, paused)


# -------------------------------------------------------------------------- rule 1


NOT_JSON = b"\x00\xffnot json"


def unreadable(
    dash: Dashboard,
    stack: QueueStack,
    body: bytes,
    content_type: str,
    reason: str,
    headers: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], str | None]:
    """Publish a body the consumer cannot read: its one outcome is decision.rejected,
    INVALID_ARGUMENT naming `reason`, decision_id null, and it is dead-lettered.
    Returns the event (wire form) and the dead letter (envelope, headers, type)."""
    nonce = str(uuid.uuid4())
    dead = dead_reader(stack.broker_url)
    try:
        dash.publish_raw(body, content_type, headers={**(headers or {}), "x-test-nonce": nonce})
        event = dash.wait(
            lambda e: e.type == "decision.rejected" and reason in e.model_dump_json(),
            f"decision.rejected naming {reason!r}",
        )
        envelope, dead_headers, dead_type = dead.wait(
            lambda m: m.get("headers", {}).get("x-test-nonce") == nonce, "dead letter"
        )
    finally:
        dead.close()
    wire = event.model_dump(mode="json")
    assert wire["decision_id"] is None
    assert wire["error"]["status"] == "INVALID_ARGUMENT"
    assert reason in wire["error"]["message"]
    # the dead letter names the rejection that announced it (and no decision id), and
    # carries its schema_version as every message of the queues does
    assert (envelope["decision_id"], envelope["event_id"]) == (None, wire["event_id"]), envelope
    assert envelope["schema_version"] == 1, envelope
    return wire, envelope, dead_headers, dead_type


@pytest.mark.parametrize(
    ("content_type", "body", "reason"),
    [
        ("application/json", NOT_JSON, "not JSON"),
        ("application/x-python-serialize", b"\x80\x04\x95garbage.", "content type"),
    ],
    ids=["not-json", "pickle"],
)
def test_unreadable_body_is_rejected_and_dead_lettered(
    dash: Dashboard, stack: QueueStack, content_type: str, body: bytes, reason: str
) -> None:
    wire, envelope, headers, dead_type = unreadable(dash, stack, body, content_type, reason)
    # kept on interlock.decisions.dead with the reason, and the body, byte for byte
    assert dead_type == "application/json"
    assert envelope["reason"] == wire["error"]["message"]
    assert headers.get("x-reason") == envelope["reason"]
    assert base64.b64decode(envelope["body_base64"]) == body


def test_a_dead_letter_sent_twice_names_one_decision_and_one_outcome(
    dash: Dashboard, stack: QueueStack
) -> None:
    """An unreadable decision with a readable id, delivered twice (a client resending,
    a consumer killed before its ack): kept twice, as each delivery was, and both dead
    letters name its decision_id and the event_id of its one outcome, published again
    the second time. A reader pairs them with the rejection and drops the repeat."""
    decision_id = str(uuid.uuid4())
    body = {"schema_version": 2, "decision_id": decision_id, "snapshot_id": "s"}
    nonces = [str(uuid.uuid4()), str(uuid.uuid4())]
    dead = dead_reader(stack.broker_url)
    try:
        letters = []
        for nth, nonce in enumerate(nonces, start=1):
            dash.publish_json(body, headers={"x-test-nonce": nonce})
            event = dash.outcome(decision_id, nth)

            def tagged(m: dict[str, Any], n: str = nonce) -> bool:
                return bool(m.get("headers", {}).get("x-test-nonce") == n)

            letter, _headers, _type = dead.wait(tagged, "dead letter")
            letters.append((event.model_dump(mode="json"), letter))
    finally:
        dead.close()
    (first, one), (again, two) = letters
    assert first["type"] == "decision.rejected" and first["error"]["status"] == "INVALID_ARGUMENT"
    assert again == first, "the first outcome, published again"
    for letter in (one, two):
        assert letter["decision_id"] == decision_id, letter
        assert letter["event_id"] == first["event_id"], letter
        assert "schema_version" in letter["reason"], letter


def test_a_decision_of_the_wrong_content_type_is_rejected_under_its_id(
    dash: Dashboard, stack: QueueStack
) -> None:
    """A decision sent as application/xml is refused, but its id could be read: the
    rejection carries it, so the sender can tell which of its decisions it answers."""
    paused = dash.paused("Transfer $25 to xml")
    body = decision(paused.snapshot_id, paused.resume_token, restart=restart_all(paused))
    dash.publish_raw(json.dumps(body).encode(), "application/xml")
    event = dash.outcome(body["decision_id"])
    wire = event.model_dump(mode="json")
    assert event.type == "decision.rejected", wire
    assert wire["error"]["status"] == "INVALID_ARGUMENT"
    assert "content type 'application/xml' is not accepted" in wire["error"]["message"]
    still_answerable(dash, paused)


@pytest.mark.parametrize(
    ("body", "compression", "reason"),
    [
        (
            b"not zlib at all",
            "application/x-gzip",
            "cannot be decoded (compression 'application/x-gzip')",
        ),
        (
            zlib.compress(b" " * (MAX_DECISION_BYTES + 1)),
            "application/x-gzip",
            f"inflates to more than {MAX_DECISION_BYTES} bytes",
        ),
        (
            bz2.compress(b" " * (4 * MAX_DECISION_BYTES)),
            "application/x-bz2",
            f"inflates to more than {MAX_DECISION_BYTES} bytes",
        ),
        (
            b"{}",
            "application/x-nonesuch",
            "cannot be decoded (compression 'application/x-nonesuch')",
        ),
    ],
    ids=["corrupt", "zlib-past-the-limit", "bzip2-past-the-limit", "unknown-codec"],
)
def test_a_body_kombu_cannot_inflate_is_rejected_and_kept(
    dash: Dashboard, stack: QueueStack, body: bytes, compression: str, reason: str
) -> None:
    """kombu inflates a body whose headers name a `compression` before the consumer sees
    it. One it cannot inflate (corrupt, an unknown codec) it used to ack and drop, with
    no outcome; one that inflates past the decision limit it inflated whole, in memory.
    Both are refused with decision.rejected (decision_id null) and kept, as received, on
    the dead-letter queue; the consumer goes on."""
    paused = dash.paused("Transfer $26 to compressed")
    headers = {"compression": compression}
    wire, envelope, _, _ = unreadable(dash, stack, body, "application/json", reason, headers)
    assert envelope["reason"] == wire["error"]["message"]
    assert base64.b64decode(envelope["body_base64"]) == body, "kept as received"
    marked = envelope["headers"]["x-interlock-unreadable"]  # docs/queues.md says so
    assert marked.startswith(f"the body cannot be decoded (compression {compression!r})"), marked
    assert envelope["headers"]["compression"] == compression, "the message's own, kept"
    assert stack.consumer is not None and stack.consumer.alive
    still_answerable(dash, paused)


@pytest.mark.parametrize("compress", [zlib.compress, gzip.compress], ids=["zlib", "gzip"])
def test_a_compressed_decision_is_read(dash: Dashboard, compress: Callable[[bytes], bytes]) -> None:
    """Compression within the limit works as kombu's users expect, and `x-gzip` also
    takes a gzip file's stream, as other languages' gzip functions write it."""
    paused = dash.paused("Transfer $27 to zipped")
    body = decision(paused.snapshot_id, paused.resume_token, restart=restart_all(paused))
    packed = compress(json.dumps(body).encode())
    dash.publish_raw(packed, "application/json", headers={"compression": "application/x-gzip"})
    accepted = dash.outcome(body["decision_id"])
    assert accepted.type == "decision.accepted", accepted.model_dump_json()
    done = dash.resumed_turn(accepted)
    assert done.type == "turn.completed", done.model_dump_json()


def push_item(stack: QueueStack, item: bytes | str) -> None:
    """Put `item` on the decisions queue's Redis list as it is, as a client that speaks
    Redis and not kombu would."""
    client = redis.Redis.from_url(stack.broker_url)
    try:
        client.lpush("interlock.decisions", item)
    finally:
        client.close()


def _broken_envelope(body: str) -> bytes:
    """A kombu message as it lies on the Redis list, whose base64 body is not base64."""
    properties = {
        "body_encoding": "base64",
        "delivery_tag": str(uuid.uuid4()),
        "delivery_info": {"exchange": "", "routing_key": "interlock.decisions"},
        "delivery_mode": 2,
        "priority": 0,
    }
    envelope = {"body": body, "content-type": "application/json", "headers": {}}
    return json.dumps({**envelope, "content-encoding": "utf-8", "properties": properties}).encode()


@pytest.mark.parametrize(
    ("item", "reason"),
    [
        (NOT_JSON, "the queue item is not JSON"),
        (b"hello, resume consumer", "the queue item is not JSON"),
        (b"[1, 2]", "a JSON list, not a kombu message"),
        (_broken_envelope("!!!not base64"), "body cannot be decoded as 'base64'"),
        (b'{"body": "x", "properties": "p"}', "no properties with a delivery_tag"),
        (b'{"schema_version": 1, "reviewer": "\xff"}', "the queue item is not JSON: 'utf-8'"),
    ],
    ids=["bytes", "text", "array", "bad-base64", "bad-properties", "not-utf8"],
)
def test_a_queue_item_that_is_no_message_is_rejected_and_kept(
    dash: Dashboard, stack: QueueStack, item: bytes, reason: str
) -> None:
    """An item a client pushed onto the Redis list itself, that kombu cannot read as a
    message: before, it was popped and lost, and the consumer stopped. It is answered with
    decision.rejected (decision_id null) and kept on the dead-letter queue byte for byte;
    the consumer goes on."""
    paused = dash.paused("Transfer $23 to raw-item")
    dead = dead_reader(stack.broker_url)
    try:
        push_item(stack, item)
        event = dash.wait(
            lambda e: e.type == "decision.rejected" and reason in e.model_dump_json(),
            "decision.rejected naming the item's fault",
        )
        envelope, _, _ = dead.wait(
            lambda m: base64.b64decode(m["body_base64"]) == item, "the item on the dead letters"
        )
    finally:
        dead.close()
    wire = event.model_dump(mode="json")
    assert wire["decision_id"] is None
    assert wire["error"]["status"] == "INVALID_ARGUMENT"
    assert envelope["reason"] == wire["error"]["message"]
    assert stack.consumer is not None and stack.consumer.alive
    still_answerable(dash, paused)


def test_an_item_that_is_no_message_but_names_its_decision_is_rejected_under_that_id(
    dash: Dashboard, stack: QueueStack
) -> None:
    """A bare decision that happens to carry a top-level `properties` field looks like
    a broken kombu envelope: refused as such, but under its decision_id (and with its
    snapshot_id), so that its sender can match the rejection."""
    paused = dash.paused("Transfer $25 to odd-fields")
    body = {
        **decision(paused.snapshot_id, paused.resume_token, restart=restart_all(paused)),
        "body": "x",
        "properties": "p",
    }
    push_item(stack, json.dumps(body))
    event = dash.outcome(body["decision_id"])
    wire = event.model_dump(mode="json")
    assert wire["type"] == "decision.rejected", wire
    assert wire["error"]["status"] == "INVALID_ARGUMENT"
    assert "no properties with a delivery_tag" in wire["error"]["message"]
    assert wire["snapshot_id"] == paused.snapshot_id
    still_answerable(dash, paused)


@pytest.mark.parametrize(
    ("extra", "mark"),
    [({}, b""), ({"body": "looks right to me"}, b""), ({}, "\ufeff".encode())],
    ids=["plain", "body", "byte-order-mark"],
)
def test_a_bare_decision_pushed_onto_the_list_is_read(
    dash: Dashboard, stack: QueueStack, extra: dict[str, Any], mark: bytes
) -> None:
    """A decision's JSON pushed onto the Redis list as it is, with no kombu envelope
    (the simplest client in another language): read as the decision it is, also with a
    `body` field of its own (it names its schema_version: no envelope), and after a
    leading byte order mark, which docs/queues.md says is ignored (it used to make the
    item "not JSON")."""
    paused = dash.paused("Transfer $24 to bare-push")
    body = {
        **decision(paused.snapshot_id, paused.resume_token, restart=restart_all(paused)),
        **extra,
    }
    push_item(stack, mark + json.dumps(body).encode())
    accepted = dash.outcome(body["decision_id"])
    assert accepted.type == "decision.accepted", accepted.model_dump_json()
    done = dash.resumed_turn(accepted)
    assert done.type == "turn.completed", done.model_dump_json()


def test_a_ref_in_both_lists_is_answered_by_its_respond_entry(
    dash: Dashboard, stack: QueueStack
) -> None:
    """docs/queues.md (semantics rule 5): respond wins; the decision is accepted, the
    restart entry dropped: the approval in it is not applied. The consumer's log says so,
    for the operator of a client that did not mean it."""
    paused = dash.paused("Transfer $30 to both-lists")
    declined = [
        {"name": i.name, "ref": i.ref, "output": {"success": False}} for i in paused.interrupts
    ]
    body = decision(
        paused.snapshot_id, paused.resume_token, restart=restart_all(paused), respond=declined
    )
    dash.publish_json(body)
    accepted = dash.outcome(body["decision_id"])
    assert accepted.type == "decision.accepted", accepted.model_dump_json()
    done = dash.resumed_turn(accepted)
    assert done.type == "turn.completed", done.model_dump_json()
    assert "declined" in done.message.text, done.model_dump_json()  # type: ignore[attr-defined]
    assert "txn-" not in done.message.text  # type: ignore[attr-defined]
    refs = ", ".join(i.ref for i in paused.interrupts)
    said = f"decision {body['decision_id']} answers {refs} in both respond and restart"
    eventually(lambda: said in stack.logs(20_000), "the consumer's warning")


def test_the_smallest_envelope_the_docs_allow_is_read(dash: Dashboard, stack: QueueStack) -> None:
    """docs/queues.md: of a kombu envelope only `body` and `properties.delivery_tag` are
    required, and without `body_encoding` the body is the JSON text itself."""
    paused = dash.paused("Transfer $28 to small-envelope")
    body = decision(paused.snapshot_id, paused.resume_token, restart=restart_all(paused))
    item = {"body": json.dumps(body), "properties": {"delivery_tag": str(uuid.uuid4())}}
    push_item(stack, json.dumps(item))
    accepted = dash.outcome(body["decision_id"])
    assert accepted.type == "decision.accepted", accepted.model_dump_json()
    done = dash.resumed_turn(accepted)
    assert done.type == "turn.completed", done.model_dump_json()


def test_an_envelope_with_null_headers_is_no_message(dash: Dashboard, stack: QueueStack) -> None:
    """docs/queues.md: `headers`, when given, must be an object."""
    paused = dash.paused("Transfer $29 to null-headers")
    body = decision(paused.snapshot_id, paused.resume_token, restart=restart_all(paused))
    properties = {"delivery_tag": str(uuid.uuid4()), "body_encoding": "base64"}
    encoded = base64.b64encode(json.dumps(body).encode()).decode()
    push_item(stack, json.dumps({"body": encoded, "headers": None, "properties": properties}))
    event = dash.wait(
        lambda e: e.type == "decision.rejected" and "headers are not" in e.model_dump_json(),
        "decision.rejected naming the headers",
    )
    assert event.model_dump(mode="json")["error"]["status"] == "INVALID_ARGUMENT"
    still_answerable(dash, paused)


DEEP = "[" * 100_000 + "]" * 100_000
"""Valid JSON nested deeper than any parser's recursion limit."""


@pytest.mark.parametrize(
    ("make", "has_id", "reason"),
    [
        (lambda d: [d], False, "decision must be a JSON object, not an array"),
        (lambda d: {**d, "schema_version": 2}, True, "schema_version"),
        (lambda d: {k: v for k, v in d.items() if k != "schema_version"}, True, "schema_version"),
        (lambda d: {k: v for k, v in d.items() if k != "snapshot_id"}, True, "snapshot_id"),
        (lambda d: {**d, "restart": "all of them"}, True, "restart"),
        (lambda d: {**d, "decision_id": ""}, False, "decision_id"),
        (lambda d: {**d, "reviewer": "x" * MAX_DECISION_BYTES}, True, "limit"),
        (lambda d: DEEP, False, "nested too deeply"),
        (
            lambda d: {**d, "restart": [{"name": "t", "ref": "r", "resumed": {"x": DEEP}}]},
            True,  # its decision_id, at the top level, is read all the same
            "nested",
        ),
        (lambda d: {**d, "decision_id": "nul\u0000id"}, False, "NUL"),
        (lambda d: {**d, "snapshot_id": "nul\u0000snapshot"}, True, "NUL"),
        (lambda d: {**d, "reviewer": "nul\u0000reviewer"}, True, "NUL"),
        (lambda d: {**d, "restart": [{"name": "t\u0000", "ref": "r"}]}, True, "NUL"),
        (lambda d: {**d, "schema_version": True}, True, "unknown schema_version true;"),
        (lambda d: {**d, "reviewer": float("nan")}, True, "NaN is not a JSON value"),
        (lambda d: {**d, "reviewer": float("inf")}, True, "Infinity is not a JSON value"),
        (  # valid JSON, but a double cannot hold it: it would be kept as Infinity
            lambda d: json.dumps({**d, "reviewer": "BIG"}).replace('"BIG"', "1e400"),
            True,
            "1e400 is out of the range of a JSON number (a double)",
        ),
        (  # no UTF-8: a decision_id read with a byte replaced is not the one sent
            lambda d: json.dumps({**d, "decision_id": "BAD"}).encode().replace(b"BAD", b"id\xff"),
            False,
            "decision is not JSON: it is not UTF-8 text (byte 0xff at offset ",
        ),
        (  # no UTF-8 elsewhere: its decision_id is read all the same
            lambda d: json.dumps({**d, "reviewer": "BAD"}).encode().replace(b"BAD", b"\xff"),
            True,
            "decision is not JSON: it is not UTF-8 text (byte 0xff at offset ",
        ),
    ],
    ids=[
        "array",
        "schema-version-2",
        "no-schema-version",
        "no-snapshot",
        "bad-restart",
        "empty-id",
        "too-big",
        "deep",
        "deep-inside",
        "nul-decision-id",
        "nul-snapshot-id",
        "nul-reviewer",
        "nul-tool-name",
        "schema-version-true",
        "nan",
        "infinity",
        "overflow",
        "no-utf8-decision-id",
        "no-utf8-reviewer",
    ],
)
def test_invalid_decision_is_rejected_and_dead_lettered(
    dash: Dashboard, stack: QueueStack, make: Any, has_id: bool, reason: str
) -> None:
    nonce = str(uuid.uuid4())
    base = decision(f"snap-{nonce}", "token", restart=[])
    message = make(base)
    raw = (
        message
        if isinstance(message, bytes)
        else (message if isinstance(message, str) else json.dumps(message)).encode()
    )
    raw = raw.replace(b'"' + DEEP.encode() + b'"', DEEP.encode())  # unquote a nested DEEP
    dead = dead_reader(stack.broker_url)
    try:
        dash.publish_raw(
            raw, "application/json", exchange="interlock.decisions", headers={"x-test-nonce": nonce}
        )
        if has_id:
            event = dash.outcome(base["decision_id"])
        else:
            event = dash.wait(
                lambda e: e.type == "decision.rejected" and e.model_dump()["decision_id"] is None,
                "decision.rejected with decision_id null",
            )
        envelope, _, _ = dead.wait(
            lambda m: m.get("headers", {}).get("x-test-nonce") == nonce, "dead letter"
        )
    finally:
        dead.close()
    assert event.type == "decision.rejected"
    assert event.error.status == Status.INVALID_ARGUMENT, event.error  # type: ignore[attr-defined]
    assert reason in event.error.message, event.error.message  # type: ignore[attr-defined]
    assert envelope["reason"] == event.error.message  # type: ignore[attr-defined]
    assert base64.b64decode(envelope["body_base64"]) == raw
    # A JSON object names its snapshot and reviewer in the rejection, where it gives
    # them as a decision could (text of at most 200 and 500 characters, no NUL).
    try:
        read = json.loads(raw)
    except (ValueError, RecursionError):
        read = None
    given = read if isinstance(read, dict) else {}
    named, reviewer = given.get("snapshot_id"), given.get("reviewer")
    assert event.snapshot_id == (named if isinstance(named, str) and "\x00" not in named else None)
    assert event.reviewer == (  # type: ignore[attr-defined]
        reviewer
        if isinstance(reviewer, str) and len(reviewer) <= 500 and "\x00" not in reviewer
        else None
    )


def test_absurdly_nested_restart_input_is_rejected(dash: Dashboard, stack: QueueStack) -> None:
    """An input nested 400 levels deep (valid JSON, within the size limit) is a changed
    input: rejected once with INVALID_ARGUMENT, never requeued; the turn is untouched."""
    paused = dash.paused("Transfer $22 to deep-input")
    [item] = paused.interrupts
    body = decision(
        paused.snapshot_id,
        paused.resume_token,
        restart=[{"name": item.name, "ref": item.ref, "input": "DEEP", "resumed": {}}],
    )
    raw = json.dumps(body).replace('"DEEP"', "[" * 400 + "]" * 400).encode()
    dash.publish_raw(raw, "application/json", exchange="interlock.decisions")
    event = dash.outcome(body["decision_id"])
    assert event.type == "decision.rejected", event.model_dump_json()
    assert event.error.status == Status.INVALID_ARGUMENT, event.error  # type: ignore[attr-defined]
    assert "changed its input" in event.error.message  # type: ignore[attr-defined]
    assert event.snapshot_id == paused.snapshot_id
    still_answerable(dash, paused)


def test_empty_resume_data_is_checked_by_the_consumer(dash: Dashboard, stack: QueueStack) -> None:
    """`resumed: {}` is resume data like any other: the consumer refuses it against the
    tool's Resume type (ApprovalReply needs `approved`), rather than accepting it and
    leaving the tool to fail the turn."""
    paused = dash.paused("Transfer $23 to empty-reply")
    [item] = paused.interrupts
    body = decision(
        paused.snapshot_id,
        paused.resume_token,
        restart=[{"name": item.name, "ref": item.ref, "resumed": {}}],
    )
    dash.publish_json(body)
    event = dash.outcome(body["decision_id"])
    assert event.type == "decision.rejected", event.model_dump_json()
    assert event.error.status == Status.INVALID_ARGUMENT, event.error  # type: ignore[attr-defined]
    assert event.error.message == (  # type: ignore[attr-defined]
        "invalid resume data for tool 'transferMoney': approved: Field required"
    )
    still_answerable(dash, paused)


def test_consumer_keeps_serving_after_a_burst_of_bad_input(
    dash: Dashboard, stack: QueueStack
) -> None:
    paused = dash.paused("Transfer $20 to survivor")
    junk: list[tuple[bytes, str]] = [
        (NOT_JSON, "application/json"),
        (b"\x80\x04garbage", "application/x-python-serialize"),
        (b"", "application/json"),
        (b"null", "application/json"),
        (b'{"schema_version": 1}', "application/json"),
        (b"<decision/>", "application/xml"),
        (DEEP.encode(), "application/json"),
        (
            b'{"schema_version": 1, "decision_id": "a\\u0000", "snapshot_id": "s"}',
            "application/json",
        ),
    ]
    for body, content_type in junk:
        dash.publish_raw(body, content_type)
    wrong = decision(paused.snapshot_id, "wrong", restart=restart_all(paused))
    dash.publish_json(wrong)
    # after all that, a valid decision on the same paused turn is accepted and runs
    still_answerable(dash, paused)
    nulls = dash.events(
        lambda e: e.type == "decision.rejected" and e.model_dump()["decision_id"] is None
    )
    assert len(nulls) == len(junk)
    assert {e.error.status for e in nulls} == {Status.INVALID_ARGUMENT}  # type: ignore[attr-defined]
    assert dash.outcomes(wrong["decision_id"])[0].error.status == Status.PERMISSION_DENIED  # type: ignore[attr-defined]
    # and a fresh turn goes through too
    assert dash.resolve(dash.paused("Transfer $21 to after")).type == "turn.completed"
    assert stack.consumer is not None and stack.consumer.alive
