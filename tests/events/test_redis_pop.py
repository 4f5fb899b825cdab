"""Queue reads on Redis that cannot lose a message: the pop and its record as unacked
are one step (events/redis_pop.py), so a consumer dying the instant it has a message
leaves it for the visibility timeout's restore."""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from queue import Empty
from typing import Any

import pytest
import redis
from kombu.connection import Connection
from kombu.entity import Exchange, Queue
from kombu.message import Message
from kombu.transport import redis as kombu_redis

from events.redis_pop import (
    HELD,
    QUEUE_ITEM,
    READERS,
    UNRESTORABLE,
    WRAP_LIMIT,
    beat,
    reading_key,
    refused,
    rescue,
)
from events.redis_transport import UNREADABLE, Transport, envelope

ROOT = Path(__file__).resolve().parents[2]

DIES_ON_RECEIPT = """
import os, sys
from kombu.connection import Connection
from kombu.entity import Queue
import events.redis_transport as transport

def die(*args, **kwargs):  # the first step after the reply has reached the client
    os._exit(9)

url, name, mode, where, beat = sys.argv[1:]
setattr(transport, where, die)
options = {"reader_beat": float(beat)}
with Connection(url, transport=transport.Transport, transport_options=options) as conn:
    queue = Queue(name).bind(conn.default_channel)
    if mode == "get":
        queue.get(no_ack=False)
    else:
        with conn.Consumer(queue, callbacks=[lambda body, message: None]):
            conn.drain_events(timeout=10)
sys.exit(0)
"""


@pytest.fixture
def raw(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def name() -> str:
    return f"test.pop.{uuid.uuid4().hex}"


def _commands(client: redis.Redis) -> dict[str, int]:
    stats = client.info("commandstats")
    return {key.removeprefix("cmdstat_"): int(value["calls"]) for key, value in stats.items()}


def _delta(before: dict[str, int], after: dict[str, int], command: str) -> int:
    return after.get(command, 0) - before.get(command, 0)


def _consume(conn: Connection, queue: Queue, count: int, **options: Any) -> list[Message]:
    """`count` messages of `queue`. Drains in short steps: kombu restores unacked
    messages past the visibility timeout when a step ends with nothing read."""
    got: list[Message] = []
    deadline = time.monotonic() + 20
    with conn.Consumer(queue, callbacks=[lambda body, message: got.append(message)], **options):
        while len(got) < count:
            assert time.monotonic() < deadline, f"{len(got)} of {count} messages read"
            with contextlib.suppress(TimeoutError):
                conn.drain_events(timeout=0.5)
    return got


ITEMS = {
    "kombu": None,  # a kombu message, as kombu publishes it
    "bare": b'{"n": 1}',  # a client's own JSON, pushed with LPUSH (docs/queues.md)
    "junk": b"\x00\xffnot json",  # bytes that are no JSON at all
    # envelopes Redis' JSON reader takes and Python's does not: a raw tab in a string, a
    # hex number, a tag that is no UTF-8 (recorded as they are, their records could not
    # be restored)
    "tab": b'{"body": "e30=", "properties": {"delivery_tag": "a\tb", "delivery_info": '
    b'{"exchange": "", "routing_key": "x"}}}',
    "hex": b'{"body": "e30=", "n": 0x10, "properties": {"delivery_tag": "h", "delivery_info": '
    b'{"exchange": "", "routing_key": "x"}}}',
    "latin": b'{"body": "e30=", "properties": {"delivery_tag": "\xff", "delivery_info": '
    b'{"exchange": "", "routing_key": "x"}}}',
    # an envelope with no delivery_info: read as one on kombu's default exchange
    "noinfo": b'{"body": "eyJuIjogMX0=", "content-type": "application/json", '
    b'"content-encoding": "utf-8", '
    b'"properties": {"delivery_tag": "ni", "body_encoding": "base64"}}',
}
UNREADABLE_KINDS = ("junk", "tab", "hex", "latin")  # "latin": JSON text is UTF-8


@pytest.mark.parametrize("kind", list(ITEMS))
@pytest.mark.parametrize("mode", ["consume", "get"])
def test_a_consumer_dying_with_a_message_in_hand_loses_nothing(
    redis_url: str, raw: redis.Redis, name: str, mode: str, kind: str
) -> None:
    """A consumer process killed the instant a read's reply reaches it (kombu's own read
    has popped the message and not yet recorded it) leaves the item in the unacked index,
    whatever the item is; the next consumer's restore, past the visibility timeout,
    delivers it as the first read would have."""
    item = ITEMS[kind]
    if item is None:
        with Connection(redis_url, transport=Transport) as conn:
            queue = Queue(name).bind(conn.default_channel)
            queue.declare()
            conn.Producer().publish({"n": 1}, routing_key=name)
    else:
        raw.lpush(name, item)
    _died(redis_url, name, mode, "envelope")
    assert raw.llen(name) == 0, "the consumer took the message off its list"
    [tag] = raw.hkeys("unacked")
    stored, exchange, routing_key = json.loads(raw.hget("unacked", tag) or b"null")
    body = base64.b64decode(stored["body"])
    if item is None:
        assert json.loads(body) == {"n": 1}
    else:
        assert body == item, "the item's exact bytes"
        assert stored["headers"] == {QUEUE_ITEM: 1}
    assert (exchange, routing_key) == ("", name)

    options = {"visibility_timeout": 0, "unacked_restore_throttle": 1}
    with Connection(redis_url, transport=Transport, transport_options=options) as conn:
        queue = Queue(name).bind(conn.default_channel)
        [message] = _consume(conn, queue, 1)
        if kind in UNREADABLE_KINDS:
            assert message.body == item
            assert "the queue item is not JSON" in message.headers[UNREADABLE]
        else:
            assert message.payload == {"n": 1}
            assert UNREADABLE not in message.headers
        if kind == "kombu":
            assert message.delivery_info["redelivered"] is True
        message.ack()
    assert raw.hlen("unacked") == 0 and raw.zcard("unacked_index") == 0
    raw.delete(name)


def test_a_read_records_the_message_as_kombu_does_and_acks_clear_it(
    redis_url: str, raw: redis.Redis, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The record is kombu's own, `[message, exchange, routing_key]` under the delivery
    tag; the read makes no second command for it, and an ack or a reject removes it."""
    appended: list[str] = []
    kombu_append = kombu_redis.QoS.append

    def spy(self: Any, message: Any, delivery_tag: str) -> None:
        appended.append(delivery_tag)
        kombu_append(self, message, delivery_tag)

    monkeypatch.setattr(kombu_redis.QoS, "append", spy)
    exchange = Exchange(f"{name}.x", type="direct")
    with Connection(redis_url, transport=Transport) as conn:
        queue = Queue(name, exchange, routing_key="k").bind(conn.default_channel)
        queue.declare()
        producer = conn.Producer()
        for n in range(3):
            producer.publish({"n": n}, exchange=exchange, routing_key="k")
        before = _commands(raw)
        got = _consume(conn, queue, 3)
        after = _commands(raw)
        assert [m.payload["n"] for m in got] == [0, 1, 2], "oldest first"
        for message in got:
            stored, ex, rk = json.loads(raw.hget("unacked", message.delivery_tag) or b"null")
            assert stored["properties"]["delivery_tag"] == message.delivery_tag
            assert json.loads(base64.b64decode(stored["body"])) == message.payload
            assert (ex, rk) == (exchange.name, "k")
        assert _delta(before, after, "brpop") == 0
        assert appended == [], "kombu's own record (a second command) was not made"
        # one script a message, and the reading list's registration before the first wait
        assert _delta(before, after, "evalsha") == 3 + 1
        assert _delta(before, after, "blmove") >= 1
        got[0].ack()
        got[1].reject()
        got[2].requeue()
        assert raw.hlen("unacked") == 0 and raw.zcard("unacked_index") == 0
        [again] = _consume(conn, queue, 1)
        assert again.payload == {"n": 2} and again.delivery_info["redelivered"] is True
        again.ack()
        queue.delete()


def test_messages_with_a_priority_are_read_in_kombus_order_without_waiting(
    redis_url: str, raw: redis.Redis, name: str
) -> None:
    """The wait watches the list of unprioritized messages; those on a priority's own
    list are popped in kombu's order, and while any are left the next read does not wait
    (a `PING`, not a `BLMOVE` that would block for its timeout)."""
    options = {"brpop_timeout": 30}
    with Connection(redis_url, transport=Transport, transport_options=options) as conn:
        queue = Queue(name, max_priority=9).bind(conn.default_channel)
        queue.declare()
        producer = conn.Producer()
        producer.publish({"n": "plain"}, routing_key=name)
        for n in range(3):
            producer.publish({"n": n}, routing_key=name, priority=6)
        before = _commands(raw)
        got = _consume(conn, queue, 4)
        after = _commands(raw)
        for message in got:
            message.ack()
        queue.delete()
    # kombu's Redis order: the lowest priority number first, FIFO within one
    assert [m.payload["n"] for m in got] == ["plain", 0, 1, 2]
    assert _delta(before, after, "ping") == 3
    assert _delta(before, after, "blmove") == 1
    assert raw.hlen("unacked") == 0


def test_reads_without_acks_and_of_several_queues_stay_kombus(
    redis_url: str, raw: redis.Redis, name: str
) -> None:
    """A consumer without acks records nothing, so it keeps kombu's `BRPOP`; so does a
    channel reading several queues (a wait watches one list)."""
    with Connection(redis_url, transport=Transport) as conn:
        one, two = (Queue(f"{name}.{n}").bind(conn.default_channel) for n in (1, 2))
        for queue in (one, two):
            queue.declare()
            conn.Producer().publish({"q": queue.name}, routing_key=queue.name)
        before = _commands(raw)
        [unacked] = _consume(conn, one, 1, no_ack=True)
        assert unacked.payload == {"q": one.name}
        assert raw.hlen("unacked") == 0
        got: list[Message] = []
        with conn.Consumer([one, two], callbacks=[lambda body, m: got.append(m)]):
            conn.Producer().publish({"q": one.name}, routing_key=one.name)
            while len(got) < 2:
                conn.drain_events(timeout=10)
        after = _commands(raw)
        assert sorted(m.payload["q"] for m in got) == [one.name, two.name]
        for message in got:
            message.ack()
        assert _delta(before, after, "brpop") >= 2
        assert _delta(before, after, "blmove") == 0
        one.delete()
        two.delete()
    assert raw.hlen("unacked") == 0


def test_an_item_delivered_as_a_made_message_keeps_one_record(
    redis_url: str, raw: redis.Redis, name: str
) -> None:
    """An item the script records but `envelope` cannot deliver as it is (here: a body
    that is not the base64 it claims) is delivered as a message made from it; its record
    is replaced by the made message's, so a requeue restores it once, and an ack leaves
    nothing behind."""
    item: dict[str, Any] = {
        "body": "!!!not base64",
        "headers": {},
        "content-type": "application/json",
        "content-encoding": "utf-8",
        "properties": {
            "body_encoding": "base64",
            "delivery_tag": str(uuid.uuid4()),
            "delivery_info": {"exchange": "", "routing_key": name},
        },
    }
    raw.lpush(name, json.dumps(item))
    with Connection(redis_url, transport=Transport) as conn:
        queue = Queue(name).bind(conn.default_channel)
        [made] = _consume(conn, queue, 1)
        assert "cannot be decoded as 'base64'" in made.headers[UNREADABLE]
        assert made.delivery_tag != item["properties"]["delivery_tag"]
        assert raw.hkeys("unacked") == [made.delivery_tag.encode()]
        made.requeue()
        assert raw.llen(name) == 1 and raw.hlen("unacked") == 0
        polled = queue.get(no_ack=False)
        assert polled is not None and polled.body == made.body
        assert raw.hkeys("unacked") == [polled.delivery_tag.encode()]
        polled.ack()
    assert raw.hlen("unacked") == 0 and raw.zcard("unacked_index") == 0
    assert raw.llen(name) == 0


def test_a_global_key_prefix_applies_to_the_lists_and_the_records(
    redis_url: str, raw: redis.Redis, name: str
) -> None:
    options = {"global_keyprefix": "pfx:"}
    with Connection(redis_url, transport=Transport, transport_options=options) as conn:
        queue = Queue(name).bind(conn.default_channel)
        queue.declare()
        conn.Producer().publish({"n": 1}, routing_key=name)
        assert raw.llen(f"pfx:{name}") == 1
        [message] = _consume(conn, queue, 1)
        assert raw.hexists("pfx:unacked", message.delivery_tag)
        assert raw.zscore("pfx:unacked_index", message.delivery_tag) is not None
        assert not raw.exists("unacked")
        message.ack()
        assert raw.hlen("pfx:unacked") == 0
        polled_none = queue.get(no_ack=False)
        assert polled_none is None
        queue.delete()


@pytest.fixture
def limited_user(raw: redis.Redis, redis_url: str, request: pytest.FixtureRequest) -> Iterator[str]:
    """A broker URL for a user the server denies `request.param` (an ACL rule)."""
    user = f"limited{uuid.uuid4().hex[:8]}"
    commands = ["+@all", *request.param]
    raw.acl_setuser(user, enabled=True, nopass=True, keys=["*"], channels=["*"], commands=commands)
    try:
        yield redis_url.replace("redis://", f"redis://{user}@", 1)
    finally:
        raw.acl_deluser(user)


@pytest.mark.parametrize(
    ("limited_user", "refused"),
    [
        (["-blmove"], "BLMOVE"),
        (["-blmove", "-lmove"], "BLMOVE"),  # Redis before 6.2
        (["-evalsha", "-eval"], "the queue read script"),
    ],
    indirect=["limited_user"],
)
def test_a_broker_refusing_the_wait_or_the_script_gets_kombus_read(
    limited_user: str,
    raw: redis.Redis,
    name: str,
    refused: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A server without `BLMOVE` (before Redis 6.2) or refusing scripts still delivers
    every message, through kombu's `BRPOP`, with one warning saying what is at stake."""
    caplog.set_level(logging.WARNING, logger="interlock.transport")
    raw.delete(READERS)
    with Connection(limited_user, transport=Transport) as conn:
        queue = Queue(name).bind(conn.default_channel)
        queue.declare()
        for n in range(3):
            conn.Producer().publish({"n": n}, routing_key=name)
        got = _consume(conn, queue, 2)
        polled = queue.get(no_ack=False)
        assert polled is not None
        got.append(polled)
        assert [m.payload["n"] for m in got] == [0, 1, 2]
        for message in got:
            message.ack()
        queue.delete()
    warnings = [r.getMessage() for r in caplog.records if "reading queues with" in r.getMessage()]
    assert len(warnings) == 1 and f"Redis refused {refused}" in warnings[0]
    assert raw.hlen("unacked") == 0
    assert raw.zcard(READERS) == 0, "a channel reading kombu's way leaves the registry"


def test_a_message_only_marked_as_a_queue_items_record_is_read_as_it_is(redis_url: str) -> None:
    """A client's own message with the `QUEUE_ITEM` header whose body is not that record's
    base64 is delivered as it is, not taken apart."""
    message = {
        "body": "not base64!",
        "headers": {QUEUE_ITEM: 1},
        "properties": {"delivery_tag": "t", "delivery_info": {"exchange": "", "routing_key": "q"}},
    }
    with Connection(redis_url, transport=Transport) as conn:
        assert envelope(json.dumps(message).encode(), "q", conn.default_channel) == message


def test_a_long_item_that_is_no_message_is_recorded_by_the_reader(
    redis_url: str, raw: redis.Redis, name: str
) -> None:
    """Past `WRAP_LIMIT` the script does not encode an item that is no kombu message (it
    would hold Redis up): the reader records the message made of it, kombu's way."""
    item = b"x" * (WRAP_LIMIT + 1)
    raw.lpush(name, item)
    with Connection(redis_url, transport=Transport) as conn:
        queue = Queue(name).bind(conn.default_channel)
        [message] = _consume(conn, queue, 1)
        assert message.body == item
        assert raw.hkeys("unacked") == [message.delivery_tag.encode()]
        message.ack()
    assert raw.hlen("unacked") == 0


def test_without_ack_emulation_reads_stay_kombus(
    redis_url: str, raw: redis.Redis, name: str
) -> None:
    """With kombu's ack emulation off, acks never remove a record: nothing is recorded."""
    options = {"ack_emulation": False}
    with Connection(redis_url, transport=Transport, transport_options=options) as conn:
        queue = Queue(name).bind(conn.default_channel)
        queue.declare()
        conn.Producer().publish({"n": 1}, routing_key=name)
        before = _commands(raw)
        [message] = _consume(conn, queue, 1)
        message.ack()
        assert _delta(before, _commands(raw), "blmove") == 0
        queue.delete()
    assert raw.hlen("unacked") == 0


def test_redis_out_of_memory_is_raised_and_the_message_kept(
    redis_url: str, raw: redis.Redis, name: str
) -> None:
    """A full Redis refuses the wait (`BLMOVE` may grow memory). That is an error of the
    server, raised as kombu raises its own commands' errors, not a refusal of the command
    that would switch the channel to kombu's read (whose second command would then fail
    with the message already popped): the message stays on its list."""
    with Connection(redis_url, transport=Transport) as conn:
        queue = Queue(name).bind(conn.default_channel)
        queue.declare()
        conn.Producer().publish({"n": 1}, routing_key=name)
        policy = str(raw.config_get("maxmemory-policy")["maxmemory-policy"])
        with conn.Consumer(queue, callbacks=[lambda body, message: None]):
            raw.config_set("maxmemory-policy", "noeviction")
            raw.config_set("maxmemory", "1")
            try:
                with pytest.raises(redis.exceptions.OutOfMemoryError):
                    conn.drain_events(timeout=5)
                assert conn.default_channel._atomic, "still reading with the script"
                assert raw.llen(name) == 1 and raw.hlen("unacked") == 0
            finally:
                raw.config_set("maxmemory", "0")
                raw.config_set("maxmemory-policy", policy)
        [message] = _consume(conn, queue, 1)
        assert message.payload == {"n": 1}
        message.ack()
        queue.delete()


_E = redis.exceptions


@pytest.mark.parametrize(
    ("error", "is_refusal"),
    [
        (_E.NoPermissionError("this user has no permissions to run the 'blmove' command"), True),
        (_E.ResponseError("unknown command 'BLMOVE', with args beginning with:"), True),
        (_E.OutOfMemoryError("command not allowed when used memory > 'maxmemory'."), False),
        (_E.ReadOnlyError("You can't write against a read only replica."), False),
        (_E.BusyLoadingError("Redis is loading the dataset in memory"), False),
        (_E.ResponseError("WRONGTYPE Operation against a key holding the wrong kind"), False),
        (_E.ResponseError("BUSY Redis is busy running a script."), False),
    ],
)
def test_what_counts_as_a_refusal(error: redis.exceptions.ResponseError, is_refusal: bool) -> None:
    """redis-py drops the code of the errors it has classes for (OOM, READONLY, LOADING,
    NOPERM): those are told apart by their class."""
    assert refused(error) is is_refusal


def test_one_message_wakes_one_of_the_consumers_waiting_on_its_queue(
    redis_url: str, raw: redis.Redis, name: str
) -> None:
    """Consumers waiting on one queue (the worker processes of a batch pipeline) are not
    all woken for each message: the wait moves the message to the one consumer it
    serves, so Redis runs one wait and one read script a message, not one per waiter."""
    readers, count = 4, 40
    got: list[tuple[int, Any]] = []
    stop = threading.Event()
    ready = threading.Barrier(readers + 1)

    def read(n: int) -> None:
        with Connection(redis_url, transport=Transport) as conn:
            queue = Queue(name).bind(conn.default_channel)

            def on_message(body: Any, message: Message) -> None:
                got.append((n, body["n"]))
                message.ack()

            with conn.Consumer(queue, callbacks=[on_message]):
                ready.wait(timeout=10)
                while not stop.is_set():
                    with contextlib.suppress(TimeoutError):
                        conn.drain_events(timeout=0.2)

    threads = [threading.Thread(target=read, args=(n,), daemon=True) for n in range(readers)]
    for thread in threads:
        thread.start()
    ready.wait(timeout=10)
    time.sleep(0.3)  # every reader is waiting
    before = _commands(raw)
    with Connection(redis_url, transport=Transport) as conn:
        producer = conn.Producer()
        for n in range(count):
            producer.publish({"n": n}, routing_key=name)
            time.sleep(0.02)  # each message finds the readers waiting again
        deadline = time.monotonic() + 20
        while len(got) < count and time.monotonic() < deadline:
            time.sleep(0.05)
    after = _commands(raw)
    stop.set()
    for thread in threads:
        thread.join(timeout=10)
    assert sorted(n for _, n in got) == list(range(count)), "each message read once"
    assert len({reader for reader, _ in got}) > 1, "the messages were shared out"
    waits, reads = _delta(before, after, "blmove"), _delta(before, after, "evalsha")
    assert waits < 2 * count, f"{waits} waits served for {count} messages"
    assert reads < 2 * count, f"{reads} read scripts for {count} messages"
    assert raw.hlen("unacked") == 0
    raw.delete(name)


def _members(client: redis.Redis) -> list[str]:
    members: list[bytes] = client.zrange(READERS, 0, -1)  # type: ignore[assignment]
    return [m.decode() for m in members]


def _waiting(conn: Connection, raw: redis.Redis, name: str, delivered: list[Any]) -> Any:
    """A channel consuming `name` with acks whose wait, in flight, has moved a message
    that was pushed meanwhile to its reading list; delivered messages go to `delivered`."""
    channel = conn.channel()
    queue = Queue(name).bind(channel)
    queue.declare()
    channel.basic_consume(name, False, delivered.append, consumer_tag="c")
    conn.transport.cycle._register_BRPOP(channel)  # as the poller starts a wait
    raw.lpush(name, json.dumps({"n": 1}))
    deadline = time.monotonic() + 5
    while raw.llen(name) and time.monotonic() < deadline:
        time.sleep(0.01)
    [member] = _members(raw)
    assert raw.llen(reading_key(member)) == 1, "the wait has moved the message"
    return channel


def _dies(script: str, *args: str) -> None:
    """Run `script` in a process of its own, which must die (exit code 9)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    died = subprocess.run(
        [sys.executable, "-c", script, *args],
        cwd=ROOT,
        env=env,
        timeout=60,
        check=False,
        capture_output=True,
        text=True,
    )
    assert died.returncode == 9, died.stderr


def _died(redis_url: str, name: str, mode: str, where: str, beat: float = 10.0) -> None:
    _dies(DIES_ON_RECEIPT, redis_url, name, mode, where, str(beat))


def test_a_consumer_dying_between_the_wait_and_the_pop_gets_its_message_put_back(
    redis_url: str, raw: redis.Redis, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A consumer killed after the wait moved the message to its reading list, before the
    script took it from there, leaves it on that list, registered. Once three of the dead
    consumer's beats have passed, the next consumer's wait puts it back on its queue, with a
    warning, and reads it."""
    raw.delete(READERS)
    with Connection(redis_url, transport=Transport) as conn:
        Queue(name).bind(conn.default_channel).declare()
        conn.Producer().publish({"n": 1}, routing_key=name)
    _died(redis_url, name, "consume", "pop", beat=0.2)  # alive for 0.6 s
    [member] = _members(raw)
    assert member.endswith(name) and raw.llen(name) == 0
    assert raw.llen(reading_key(member)) == 1, "the wait moved the message to the reader"
    assert raw.hlen("unacked") == 0

    caplog.set_level(logging.WARNING, logger="interlock.transport")
    options = {"reader_beat": 0.2}
    with Connection(redis_url, transport=Transport, transport_options=options) as conn:
        queue = Queue(name).bind(conn.default_channel)
        time.sleep(0.7)
        [message] = _consume(conn, queue, 1)
        assert message.payload == {"n": 1}
        message.ack()
        assert not raw.exists(reading_key(member))
        assert raw.zscore(READERS, member) is None
    assert any(f"put 1 message back on queue {name}" in r.getMessage() for r in caplog.records)
    assert raw.zcard(READERS) == 0, "a channel that closes leaves the registry"
    assert raw.hlen("unacked") == 0 and raw.llen(name) == 0


DIES_HOLDING = """
import os, sys
from kombu.connection import Connection
from kombu.entity import Queue
from events.redis_transport import Transport

url, name, hold = sys.argv[1:]
options = {"reader_beat": 0.2, "restore_held": hold == "hold"}
with Connection(url, transport=Transport, transport_options=options) as conn:
    queue = Queue(name).bind(conn.default_channel)
    with conn.Consumer(queue, callbacks=[lambda body, message: os._exit(9)]):
        conn.drain_events(timeout=10)
sys.exit(0)
"""


def _died_holding(redis_url: str, name: str, hold: bool) -> None:
    """A consumer (beat 0.2 s) that is killed while it handles the message it took."""
    _dies(DIES_HOLDING, redis_url, name, "hold" if hold else "no")


def test_a_consumer_killed_holding_a_message_has_it_restored_once_its_time_is_up(
    redis_url: str, raw: redis.Redis, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A reader with `restore_held` (the resume consumer) killed while it handles a
    message: the message is in the unacked index, and `HELD` names that reader. Once three
    of its beats have passed, the next reader's wait restores it (the visibility timeout,
    an hour here, is not waited for), and it is read again; its ack clears every trace."""
    raw.delete(READERS, HELD)
    with Connection(redis_url, transport=Transport) as conn:
        Queue(name).bind(conn.default_channel).declare()
        conn.Producer().publish({"n": 1}, routing_key=name)
    _died_holding(redis_url, name, hold=True)
    [member] = _members(raw)
    [tag] = raw.hkeys("unacked")
    assert raw.hget(HELD, tag) == member.encode(), "the record names its holder"
    assert raw.llen(name) == 0

    caplog.set_level(logging.WARNING, logger="interlock.transport")
    options = {"reader_beat": 0.2, "visibility_timeout": 3600}
    with Connection(redis_url, transport=Transport, transport_options=options) as conn:
        queue = Queue(name).bind(conn.default_channel)
        time.sleep(0.7)
        [message] = _consume(conn, queue, 1)
        assert message.payload == {"n": 1}
        assert message.delivery_info["redelivered"] is True
        message.ack()
    assert any(f"put 1 message back on queue {name}" in r.getMessage() for r in caplog.records)
    assert raw.hlen("unacked") == 0 and raw.zcard("unacked_index") == 0
    assert raw.hlen(HELD) == 0 and raw.llen(name) == 0
    raw.delete(name)


def test_a_reader_without_restore_held_leaves_its_messages_to_the_visibility_timeout(
    redis_url: str, raw: redis.Redis, name: str
) -> None:
    """A reader that did not ask (a Celery worker stops waiting while its pool is busy,
    and is not dead then) records no holder: its unacked message stays for the
    visibility timeout's restore, however long ago its reader stopped."""
    raw.delete(READERS, HELD)
    with Connection(redis_url, transport=Transport) as conn:
        Queue(name).bind(conn.default_channel).declare()
        conn.Producer().publish({"n": 2}, routing_key=name)
    _died_holding(redis_url, name, hold=False)
    [tag] = raw.hkeys("unacked")
    assert raw.hlen(HELD) == 0
    options = {"reader_beat": 0.2, "visibility_timeout": 3600}
    with Connection(redis_url, transport=Transport, transport_options=options) as conn:
        queue = Queue(name).bind(conn.default_channel)
        time.sleep(0.7)
        with conn.Consumer(queue, callbacks=[lambda body, message: pytest.fail("read")]):
            for _ in range(4):  # waits that sweep the registry, the dead reader's too
                with contextlib.suppress(TimeoutError):
                    conn.drain_events(timeout=0.3)
    assert raw.hkeys("unacked") == [tag] and raw.llen(name) == 0
    raw.delete(name, "unacked", "unacked_index")


def test_a_reading_list_is_put_back_only_once_its_readers_time_is_up(
    redis_url: str, raw: redis.Redis, name: str
) -> None:
    """Each reader registers itself as alive for three of its own beats: a reader with a
    short beat leaves alone the reading list of one with a long beat. `RESCUE` leaves a
    reading list whose time is not up; one whose time is up goes back to the end of its
    queue that is read next, in its order."""
    raw.delete(READERS)
    member = "f" * 32 + name
    options = {"reader_beat": 0.05}
    with Connection(redis_url, transport=Transport, transport_options=options) as conn:
        channel = conn.default_channel
        client = channel._create_client()
        assert beat(channel, client, [member], 30.0) == []  # a reader with a 10 s beat
        raw.lpush(reading_key(member), b"older", b"newer")  # the reader takes the right end
        raw.lpush(name, b"queued")
        time.sleep(0.2)
        assert beat(channel, client, ["e" * 32 + name], 0.15) == [], "its time is not up"
        assert rescue(channel, client, member) == -1
        assert raw.llen(reading_key(member)) == 2 and raw.llen(name) == 1
        assert rescue(channel, client, "d" * 32 + name) == -1, "no such member"
        raw.zadd(READERS, {member: time.time() - 1})  # its time is up
        assert beat(channel, client, [], 0.15) == [member]
        assert rescue(channel, client, member) == 2
    assert raw.lrange(name, 0, -1) == [b"queued", b"newer", b"older"]  # RPOP: older first
    assert raw.zscore(READERS, member) is None and not raw.exists(reading_key(member))
    raw.delete(name, READERS)


@pytest.mark.parametrize(
    "item",
    [
        b'{"body": "e30=", "n": 1., "properties": {"delivery_tag": "dot", '
        b'"delivery_info": {"exchange": "", "routing_key": "q"}}}',  # cjson takes `1.`
        b"[" * 5000 + b"]" * 5000,  # nested deeper than Python's reader goes
    ],
    ids=["lenient-number", "deep"],
)
def test_an_unacked_record_kombu_cannot_read_back_is_set_aside(
    redis_url: str, raw: redis.Redis, name: str, item: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    """A record kombu's restore cannot read (here: one a dead reader left of an item that
    Redis' JSON reader takes and Python's does not) would make every sweep raise, and stop
    the restores after it. It is set aside, kept byte for byte, with an error in the log,
    and the sweep goes on to restore the records after it."""
    raw.delete(UNRESTORABLE)
    bad = b"[" + item + b', "", "' + name.encode() + b'"]'
    raw.hset("unacked", "bad", bad)
    raw.zadd("unacked_index", {"bad": 1.0})
    caplog.set_level(logging.ERROR, logger="interlock.transport")
    options = {"visibility_timeout": 0, "unacked_restore_throttle": 1}
    with Connection(redis_url, transport=Transport, transport_options=options) as conn:
        queue = Queue(name).bind(conn.default_channel)
        queue.declare()
        conn.Producer().publish({"n": 1}, routing_key=name)
        [first] = _consume(conn, queue, 1)
        first.requeue()
        conn.default_channel.qos.restore_visible()
        assert raw.hget(UNRESTORABLE, "bad") == bad
        [again] = _consume(conn, queue, 1)
        assert again.payload == {"n": 1}
        again.ack()
        queue.delete()
    assert raw.hlen("unacked") == 0 and raw.zcard("unacked_index") == 0
    assert any("cannot be read back" in r.getMessage() for r in caplog.records)
    raw.delete(UNRESTORABLE)


@pytest.mark.parametrize("headers", [b"[]", b"null"])
def test_a_message_whose_headers_are_no_object_is_restored_not_dropped(
    redis_url: str, raw: redis.Redis, name: str, headers: bytes
) -> None:
    """kombu marks a restored message redelivered in its headers: headers that are no
    object made it fail and drop the message. Such a message is restored with empty
    headers, and read as a kombu message, not taken apart."""
    body = base64.b64encode(b'{"n": 1}')
    item = (
        b'{"body": "' + body + b'", "content-type": "application/json", '
        b'"content-encoding": "utf-8", "headers": ' + headers + b', "properties": '
        b'{"delivery_tag": "h1", "body_encoding": "base64", '
        b'"delivery_info": {"exchange": "", "routing_key": "' + name.encode() + b'"}}}'
    )
    raw.hset("unacked", "h1", b"[" + item + b', "", "' + name.encode() + b'"]')
    raw.zadd("unacked_index", {"h1": 1.0})
    options = {"visibility_timeout": 0, "unacked_restore_throttle": 1}
    with Connection(redis_url, transport=Transport, transport_options=options) as conn:
        queue = Queue(name).bind(conn.default_channel)
        conn.default_channel.qos.restore_visible()
        assert raw.llen(name) == 1, "restored"
        [message] = _consume(conn, queue, 1)
        assert message.payload == {"n": 1} and message.headers == {"redelivered": True}
        message.ack()
    assert raw.hlen("unacked") == 0


@pytest.mark.parametrize("how", ["cancel", "close"])
def test_a_wait_answered_after_its_queue_is_no_longer_read_puts_the_message_back(
    redis_url: str, raw: redis.Redis, name: str, how: str
) -> None:
    """A wait that returns a message after its consumer was cancelled, or while its
    channel closes, delivers nothing and puts the message back on its queue."""
    raw.delete(READERS)
    delivered: list[Any] = []
    with Connection(redis_url, transport=Transport) as conn:
        channel = _waiting(conn, raw, name, delivered)
        if how == "cancel":
            channel.basic_cancel("c")
            with pytest.raises(Empty):
                channel._brpop_read()
            assert raw.llen(name) == 1, "put back at once, not when the channel closes"
            channel.close()
        else:
            channel.close()
    assert delivered == []
    assert raw.lrange(name, 0, -1) == [json.dumps({"n": 1}).encode()]
    assert raw.zcard(READERS) == 0 and raw.hlen("unacked") == 0
    raw.delete(name)


@pytest.mark.parametrize(
    ("item", "wrong"),
    [
        (b"[" * 5000 + b"]" * 5000, "the queue item is not JSON"),
        (
            b'{"body": "e30=", "headers": [], "properties": {"delivery_tag": "t"}}',
            "the kombu message's headers are not an object",
        ),
        (
            b'{"body": "e30=", "headers": null, "properties": {"delivery_tag": "t"}}',
            "the kombu message's headers are not an object",
        ),
    ],
    ids=["deep", "list-headers", "null-headers"],
)
def test_an_item_nested_too_deep_or_with_headers_that_are_no_object_is_unreadable(
    redis_url: str, item: bytes, wrong: str
) -> None:
    """Delivered as its exact bytes with what is wrong, for the consumer to refuse and
    keep, where reading it raised out of the consumer's loop."""
    with Connection(redis_url, transport=Transport) as conn:
        message = envelope(item, "q", conn.default_channel)
    assert base64.b64decode(message["body"]) == item
    assert message["headers"][UNREADABLE].startswith(wrong)


def test_a_channel_closing_leaves_the_registry_for_every_queue_it_waited_on(
    redis_url: str, raw: redis.Redis, name: str
) -> None:
    """A channel that read one queue, then waits on another when it closes, gives both
    reading lists back and leaves no member in the registry."""
    raw.delete(READERS)
    first, second = f"{name}.1", f"{name}.2"
    with Connection(redis_url, transport=Transport) as conn:
        channel = conn.channel()
        for queue in (first, second):
            Queue(queue).bind(channel).declare()
        conn.Producer(channel).publish({"n": 1}, routing_key=first)
        got: list[Any] = []
        channel.basic_consume(first, False, got.append, consumer_tag="a")
        while not got:
            with contextlib.suppress(TimeoutError):
                conn.drain_events(timeout=1)
        got[0].ack()
        channel.basic_cancel("a")
        channel.basic_consume(second, False, got.append, consumer_tag="b")
        conn.transport.cycle._register_BRPOP(channel)  # a wait on the second queue
        assert len(_members(raw)) == 2
        channel.close()
    assert raw.zcard(READERS) == 0
    raw.delete(first, second)


def test_a_read_script_refused_after_the_wait_puts_the_message_back(
    redis_url: str, raw: redis.Redis, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Scripts refused between the wait and the read (an ACL changed meanwhile): the
    message the wait moved goes back to its queue, and the channel, now reading kombu's
    way, leaves the registry."""
    raw.delete(READERS)
    user = f"turncoat{uuid.uuid4().hex[:8]}"
    raw.acl_setuser(user, enabled=True, nopass=True, keys=["*"], channels=["*"], commands=["+@all"])
    caplog.set_level(logging.WARNING, logger="interlock.transport")
    try:
        url = redis_url.replace("redis://", f"redis://{user}@", 1)
        with Connection(url, transport=Transport) as conn:
            channel = conn.channel()
            Queue(name).bind(channel).declare()
            channel.basic_consume(name, False, lambda m: None, consumer_tag="c")
            conn.transport.cycle._register_BRPOP(channel)
            raw.lpush(name, json.dumps({"n": 1}))
            deadline = time.monotonic() + 5
            while raw.llen(name) and time.monotonic() < deadline:
                time.sleep(0.01)
            [member] = _members(raw)
            assert raw.llen(reading_key(member)) == 1
            raw.acl_setuser(user, commands=["-evalsha", "-eval"])
            with pytest.raises(Empty):
                channel._brpop_read()
            assert raw.lrange(name, 0, -1) == [json.dumps({"n": 1}).encode()]
            assert raw.zcard(READERS) == 0 and not raw.exists(reading_key(member))
            channel.close()
    finally:
        raw.acl_deluser(user)
    assert any("Redis refused the queue read script" in r.getMessage() for r in caplog.records)
    raw.delete(name)


def test_an_error_event_on_the_wait_keeps_its_message_for_the_next_read(
    redis_url: str, raw: redis.Redis, name: str
) -> None:
    """kombu's poller answers an error event on the socket with `_poll_error`, which
    reads the wait's reply; the message the wait moved is delivered by the next read,
    at once, and once (kombu's own handler drops a `BRPOP` reply's message)."""
    raw.delete(READERS)
    delivered: list[Any] = []
    with Connection(redis_url, transport=Transport) as conn:
        channel = _waiting(conn, raw, name, delivered)
        [member] = _members(raw)
        channel._poll_error("BRPOP")  # the socket's error event
        assert delivered == [] and raw.llen(reading_key(member)) == 1
        assert not channel._in_poll, "no read in flight: the next poll may send one"
        conn.transport.cycle._register_BRPOP(channel)  # the next poll: a new read is sent
        assert channel._brpop_read() is True
        # the message was moved off the queue: a read that waited there would deliver none
        [message] = delivered
        assert json.loads(message.body) == {"n": 1}
        message.ack()
        assert raw.llen(reading_key(member)) == 0 and raw.hlen("unacked") == 0
        channel.close()
    assert raw.llen(name) == 0 and raw.zcard(READERS) == 0
    raw.delete(name)
