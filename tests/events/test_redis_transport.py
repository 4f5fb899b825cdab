"""The Redis transport of workers and consumers: kombu's, with one redis client per
channel for its commands instead of one per command, and publishes routed by one
server-side script, topic bindings matching as on RabbitMQ."""

from __future__ import annotations

import base64
import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kombu.connection import Connection
from kombu.entity import Exchange, Queue
from kombu.transport.virtual.exchange import TopicExchange

from events.publisher import Publisher
from events.redis_route import ROUTE, topic_match
from events.redis_transport import UNREADABLE, Channel, Transport, envelope, transport_for
from events.topology import EVENTS
from tests.queue_helpers import rabbitmq_vhost
from tests.services import start_redis
from workers.app import create_app
from workers.runtime import Runtime
from workers.settings import Settings


@pytest.fixture
def clients_built(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the `redis.Redis` clients built while a test runs."""
    built: list[int] = []
    init = redis.Redis.__init__

    def counting(self: redis.Redis, *args: Any, **kwargs: Any) -> None:
        built.append(1)
        init(self, *args, **kwargs)

    monkeypatch.setattr(redis.Redis, "__init__", counting)
    return built


def test_redis_urls_get_the_transport_others_keep_theirs() -> None:
    assert transport_for("redis://localhost:6379/0") == "events.redis_transport:Transport"
    assert transport_for("rediss://h:6380/1") == "events.redis_transport:Transport"
    assert transport_for("amqp://guest@localhost//") is None
    assert transport_for("memory://") is None
    redis_app = create_app(Settings(broker_url="redis://127.0.0.1:1/0"))
    assert redis_app.conf.broker_transport == "events.redis_transport:Transport"
    assert create_app(Settings(broker_url="memory://")).conf.broker_transport is None


def test_events_go_out_on_one_client(redis_url: str, clients_built: list[int]) -> None:
    """200 events through the topic exchange reach a queue bound by pattern; the
    channel builds its command client once, not once or more per event."""
    rt = Runtime(Settings(broker_url=redis_url))
    queue = Queue(f"test.transport.{uuid.uuid4().hex}", EVENTS, routing_key="turn.#")
    with rt.connection() as conn:
        assert isinstance(conn.default_channel, Channel)
        queue.bind(conn.default_channel).declare()
        publisher = Publisher(conn)
        publisher.publish_raw_event("turn.completed", '{"n": -1}')  # connects, declares
        before = len(clients_built)
        for n in range(200):
            publisher.publish_raw_event("turn.completed", f'{{"n": {n}}}')
        assert len(clients_built) - before <= 1
        received = []
        bound = queue.bind(conn.default_channel)
        while (message := bound.get(no_ack=True)) is not None:
            received.append(message.payload["n"])
        bound.delete()
    assert received == [-1, *range(200)], "every event, in order"


def test_a_new_pool_gets_a_new_client(redis_url: str, clients_built: list[int]) -> None:
    """After a reconnect kombu replaces the channel's pool: the client follows it."""
    with Connection(redis_url, transport=Transport) as conn:
        channel = conn.default_channel
        exchange = Exchange(f"test.direct.{uuid.uuid4().hex}", type="direct")
        queue = Queue(f"test.q.{uuid.uuid4().hex}", exchange, routing_key="k")
        bound = queue.bind(channel)
        bound.declare()
        producer = conn.Producer()
        producer.publish({"a": 1}, exchange=exchange, routing_key="k")
        first = channel._shared_client
        assert first is not None
        channel._pool = None  # what kombu does to a channel's pools on disconnect
        producer.publish({"a": 2}, exchange=exchange, routing_key="k")
        second = channel._shared_client
        assert second is not None and second[0] is not first[0] and second[1] is not first[1]
        assert [bound.get(no_ack=True).payload["a"] for _ in range(2)] == [1, 2]
        bound.delete()


# ------------------------------------------------------------ routing in one round trip

SEP = Channel.sep
WORDS = [
    "turn",
    "decision",
    "a",
    "b",
    "",
    "x-y",
    "a+b",
    "v1.2",
    "é",
    "a%b",
    "(x)",
    "[y]",
    "^z$",
    "a*b",
    "x#",
    "*",
    "#",
]


def _keys(words: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.lists(words, min_size=1, max_size=4).map(".".join)


@pytest.fixture(scope="module")
def route(redis_url: str) -> Any:
    client = redis.Redis.from_url(redis_url)
    return client, client.register_script(ROUTE)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    bindings=st.lists(_keys(st.sampled_from(WORDS)), min_size=1, max_size=5),
    routing_key=_keys(st.sampled_from(WORDS[:-2])),
    kind=st.sampled_from(["topic", "direct"]),
)
def test_the_script_routes_as_topic_match_does(
    route: Any, bindings: list[str], routing_key: str, kind: str
) -> None:
    """Whatever the bindings, the script pushes to exactly the queues AMQP's topic
    matching (`topic_match`) or a direct exchange's picks, each once."""
    client, script = route
    tag = uuid.uuid4().hex
    table = f"test.table.{tag}"
    members = [f"{b}{SEP}pattern-unused{SEP}test.q.{tag}.{i % 3}" for i, b in enumerate(bindings)]
    client.sadd(table, *members)
    try:
        pushed = script(keys=[table], args=[kind, routing_key, "body", SEP, ""])
        queues = {f"test.q.{tag}.{i}": client.llen(f"test.q.{tag}.{i}") for i in range(3)}
    finally:
        client.delete(table, *(f"test.q.{tag}.{i}" for i in range(3)))
    match = topic_match if kind == "topic" else str.__eq__
    wanted = {
        m.rsplit(SEP, 1)[1] for m, b in zip(members, bindings, strict=True) if match(b, routing_key)
    }
    assert pushed == len(wanted)
    assert {q for q, n in queues.items() if n} == wanted
    assert all(n <= 1 for n in queues.values())


@pytest.mark.parametrize(
    ("binding", "routing_key", "matched"),
    [
        ("turn.#", "turn", True),  # `#` is zero or more words (kombu's regex: one or more)
        ("turn.interrupted.#", "turn.interrupted", True),
        ("#.interrupted", "turn.interrupted", True),
        ("#.interrupted", "interrupted", True),
        ("turn.#.x", "turn.x", True),
        ("#.#", "turn", True),
        ("turn.*", "turn", False),  # `*` is exactly one word
        ("turn.a*", "turn.a*", True),  # a word mixing wildcards with text is literal
        ("turn.a*", "turn.ab", False),
        ("#x.turn", "ax.turn", False),
        ("a\x00", "a", False),
        ("\x00.*", "a.b", False),
        ("x\n", "y", False),
    ],
)
def test_topic_bindings_match_as_on_rabbitmq(
    route: Any, binding: str, routing_key: str, matched: bool
) -> None:
    """The cases where kombu's regex and AMQP part: the script routes as RabbitMQ does
    (`test_topic_routing_is_rabbitmqs` checks the same against a real one)."""
    client, script = route
    tag = uuid.uuid4().hex
    table, queue = f"test.table.{tag}", f"test.q.{tag}"
    client.sadd(table, f"{binding}{SEP}p{SEP}{queue}")
    try:
        assert topic_match(binding, routing_key) is matched
        pushed = script(keys=[table], args=["topic", routing_key, "body", SEP, ""])
        assert (pushed, client.llen(queue)) == ((1, 1) if matched else (0, 0))
    finally:
        client.delete(table, queue)


PATTERNS = [
    "#",
    "#.#",
    "*",
    "*.*",
    "turn.#",
    "turn.*",
    "turn.interrupted.#",
    "#.interrupted",
    "#.interrupted.#",
    "turn.#.x",
    "decision.#",
    "*.rejected",
    "turn.a*",
    "a.*.b",
    "a.#.b",
]
KEYS = [
    "turn",
    "turn.interrupted",
    "turn.completed",
    "interrupted",
    "decision.rejected",
    "turn.x",
    "turn.y.x",
    "turn.a*",
    "turn.ab",
    "a.b",
    "a.x.b",
    "a..b",
    "a.x.y.b",
]


def _routed(url: str, transport: Any = None, priority: int | None = None) -> dict[str, list[str]]:
    """Which of `KEYS` each queue bound with one of `PATTERNS` got, on that broker."""
    tag = uuid.uuid4().hex[:12]
    exchange = Exchange(f"test.topic.{tag}", type="topic", durable=False)
    got: dict[str, list[str]] = {}
    with Connection(url, transport=transport) as conn:
        channel = conn.default_channel
        bound = [
            Queue(f"test.q.{tag}.{i}", exchange, routing_key=p, durable=False).bind(channel)
            for i, p in enumerate(PATTERNS)
        ]
        for queue in bound:
            queue.declare()
        producer = conn.Producer(channel)
        for key in KEYS:
            producer.publish({"key": key}, exchange=exchange, routing_key=key, priority=priority)
        # Every queue got what it will get once the last one has its last message.
        deadline = time.monotonic() + 10
        while bound[0].queue_declare(passive=True).message_count < len(KEYS):
            assert time.monotonic() < deadline, "the messages did not arrive"
            time.sleep(0.05)
        for queue, pattern in zip(bound, PATTERNS, strict=True):
            got[pattern] = []
            while (message := queue.get(no_ack=True)) is not None:
                got[pattern].append(message.payload["key"])
            queue.delete()
        exchange.bind(channel).delete()
    return got


def test_topic_routing_is_rabbitmqs(redis_url: str) -> None:
    """The same bindings and routing keys on a real RabbitMQ and on Redis: every queue
    gets the same messages, by the routing script and by kombu's path (a prioritized
    message), and `topic_match` says so too. kombu's own transport would not: its `#`
    is one or more words."""
    with rabbitmq_vhost() as amqp_url:
        rabbitmq = _routed(amqp_url)
    assert rabbitmq == {p: [k for k in KEYS if topic_match(p, k)] for p in PATTERNS}
    assert _routed(redis_url, Transport) == rabbitmq
    assert _routed(redis_url, Transport, priority=9) == rabbitmq
    stock = _routed(redis_url, "redis")
    assert stock["turn.interrupted.#"] == [] and rabbitmq["turn.interrupted.#"] != []


@pytest.mark.parametrize("transport", [Transport, "redis"])
def test_publishes_reach_the_same_queues_with_either_transport(
    redis_url: str, transport: Any
) -> None:
    """Ours and kombu's stock transport, on real bindings: every queue bound with a
    matching pattern gets each message once, in order; the others get none. A
    binding kombu alone can read (`turn.x*`) and a prioritized message go kombu's way,
    with the same result."""
    tag = uuid.uuid4().hex
    exchange = Exchange(f"test.topic.{tag}", type="topic")
    patterns = ["#", "turn.*", "turn.#", "decision.#", "turn.completed", "*.failed", "nothing"]
    with Connection(redis_url, transport=transport) as conn:
        channel = conn.default_channel
        bound = [
            Queue(f"test.q.{tag}.{i}", exchange, routing_key=p).bind(channel)
            for i, p in enumerate(patterns)
        ]
        for queue in bound:
            queue.declare()
        producer = conn.Producer()
        keys = ["turn.completed", "turn.failed", "decision.accepted", "turn.x.y"]
        for n, key in enumerate(keys):
            producer.publish(
                {"n": n}, exchange=exchange, routing_key=key, priority=9 if n == 3 else None
            )
        got: dict[str, list[Any]] = {}
        for queue, pattern in zip(bound, patterns, strict=True):
            got[pattern] = []
            while (message := queue.get(no_ack=True)) is not None:
                got[pattern].append(message.payload["n"])
            queue.delete()
    assert got == {
        "#": [0, 1, 2, 3],
        "turn.*": [0, 1],
        "turn.#": [0, 1, 3],
        "decision.#": [2],
        "turn.completed": [0],
        "*.failed": [1],
        "nothing": [],
    }


@pytest.mark.parametrize(
    "refusal",
    [
        "unknown command 'evalsha'",
        "NOPERM User bench has no permissions to run the 'evalsha' command",
        "script tried accessing undeclared key, key: interlock.interrupted",
    ],
)
def test_a_broker_refusing_scripts_gets_kombus_two_commands(
    redis_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, refusal: str
) -> None:
    """Where the script is refused (EVAL disabled or renamed, denied by an ACL, a
    Redis-compatible server that forbids undeclared keys), the channel falls back to
    kombu's lookup and push for that publish and every later one."""
    calls: list[str] = []

    def refuse(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append("eval")
        raise redis.exceptions.ResponseError(refusal)

    monkeypatch.setattr(redis.commands.core.Script, "__call__", refuse)
    tag = uuid.uuid4().hex
    exchange = Exchange(f"test.topic.{tag}", type="topic")
    with Connection(redis_url, transport=Transport) as conn:
        queue = Queue(f"test.q.{tag}", exchange, routing_key="turn.*").bind(conn.default_channel)
        queue.declare()
        producer = conn.Producer()
        for n in range(3):
            producer.publish({"n": n}, exchange=exchange, routing_key="turn.done")
        received = [queue.get(no_ack=True).payload["n"] for _ in range(3)]
        queue.delete()
    assert received == [0, 1, 2]
    assert calls == ["eval"], "refused once, then not asked again"
    [warning] = [r for r in caplog.records if r.name == "interlock.transport"]
    assert f"refused the routing script ({refusal})" in warning.getMessage()


def test_a_queue_with_an_expiry_declared_here_keeps_kombus_path(redis_url: str) -> None:
    """kombu refreshes the expiry of a queue declared with `expires` on the publishing
    channel at each publish; the script does not, so such a channel publishes kombu's
    way: the message arrives and the queue's key carries its TTL."""
    tag = uuid.uuid4().hex
    exchange = Exchange(f"test.topic.{tag}", type="topic")
    queue = Queue(f"test.q.{tag}", exchange, routing_key="turn.*", expires=60)
    client = redis.Redis.from_url(redis_url)
    with Connection(redis_url, transport=Transport) as conn:
        bound = queue.bind(conn.default_channel)
        bound.declare()
        conn.Producer().publish({"n": 1}, exchange=exchange, routing_key="turn.done")
        ttl = client.pttl(queue.name)
        message = bound.get(no_ack=True)
        bound.delete()
    assert message is not None and message.payload == {"n": 1}
    assert 0 < ttl <= 60_000


@pytest.mark.parametrize(
    ("binding", "routing_key"),
    [("a.b", "a.b\n"), ("", "\n"), ("a.#", "a.x\ny"), ("#", "x\ny"), ("a", "a\x00")],
)
def test_keys_with_a_newline_or_nul_are_left_to_kombu(
    route: Any, binding: str, routing_key: str
) -> None:
    """A routing key with a newline or a NUL: the script pushes nothing and answers -1,
    and kombu's path (with the same matching) decides."""
    client, script = route
    tag = uuid.uuid4().hex
    table, queue = f"test.table.{tag}", f"test.q.{tag}"
    client.sadd(table, f"{binding}{SEP}p{SEP}{queue}")
    try:
        assert script(keys=[table], args=["topic", routing_key, "body", SEP, ""]) == -1
        assert client.llen(queue) == 0
    finally:
        client.delete(table, queue)


def test_a_topic_binding_stored_without_a_pattern_matches_every_key(route: Any) -> None:
    """A queue bound while its channel took the exchange for a direct one is stored with
    an empty pattern; kombu's empty regex matches every routing key, and so does the
    script."""
    client, script = route
    tag = uuid.uuid4().hex
    table, queue = f"test.table.{tag}", f"test.q.{tag}"
    client.sadd(table, f"a.b{SEP}{SEP}{queue}")
    try:
        assert _kombu_topic_match_stored("", "zzz")
        assert script(keys=[table], args=["topic", "zzz", "body", SEP, ""]) == 1
        assert client.lrange(queue, 0, -1) == [b"body"]
    finally:
        client.delete(table, queue)


def _kombu_topic_match_stored(pattern: str, routing_key: str) -> bool:
    return TopicExchange(None)._match(pattern, routing_key) is not None


@pytest.mark.parametrize("transport", [Transport, "redis"])
def test_a_global_key_prefix_applies_to_the_queues(
    redis_url: str, transport: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """With `global_keyprefix` every key kombu touches is prefixed: the bindings the
    script reads, the exchange's mark, and the queues it pushes to, as consumers read
    them."""
    tag = uuid.uuid4().hex
    exchange = Exchange(f"test.topic.{tag}", type="topic")
    options = {"global_keyprefix": f"pfx{tag[:6]}:"}
    with Connection(redis_url, transport=transport, transport_options=options) as conn:
        queue = Queue(f"test.q.{tag}", exchange, routing_key="turn.*").bind(conn.default_channel)
        queue.declare()
        conn.Producer().publish({"n": 7}, exchange=exchange, routing_key="turn.done")
        message = queue.get(no_ack=True)
        queue.delete()
    assert message is not None and message.payload == {"n": 7}
    client = redis.Redis.from_url(redis_url)
    assert client.exists(f"test.q.{tag}") == 0
    assert client.exists(f"_interlock.bound.test.topic.{tag}") == 0
    if transport is Transport:
        assert client.get(f"pfx{tag[:6]}:_interlock.bound.test.topic.{tag}") == b"1"
        assert "Redis holds no bindings" not in caplog.text, "the mark was found"


def test_other_script_errors_are_raised_and_keep_the_script(redis_url: str) -> None:
    """A push the server refuses (a queue's key holding a string: WRONGTYPE) fails the
    publish, as kombu's own LPUSH would; it is not taken for "no scripts here", so the
    next publish goes through the script again."""
    tag = uuid.uuid4().hex
    exchange = Exchange(f"test.topic.{tag}", type="topic")
    client = redis.Redis.from_url(redis_url)
    with Connection(redis_url, transport=Transport) as conn:
        channel = conn.default_channel
        queue = Queue(f"test.q.{tag}", exchange, routing_key="turn.*").bind(channel)
        queue.declare()
        client.set(queue.name, "not a list")
        producer = conn.Producer()
        with pytest.raises(redis.exceptions.ResponseError, match="WRONGTYPE"):
            producer.publish({"n": 1}, exchange=exchange, routing_key="turn.done", retry=False)
        assert channel._route not in (None, False), "the script stays in use"
        client.delete(queue.name)
        producer.publish({"n": 2}, exchange=exchange, routing_key="turn.done")
        message = queue.get(no_ack=True)
        queue.delete()
    assert message is not None and message.payload == {"n": 2}


def test_queue_items_that_are_no_message_are_delivered_and_restored(redis_url: str) -> None:
    """Items pushed onto a queue's list by a client of its own: a bare JSON object is a
    JSON message; anything else keeps its bytes, with what is wrong in a header. Both are
    read by consuming (`BRPOP`) and polling (`basic_get`) alike, and a rejected one is
    restored like any message, not lost; kombu's own messages pass as they are."""
    name = f"test.raw.{uuid.uuid4().hex}"
    with Connection(redis_url, transport=Transport) as conn:
        queue = conn.SimpleQueue(name)
        client = redis.Redis.from_url(redis_url)
        try:
            client.lpush(name, b'{"hello": 1}')
            bare = queue.get(timeout=5)
            assert (bare.content_type, bare.payload) == ("application/json", {"hello": 1})
            assert UNREADABLE not in bare.headers
            bare.ack()

            client.lpush(name, b"\x00\xffnot json")
            junk = queue.get(timeout=5)
            assert junk.body == b"\x00\xffnot json"
            assert "the queue item is not JSON" in junk.headers[UNREADABLE]
            junk.requeue()  # back on the list, as kombu restores a message
            polled = queue.get_nowait()
            assert polled.body == b"\x00\xffnot json"
            assert polled.headers[UNREADABLE] == junk.headers[UNREADABLE]
            polled.ack()

            queue.put({"kombu": True})
            sound = queue.get(timeout=5)
            assert sound.payload == {"kombu": True}
            assert UNREADABLE not in sound.headers
            sound.ack()
            assert client.llen(name) == 0
        finally:
            client.close()
            queue.queue.delete()
            queue.close()


def test_envelope_tells_what_is_wrong(redis_url: str) -> None:
    properties = {"delivery_tag": "t", "body_encoding": "base64"}
    bad_base64 = json.dumps({"body": "!!!notb64", "properties": properties}).encode()
    with Connection(redis_url, transport=Transport) as conn:
        channel = conn.default_channel
        cases = {
            b"[1]": "a JSON list, not a kombu message",
            b'{"body": "e30=", "properties": {}}': "no properties with a delivery_tag",
            bad_base64: "cannot be decoded as 'base64'",
            b'{"body": "x", "headers": [1], "properties": {"delivery_tag": "t"}}': (
                "headers are not an object"
            ),
            b'{"body": "e30="}': "no properties with a delivery_tag",  # lost its properties
            b'{"schema_version": 1, "x": "\xff"}': (  # not UTF-8: no JSON text
                "the queue item is not JSON: 'utf-8' codec can't decode byte 0xff"
            ),
        }
        for item, wrong in cases.items():
            made = envelope(item, "q", channel)
            assert wrong in made["headers"][UNREADABLE], item
            assert made["properties"]["delivery_info"] == {"exchange": "", "routing_key": "q"}
        # a message of ours (it names its schema_version) with a `body` field of its own
        # is the message itself, not a broken envelope
        bare = b'{"schema_version": 1, "decision_id": "d", "body": "a comment"}'
        made = envelope(bare, "q", channel)
        assert made["headers"] == {} and made["content-type"] == "application/json"
        assert base64.b64decode(made["body"]) == bare
        # what kombu reads passes as it is: a client's numeric delivery tag included;
        # a missing delivery_info is kombu's default exchange's, which acks need
        numbered: dict[str, Any] = {
            "body": "e30=",
            "properties": {"delivery_tag": 7, "body_encoding": "base64"},
        }
        info = {"exchange": "", "routing_key": "q"}
        assert envelope(json.dumps(numbered).encode(), "q", channel) == {
            **numbered,
            "properties": {**numbered["properties"], "delivery_info": info},
        }


def test_a_channel_closing_after_its_connection_keeps_its_unacked_messages(
    redis_url: str,
) -> None:
    """Celery closes a connection whose broker went away; a channel that closes after the
    transport was let go must not fail with an AttributeError (a worker took it for an
    unrecoverable error and exited). Its unacked message stays in Redis' unacked index,
    for the visibility timeout's restore."""
    queue = Queue(f"test.closing.{uuid.uuid4().hex}")
    conn = Connection(redis_url, transport=Transport)
    channel = conn.channel()
    queue.bind(channel).declare()
    Publisher(conn).publish_raw_event("x", "{}")  # declares the topology on this broker
    conn.default_channel.basic_publish(
        channel.prepare_message("{}", content_type="application/json"), "", queue.name
    )
    message = queue.bind(channel).get(no_ack=False)
    assert message is not None
    tag = message.delivery_tag
    conn.transport.client = None  # as kombu's Connection._close leaves it
    channel._disconnect_pools()
    conn.maybe_close_channel(channel)  # raised AttributeError: 'NoneType' ... 'hostname'
    # A close that could restore ends by letting go of the channel (Redis came back);
    # a task that ran on through the loss then acks its message on the closed channel:
    # a connection error, which Celery logs (an AttributeError stopped the worker).
    conn.transport.close_channel(channel)
    assert channel.connection is None
    with pytest.raises(redis.exceptions.ConnectionError, match="connection has been closed"):
        message.ack()
    raw = redis.Redis.from_url(redis_url)
    try:
        assert raw.hexists("unacked", tag), "kept for the visibility timeout's restore"
        raw.hdel("unacked", tag)
        raw.zrem("unacked_index", tag)
        raw.delete(queue.name)
    finally:
        raw.close()


def test_bindings_lost_with_a_redis_restarted_empty_are_stored_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A Redis that restarts with nothing kept has lost every binding: a publish before
    the processes declare them again reached no queue, and the event was gone. A
    channel's publish now finds the exchange's mark missing, stores again the bindings
    declared through its connection, and then routes: `interlock.interrupted` gets the
    event. A fresh Redis, where the declaration set the mark, warns of nothing."""
    from events.publisher import declare

    server = start_redis(tmp_path)
    client = redis.Redis.from_url(server.url)
    try:
        with Connection(server.url, transport=Transport) as conn:
            publisher = Publisher(conn)
            publisher.publish_raw_event("turn.interrupted", json.dumps({"n": 1}))
            assert client.llen("interlock.interrupted") == 1
            assert not [r for r in caplog.records if r.levelname == "WARNING"]
            server.restart()
            assert client.exists("_kombu.binding.interlock.events") == 0, "lost"
            publisher.publish_raw_event("turn.interrupted", json.dumps({"n": 2}))
            assert client.llen("interlock.interrupted") == 1, "the event was routed"
            [item] = client.lrange("interlock.interrupted", 0, -1)
            assert json.loads(base64.b64decode(json.loads(item)["body"])) == {"n": 2}
            assert "Redis holds no bindings of interlock.events" in caplog.text
            # A direct exchange too: a task sent to interlock.turns (a resume enqueued).
            turns = Exchange("interlock.turns", type="direct", durable=True)
            conn.Producer().publish({"task": 1}, exchange=turns, routing_key="interlock.turns")
            assert client.llen("interlock.turns") == 1
            # A binding deleted on purpose while the mark stands is not stored again.
            client.delete("_kombu.binding.interlock.events")
            caplog.clear()
            publisher.publish_raw_event("turn.interrupted", json.dumps({"n": 3}))
            assert client.llen("interlock.interrupted") == 1
            assert "Redis holds no bindings" not in caplog.text
            # A process that declared nothing on that exchange restores nothing.
            server.restart()
            with Connection(server.url, transport=Transport) as other:
                other.default_channel.basic_publish(
                    other.default_channel.prepare_message("x"), "interlock.events", "turn.x"
                )
            assert client.exists("interlock.interrupted") == 0
            declare(conn)  # as a worker does at start: the mark is set with the bindings
            assert client.get("_interlock.bound.interlock.events") == b"1"
    finally:
        client.close()
        server.stop()
