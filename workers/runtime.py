"""What a worker or a consumer process holds: registry, store, outbox, broker."""

from __future__ import annotations

from functools import cached_property

from kombu.connection import Connection

from events.decision_log import DecisionLog
from events.outbox import Outbox, OutboxRelay
from events.publisher import Publisher
from interlock import Agent, Interlock, SqlSessionStore
from interlock.stores.sql_journal import SqlTurnJournal

from .holders import process_id
from .loader import load_registry
from .settings import Settings

__all__ = ["Runtime"]


class Runtime:
    """Everything is built on first use, so a prefork child builds its own after fork."""

    def __init__(self, settings: Settings, registry: Interlock | None = None) -> None:
        self.settings = settings
        self._registry = registry

    @cached_property
    def registry(self) -> Interlock:
        return self._registry if self._registry is not None else load_registry(self.settings.app)

    @cached_property
    def store(self) -> SqlSessionStore:
        return SqlSessionStore(self.settings.store_url)

    @cached_property
    def outbox(self) -> Outbox:
        return Outbox(self.store)

    @cached_property
    def journal(self) -> SqlTurnJournal:
        """Turn journal and turn leases, in the store's database."""
        return SqlTurnJournal(self.store)

    @property
    def worker_id(self) -> str:
        """`HOST:PIDNS:PID` of this process (the start of its lease owners)."""
        return process_id()

    @cached_property
    def decisions(self) -> DecisionLog:
        return DecisionLog(self.store)

    def connection(self) -> Connection:
        """A new broker connection with the shared transport options."""
        return self.settings.connection()

    @cached_property
    def publisher(self) -> Publisher:
        return Publisher(self.connection())

    @cached_property
    def relay(self) -> OutboxRelay:
        # A publisher (a connection) of its own: the relay may run in a thread beside
        # the consumer, and a kombu connection must not be used by two threads at once.
        return OutboxRelay(self.outbox, Publisher(self.connection()))

    def agent(self, name: str) -> Agent:
        """The registry's agent `name`, keeping its sessions in this runtime's store."""
        self.outbox  # noqa: B018 - the outbox must hook the store before any save
        return self.registry.lookup_agent(name).with_store(self.store)

    def close(self) -> None:
        if "relay" in self.__dict__:
            self.relay.publisher.close()
            self.relay.publisher.connection.release()
        if "outbox" in self.__dict__:
            self.outbox.close()  # mark what was published, so no sweep sends it again
        if "publisher" in self.__dict__:
            self.publisher.close()
            self.publisher.connection.release()
        if "store" in self.__dict__:
            self.store.dispose()
