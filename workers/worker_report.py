"""The worker's last JSON line: `{"worker": "stopped" | "drained", "handled": N}`.

`interlock worker` hands the Celery process it becomes a copy of its standard output
(whose own copy goes to the log), so that stdout holds JSON lines only, as for the resume
consumer: the "starting" line and, as the worker ends, this one."""

from __future__ import annotations

import contextlib
import json
import os

__all__ = ["REPORT_FD_ENV", "report_line", "report_stop"]

REPORT_FD_ENV = "INTERLOCK_WORKER_REPORT_FD"
"""Set by `interlock worker` to the file descriptor of its standard output."""


def report_stop(drained: bool) -> None:
    """Write the last line to the descriptor `REPORT_FD_ENV` names (nothing when unset:
    a plain `celery worker` of the app): "drained" when burst mode stopped the worker
    on an empty queue, else "stopped"; `handled` counts the tasks this worker took."""
    from celery.worker import state

    report_line("drained" if drained else "stopped", sum(state.total_count.values()))


def report_line(ended: str, handled: int) -> None:
    """Write `{"worker": ended, "handled": handled}` to the descriptor `REPORT_FD_ENV`
    names (nothing when unset). Loads nothing: a signal handler may call it."""
    fd = os.environ.get(REPORT_FD_ENV)
    if not fd or not fd.isdigit():
        return
    line = {"worker": ended, "handled": handled}
    with contextlib.suppress(OSError):  # the reader is gone: nothing to tell
        os.write(int(fd), (json.dumps(line) + "\n").encode())
