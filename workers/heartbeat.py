"""The worker's heartbeat file: touched from the Celery consumer's own loop while it
serves, so `interlock health --heartbeat-file` sees a worker that is alive, not only a
broker and a store that answer."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, ClassVar

from celery import bootsteps

__all__ = ["EVERY", "WorkerHeartbeat"]

EVERY = 5.0
"""Seconds between two touches (`interlock health --max-age`, 30 s by default, allows
for a few missed)."""

log = logging.getLogger("interlock.worker")


class WorkerHeartbeat(bootsteps.StartStopStep):  # type: ignore[misc]
    """A consumer bootstep: with `INTERLOCK_HEARTBEAT_FILE` set, touch that file now and
    every `EVERY` seconds on the consumer's timer. The timer runs in the loop that
    fetches tasks (prefork's event loop), so a loop that hangs stops touching it."""

    requires: ClassVar[tuple[str, ...]] = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        from .settings import Settings

        super().__init__(parent, **kwargs)
        found = Settings.from_env().heartbeat_file
        self.path = Path(found) if found else None
        self._timer: Any = None

    def start(self, parent: Any) -> None:
        if self.path is None:
            return
        self._touch()
        self._timer = parent.timer.call_repeatedly(EVERY, self._touch)
        log.info("touching %s every %.0f s while serving", self.path, EVERY)

    def stop(self, parent: Any) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _touch(self) -> None:
        assert self.path is not None
        try:
            self.path.touch()
        except OSError as exc:  # a health check will say so; the worker goes on
            log.warning("cannot touch the heartbeat file %s: %s", self.path, exc)
