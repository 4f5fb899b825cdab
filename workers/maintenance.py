"""Periodic upkeep, run by the resume consumer: expire overdue interrupts, publish what
the outbox still holds, and delete the rows of events published long ago."""

from __future__ import annotations

import logging
import threading
from time import monotonic

from events.expiry import expire_overdue

from .runtime import Runtime
from .turns import log_failure

__all__ = ["Maintenance"]

log = logging.getLogger("interlock.maintenance")

PRUNE_INTERVAL = 300.0
"""Seconds between two deletions of old outbox rows: the retention is days, so a round
every five minutes keeps the table short without a write transaction every interval."""

PRUNE_BATCH = 1000
"""Rows deleted a round at most; a round that deletes this many is followed by another
at the next interval, until the backlog is gone."""


class Maintenance:
    """`run_once()` now, or `start(interval)` in a daemon thread."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._next_prune = 0.0  # monotonic time; the first round prunes

    def run_once(self) -> tuple[int, int]:
        """(interrupts expired, events published); then, at most every
        `PRUNE_INTERVAL` seconds, the rows of events published longer ago than
        `INTERLOCK_OUTBOX_RETENTION` are deleted."""
        expired = expire_overdue(self.rt.store, self.rt.outbox)
        for event in expired:
            log.info("snapshot %s expired (deadline %s)", event.snapshot_id, event.expires_at)
        published = self.rt.relay.flush()
        self._prune()
        return len(expired), published

    def _prune(self) -> None:
        now = monotonic()
        if now < self._next_prune:
            return
        pruned = self.rt.outbox.prune_sent(self.rt.settings.outbox_retention, PRUNE_BATCH)
        if pruned:
            log.info("deleted %d outbox rows of events published before the retention", pruned)
        self._next_prune = now if pruned >= PRUNE_BATCH else now + PRUNE_INTERVAL

    def start(self, interval: float) -> None:
        def loop() -> None:
            while True:
                try:
                    self.run_once()
                except Exception as exc:
                    again = f"; trying again in {interval:.0f} s"
                    log_failure(log, exc, "maintenance failed", again)
                if self._stop.wait(interval):
                    return

        self._thread = threading.Thread(target=loop, name="interlock-maintenance", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
