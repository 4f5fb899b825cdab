"""The worker's heartbeat file: touched from the Celery consumer's own loop while it
serves, so `interlock health --heartbeat-file` sees a worker that is alive, not only a
broker and a store that answer."""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path
from typing import Any, ClassVar

from celery import bootsteps

__all__ = ["EVERY", "WorkerHeartbeat", "touch"]

EVERY = 5.0
"""Seconds between two touches (`interlock health --max-age`, 30 s by default, allows
for a few missed)."""

log = logging.getLogger("interlock.worker")


def touch(path: Path) -> str | None:
    """Touch `path`; None when done, else why not (a missing folder, a read-only disk):
    a process that serves says so in its log and goes on, a health check tells. A folder
    is refused: its time can be set, but `interlock health` takes no folder for a
    heartbeat."""
    if path.is_dir():
        return f"cannot touch the heartbeat file {path}: {os.strerror(errno.EISDIR)}"
    try:
        path.touch()
    except OSError as exc:
        return f"cannot touch the heartbeat file {path}: {exc.strerror or exc}"
    return None


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
        self._failed: str | None = None  # said once, then again once it can be touched

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
        failed = touch(self.path)
        if failed is not None and failed != self._failed:  # a health check will say so
            log.warning("%s; the worker goes on serving", failed)
        elif failed is None and self._failed is not None:
            log.info("touching the heartbeat file %s again", self.path)
        self._failed = failed
