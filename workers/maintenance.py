"""Periodic upkeep, run by the resume consumer: expire overdue interrupts, publish what
the outbox still holds, and delete the rows of events published long ago."""

from __future__ import annotations

import logging
import threading

from events.expiry import expire_overdue

from .runtime import Runtime
from .turns import log_failure

__all__ = ["Maintenance"]

log = logging.getLogger("interlock.maintenance")


class Maintenance:
    """`run_once()` now, or `start(interval)` in a daemon thread."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def run_once(self) -> tuple[int, int]:
        """(interrupts expired, events published); then the rows of events published
        longer ago than `INTERLOCK_OUTBOX_RETENTION` are deleted."""
        expired = expire_overdue(self.rt.store, self.rt.outbox)
        for event in expired:
            log.info("snapshot %s expired (deadline %s)", event.snapshot_id, event.expires_at)
        published = self.rt.relay.flush()
        pruned = self.rt.outbox.prune_sent(self.rt.settings.outbox_retention)
        if pruned:
            log.info("deleted %d outbox rows of events published before the retention", pruned)
        return len(expired), published

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
