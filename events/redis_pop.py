"""A queue read that cannot lose a message: pop it and record it as unacked in one step.

kombu's Redis transport reads a queue with `BRPOP`, then records the message in its
unacked hash and index with a second command. A consumer that dies between the two
(killed, out of memory, its host gone) has taken the message off the list without
leaving a trace of it: lost. Here the pop and the record are one server-side script
(`POP`), so a message is always either on its list or in the unacked index, from which
kombu's visibility-timeout sweep restores it.

A script cannot block, so a consumer waits first with `BLMOVE key key RIGHT RIGHT`,
which returns the list's oldest item without taking it (it moves it to where it already
is), then runs `POP`. The wait sees one key: the queue's list at priority 0, where every
message without a priority goes. Messages on a priority's own list are popped in
kombu's order by the same script; the script says when any are left, and the next read
pops again without waiting.

What the script records is what kombu's `QoS.append` would, `[message, exchange,
routing_key]` under the delivery tag, so acks, rejects and restores stay kombu's. It
records only a message it can read: a JSON object with properties holding a string
`delivery_tag` and a `delivery_info` with a string exchange and routing key (every
message kombu publishes). Anything else is left to kombu's second command, as before.
"""

from __future__ import annotations

import time
from typing import Any

import redis
from kombu.transport import redis as kombu_redis
from kombu.transport import virtual
from kombu.utils.json import dumps

__all__ = ["POP", "RAISED", "QoS", "pop", "refused"]

POP = r"""
local n = #KEYS - 2
for i = 1, n do
  local item = redis.call('RPOP', KEYS[i])
  if item then
    local tag = false
    local ok, m = pcall(cjson.decode, item)
    if ok and type(m) == 'table' then
      local p = m['properties']
      if type(p) == 'table' then
        local t, d = p['delivery_tag'], p['delivery_info']
        if type(t) == 'string' and type(d) == 'table'
            and type(d['exchange']) == 'string' and type(d['routing_key']) == 'string' then
          redis.call('ZADD', KEYS[n + 2], ARGV[1], t)
          redis.call('HSET', KEYS[n + 1], t, '[' .. item .. ','
            .. cjson.encode(d['exchange']) .. ',' .. cjson.encode(d['routing_key']) .. ']')
          tag = t
        end
      end
    end
    local left = 0
    for j = 2, n do
      left = left + redis.call('LLEN', KEYS[j])
    end
    return {item, tag, left}
  end
end
return false
"""
"""Pop the oldest item of a queue's lists (KEYS[1..n], in kombu's priority order) and,
where it is a kombu message, record it in the unacked hash (KEYS[n+1]) and index
(KEYS[n+2], scored ARGV[1], the time). Returns false when every list is empty, else
{item, its recorded delivery tag or false, how many items the lists after the first
still hold}."""


def pop(channel: Any, client: Any, queue: str) -> tuple[bytes, str | None, int] | None:
    """Run `POP` on `queue`'s lists with `client`: the item, the delivery tag recorded
    for it (None where kombu must record it) and the items left on the priority lists;
    None when the queue is empty. Raises redis' ResponseError where the broker refuses
    the script."""
    script = channel._pop_script
    if script is None:
        script = channel._pop_script = client.register_script(POP)
    keys = [channel._q_for_pri(queue, pri) for pri in channel.priority_steps]
    keys += [channel.unacked_key, channel.unacked_index_key]
    prefix = channel.global_keyprefix or ""  # a prefixing client prefixes KEYS[1] only
    keys[1:] = [prefix + key for key in keys[1:]]
    reply = script(keys=keys, args=[repr(time.time())], client=client)
    if not reply:
        return None
    item, tag, left = reply
    if tag is not None and not isinstance(tag, str):
        tag = tag.decode() if isinstance(tag, bytes) else None  # a Lua false reads as None
    return item, tag, int(left)


class QoS(kombu_redis.QoS):
    """kombu's Redis QoS, which skips recording a message `POP` has recorded already.

    `channel._recorded` maps a delivery tag about to be delivered to the tag `POP`
    recorded for its item: the same tag for a message delivered as it was, another where
    the item was delivered as a message made from it (`envelope`). In the latter case
    the made message is recorded and the item's record dropped, in one transaction."""

    def append(self, message: Any, delivery_tag: Any) -> None:
        recorded = self.channel._recorded.pop(delivery_tag, None)
        if recorded is None:
            super().append(message, delivery_tag)
            return
        if recorded != delivery_tag:
            delivery = message.delivery_info
            raw = dumps([message._raw, delivery["exchange"], delivery["routing_key"]])
            with self.pipe_or_acquire() as pipe:
                pipe.zadd(self.unacked_index_key, {delivery_tag: time.time()})
                pipe.hset(self.unacked_key, delivery_tag, raw)
                self._remove_from_indices(recorded, pipe).execute()
        virtual.QoS.append(self, message, delivery_tag)


RAISED = ("WRONGTYPE", "OOM", "READONLY", "MISCONF", "BUSY", "LOADING", "NOREPLICAS")
"""Errors of a command or script that ran (it may have changed data before it failed) or
of a server that would refuse kombu's own commands as well: raised. Any other error
reply is taken for a refusal to run the command at all (an unknown or renamed command,
`EVAL` disabled or denied by an ACL, a Redis-compatible server that forbids scripts
touching undeclared keys)."""


def refused(exc: redis.exceptions.ResponseError) -> bool:
    """Whether `exc` is a refusal to run the command at all (see `RAISED`)."""
    return str(exc).split(" ", 1)[0] not in RAISED
