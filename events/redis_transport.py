"""kombu's Redis transport, with one redis client per channel for its commands.

kombu's Redis channel builds a new `redis.Redis` for every command it sends outside a
pipeline (a publish, the topic exchange's bindings lookup, an ack, a queue's size):
constructing one copies its table of response callbacks, about a fifth of a
millisecond of CPU, several times for each event and task. A client over a connection
pool keeps no state of its own between commands and is safe to share, so this channel
builds one and keeps it until its pool is replaced (after a reconnect). Everything
else, blocking reads included, is kombu's own.

Used for `redis://` and `rediss://` brokers (`transport_for`); other URLs keep their
transport.
"""

from __future__ import annotations

from typing import Any

from kombu.transport import redis as kombu_redis

__all__ = ["Channel", "Transport", "transport_for"]

TRANSPORT = "events.redis_transport:Transport"


class Channel(kombu_redis.Channel):
    _shared_client: tuple[Any, Any] | None = None  # (the pool it uses, the client)

    def _create_client(self, asynchronous: bool = False) -> Any:
        if asynchronous:  # blocking reads (BRPOP, pub/sub) keep their own clients
            return super()._create_client(asynchronous=True)
        pool = self.pool
        shared = self._shared_client
        if shared is None or shared[0] is not pool:
            shared = self._shared_client = (pool, super()._create_client())
        return shared[1]


class Transport(kombu_redis.Transport):
    Channel = Channel


def transport_for(broker_url: str) -> str | None:
    """This transport's import path for a Redis broker URL; None for any other broker
    (kombu then picks the transport from the URL's scheme)."""
    scheme = broker_url.split("://", 1)[0].lower()
    return TRANSPORT if scheme in ("redis", "rediss") else None
