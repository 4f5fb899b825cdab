"""kombu's Redis transport, with one redis client per channel for its commands,
publishes routed in one round trip, and reads that pop and record a message as unacked
in one step.

kombu's Redis channel builds a new `redis.Redis` for every command it sends outside a
pipeline (a publish, the topic exchange's bindings lookup, an ack, a queue's size):
constructing one copies its table of response callbacks, about a fifth of a
millisecond of CPU, several times for each event and task. A client over a connection
pool keeps no state of its own between commands and is safe to share, so this channel
builds one and keeps it until its pool is replaced (after a reconnect).

A publish to a topic or direct exchange costs kombu two commands: read the exchange's
bindings (`SMEMBERS`), then `LPUSH` to each matching queue. This channel sends one
script that does both on the server (`redis_route.ROUTE`). It is also atomic: a queue bound before
the publish gets the message. Where the script cannot stand in, kombu's own path runs
instead: message priorities, queues with an expiry declared on this channel, a
dead-letter queue, batched publishes, a newline or NUL in a routing key, a broker
refusing scripts. Other errors of the script (a queue's key holding another type, Redis
out of memory or read-only) are raised, as kombu's own push would raise them.

Topic bindings match as AMQP has it, and RabbitMQ routes, on both paths (`redis_route`).

A channel reading one queue with acks (every worker and consumer of Interlock) waits
with `BLMOVE`, which moves a message to a reading list of its own, and takes it with a
script that pops it and records it as unacked together (`redis_pop`), where kombu's
`BRPOP` and second command leave a window in which a dying consumer loses the message.
Other reads, and everything else, are kombu's own.

An item on a queue that is no kombu message (a client that pushed its own JSON onto the
list, a truncated or hand-edited envelope) would make kombu's read raise out of the
consumer's loop, the item already popped: lost, and the consumer stopped. This channel
delivers it instead as a message (`envelope`): a JSON object with no envelope around it
as that message's JSON body, anything else as its exact bytes with the header
`UNREADABLE` saying what is wrong, so the consumer can refuse it and keep it.

Used for `redis://` and `rediss://` brokers (`transport_for`); other URLs keep their
transport.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import time
import uuid
from queue import Empty
from typing import Any

import redis
from kombu.transport import redis as kombu_redis
from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import dumps, loads

from .redis_pop import (
    QUEUE_ITEM,
    QoS,
    beat,
    give_back,
    held_by,
    pop,
    queue_of,
    reading_key,
    refused,
    rescue,
)
from .redis_route import BOUND, ROUTE, TopicExchange

__all__ = [
    "UNREADABLE",
    "Channel",
    "Transport",
    "envelope",
    "transport_for",
]

UNREADABLE = "x-interlock-unreadable"
"""The header of a message made from a queue item that was no kombu message: what is
wrong with it. The message's body is the item's bytes, exactly."""

TRANSPORT = "events.redis_transport:Transport"

MIN_BEAT = 0.05
"""The shortest `reader_beat` taken, in seconds (0 would make every wait endless)."""

log = logging.getLogger("interlock.transport")


class Channel(kombu_redis.Channel):
    QoS = QoS
    # kombu's: the classes, which each channel makes its own instances of.
    exchange_types = {  # noqa: RUF012
        **kombu_redis.Channel.exchange_types,
        "topic": TopicExchange,
    }
    from_transport_options = (  # type: ignore[assignment]
        *kombu_redis.Channel.from_transport_options,
        "reader_beat",
        "restore_held",
    )
    reader_beat = 10.0
    """Seconds between a reader's registrations of its reading list while it waits (and
    the longest wait); a reader counts as alive for three beats after it registers."""
    restore_held = False
    """Whether the messages this channel takes, unacked, are restored as soon as its time
    as a reader is up (it died, or stopped waiting for three beats), not only after the
    visibility timeout (`redis_pop.HELD`). For a consumer that handles one message at a
    time and waits again at once, such as the resume consumer; not for a Celery worker,
    which stops waiting while its pool is busy."""
    _holder: str | None = None  # the member `QoS.append` names as holder (`restore_held`)
    _shared_client: tuple[Any, Any] | None = None  # (the pool it uses, the client)
    _route: Any = None  # the registered `ROUTE` script; False once the broker refused it
    _atomic = True  # reads with `POP`; False once the broker refused it or `BLMOVE`
    _sent: str | None = None  # the read command in flight: BRPOP, BLMOVE or PING
    _waited: str | None = None  # the queue that BLMOVE or PING was sent for
    _pop_next = False  # the priority lists hold messages: pop before waiting again

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._recorded: dict[Any, str] = {}  # see `redis_pop.QoS`
        self._no_ack: set[str] = set()  # queues consumed without acks
        self._scripts: dict[str, Any] = {}  # `redis_pop`'s scripts, registered
        self._tag = uuid.uuid4().hex  # this channel's reading lists: `_member`
        self._beats: dict[str, float] = {}  # queue -> when its member last registered
        super().__init__(*args, **kwargs)

    def _create_client(self, asynchronous: bool = False) -> Any:
        if self.connection is None or self.connection.client is None:
            # The kombu connection has let go of this transport (it is being closed, as
            # Celery does when the broker goes away) and the channel, closing after it,
            # asks for a client to restore its unacked messages; or the channel is closed
            # (no connection at all) and a task that ran on through the loss acks its
            # message. kombu would fail with an AttributeError building a pool from
            # nothing, which a worker takes for an unrecoverable error and exits. A
            # connection error is what closing expects, and what Celery logs for an ack
            # that cannot be made; the messages stay in Redis' unacked index and come
            # back after the visibility timeout.
            raise redis.exceptions.ConnectionError("the broker connection has been closed")
        if asynchronous:  # blocking reads (BRPOP, pub/sub) keep their own clients
            return super()._create_client(asynchronous=True)
        pool = self.pool
        shared = self._shared_client
        if shared is None or shared[0] is not pool:
            shared = self._shared_client = (pool, super()._create_client())
        return shared[1]

    def basic_publish(self, message: Any, exchange: str, routing_key: str, **kwargs: Any) -> Any:
        kind = self.typeof(exchange).type if exchange else None
        if (
            kind not in ("topic", "direct")
            or self._route is False
            or "_publish_batch" in kwargs
            or getattr(self, "_expires", None)
            or self.deadletter_queue is not None
        ):
            return super().basic_publish(message, exchange, routing_key, **kwargs)
        self._inplace_augment_message(message, exchange, routing_key)
        unprioritized = self.priority(self._get_message_priority(message, reverse=False)) == 0
        if unprioritized and self._route_in_one_trip(kind, exchange, routing_key, dumps(message)):
            return None
        return self.typeof(exchange).deliver(message, exchange, routing_key, **kwargs)

    def _route_in_one_trip(self, kind: str, exchange: str, routing_key: str, body: str) -> bool:
        """Route and push with `ROUTE`; False when kombu's path must do it instead.

        A Redis that restarted empty has lost every binding, and until each process that
        declared one declares it again, a publish reaches no queue: lost, as if nobody
        were bound. `ROUTE` tells (the exchange's mark is gone), and this channel first
        stores again the bindings declared through its connection (Interlock's workers,
        resume consumers and commands declare all of Interlock's), then routes."""
        client = self._create_client()
        if self._route is None:
            self._route = client.register_script(ROUTE)
        # A `global_keyprefix` client prefixes the first key of a script only.
        mark = (self.global_keyprefix or "") + BOUND % (exchange,)
        keys = [self.keyprefix_queue % (exchange,), mark]
        args = [kind, routing_key, body, self.sep, self.global_keyprefix or ""]
        try:
            pushed = self._route(keys=keys, args=args, client=client)
            if int(pushed) == -2:
                known = self._declared_bindings(exchange)
                if known:
                    log.warning(
                        "Redis holds no bindings of %s (restarted empty?): storing again "
                        "the %d declared here",
                        exchange,
                        len(known),
                    )
                args += ["restore", *known]
                pushed = self._route(keys=keys, args=args, client=client)
        except redis.exceptions.ResponseError as exc:
            if not refused(exc):
                raise
            self._route = False  # scripts refused (disabled, or no EVAL): kombu's path
            log.warning(
                "Redis refused the routing script (%s); publishing with kombu's lookup", exc
            )
            return False
        return int(pushed) >= 0

    def _queue_bind(self, exchange: str, routing_key: str, pattern: str, queue: str) -> None:
        """kombu's, and the exchange's mark that its bindings are in Redis (`ROUTE`)."""
        super()._queue_bind(exchange, routing_key, pattern, queue)
        with self.conn_or_acquire() as client:
            client.set(BOUND % (exchange,), "1")

    def _declared_bindings(self, exchange: str) -> list[str]:
        """The bindings to `exchange` declared through this connection, as kombu stores
        them in Redis (`_queue_bind`)."""
        kind = self.typeof(exchange)
        return [
            self.sep.join(
                part or ""
                for part in kind.prepare_bind(key.queue, exchange, key.routing_key, arguments)
            )
            for key, arguments in list(self.state.bindings.items())
            if key.exchange == exchange
        ]

    def basic_consume(self, queue: str, *args: Any, **kwargs: Any) -> Any:
        no_ack = kwargs.get("no_ack", args[0] if args else False)
        (self._no_ack.add if no_ack else self._no_ack.discard)(queue)
        return super().basic_consume(queue, *args, **kwargs)

    def basic_get(self, queue: str, no_ack: bool = False, **kwargs: Any) -> Any:
        """kombu's polling read; with acks, the message is popped and recorded as unacked
        in one step (`redis_pop`)."""
        if no_ack or not self._atomic or not self.ack_emulation:
            return super().basic_get(queue, no_ack, **kwargs)
        client = self._create_client()
        got = self._pop(client, queue)
        expire = getattr(self, "_maybe_update_queues_expire", None)
        if expire is not None:
            expire(client, queue)
        if got is None:
            return None if self._atomic else super().basic_get(queue, no_ack, **kwargs)
        message = self.Message(got, channel=self)
        try:
            self.qos.append(message, message.delivery_tag)
        finally:
            self._recorded.pop(message.delivery_tag, None)
        return message

    def _one_queue(self) -> str | None:
        """The queue a read waits on with `BLMOVE` and takes from with `POP`: the only
        queue this channel consumes, with acks; None where kombu's `BRPOP` must read (no
        such queue, several queues, or a broker that refused either command)."""
        if not self._atomic or not self.ack_emulation:
            return None
        queues = self.active_queues
        if len(queues) != 1 or queues[0] in self._no_ack:
            return None
        return str(queues[0])

    def _brpop_start(self, timeout: Any = None) -> None:
        queue = self._one_queue()
        if queue is None:
            self._sent = "BRPOP"
            return super()._brpop_start(timeout)  # type: ignore[no-any-return]
        if timeout is None:
            timeout = self.brpop_timeout
        if self._pop_next:
            command: list[Any] = ["PING"]  # answered at once: then pop, without waiting
        elif not self._tend(queue):
            return self._brpop_start(timeout)  # the broker refused the registry: kombu's
        else:
            prefix, beat_s = self.global_keyprefix or "", self._beat()
            key = prefix + self._q_for_pri(queue, 0)
            reading = prefix + reading_key(self._member(queue))
            wait = min(float(timeout), beat_s) if timeout else beat_s  # registered meanwhile
            command = ["BLMOVE", key, reading, "RIGHT", "LEFT", wait]
        self._sent, self._waited = command[0], queue
        self._in_poll = self.client.connection
        self._brpop_sent_at = time.monotonic()  # type: ignore[assignment]
        self.client.connection.send_command(*command)
        return None

    def _brpop_read(self, **options: Any) -> Any:
        if self._sent in ("BLMOVE", "PING"):
            return self._wait_read(**options)
        return self._kombu_brpop_read(**options)

    def _wait_read(self, **options: Any) -> Any:
        """Read the reply of the wait (`BLMOVE`, or `PING` when the priority lists hold
        messages), then pop and deliver the queue's oldest message with `POP`."""
        sent, queue = self._sent or "BLMOVE", self._waited or ""
        try:
            try:
                self._parse_reply(sent, **options)
            except redis.exceptions.ResponseError as exc:
                if not refused(exc):
                    raise
                self._refuse(sent, exc)
                raise Empty() from None
            finally:
                self._in_poll = None  # type: ignore[assignment]
                self._sent = None
            if getattr(self, "_closing", False) or self._one_queue() != queue:
                # Closing, or no longer read this way (cancelled; consumed without acks,
                # so nothing would ack a record): the item goes back to its queue. Where
                # that fails, it stays registered and another reader puts it back later.
                with contextlib.suppress(*self.connection_errors, redis.exceptions.ResponseError):
                    self._give_back(self.client, queue)
                raise Empty()
            got = self._pop(self.client, queue)
            if got is None:
                raise Empty()
            message_tag = got["properties"]["delivery_tag"]
            self._holder = self._member(queue) if self.restore_held else None
            try:
                self.connection._deliver(got, queue)
            finally:
                self._recorded.pop(message_tag, None)
                self._holder = None
            return True
        finally:
            self._flush_reauth()

    def _parse_reply(self, command: str, **options: Any) -> Any:
        """The reply to the read command in flight; a connection error drops the
        connection (the next iteration reconnects) and is raised."""
        try:
            return self.client.parse_response(self.client.connection, command, **options)
        except self.connection_errors:
            self.client.connection.disconnect()
            raise

    def _flush_reauth(self) -> None:
        """Send a pending re-authentication now that no read is in flight, as kombu does
        after each read (kombu 5.6 and later)."""
        flush = getattr(self, "_flush_brpop_reauth", None)
        if flush is not None:
            flush()

    def _beat(self) -> float:
        return max(MIN_BEAT, float(self.reader_beat))

    def _member(self, queue: str) -> str:
        """The registry member of this channel's reading list for `queue`."""
        return self._tag + queue

    def _tend(self, queue: str) -> bool:
        """Before a wait on `queue`: register its reading list when a beat is due, and put
        back the reading lists of readers whose time is up. False where the broker
        refused the scripts (kombu's reads take over)."""
        now = time.monotonic()
        if now - self._beats.get(queue, -1e9) < self._beat():
            return True
        client = self._create_client()
        try:
            for member in beat(self, client, [self._member(queue)], 3 * self._beat()):
                moved = rescue(self, client, member)
                if moved >= 0:  # its time was up, and this reader dropped it
                    moved += self._restore_held(client, member)
                if moved > 0:
                    log.warning(
                        "put %d message%s back on queue %s: a reader that stopped "
                        "responding had taken %s",
                        moved,
                        "" if moved == 1 else "s",
                        queue_of(member),
                        "it" if moved == 1 else "them",
                    )
        except redis.exceptions.ResponseError as exc:
            if not refused(exc):
                raise
            self._refuse("POP", exc)
            return False
        self._beats[queue] = now
        return True

    def _restore_held(self, client: Any, member: str) -> int:
        """Restore the unacked messages `HELD` names `member` (a reader whose time is up)
        the holder of, as the visibility timeout would later; how many there were."""
        tags = held_by(self, client, member)
        for tag in tags:
            self.qos.restore_by_tag(tag, client)
        return len(tags)

    def _give_back(self, client: Any, queue: str) -> None:
        """Put this channel's reading list of `queue` back on the queue and leave the
        registry (the next wait registers again)."""
        self._beats.pop(queue, None)
        give_back(self, client, self._member(queue))

    def close(self) -> None:
        if not self.closed and self._beats:
            # Put back what a wait whose reply was lost (a connection error) may have left
            # on a reading list, and leave the registry; a wait in flight gives its own
            # queue's back when kombu's close reads its reply (`_wait_read`).
            waiting = self._waited if self._in_poll and self._sent == "BLMOVE" else None
            with contextlib.suppress(*self.connection_errors, redis.exceptions.ResponseError):
                client = self._create_client()
                for queue in [q for q in self._beats if q != waiting]:
                    self._give_back(client, queue)
        super().close()

    def _do_restore_message(
        self, payload: Any, exchange: Any, routing_key: Any, pipe: Any, leftmost: bool = False
    ) -> None:
        """kombu's restore of one message. Headers or a delivery_info that are no object
        (`null`, a list) are restored as empty objects: kombu, marking the message
        redelivered in them, would fail and drop it."""
        if isinstance(payload, dict):
            if not isinstance(payload.get("headers", {}), dict):
                payload["headers"] = {}
            properties = payload.get("properties")
            if isinstance(properties, dict) and not isinstance(
                properties.get("delivery_info", {}), dict
            ):
                properties["delivery_info"] = {}
        super()._do_restore_message(payload, exchange, routing_key, pipe, leftmost)

    def _pop(self, client: Any, queue: str) -> dict[str, Any] | None:
        """The oldest message of `queue`, popped and recorded with `POP` (see
        `redis_pop.QoS`); None when the queue is empty, or where the broker refused the
        script (then `_atomic` is False, and kombu's reads take over)."""
        try:
            got = pop(self, client, queue, self._member(queue), hold=self.restore_held)
        except redis.exceptions.ResponseError as exc:
            if not refused(exc):
                raise
            self._refuse("POP", exc)
            return None
        if got is None:
            self._pop_next = False
            return None
        item, tag, left = got
        self._pop_next = left > 0
        message = envelope(item, queue, self)
        if tag is not None:
            self._recorded[message["properties"]["delivery_tag"]] = tag
        return message

    def _refuse(self, command: str, exc: Exception) -> None:
        self._atomic = False
        for queue in list(self._beats):  # leave the registry (scripts may be refused)
            with contextlib.suppress(*self.connection_errors, redis.exceptions.ResponseError):
                self._give_back(self._create_client(), queue)
        log.warning(
            "Redis refused %s (%s); reading queues with kombu's BRPOP, which can lose a "
            "message popped by a consumer that dies before recording it",
            "the queue read script" if command == "POP" else command,
            exc,
        )

    def _poll_error(self, type: str, **options: Any) -> Any:
        """An error event on the wait's socket: read the wait's reply (a broken
        connection raises, and is dropped), and let the next poll start a new read. A
        message the wait had moved stays on the reading list; the next read pops it
        without waiting (kombu's own handler throws a `BRPOP` reply's message away)."""
        if type == "BRPOP" and self._sent in ("BLMOVE", "PING"):
            sent, self._sent = self._sent, None
            try:
                reply = self._parse_reply(sent)
            finally:
                self._in_poll = None  # type: ignore[assignment]
            if reply is not None:  # a moved message (BLMOVE), or messages to pop (PING)
                self._pop_next = True
            return reply
        return super()._poll_error(type, **options)

    def _kombu_brpop_read(self, **options: Any) -> Any:
        """kombu's read of a `BRPOP` reply, with the item turned into a message by
        `envelope` (kombu's `loads` raises on an item that is no JSON)."""
        try:
            dest_item = self._parse_reply("BRPOP", **options)
            if not dest_item:
                raise Empty()
            dest, item = dest_item
            queue = bytes_to_str(dest).rsplit(self.sep, 1)[0]
            self._queue_cycle.rotate(queue)
            self.connection._deliver(envelope(item, queue, self), queue)
            return True
        finally:
            self._in_poll = None  # type: ignore[assignment]  # as kombu does
            self._flush_reauth()

    def _get(self, queue: str, timeout: Any = None) -> Any:
        """kombu's `_get` (a polling read, `basic_get`), with the item read by `envelope`."""
        expire = getattr(self, "_maybe_update_queues_expire", None)
        with self.conn_or_acquire() as client:
            for pri in self.priority_steps:
                item = client.rpop(self._q_for_pri(queue, pri))
                if item:
                    if expire is not None:
                        expire(client, queue)
                    return envelope(item, queue, self)
            if expire is not None:
                expire(client, queue)
            raise Empty()


def envelope(item: bytes | str, queue: str, channel: Any) -> dict[str, Any]:
    """The kombu message that the queue item `item` holds. An item that is no kombu
    message is made into one: a JSON object without kombu's envelope (no `properties`,
    and no `body` unless it has a `schema_version`: `_is_envelope`) becomes its JSON
    body; anything else keeps its exact bytes as the body, with what is wrong in the
    `UNREADABLE` header. Made messages are acked and restored
    like any other. The record `redis_pop` keeps of such an item until its message is
    made (`QUEUE_ITEM`), restored after a reader stopped, is read as the item itself."""
    raw = item if isinstance(item, bytes) else item.encode("utf-8", errors="surrogatepass")
    message = _envelope(raw, queue, channel)
    if (message.get("headers") or {}).get(QUEUE_ITEM):
        # the record of a queue item that was no kombu message, restored after its
        # reader stopped (`redis_pop`): read the item itself, as the first time
        try:
            item = base64.b64decode(str(message.get("body") or ""), validate=True)
        except ValueError:
            return message  # not one of those records: the message as it is
        return _envelope(item, queue, channel)
    return message


def _envelope(raw: bytes, queue: str, channel: Any) -> dict[str, Any]:
    try:
        # strict (kombu's own decode replaces bytes), a leading byte order mark ignored
        payload = loads(raw.decode("utf-8-sig"))
    except (ValueError, RecursionError) as exc:  # not UTF-8, not JSON, nested too deep
        return _made(raw, queue, f"the queue item is not JSON: {exc}")
    if isinstance(payload, dict) and not _is_envelope(payload):
        return _made(raw, queue, None)  # a bare JSON message, as another client may push
    wrong = _unsound(payload, channel)
    if wrong is not None:
        return _made(raw, queue, wrong)
    message: dict[str, Any] = payload
    info = message["properties"].get("delivery_info") or {}
    if not isinstance(info.get("exchange"), str) or not isinstance(info.get("routing_key"), str):
        # as kombu's default exchange has it: what acks, rejects and restores need
        message["properties"]["delivery_info"] = {**info, "exchange": "", "routing_key": queue}
    return message


def _is_envelope(payload: dict[str, Any]) -> bool:
    """Whether the JSON object `payload` is meant as a kombu envelope: it has kombu's
    `properties`, or a `body` without the `schema_version` every Interlock message
    carries (an envelope that lost its properties, said so). A message of ours with a
    `body` field of its own (a reviewer's comment, say) is the message itself."""
    return "properties" in payload or ("body" in payload and "schema_version" not in payload)


def _unsound(payload: Any, channel: Any) -> str | None:
    """What keeps `payload` from being read as a kombu message, or None."""
    if not isinstance(payload, dict):
        return f"the queue item is a JSON {type(payload).__name__}, not a kombu message"
    properties = payload.get("properties")
    tag = properties.get("delivery_tag") if isinstance(properties, dict) else None
    if not isinstance(properties, dict) or isinstance(tag, bool) or not isinstance(tag, str | int):
        return "the kombu message has no properties with a delivery_tag"
    if not isinstance(payload.get("headers", {}), dict):
        return "the kombu message's headers are not an object"
    if not isinstance(properties.get("delivery_info") or {}, dict):
        return "the kombu message's delivery_info is not an object"
    for key in ("content-type", "content-encoding"):
        if not isinstance(payload.get(key) or "", str):
            return f"the kombu message's {key} is not a string"
    body, encoding = payload.get("body"), properties.get("body_encoding")
    if body:
        try:
            channel.decode_body(body, encoding)
        except (ValueError, TypeError, AttributeError, LookupError) as exc:
            return f"the kombu message's body cannot be decoded as {encoding!r}: {exc}"
    return None


def _made(raw: bytes, queue: str, wrong: str | None) -> dict[str, Any]:
    return {
        "body": base64.b64encode(raw).decode(),
        "content-encoding": "binary" if wrong is not None else "utf-8",
        "content-type": "application/octet-stream" if wrong is not None else "application/json",
        "headers": {UNREADABLE: wrong[:500]} if wrong is not None else {},
        "properties": {
            "body_encoding": "base64",
            "delivery_tag": str(uuid.uuid4()),
            "delivery_info": {"exchange": "", "routing_key": queue},
            "delivery_mode": 2,
            "priority": 0,
        },
    }


class Transport(kombu_redis.Transport):
    Channel = Channel


def transport_for(broker_url: str) -> str | None:
    """This transport's import path for a Redis broker URL; None for any other broker
    (kombu then picks the transport from the URL's scheme)."""
    scheme = broker_url.split("://", 1)[0].lower()
    return TRANSPORT if scheme in ("redis", "rediss") else None
