"""Turns to submit, read from a file: one per line (`interlock submit --file`).

A line is the user's message as it stands, or, when it starts with `{`, a JSON object
`{"text": "...", "session_id": "...", "turn_id": "..."}` (`session_id` optional: a new
session when absent; `turn_id` optional: a new one when absent, and a turn sent again
with the same one runs once). Blank lines are skipped, and the spaces around a line
are no part of it; a byte order mark at the start of the file is no part of its first
line. Lines end at a line feed (`\n`, or `\r\n`) only: a carriage return or a Unicode
line separator inside a line is part of its message, so the numbers in errors are
those of `sed -n Np` and `wc -l`. The whole
file is read and checked before anything is sent, so a bad line (its number in the
error) leaves nothing half submitted: that includes what a worker would refuse before
the turn runs, a NUL character or a lone surrogate.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from interlock import Status, StatusError
from interlock.journal import session_for_turn

from .decisions import unstorable

__all__ = ["FileTurn", "file_lines", "read_turns", "session_for"]

MAX_TURNS = 100_000
"""Turns one file may hold: they are read into memory before any is sent."""

SHOWN = 10
"""Bad lines an error gives with their reasons; the others are counted."""

FIELDS = ("text", "session_id", "turn_id")
"""The fields of a JSON line."""


@dataclass(frozen=True)
class FileTurn:
    """One turn to send: the line it is on (0 for `--text`), the message, and the ids
    the line gives (None: none given)."""

    line: int
    text: str
    session_id: str | None = None
    turn_id: str | None = None


def file_lines(data: bytes, name: str = "the file") -> list[str]:
    """The lines of a file's bytes, split at line feeds only and decoded as UTF-8 (a
    byte order mark at the start dropped); a `StatusError` (INVALID_ARGUMENT) naming
    the lines that are no UTF-8 text."""
    lines: list[str] = []
    bad: list[StatusError] = []
    for number, raw in enumerate(data.split(b"\n"), start=1):
        if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]
        try:
            lines.append(raw.decode("utf-8"))
        except UnicodeDecodeError as exc:
            bad.append(_bad(name, number, f"not UTF-8 text: {exc.reason} at byte {exc.start + 1}"))
    _refuse(name, bad)
    if lines and lines[-1] == "":
        lines.pop()  # the line feed that ends the last line starts none
    return lines


def read_turns(lines: Iterable[str], name: str = "the file") -> list[FileTurn]:
    """The turns of `lines`; a `StatusError` (INVALID_ARGUMENT) naming the bad lines,
    or saying the file holds none."""
    turns: list[FileTurn] = []
    ids: dict[str, int] = {}  # turn_id: the line that gives it
    bad: list[StatusError] = []
    for number, raw in enumerate(lines, start=1):
        try:
            _add(turns, ids, name, number, raw)
        except _TooMany as exc:
            bad.append(exc.error)
            break  # the lines after it are not read: the file is to be split
        except StatusError as exc:
            bad.append(exc)
    _refuse(name, bad)
    if not turns:
        raise StatusError(Status.INVALID_ARGUMENT, f"no turns in {name}: it has no text line")
    return turns


def session_for(turn: FileTurn) -> str:
    """The session `turn` goes to: its own; for a turn with a `turn_id` and no session,
    one named after the turn id (the same each time it is sent, so that a turn sent
    again names the session it ran in); else a new one."""
    if turn.session_id is not None:
        return turn.session_id
    if turn.turn_id is not None:
        return session_for_turn(turn.turn_id)
    return str(uuid.uuid4())


def _add(turns: list[FileTurn], ids: dict[str, int], name: str, number: int, raw: str) -> None:
    line = raw.strip()
    if not line:
        return
    if len(turns) == MAX_TURNS:
        raise _TooMany(_bad(name, number, f"more than {MAX_TURNS} turns in one file: split it"))
    turn = (
        _object_turn(name, number, line) if line.startswith("{") else _text_turn(name, number, line)
    )
    if turn.turn_id is not None:
        first = ids.setdefault(turn.turn_id, number)
        if first != number:
            said = json.dumps(turn.turn_id)
            raise _bad(name, number, f"turn_id {said} is line {first}'s too: each turn has its own")
    turns.append(turn)


def _text_turn(name: str, number: int, line: str) -> FileTurn:
    _check_sendable(name, number, line)
    return FileTurn(number, line)


def _object_turn(name: str, number: int, line: str) -> FileTurn:
    try:
        value = json.loads(line)
    except ValueError as exc:
        raise _bad(name, number, f"not a JSON object: {exc}") from None
    if not isinstance(value, dict):
        raise _bad(name, number, "not a JSON object")
    _check_sendable(name, number, value)
    unknown = sorted(set(value) - set(FIELDS))
    if unknown:
        raise _bad(name, number, f"unknown field(s) {', '.join(unknown)}: use {', '.join(FIELDS)}")
    text = value.get("text")
    if not isinstance(text, str) or not text.strip():
        raise _bad(name, number, '"text" must be a non-empty string')
    session_id = _optional_id(name, number, value, "session_id")
    turn_id = _optional_id(name, number, value, "turn_id")
    if turn_id is not None:
        from .resume_check import reserved, reserved_said

        if reserved(turn_id):
            raise _bad(name, number, reserved_said(turn_id))
    return FileTurn(number, text, session_id, turn_id)


def _optional_id(name: str, number: int, value: dict[str, Any], field: str) -> str | None:
    """The id `field` of a JSON line (absent or null: None), a non-empty string."""
    found = value.get(field)
    if found is not None and (not isinstance(found, str) or not found.strip()):
        raise _bad(name, number, f'"{field}" must be a non-empty string or absent')
    return found if isinstance(found, str) else None


def _check_sendable(name: str, number: int, data: Any) -> None:
    """Refuse what a worker would refuse before the turn runs ("run_turn request
    contains ..."): a NUL character or a lone surrogate in any string of the line."""
    bad = unstorable(data)
    if bad is not None:
        raise _bad(name, number, f"contains {bad}: a worker would refuse the turn")


class _TooMany(Exception):
    def __init__(self, error: StatusError) -> None:
        self.error = error


def _bad(name: str, number: int, reason: str) -> StatusError:
    return StatusError(Status.INVALID_ARGUMENT, f"{name}, line {number}: {reason}")


def _refuse(name: str, bad: list[StatusError]) -> None:
    """Raise one error for the bad lines found: the first `SHOWN` with their reasons."""
    if not bad:
        return
    if len(bad) == 1:
        raise bad[0]
    shown = "; ".join(error.message.removeprefix(f"{name}, ") for error in bad[:SHOWN])
    more = len(bad) - SHOWN
    rest = f"; and {more} more bad line{'s' if more != 1 else ''}" if more > 0 else ""
    raise StatusError(Status.INVALID_ARGUMENT, f"{name}: {len(bad)} bad lines: {shown}{rest}")
