"""Routing a publish on Redis as RabbitMQ routes it: the script that reads an exchange's
bindings and pushes to every matching queue in one round trip (`ROUTE`), and the topic
match it and kombu's own path share.

Topic bindings match as AMQP has it, and RabbitMQ routes (`topic_match`), on both
paths: a binding's words are literal, `*` (exactly one word) or `#` (zero or more
words). kombu's own regex makes `#` one or more words, so that `turn.interrupted.#` or
`#.interrupted` would miss `turn.interrupted`, and reads a word such as `a*b` as a
regex.
"""

from __future__ import annotations

from typing import Any

from kombu.transport.virtual import exchange as kombu_exchange

__all__ = ["BOUND", "ROUTE", "TopicExchange", "topic_match"]

ROUTE = r"""
local function words(text)
  local found = {}
  for word in string.gmatch(text .. '.', '([^.]*)%.') do
    found[#found + 1] = word
  end
  return found
end

local function matches(pattern, i, key, j)
  while i <= #pattern do
    local word = pattern[i]
    if word == '#' then
      while pattern[i + 1] == '#' do
        i = i + 1
      end
      if i == #pattern then
        return true
      end
      for k = j, #key + 1 do
        if matches(pattern, i + 1, key, k) then
          return true
        end
      end
      return false
    end
    if j > #key or (word ~= '*' and word ~= key[j]) then
      return false
    end
    i, j = i + 1, j + 1
  end
  return j > #key
end

local topic, rkey, body, sep, prefix = ARGV[1] == 'topic', ARGV[2], ARGV[3], ARGV[4], ARGV[5]
if string.find(rkey, '[%z\n]') then
  return -1
end
if KEYS[2] then
  if ARGV[6] == 'restore' then
    for i = 7, #ARGV do
      redis.call('SADD', KEYS[1], ARGV[i])
    end
    redis.call('SET', KEYS[2], '1')
  elseif redis.call('EXISTS', KEYS[2]) == 0 then
    return -2
  end
end
local key_words = words(rkey)
local queues, seen = {}, {}
for _, member in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local a = string.find(member, sep, 1, true)
  local b = a and string.find(member, sep, a + #sep, true)
  if not b or string.find(member, sep, b + #sep, true) then
    return -1
  end
  local binding = string.sub(member, 1, a - 1)
  local stored = string.sub(member, a + #sep, b - 1)
  local queue = string.sub(member, b + #sep)
  local hit
  if topic then
    if stored == '' then
      hit = true
    else
      hit = matches(words(binding), 1, key_words, 1)
    end
    hit = hit and queue ~= ''
  else
    hit = binding == rkey
  end
  if hit and not seen[queue] then
    seen[queue] = true
    queues[#queues + 1] = queue
  end
end
for _, queue in ipairs(queues) do
  redis.call('LPUSH', prefix .. queue, body)
end
return #queues
"""
"""Route a message like kombu's topic (ARGV[1] == "topic") or direct exchange and push
it to every matching queue. KEYS[1]: the exchange's bindings; ARGV: exchange type,
routing key, message, kombu's field separator, the key prefix of the queues
(`global_keyprefix`; the client prefixes KEYS[1] itself). A topic binding stored with
no pattern matches every key, as kombu's empty regex does. Returns how many queues
got it, or -1 (nothing pushed) where kombu's own path must decide: a newline or NUL in
the key (that path matches the same way: `TopicExchange`), a malformed binding.

With KEYS[2], the exchange's mark (`BOUND`): where it is missing, the server has lost
its keys (restarted empty) or never routed for this exchange, and the script returns -2,
pushing nothing; called again with ARGV[6] = "restore" and the bindings the caller
declared (ARGV[7...], stored as kombu stores them), it adds them, sets the mark, and
routes."""

BOUND = "_interlock.bound.%s"
"""The mark, per exchange, that its bindings are in Redis (`ROUTE`'s KEYS[2])."""


def topic_match(binding: str, routing_key: str) -> bool:
    """Whether a topic binding matches a routing key, as AMQP (and RabbitMQ) match
    them: word by word, where `*` is exactly one word and `#` zero or more."""
    pattern, key = binding.split("."), routing_key.split(".")

    def match(i: int, j: int) -> bool:
        while i < len(pattern):
            word = pattern[i]
            if word == "#":
                while i + 1 < len(pattern) and pattern[i + 1] == "#":
                    i += 1
                if i + 1 == len(pattern):
                    return True
                return any(match(i + 1, k) for k in range(j, len(key) + 1))
            if j == len(key) or (word != "*" and word != key[j]):
                return False
            i, j = i + 1, j + 1
        return j == len(key)

    return match(0, 0)


class TopicExchange(kombu_exchange.TopicExchange):
    """kombu's topic exchange, matching as `topic_match` does (kombu's path: a
    prioritized message, an expiring queue, ...), like the routing script."""

    def lookup(self, table: Any, exchange: str, routing_key: str, default: Any) -> set[str]:
        # A binding stored with no pattern matches every key, as kombu's empty regex.
        return {
            queue
            for binding, pattern, queue in table
            if pattern == "" or topic_match(binding, routing_key)
        }
