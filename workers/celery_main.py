"""The Celery process `interlock worker` becomes: `python -m workers.celery_main worker
...`, Celery's own command line, with Ctrl-C and SIGTERM ending it as they end every
Interlock command until Celery's worker sets its own handling (a warm shutdown, as it
starts serving).

The process starts afresh (`interlock worker` execs it), with Python's handling of the
two signals: for the second or two Celery takes to load, Ctrl-C would end it with a
traceback or click's "Aborted!" (exit 1), and SIGTERM with no line at all. Here, either
ends it at once with the worker's last JSON line (`{"worker": "stopped", "handled": 0}`:
no task is taken before Celery's handling is set), then `interrupted` (130) or
`terminated` (143) on stderr. `interlock worker` blocks both signals from its "starting"
line on, so one sent as it becomes this process waits for these handlers. A signal the
process was started with ignored (a shell's background job ignores Ctrl-C) stays
ignored.
"""

from __future__ import annotations

import os
import signal
from types import FrameType

from .console import EXIT_INTERRUPTED, EXIT_TERMINATED
from .worker_report import report_line

__all__ = ["main"]

_ENDS = {
    signal.SIGINT: (b"\ninterrupted\n", EXIT_INTERRUPTED),
    signal.SIGTERM: (b"terminated\n", EXIT_TERMINATED),
}
"""What each signal prints on stderr, and the exit status it ends the process with."""


def _end(signum: int, _frame: FrameType | None) -> None:
    """End the process on the spot: it may be anywhere in Celery's start-up (an import,
    click), where an exception would be caught or shown as a traceback."""
    said, status = _ENDS[signal.Signals(signum)]
    report_line("stopped", 0)
    os.write(2, said)
    os._exit(status)


def main() -> None:
    """Celery's command line (`celery.__main__`), the two signals handled from the first."""
    for signum in _ENDS:
        if signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, _end)
    # `interlock worker` blocked them before it printed its "starting" line and became
    # this process: one that came meanwhile is handled now.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _ENDS)
    from celery.__main__ import main as celery

    celery()


if __name__ == "__main__":
    main()
