"""Turns to submit, read from a file: one per line (`interlock submit --file`).

A line is the user's message as it stands, or, when it starts with `{`, a JSON object
`{"text": "...", "session_id": "..."}` (`session_id` optional: a new session when
absent). Blank lines are skipped. The whole file is read and checked before anything is
sent, so a bad line (its number in the error) leaves nothing half submitted.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from interlock import Status, StatusError

__all__ = ["FileTurn", "read_turns"]

MAX_TURNS = 100_000
"""Turns one file may hold: they are read into memory before any is sent."""


@dataclass(frozen=True)
class FileTurn:
    line: int
    text: str
    session_id: str | None = None


def read_turns(lines: Iterable[str], name: str = "the file") -> list[FileTurn]:
    """The turns of `lines`; a `StatusError` (INVALID_ARGUMENT) naming the first bad
    line, or saying the file holds none."""
    turns: list[FileTurn] = []
    try:
        for number, raw in enumerate(lines, start=1):
            _add(turns, name, number, raw)
    except UnicodeDecodeError as exc:  # the file is read as UTF-8 (click.File)
        raise StatusError(
            Status.INVALID_ARGUMENT, f"{name} is not UTF-8 text: {exc.reason}"
        ) from None
    if not turns:
        raise StatusError(Status.INVALID_ARGUMENT, f"no turns in {name}: it has no text line")
    return turns


def _add(turns: list[FileTurn], name: str, number: int, raw: str) -> None:
    line = raw.strip()
    if not line:
        return
    if len(turns) == MAX_TURNS:
        raise _bad(name, number, f"more than {MAX_TURNS} turns in one file: split it")
    turns.append(
        _object_turn(name, number, line) if line.startswith("{") else FileTurn(number, line)
    )


def _object_turn(name: str, number: int, line: str) -> FileTurn:
    try:
        value = json.loads(line)
    except ValueError as exc:
        raise _bad(name, number, f"not a JSON object: {exc}") from None
    if not isinstance(value, dict):
        raise _bad(name, number, "not a JSON object")
    unknown = sorted(set(value) - {"text", "session_id"})
    if unknown:
        raise _bad(name, number, f"unknown field(s) {', '.join(unknown)}: use text, session_id")
    text, session_id = value.get("text"), value.get("session_id")
    if not isinstance(text, str) or not text.strip():
        raise _bad(name, number, '"text" must be a non-empty string')
    if session_id is not None and (not isinstance(session_id, str) or not session_id):
        raise _bad(name, number, '"session_id" must be a non-empty string or absent')
    return FileTurn(number, text, session_id)


def _bad(name: str, number: int, reason: str) -> StatusError:
    return StatusError(Status.INVALID_ARGUMENT, f"{name}, line {number}: {reason}")
