"""`interlock demo`'s question at a terminal: the answers it takes, and Ctrl-C, which
must end it whenever it comes."""

from __future__ import annotations

import io
import os
import pty
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import click
import pytest

from tests.queue_helpers import child_env, interlock_bin
from workers.demo import confirm, read_answer

QUESTION = b"Approve this transfer? [y/N]: "


class Terminal:
    """`interlock demo --in-process` on a pseudo-terminal of its own, as a user runs it."""

    def __init__(self, cwd: Path) -> None:
        self.leader, follower = pty.openpty()
        self.proc = subprocess.Popen(
            [interlock_bin(), "demo", "--in-process"],
            stdin=follower,
            stdout=follower,
            stderr=follower,
            env=child_env(),
            cwd=cwd,
            start_new_session=True,
        )
        os.close(follower)
        self.seen = b""

    def read_until(self, text: bytes, count: int = 1, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while self.seen.count(text) < count and time.monotonic() < deadline:
            self._read(1)
        assert self.seen.count(text) >= count, self.seen

    def type(self, keys: bytes) -> None:
        os.write(self.leader, keys)

    def exit_code(self, timeout: float = 60) -> int:
        """Wait for the demo to end, reading all the while (a full terminal would
        block it), then take what is left."""
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            if not self._read(0.5):
                break
        code = self.proc.wait(timeout=30)
        while self._read(0.5):
            pass
        return code

    def _read(self, wait: float) -> bool:
        """False once the other side has closed."""
        if select.select([self.leader], [], [], wait)[0]:
            try:
                self.seen += os.read(self.leader, 4096)
            except OSError:
                return False
        return True

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
        os.close(self.leader)


@pytest.fixture
def terminal(tmp_path: Path) -> Iterator[Terminal]:
    term = Terminal(tmp_path)
    try:
        yield term
    finally:
        term.close()


def test_ctrl_c_at_the_demo_prompt_is_interrupted_too(terminal: Terminal) -> None:
    """At a terminal, Ctrl-C while the demo asks: the same "interrupted" and 130
    (click turns it into its Abort, which printed "Aborted!" and exited 1)."""
    terminal.read_until(QUESTION)
    terminal.proc.send_signal(signal.SIGINT)  # what the terminal's Ctrl-C sends
    assert terminal.exit_code() == 130, terminal.seen
    assert b"interrupted" in terminal.seen and b"Aborted" not in terminal.seen, terminal.seen


def test_the_demo_asks_again_until_it_can_read_the_answer(terminal: Terminal) -> None:
    terminal.read_until(QUESTION)
    terminal.type(b"maybe\n")
    terminal.read_until(QUESTION, count=2)
    assert b"Error: invalid input" in terminal.seen, terminal.seen
    terminal.type(b"Y\n")
    assert terminal.exit_code() == 0, terminal.seen
    assert b"human: approve" in terminal.seen, terminal.seen
    assert b"transferred $500.00 to savings" in terminal.seen, terminal.seen


def test_an_empty_answer_at_the_terminal_declines(terminal: Terminal) -> None:
    """The default of `[y/N]` is no: Enter alone declines the transfer."""
    terminal.read_until(QUESTION)
    terminal.type(b"\n")
    assert terminal.exit_code() == 0, terminal.seen
    assert b"human: deny" in terminal.seen, terminal.seen
    assert b"was declined" in terminal.seen, terminal.seen


def test_end_of_input_at_the_prompt_ends_the_demo_as_interrupted(terminal: Terminal) -> None:
    terminal.read_until(QUESTION)
    terminal.type(b"\x04")  # Ctrl-D on an empty line: the end of the terminal's input
    assert terminal.exit_code() == 130, terminal.seen
    assert b"interrupted" in terminal.seen and b"human:" not in terminal.seen, terminal.seen


# ------------------------------------------------------------- the read, in this process


class Keyboard:
    """Standard input from a pipe: what is typed, and the end of the input."""

    def __init__(self) -> None:
        read_end, self._write_end = os.pipe()
        self.stdin = io.TextIOWrapper(io.FileIO(read_end, "r"), encoding="utf-8")
        self.closed = False

    def type(self, keys: bytes) -> None:
        os.write(self._write_end, keys)

    def end(self) -> None:
        if not self.closed:
            self.closed = True
            os.close(self._write_end)


@pytest.fixture
def keyboard(monkeypatch: pytest.MonkeyPatch) -> Iterator[Keyboard]:
    keys = Keyboard()
    monkeypatch.setattr("sys.stdin", keys.stdin)
    try:
        yield keys
    finally:
        keys.end()
        keys.stdin.close()


def _later(delay: float, action: Callable[[], object]) -> threading.Timer:
    timer = threading.Timer(delay, action)
    timer.start()
    return timer


def test_ctrl_c_during_the_wait_raises_keyboard_interrupt(keyboard: Keyboard) -> None:
    timer = _later(0.2, lambda: os.kill(os.getpid(), signal.SIGINT))
    try:
        with pytest.raises(KeyboardInterrupt):
            read_answer()  # nothing is ever typed: only the signal ends the wait
    finally:
        timer.join()
    assert signal.set_wakeup_fd(-1) == -1, "the wake-up descriptor is put back"


def test_another_signal_does_not_end_the_wait(keyboard: Keyboard) -> None:
    seen: list[int] = []
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: seen.append(signum))
    timers = [
        _later(0.1, lambda: os.kill(os.getpid(), signal.SIGUSR1)),
        _later(0.4, lambda: keyboard.type(b"yes\n")),
    ]
    try:
        assert read_answer() == "yes\n"
    finally:
        for timer in timers:
            timer.join()
        signal.signal(signal.SIGUSR1, previous)
    assert seen == [signal.SIGUSR1], "its handler ran, and the wait went on"


@pytest.mark.parametrize(
    ("typed", "expected"),
    [(b"y\n", True), (b" YES \n", True), (b"n\n", False), (b"No\n", False), (b"\n", False)],
)
def test_confirm_reads_yes_no_and_the_default(
    keyboard: Keyboard, typed: bytes, expected: bool
) -> None:
    keyboard.type(typed)
    assert confirm("Approve?") is expected


def test_confirm_asks_again_until_it_can_read_the_answer(
    keyboard: Keyboard, capsys: pytest.CaptureFixture[str]
) -> None:
    keyboard.type(b"perhaps\n")
    timer = _later(0.2, lambda: keyboard.type(b"y\n"))
    try:
        assert confirm("Approve?") is True
    finally:
        timer.join()
    out = capsys.readouterr().out
    assert out == "Approve? [y/N]: Error: invalid input\nApprove? [y/N]: ", out


def test_confirm_at_the_end_of_the_input_aborts(keyboard: Keyboard) -> None:
    keyboard.type(b"maybe\n")
    keyboard.end()
    with pytest.raises(click.Abort):
        confirm("Approve?")
