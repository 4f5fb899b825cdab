"""The `interlock` console script, and how a command stops on Ctrl-C and SIGTERM.

Loading the command line and the module of the command given takes a moment (click's
modules and ours; pydantic, SQLAlchemy and kombu are loaded once the command runs). A
signal in that time used to end a command otherwise than one that comes later: Ctrl-C
with a `KeyboardInterrupt` traceback, SIGTERM on the spot, silently. The script sets the
handling of both first, with nothing but the standard library loaded, and a start-up
that either stops ends as a stopped command ends: `interrupted` and exit 130,
`terminated` and exit 143 (`stop`). Once the command starts, it handles them itself
(`workers.cli.base.terminable`), or the process's own handling is given back
(`started`)."""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any, NoReturn

__all__ = ["EXIT_INTERRUPTED", "EXIT_TERMINATED", "Terminated", "main", "started", "stop"]

EXIT_INTERRUPTED = 130
"""The exit code of a command stopped by Ctrl-C (128 + SIGINT, as shells report it)."""
EXIT_TERMINATED = 143
"""The exit code of a command that SIGTERM stopped (128 + SIGTERM), where it ends with
`terminated` (a `terminable` command, and any command while it starts)."""


class Terminated(BaseException):
    """SIGTERM, raised where a `terminable` command stands, as Ctrl-C raises
    KeyboardInterrupt: what the command holds is let go on the way out (a queue of its
    own deleted). No `Exception`, so no handler of errors takes it for one."""


class _Interrupted(BaseException):
    """Ctrl-C while the command line starts. No `KeyboardInterrupt`: click would end
    that with "Aborted!" and exit 1 while it reads the arguments."""


_BEFORE: dict[int, Callable[[int, FrameType | None], Any] | int | None] = {}
"""The handler of each signal before the start-up's own (`main`)."""


def _on_signal(signum: int, frame: FrameType | None) -> None:
    raise Terminated if signum == signal.SIGTERM else _Interrupted


def stop(signum: int) -> NoReturn:
    """End the process as a command stopped by `signum` (SIGINT: Ctrl-C; SIGTERM) ends:
    one line on stderr (`interrupted`, on a line of its own after the terminal's `^C`;
    `terminated`) and the shell's exit status for the signal."""
    if signum == signal.SIGTERM:
        print("terminated", file=sys.stderr, flush=True)
        sys.exit(EXIT_TERMINATED)
    print("\ninterrupted", file=sys.stderr, flush=True)
    sys.exit(EXIT_INTERRUPTED)


def started() -> None:
    """The command starts: give Ctrl-C back the handling the process had before the
    start-up's (Python's `KeyboardInterrupt`, which the commands end with `interrupted`).
    SIGTERM goes on raising `Terminated`, so that a command that loads what it runs on
    once it has started ends as it would have while starting, until it sets its own
    handling (the worker's and the resume consumer's graceful stop). A no-op where the
    start-up set none (the command line run in process)."""
    if signal.getsignal(signal.SIGINT) is _on_signal:
        handler = _BEFORE[signal.SIGINT]
        signal.signal(signal.SIGINT, signal.SIG_DFL if handler is None else handler)


def main() -> None:
    """Run `interlock` (`workers.cli.main`), Ctrl-C and SIGTERM handled from the first.
    A signal the process was started with ignored (a shell's background job ignores
    Ctrl-C) stays ignored, as Python leaves it."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(signum) is not signal.SIG_IGN:
            _BEFORE[signum] = signal.signal(signum, _on_signal)
    try:
        from .cli import main as command_line

        command_line()
    except (KeyboardInterrupt, _Interrupted):
        stop(signal.SIGINT)
    except Terminated:
        stop(signal.SIGTERM)
