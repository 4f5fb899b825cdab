"""Reading the turns of `interlock submit --file`: what a line may be, and the error
that names a bad one before anything is sent."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from interlock import Status, StatusError
from workers import turn_file
from workers.cli import main
from workers.turn_file import FileTurn, file_lines, read_turns, session_for


def test_lines_are_messages_or_json_objects() -> None:
    lines = [
        "Transfer $5 to savings\n",
        "   \n",
        '{"text": "Hi", "session_id": "s-1"}\n',
        '{"text": "Hello"}',
        "[not an object, so a message]",
        '{"text": "Again", "turn_id": "batch-7.6", "session_id": null}',
        '{"text": "Both", "session_id": "s-2", "turn_id": "batch-7.7"}',
    ]
    assert read_turns(lines) == [
        FileTurn(1, "Transfer $5 to savings"),
        FileTurn(3, "Hi", "s-1"),
        FileTurn(4, "Hello"),
        FileTurn(5, "[not an object, so a message]"),
        FileTurn(6, "Again", turn_id="batch-7.6"),
        FileTurn(7, "Both", "s-2", "batch-7.7"),
    ]


def test_a_turn_id_names_the_same_session_each_time() -> None:
    """A line that gives a turn_id and no session: sent again, it names the session the
    turn ran in (a new one for another turn id); a line without either, a new session
    each time."""
    again = FileTurn(1, "Hi", turn_id="batch-7.1")
    assert session_for(again) == session_for(FileTurn(9, "Hi", turn_id="batch-7.1"))
    assert session_for(again) != session_for(FileTurn(1, "Hi", turn_id="batch-7.2"))
    assert session_for(FileTurn(1, "Hi", "s-1", "batch-7.1")) == "s-1"
    assert session_for(FileTurn(1, "Hi")) != session_for(FileTurn(1, "Hi"))


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ('{"text": "cut', "not a JSON object: "),
        ('{"txt": "typo"}', "unknown field(s) txt: use text, session_id, turn_id"),
        ('{"session_id": "s"}', '"text" must be a non-empty string'),
        ('{"text": "  "}', '"text" must be a non-empty string'),
        ('{"text": "hi", "session_id": 7}', '"session_id" must be a non-empty string'),
        ('{"text": "hi", "turn_id": 7}', '"turn_id" must be a non-empty string or absent'),
        ('{"text": "hi", "turn_id": ""}', '"turn_id" must be a non-empty string or absent'),
        ('{"text": "hi", "session_id": " "}', '"session_id" must be a non-empty string'),
        ("Hello\x00world", "contains a NUL character (\\u0000): a worker would refuse the turn"),
        ('{"text": "Hello\\u0000"}', "contains a NUL character (\\u0000): a worker would refuse"),
        ('{"text": "hi", "session_id": "s\\u0000"}', "contains a NUL character (\\u0000)"),
        ('{"text": "hi", "turn_id": "t\\u0000"}', "contains a NUL character (\\u0000)"),
        ('{"text": "hi\\ud800"}', "contains a lone surrogate (\\ud800), which is not text"),
        # ids only Interlock gives: the worker would refuse them (turn.failed, turn_id null)
        ('{"text": "hi", "turn_id": "resume:abc"}', "turn_id 'resume:abc' is reserved: "),
        ('{"text": "hi", "turn_id": "session:abc"}', "turn_id 'session:abc' is reserved: "),
    ],
)
def test_a_bad_line_is_named(line: str, reason: str) -> None:
    with pytest.raises(StatusError) as info:
        read_turns(["Hello", line], name="turns.txt")
    assert info.value.status is Status.INVALID_ARGUMENT
    assert info.value.message.startswith(f"turns.txt, line 2: {reason}"), info.value.message


def test_a_turn_id_is_given_once_in_a_file() -> None:
    """Two lines with one turn_id would run once (the second is taken for the first
    sent again): refused, naming both lines."""
    lines = ['{"text": "a", "turn_id": "t-1"}', "b", '{"text": "c", "turn_id": "t-1"}']
    with pytest.raises(StatusError) as info:
        read_turns(lines, name="turns.txt")
    assert info.value.message == (
        'turns.txt, line 3: turn_id "t-1" is line 1\'s too: each turn has its own'
    )


def test_a_file_over_the_limit_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """The turns are held in memory until all are checked: a file has a ceiling."""
    monkeypatch.setattr(turn_file, "MAX_TURNS", 2)
    with pytest.raises(StatusError) as info:
        read_turns(["a", "b", "", "c"], name="big.txt")
    assert info.value.message == "big.txt, line 4: more than 2 turns in one file: split it"


def test_a_file_without_text_is_refused() -> None:
    with pytest.raises(StatusError) as info:
        read_turns(["", "  \n"], name="empty.txt")
    assert info.value.status is Status.INVALID_ARGUMENT
    assert info.value.message == "no turns in empty.txt: it has no text line"


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--text", "hi", "--file", "-"], 2, "Error: give --text or --file, not both"),
        ([], 2, "Error: give the message with --text, or a file of them with --file"),
        (["--text", " "], 2, "Error: Invalid value for --text: the message is empty"),
        (
            ["--text", "hi", "--session", " "],
            2,
            "Error: Invalid value for --session: the session id is empty (leave --session out "
            "for a new session)",
        ),
        (["--text", "hi", "--session", ""], 2, "Error: Invalid value for --session: the session"),
        (["--file", "-", "--session", "s"], 2, "Error: --session goes with --text"),
        (["--file", "-"], 1, "error: INVALID_ARGUMENT: no turns in <stdin>: it has no text line"),
        (
            ["--text", "Hello\x00"],
            1,
            "error: INVALID_ARGUMENT: --text contains a NUL character (\\u0000): a worker "
            "would refuse the turn",
        ),
        (
            ["--text", "caf\udce9"],
            1,
            "error: INVALID_ARGUMENT: --text contains a lone surrogate (\\udce9), which is not "
            "text: a worker would refuse the turn",
        ),
        (
            ["--text", "hi", "--session", "s\udcff"],
            1,
            "error: INVALID_ARGUMENT: --session contains a lone surrogate (\\udcff)",
        ),
        (
            ["--text", "hi", "--store", "notaurl"],
            1,
            "error: INVALID_ARGUMENT: store URL 'notaurl' is not a database URL",
        ),
        (
            ["--text", "hi", "--broker", "redis://127.0.0.1:99999/0"],
            1,
            "error: INVALID_ARGUMENT: broker URL 'redis://127.0.0.1:99999/0' has a bad port: "
            "Port out of range 0-65535",
        ),
        (
            ["--text", "hi", "--broker", "redis://127.0.0.1:1/abc"],
            1,
            "error: INVALID_ARGUMENT: broker URL 'redis://127.0.0.1:1/abc' names Redis "
            "database 'abc', which is no number",
        ),
    ],
)
def test_submit_refuses_before_it_connects(args: list[str], code: int, message: str) -> None:
    """Nothing listens on the broker given: these fail before any connection. A usage
    mistake exits 2, bad input 1."""
    result = CliRunner().invoke(
        main,
        ["submit", "--broker", "redis://127.0.0.1:1/0", "--agent", "bankingAgent", *args],
        input="\n",
    )
    assert result.exit_code == code, result.output
    assert message in result.output


def test_a_line_a_worker_would_refuse_is_refused_before_anything_is_sent(tmp_path: Path) -> None:
    """A NUL, raw or escaped in a JSON line, used to be sent, and failed later as
    `turn.failed` INVALID_ARGUMENT; now the file check names its line (the broker given
    is never reached)."""
    path = tmp_path / "turns.txt"
    path.write_text('Hello\n{"text": "Transfer $5\\u0000 to savings"}\n', encoding="utf-8")
    result = CliRunner().invoke(
        main,
        [
            "submit",
            "--broker",
            "redis://127.0.0.1:1/0",
            "--agent",
            "bankingAgent",
            "--file",
            f"{path}",
        ],
    )
    assert result.exit_code == 1, result.output
    assert result.output == (
        f"error: INVALID_ARGUMENT: {path}, line 2: contains a NUL character (\\u0000): a "
        "worker would refuse the turn\n"
    )


def test_a_file_that_is_not_utf8_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "turns.txt"
    path.write_bytes(b"Transfer $5 to savings\n\xff\xfe not text\n")
    result = CliRunner().invoke(
        main,
        [
            "submit",
            "--broker",
            "redis://127.0.0.1:1/0",
            "--agent",
            "bankingAgent",
            "--file",
            f"{path}",
        ],
    )
    assert result.exit_code == 1, result.output
    said = f"error: INVALID_ARGUMENT: {path}, line 2: not UTF-8 text: invalid start byte at byte 1"
    assert said in result.output, result.output
    assert "Traceback" not in result.output


def test_lines_end_at_line_feeds_only_so_line_numbers_are_those_of_sed() -> None:
    """A carriage return alone, or a Unicode line separator, is part of its line's
    message: Python's text mode would split there, and every line number after it would
    differ from `sed -n Np`'s. Spaces around a line are no part of it."""
    data = "\ufeffhello\rworld\r\nsep\u2028arated\n\n  padded  \n{bad\n".encode()
    lines = file_lines(data, "t.txt")
    assert lines == ["hello\rworld\r", "sep\u2028arated", "", "  padded  ", "{bad"]
    with pytest.raises(StatusError) as bad:
        read_turns(lines, name="t.txt")
    assert bad.value.message.startswith("t.txt, line 5: not a JSON object")
    assert [(t.line, t.text) for t in read_turns(lines[:4])] == [
        (1, "hello\rworld"),
        (2, "sep\u2028arated"),
        (4, "padded"),
    ]


def test_a_line_that_is_no_utf8_is_named_by_its_number() -> None:
    with pytest.raises(StatusError) as bad:
        file_lines(b"ok\nok2\nhel\xfflo\n", "b.txt")
    assert bad.value.status == Status.INVALID_ARGUMENT
    assert bad.value.message == "b.txt, line 3: not UTF-8 text: invalid start byte at byte 4"


def test_every_bad_line_is_named_in_one_error_so_a_file_is_mended_in_one_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Not only the first: each bad line with its reason, the first SHOWN of them, the
    rest counted; the good lines between them are not named."""
    lines = ["ok", "{bad", "fine", '{"text": 1}', "also fine", "{x", '{"text": "hi", "x": 1}']
    with pytest.raises(StatusError) as info:
        read_turns(lines, name="t.txt")
    assert info.value.status is Status.INVALID_ARGUMENT
    message = info.value.message
    assert message.startswith("t.txt: 4 bad lines: line 2: not a JSON object: "), message
    assert '; line 4: "text" must be a non-empty string; line 6: not a JSON object: ' in message
    assert message.endswith("; line 7: unknown field(s) x: use text, session_id, turn_id"), message
    monkeypatch.setattr(turn_file, "SHOWN", 2)
    with pytest.raises(StatusError) as capped:
        read_turns(lines, name="t.txt")
    assert capped.value.message.startswith("t.txt: 4 bad lines: line 2: ")
    assert "line 6" not in capped.value.message
    assert capped.value.message.endswith(
        'line 4: "text" must be a non-empty string; and 2 more bad lines'
    )


def test_every_line_that_is_no_utf8_is_named() -> None:
    with pytest.raises(StatusError) as bad:
        file_lines(b"ok\n\xffa\nok\nb\xfe\n", "b.txt")
    assert bad.value.message == (
        "b.txt: 2 bad lines: line 2: not UTF-8 text: invalid start byte at byte 1; "
        "line 4: not UTF-8 text: invalid start byte at byte 2"
    )
