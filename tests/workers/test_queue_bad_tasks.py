"""Bad messages on `interlock.turns` against a real worker: what it cannot run as a task
(an undecodable body, a content type it refuses, no Celery task headers, a task it does
not know) is kept on `interlock.turns.dead` with the reason and the bytes as sent, and
gone from `interlock.turns`; a task with the wrong arguments is answered with
turn.failed; the worker goes on serving turns."""

from __future__ import annotations

import base64
import json
import pickle
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from events.topology import TURNS
from tests.queue_helpers import (
    Dashboard,
    QueueStack,
    celery_headers,
    dashboard_for,
    dead_turns_reader,
    module_stack,
    put_on_turns,
)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, pg_admin: str) -> Iterator[QueueStack]:
    with module_stack(tmp_path_factory.mktemp("bad-tasks"), pg_admin) as queue_stack:
        yield queue_stack


@pytest.fixture
def dash(stack: QueueStack, request: pytest.FixtureRequest) -> Iterator[Dashboard]:
    with dashboard_for(stack, request) as dashboard:
        yield dashboard


def kept(
    stack: QueueStack, body: bytes, content_type: str, headers: dict[str, Any]
) -> dict[str, Any]:
    """Put a message on interlock.turns; return its dead letter (found by a nonce).
    The worker's log says it was kept, and nothing there says it was discarded."""
    nonce = str(uuid.uuid4())
    assert stack.worker is not None
    logged = len(stack.worker.output())
    dead = dead_turns_reader(stack.broker_url)
    try:
        put_on_turns(stack, body, content_type, {**headers, "x-test-nonce": nonce})
        envelope, dead_headers, dead_type = dead.wait(
            lambda m: m.get("headers", {}).get("x-test-nonce") == nonce,
            "the message on interlock.turns.dead",
        )
    finally:
        dead.close()
    assert dead_type == "application/json"
    assert envelope["schema_version"] == 1, envelope
    assert base64.b64decode(envelope["body_base64"]) == body, "the bytes as they were sent"
    assert envelope["content_type"] == content_type
    assert dead_headers.get("x-reason") == envelope["reason"][:500]
    assert_gone(stack, nonce)  # acked or rejected: Celery's handling has run
    log = stack.worker.output()[logged:]
    assert (
        f"kept a message of interlock.turns on interlock.turns.dead, not run: {envelope['reason']}"
        in log
    ), log
    for celerys in ("discarded", "deleted", "Can't decode message body"):
        assert celerys not in log, log
    return envelope


def assert_gone(stack: QueueStack, nonce: str) -> None:
    """Not left on interlock.turns, nor held unacknowledged by the worker (it would come
    back after the visibility timeout)."""
    client = redis.Redis.from_url(stack.broker_url)
    try:
        deadline = time.monotonic() + 10
        while True:
            waiting = [m for m in client.lrange(TURNS, 0, -1) if nonce.encode() in m]
            unacked = [
                v
                for key in client.scan_iter("*unacked*")
                if client.type(key) == b"hash"
                for v in client.hvals(key)
                if nonce.encode() in v
            ]
            if not waiting and not unacked:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"still on {TURNS}: {waiting!r}; unacked: {unacked!r}")
            time.sleep(0.1)
    finally:
        client.close()


def still_serving(dash: Dashboard) -> None:
    paused = dash.paused(f"Transfer $7 to after-{uuid.uuid4().hex[:6]}")
    done = dash.resolve(paused)
    assert done.type == "turn.completed", done.model_dump_json()


def test_an_undecodable_body_is_kept_with_the_reason(stack: QueueStack, dash: Dashboard) -> None:
    body = b'[[{"turn_id": "t-1", '  # cut short
    envelope = kept(stack, body, "application/json", celery_headers())
    assert envelope["reason"].startswith("the task message cannot be decoded: "), envelope
    assert envelope["headers"]["task"] == "interlock.run_turn"
    # the headers as JSON values: null stays null, a number a number
    assert (envelope["headers"]["parent_id"], envelope["headers"]["retries"]) == (None, 0)
    assert envelope["body"] == body.decode()
    still_serving(dash)


def test_a_pickled_task_is_kept_and_never_unpickled(stack: QueueStack, dash: Dashboard) -> None:
    body = pickle.dumps(((), {}, {}))
    envelope = kept(stack, body, "application/x-python-serialize", celery_headers())
    assert envelope["reason"].startswith("invalid task message: "), envelope
    assert "pickle" in envelope["reason"], envelope
    still_serving(dash)


def test_an_unknown_task_is_kept_with_its_name(stack: QueueStack, dash: Dashboard) -> None:
    body = json.dumps([["x"], {}, {"callbacks": None, "errbacks": None}]).encode()
    envelope = kept(stack, body, "application/json", celery_headers(task="interlock.run_tunr"))
    assert envelope["reason"] == (
        "unknown task 'interlock.run_tunr': this queue runs interlock.run_turn"
    ), envelope
    still_serving(dash)


_REQUEST = {"turn_id": "t-shape", "agent": "bankingAgent", "input": {"message": None}}
_MALFORMED_BODY = (
    "invalid task message: the task body must be the JSON list [args, kwargs, options]: "
    "a list, two objects"
)


@pytest.mark.parametrize(
    ("body", "headers", "reason"),
    [
        ([[_REQUEST], {}], None, _MALFORMED_BODY),
        ([_REQUEST], None, _MALFORMED_BODY),
        ({"request": _REQUEST}, None, _MALFORMED_BODY),
        (None, None, _MALFORMED_BODY),
        ([[_REQUEST], {}, {}], {"task": "interlock.run_turn"}, "has no id header"),
    ],
    ids=["two-items", "bare-list", "object", "null", "no-id"],
)
def test_a_task_message_celery_would_trip_on_is_kept(
    stack: QueueStack, dash: Dashboard, body: Any, headers: dict[str, Any] | None, reason: str
) -> None:
    """Celery itself fails outside its own checks on these: a body that is no list of
    three stops the worker (and, put back, the next one), and a missing `id` header
    restarts its consumer over and over. They are kept like any unrunnable message, and
    the worker goes on."""
    raw = json.dumps(body).encode()
    envelope = kept(stack, raw, "application/json", headers or celery_headers())
    assert reason in envelope["reason"], envelope
    assert stack.worker is not None and stack.worker.alive
    still_serving(dash)


def test_a_message_that_is_no_task_is_kept(stack: QueueStack, dash: Dashboard) -> None:
    """A decision sent to the wrong queue, say: no Celery headers at all."""
    body = json.dumps({"schema_version": 1, "decision_id": str(uuid.uuid4())}).encode()
    envelope = kept(stack, body, "application/json", {})
    assert envelope["reason"] == "not a Celery task message: it names no task", envelope
    assert json.loads(envelope["body"])["schema_version"] == 1
    still_serving(dash)


@pytest.mark.parametrize(
    ("item", "why"),
    [
        (b"run my turn, please", "the queue item is not JSON: "),
        (b"[1, 2]", "the queue item is a JSON list, not a kombu message"),
    ],
    ids=["text", "array"],
)
def test_an_item_pushed_onto_the_list_that_is_no_message_is_kept_as_such(
    stack: QueueStack, dash: Dashboard, item: bytes, why: str
) -> None:
    """An item a client pushed onto the Redis list `interlock.turns` itself, that is no
    kombu message: kept with a reason that says so (and not Celery's "Refusing to
    deserialize ... application/octet-stream", which named the content type Interlock's
    transport gave the bytes), the exact bytes kept."""
    assert stack.worker is not None
    dead = dead_turns_reader(stack.broker_url)
    client = redis.Redis.from_url(stack.broker_url)
    try:
        client.lpush(TURNS, item)
        envelope, _, _ = dead.wait(
            lambda m: base64.b64decode(m["body_base64"]) == item, "the item on the dead letters"
        )
    finally:
        client.close()
        dead.close()
    assert envelope["reason"].startswith(f"not a Celery task message: {why}"), envelope
    assert "Refusing to deserialize" not in envelope["reason"], envelope
    assert envelope["headers"]["x-interlock-unreadable"] in envelope["reason"], envelope
    still_serving(dash)


def test_a_task_with_no_argument_is_answered_with_turn_failed(
    stack: QueueStack, dash: Dashboard
) -> None:
    headers = celery_headers()
    body = json.dumps([[], {}, {"callbacks": None, "errbacks": None}]).encode()
    put_on_turns(stack, body, "application/json", headers)
    failed = dash.wait(
        lambda e: e.type == "turn.failed" and "got 0 positional arguments" in e.model_dump_json(),
        "turn.failed for a task with no argument",
    )
    wire = failed.model_dump(mode="json")
    assert wire["error"]["status"] == "INVALID_ARGUMENT", wire
    assert wire["error"]["message"] == (
        "invalid run_turn request: the task takes one argument, the request; "
        "got 0 positional arguments"
    )
    assert_gone(stack, headers["id"])
    still_serving(dash)


class _Received:
    """What the consumer is handed for a message (only what it reads of one)."""

    def __init__(self, exchange: str = "interlock.turns") -> None:
        self.body = b"\x80not json"
        self.headers = {"task": "interlock.run_turn", "id": "t-unreachable"}
        self.content_type = "application/json"
        self.content_encoding = "utf-8"
        self.delivery_info = {"exchange": exchange, "routing_key": "interlock.turns"}
        self.acked = False

    def ack(self) -> None:
        self.acked = True


def _unreachable_consumer(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The worker's task consumer of an app whose broker nothing listens for."""
    import socket

    import events.publisher as publisher_module
    from workers.app import create_app
    from workers.settings import Settings
    from workers.task_consumer import TaskConsumer

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setitem(publisher_module.RETRY_POLICY, "max_retries", 1)
    monkeypatch.setitem(publisher_module.RETRY_POLICY, "interval_start", 0)
    app = create_app(Settings(broker_url=f"redis://127.0.0.1:{port}/0"))
    consumer = object.__new__(TaskConsumer)  # its message callbacks need no running worker
    consumer.app = app
    return consumer


def test_a_request_given_as_keyword_arguments_runs(stack: QueueStack, dash: Dashboard) -> None:
    """`send_task("interlock.run_turn", kwargs={"turn_id": ..., "agent": ..., ...})`, the
    request's fields as keyword arguments, runs the turn as the one-argument form does."""
    turn_id = str(uuid.uuid4())
    request = {
        "schema_version": 1,
        "turn_id": turn_id,
        "agent": "bankingAgent",
        "input": {"message": {"role": "user", "content": [{"text": "Transfer $6 to kw"}]}},
    }
    body = json.dumps([[], request, {"callbacks": None, "errbacks": None}]).encode()
    put_on_turns(stack, body, "application/json", celery_headers())
    paused = dash.wait(
        lambda e: e.type == "turn.interrupted" and e.turn_id == turn_id,
        "turn.interrupted for the keyword-argument task",
    )
    wire = paused.model_dump(mode="json")
    assert [i["name"] for i in wire["interrupts"]] == ["transferMoney"], wire
    assert wire["interrupts"][0]["input"]["amount"] == 6, wire
    still_serving(dash)


def test_a_dead_letter_the_broker_refuses_leaves_the_message_to_the_broker(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The broker cannot take the dead letter (here: nothing listens where it should
    be): the message is not acked, so the broker delivers it again later."""
    consumer = _unreachable_consumer(monkeypatch)
    message = _Received()
    consumer.on_decode_error(message, ValueError("not JSON"))
    assert not message.acked
    assert "could not keep an unrunnable message on interlock.turns.dead" in caplog.text
    assert "left to the broker, to be delivered again" in caplog.text


def test_an_undecodable_remote_control_message_goes_celerys_way(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Celery's own messages (the worker's remote control, on `celery.pidbox`) share
    the decode-error callback: they are not kept on interlock.turns.dead."""
    consumer = _unreachable_consumer(monkeypatch)
    message = _Received(exchange="celery.pidbox")
    message.delivery_info["routing_key"] = ""
    consumer.on_decode_error(message, ValueError("not JSON"))
    assert message.acked, "Celery acks it after logging it"
    assert "interlock.turns.dead" not in caplog.text
