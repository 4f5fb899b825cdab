"""A queue read that cannot lose a message: pop it and record it as unacked in one step.

kombu's Redis transport reads a queue with `BRPOP`, then records the message in its
unacked hash and index with a second command. A consumer that dies between the two
(killed, out of memory, its host gone) has taken the message off the list without
leaving a trace of it: lost. Here the pop and the record are one server-side script
(`POP`), so a message is always either on its list or in the unacked index, from which
kombu's visibility-timeout sweep restores it.

A script cannot block, so a consumer waits first with `BLMOVE queue reading RIGHT LEFT`,
which moves the queue's oldest item to a list of that consumer's own (its *reading
list*), then runs `POP`, which takes the item from there. Only the consumer the move
served wakes. The wait sees one key: the queue's list at priority 0, where every message
without a priority goes. Messages on a priority's own list are popped in kombu's order
by the same script; the script says when any are left, and the next read pops again
without waiting.

A consumer that dies between the move and `POP` leaves the item on its reading list.
Every consumer keeps its reading lists' names in a registry (`READERS`), as alive for
three of its beats: it registers at least every `reader_beat` seconds while it waits,
and no wait lasts longer. Every consumer looks in the registry as often for entries
whose time is up: their items go back to the end of their queue where they are read
next (`RESCUE`). Putting back the items of a consumer that is only slow
is harmless: `POP` and `RESCUE` are each one step, so an item is taken by one of them.

What the script records is what kombu's `QoS.append` would, `[message, exchange,
routing_key]` under the delivery tag, so acks, rejects and restores stay kombu's. A
kombu message (printable ASCII JSON that Python's reader takes too, with properties
holding a string `delivery_tag` and a `delivery_info` with a string exchange and
routing key, as kombu publishes them) is recorded as it is: a record kombu could not
read back would stop its restores. Any other item of up to `WRAP_LIMIT` bytes (a
client's bare JSON, bytes that are no JSON, an envelope kombu would not have written)
is recorded as a kombu message whose body is the item's exact bytes,
marked with the `QUEUE_ITEM` header, under a tag of the reader's; once delivered, the
reader replaces that record with the message it made of the item (`envelope`), and a
record restored before then is read as the item itself again.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from typing import Any

import redis
from kombu.transport import redis as kombu_redis
from kombu.transport import virtual
from kombu.utils.json import dumps

log = logging.getLogger("interlock.transport")

__all__ = [
    "BEAT",
    "HELD",
    "POP",
    "QUEUE_ITEM",
    "RAISED",
    "READERS",
    "READING",
    "RESCUE",
    "UNRESTORABLE",
    "WRAP_LIMIT",
    "QoS",
    "beat",
    "give_back",
    "held_by",
    "pop",
    "queue_of",
    "reading_key",
    "refused",
    "rescue",
]

QUEUE_ITEM = "x-interlock-queue-item"
"""The header of the record `POP` keeps for a queue item that is no kombu message of its
own: the message's body is the item's exact bytes, which `envelope` reads again as the
item itself when the record is restored."""

POP = r"""
local B64 = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/'
local function b64(data)
  local out = {}
  for i = 1, #data, 3 do
    local a, b, c = string.byte(data, i, i + 2)
    local v = a * 65536 + (b or 0) * 256 + (c or 0)
    local s1, s2 = math.floor(v / 262144) % 64, math.floor(v / 4096) % 64
    local s3, s4 = math.floor(v / 64) % 64, v % 64
    out[#out + 1] = string.sub(B64, s1 + 1, s1 + 1) .. string.sub(B64, s2 + 1, s2 + 1)
      .. (b and string.sub(B64, s3 + 1, s3 + 1) or '=')
      .. (c and string.sub(B64, s4 + 1, s4 + 1) or '=')
  end
  return table.concat(out)
end

local n = #KEYS - 3  -- KEYS[1]: the reading list; KEYS[2..n]: the queue's lists
local function record(tag, message, exchange, routing_key)
  redis.call('ZADD', KEYS[n + 2], ARGV[1], tag)
  redis.call('HSET', KEYS[n + 1], tag, '[' .. message .. ',' .. cjson.encode(exchange) .. ','
    .. cjson.encode(routing_key) .. ']')
  if ARGV[6] ~= '' then
    redis.call('HSET', KEYS[n + 3], tag, ARGV[6])
  end
end

local strict = cjson.new()  -- a JSON reader no more lenient than Python's: no 0x10, inf
strict.decode_invalid_numbers(false)

for i = 1, n do
  local item = redis.call('RPOP', KEYS[i])
  if item then
    local tag
    local ok, m = false, nil
    if not string.find(item, '[^\32-\126]') then  -- printable ASCII, as kombu writes JSON
      ok, m = pcall(strict.decode, item)
    end
    if ok and type(m) == 'table' and type(m['properties']) == 'table' then
      local t, d = m['properties']['delivery_tag'], m['properties']['delivery_info']
      if type(t) == 'string' and type(d) == 'table'
          and type(d['exchange']) == 'string' and type(d['routing_key']) == 'string' then
        tag = t
        record(tag, item, d['exchange'], d['routing_key'])
      end
    end
    if not tag and #item > tonumber(ARGV[5]) then
      tag = false  -- too long to encode here without holding Redis up: the reader records it
    elseif not tag then
      tag = ARGV[2]
      record(tag, '{"body":"' .. b64(item) .. '","content-encoding":"binary",'
        .. '"content-type":"application/octet-stream","headers":{"' .. ARGV[4] .. '":1},'
        .. '"properties":{"body_encoding":"base64","delivery_tag":' .. cjson.encode(tag)
        .. ',"delivery_info":{"exchange":"","routing_key":' .. cjson.encode(ARGV[3])
        .. '},"delivery_mode":2,"priority":0}}', '', ARGV[3])
    end
    local left = 0
    for j = 3, n do
      left = left + redis.call('LLEN', KEYS[j])
    end
    return {item, tag, left}
  end
end
return false
"""
"""Pop the item of a reading list (KEYS[1]), else the oldest item of a queue's lists
(KEYS[2..n], in kombu's priority order), and record it in the unacked hash (KEYS[n+1])
and index (KEYS[n+2], scored ARGV[1], the time), as kombu's `QoS.append` would, and,
where ARGV[6] names the reader's member, in `HELD` (KEYS[n+3]) as held by it: a kombu
message (printable ASCII JSON, as kombu writes it, that Python's reader would take too)
under its own delivery tag; any other item (no JSON, no envelope, a tag that is not a
string) of at most ARGV[5] bytes as a kombu message of its exact bytes, with the header
ARGV[4] (`QUEUE_ITEM`), under the tag ARGV[2], for the queue ARGV[3]. Returns false
when every list is empty, else {item, the tag it is recorded under or false (not
recorded: too long), how many items the priority lists (KEYS[3..n]) still hold}."""

READERS = "_interlock.readers"
"""The registry of reading lists: a sorted set of members (a reader's 32-character tag,
then the queue's name) scored with the time, Redis' own, until which their reader
counts as alive: three of its beats after it last registered. Each reader sets its own
time, so readers with different beats share one registry."""

UNRESTORABLE = "_interlock.unrestorable"
"""A hash of the unacked records kombu could not read back (not JSON to Python, nested
too deep), by delivery tag: set aside, with an error in the log, where kombu's restore
would raise at each sweep and stop every restore after it."""

HELD = "_interlock.held"
"""A hash of the unacked messages taken by readers that asked for it (`restore_held`), by
delivery tag: the registry member of the reader that holds it. When that reader's time
is up, the reader that puts its reading list back restores these too, at once, where
kombu would wait for the visibility timeout. An ack, a reject or a restore drops the
entry (`QoS._remove_from_indices`)."""

READING = "_interlock.reading."
"""The prefix of a reading list's key; the member follows."""

BEAT = r"""
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
for i = 3, #ARGV do
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[1]), ARGV[i])
end
return redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. now, 'LIMIT', 0, tonumber(ARGV[2]))
"""
"""Register the members ARGV[3..] in the registry KEYS[1] as alive for ARGV[1] seconds
from Redis' time; return up to ARGV[2] members whose time is up."""

RESCUE = r"""
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score then
  return -1
end
local t = redis.call('TIME')
if tonumber(score) >= tonumber(t[1]) + tonumber(t[2]) / 1000000 then
  return -1
end
local moved = 0
while redis.call('LMOVE', KEYS[2], KEYS[3], 'LEFT', 'RIGHT') do
  moved = moved + 1
end
redis.call('ZREM', KEYS[1], ARGV[1])
return moved
"""
"""Where the time of the member ARGV[1] in the registry KEYS[1] is up: put the items of
its reading list KEYS[2] back at the end of the queue KEYS[3] that is read next, in
their order, and drop the member. Returns how many items moved; -1 where its time is
not up, or where the member is gone."""


WRAP_LIMIT = 32 * 1024
"""Bytes of the longest item that is no kombu message `POP` records itself: encoding it
(base64, in Lua) holds Redis up for about a millisecond a kilobyte. A longer one is
recorded by the reader, kombu's way, in a second command."""


def reading_key(member: str) -> str:
    """The key of a member's reading list (without the global key prefix)."""
    return READING + member


def _script(channel: Any, client: Any, name: str, source: str) -> Any:
    scripts: dict[str, Any] = channel._scripts
    script = scripts.get(name)
    if script is None:
        script = scripts[name] = client.register_script(source)
    return script


def pop(
    channel: Any, client: Any, queue: str, member: str, *, hold: bool = False
) -> tuple[bytes, str | None, int] | None:
    """Run `POP` on `member`'s reading list and `queue`'s lists with `client`: the item,
    the delivery tag it is recorded under as unacked (None where the reader must record
    it) and the items left on the priority lists; None when the lists are empty. With
    `hold`, the record names `member` as its holder in `HELD`. Raises redis'
    ResponseError where the broker refuses the script."""
    script = _script(channel, client, "pop", POP)
    keys = [reading_key(member)]
    keys += [channel._q_for_pri(queue, pri) for pri in channel.priority_steps]
    keys += [channel.unacked_key, channel.unacked_index_key, HELD]
    prefix = channel.global_keyprefix or ""  # a prefixing client prefixes KEYS[1] only
    keys[1:] = [prefix + key for key in keys[1:]]
    args = [repr(time.time()), str(uuid.uuid4()), queue, QUEUE_ITEM, str(WRAP_LIMIT)]
    args.append(member if hold else "")
    reply = script(keys=keys, args=args, client=client)
    if not reply:
        return None
    item, tag, left = reply
    if isinstance(tag, bytes):
        tag = tag.decode("ascii")  # printable ASCII, or the reader's own uuid
    return item, tag if isinstance(tag, str) else None, int(left)


def beat(channel: Any, client: Any, members: list[str], alive: float, limit: int = 50) -> list[str]:
    """Register `members` as alive for `alive` seconds (`BEAT`) and return up to `limit`
    members of other readers whose time is up."""
    script = _script(channel, client, "beat", BEAT)
    reply = script(keys=[READERS], args=[repr(alive), str(limit), *members], client=client)
    found = [m.decode() if isinstance(m, bytes) else str(m) for m in reply]
    return [m for m in found if m not in members]


def queue_of(member: str) -> str:
    """The queue of a registry member (after the reader's 32-character tag)."""
    return member[32:]


def _keys(channel: Any, member: str) -> tuple[str, str]:
    """The keys, prefixed, of `member`'s reading list and of its queue's list."""
    prefix = channel.global_keyprefix or ""
    return prefix + reading_key(member), prefix + channel._q_for_pri(queue_of(member), 0)


def rescue(channel: Any, client: Any, member: str) -> int:
    """Put `member`'s reading list back on its queue and drop it from the registry
    (`RESCUE`), only if its time is up; -1 where it is not. Returns the items moved."""
    script = _script(channel, client, "rescue", RESCUE)
    return int(script(keys=[READERS, *_keys(channel, member)], args=[member], client=client))


def give_back(channel: Any, client: Any, member: str) -> None:
    """A reader's own `member`: put its reading list back on its queue, and drop it from
    the registry once the list is empty. Plain commands, so that it works where the
    broker refuses scripts; the reader is not waiting, so nothing moves in meanwhile.
    A client that prefixes keys prefixes those of LLEN and ZREM, not LMOVE's."""
    reading, queue = _keys(channel, member)
    with contextlib.suppress(redis.exceptions.ResponseError):  # no LMOVE: Redis 6.0
        while client.execute_command("LMOVE", reading, queue, "LEFT", "RIGHT"):
            pass
    if not client.llen(reading_key(member)):  # else another reader puts it back later
        client.zrem(READERS, member)


def held_by(channel: Any, client: Any, member: str) -> list[str]:
    """The delivery tags `HELD` names `member` the holder of."""
    prefix = channel.global_keyprefix or ""  # HGETALL is not among the prefixed commands
    entries: dict[bytes, bytes] = client.hgetall(prefix + HELD)
    text = member.encode()
    return [tag.decode() for tag, who in entries.items() if who == text]


class QoS(kombu_redis.QoS):
    """kombu's Redis QoS, which skips recording a message `POP` has recorded already.

    `channel._recorded` maps a delivery tag about to be delivered to the tag `POP`
    recorded for its item: the same tag for a message delivered as it was, another where
    the item was delivered as a message made from it (`envelope`). In the latter case
    the made message is recorded and the item's record dropped, in one transaction."""

    def append(self, message: Any, delivery_tag: Any) -> None:
        recorded = self.channel._recorded.pop(delivery_tag, None)
        holder: str | None = self.channel._holder  # set while `POP` with `hold` delivers
        if recorded is None:
            super().append(message, delivery_tag)
            if holder is not None:
                with self.pipe_or_acquire() as pipe:
                    pipe.hset(HELD, delivery_tag, holder).execute()
            return
        if recorded != delivery_tag:
            delivery = message.delivery_info
            raw = dumps([message._raw, delivery["exchange"], delivery["routing_key"]])
            with self.pipe_or_acquire() as pipe:
                pipe.zadd(self.unacked_index_key, {delivery_tag: time.time()})
                pipe.hset(self.unacked_key, delivery_tag, raw)
                if holder is not None:
                    pipe.hset(HELD, delivery_tag, holder)
                self._remove_from_indices(recorded, pipe).execute()
        virtual.QoS.append(self, message, delivery_tag)

    def _remove_from_indices(self, delivery_tag: Any, pipe: Any = None) -> Any:
        """kombu's, and the tag's `HELD` entry (an ack, a reject, a restore)."""
        with self.pipe_or_acquire(pipe) as pipe:
            return super()._remove_from_indices(delivery_tag, pipe).hdel(HELD, delivery_tag)

    def restore_by_tag(self, tag: Any, client: Any = None, leftmost: bool = False) -> None:
        """kombu's restore; a record it cannot read back is set aside in `UNRESTORABLE`
        (kombu's restore raises on it at every sweep, and stops the sweep)."""
        try:
            super().restore_by_tag(tag, client, leftmost)
        except (ValueError, TypeError, RecursionError) as exc:
            with self.channel.conn_or_acquire(client) as conn:
                record = conn.hget(self.unacked_key, tag)
                with conn.pipeline() as pipe:
                    if record is not None:
                        pipe.hset(UNRESTORABLE, tag, record)
                    self._remove_from_indices(tag, pipe).execute()
            log.error(
                "the unacked message %s cannot be read back (%s: %s); it is kept in "
                "the Redis hash %s",
                tag,
                type(exc).__name__,
                exc,
                UNRESTORABLE,
            )


RAISED = ("WRONGTYPE", "OOM", "READONLY", "MISCONF", "BUSY", "LOADING", "NOREPLICAS")
"""Errors of a command or script that ran (it may have changed data before it failed) or
of a server that would refuse kombu's own commands as well: raised. Any other error
reply is taken for a refusal to run the command at all (an unknown or renamed command,
`EVAL` disabled or denied by an ACL, a Redis-compatible server that forbids scripts
touching undeclared keys)."""


_RAISED_CLASSES = (
    redis.exceptions.OutOfMemoryError,
    redis.exceptions.ReadOnlyError,
    redis.exceptions.BusyLoadingError,
)
"""The errors of `RAISED` that redis-py turns into classes of their own, dropping the
code from the message."""


def refused(exc: redis.exceptions.ResponseError) -> bool:
    """Whether `exc` is a refusal to run the command at all (see `RAISED`)."""
    if isinstance(exc, _RAISED_CLASSES):
        return False
    return str(exc).split(" ", 1)[0] not in RAISED
