"""The JSON Schemas in docs/schemas are current, and real messages validate against them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from schemas import (
    MAX_DECISION_BYTES,
    Decision,
    DecisionRejected,
    ErrorInfo,
    FinishReason,
    InterruptInfo,
    Message,
    Part,
    RestartEntry,
    Status,
    TurnCompleted,
    TurnInterrupted,
)
from schemas.json_schema import message_schemas, render

DOCS = Path(__file__).resolve().parents[2] / "docs" / "schemas"


def load(name: str) -> dict[str, Any]:
    schema: dict[str, Any] = json.loads((DOCS / name).read_text())
    return schema


@pytest.mark.parametrize("name", sorted(message_schemas()))
def test_checked_in_schema_is_current(name: str) -> None:
    path = DOCS / name
    assert path.exists(), f"{path} is missing: run `make schemas`"
    assert path.read_text() == render(message_schemas()[name]), "run `make schemas`"


def test_docs_name_every_schema() -> None:
    text = (DOCS.parent / "queues.md").read_text()
    for name in message_schemas():
        assert f"schemas/{name}" in text, f"docs/queues.md does not link {name}"


def interrupted_event(interrupt: InterruptInfo, message: Message) -> TurnInterrupted:
    return TurnInterrupted(
        agent="a",
        session_id="s",
        snapshot_id="p",
        turn_id="t",
        resume_token="tok",
        interrupts=[interrupt],
        message=message,
    )


def test_events_validate() -> None:
    message = Message(role="model", content=[Part(text="done")])
    completed = TurnCompleted(
        agent="a",
        session_id="s",
        snapshot_id="p",
        turn_id="t",
        finish_reason=FinishReason.STOP,
        message=message,
    )
    interrupted = interrupted_event(
        InterruptInfo(name="transferMoney", ref="r", input={"amount": 1}, payload={}), message
    )
    rejected = DecisionRejected(error=ErrorInfo(status=Status.INVALID_ARGUMENT, message="bad"))
    for event, name in (
        (completed, "turn.completed"),
        (interrupted, "turn.interrupted"),
        (rejected, "decision.rejected"),
    ):
        body = json.loads(event.model_dump_json())
        jsonschema.validate(body, load(f"{name}.schema.json"))
        jsonschema.validate(body, load("event.schema.json"))


@pytest.mark.parametrize("dropped", ["name", "ref", "input", "payload"])
def test_an_interrupt_carries_all_four_fields(dropped: str) -> None:
    """`interrupts[]` is emitted with name, ref, input and payload (null input
    included): the schemas require each, so a reader may rely on them."""
    interrupted = interrupted_event(
        InterruptInfo(name="ask", ref="r"), Message(role="model", content=[Part(text="wait")])
    )
    body = json.loads(interrupted.model_dump_json())
    assert set(body["interrupts"][0]) == {"name", "ref", "input", "payload"}
    for name in ("turn.interrupted.schema.json", "event.schema.json"):
        jsonschema.validate(body, load(name))
        del_one = json.loads(json.dumps(body))
        del del_one["interrupts"][0][dropped]
        with pytest.raises(jsonschema.ValidationError, match=dropped):
            jsonschema.validate(del_one, load(name))


def test_decision_validates_and_bad_one_does_not() -> None:
    decision = Decision(
        decision_id="d",
        snapshot_id="s",
        resume_token="t",
        restart=[RestartEntry(name="transferMoney", ref="r", resumed={"approved": True})],
    )
    schema = load("decision.schema.json")
    jsonschema.validate(json.loads(decision.model_dump_json()), schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"schema_version": 1, "snapshot_id": "s"}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"schema_version": 2, "decision_id": "d", "snapshot_id": "s"}, schema)


@pytest.mark.parametrize(
    ("field", "absent"),
    [("resume_token", ""), ("respond", []), ("restart", []), ("reviewer", None)],
)
def test_a_null_field_counts_as_absent(field: str, absent: Any) -> None:
    """A client that writes every field (Go's encoding/json writes a nil slice as null):
    the schema accepts the null, and the model reads it as the field left out."""
    body = {"schema_version": 1, "decision_id": "d", "snapshot_id": "s", field: None}
    jsonschema.validate(body, load("decision.schema.json"))
    assert getattr(Decision.model_validate(body), field) == absent
    assert getattr(Decision.model_validate_json(json.dumps(body)), field) == absent


def test_a_null_id_is_still_refused() -> None:
    body = {"schema_version": 1, "decision_id": None, "snapshot_id": "s"}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(body, load("decision.schema.json"))
    with pytest.raises(ValueError, match="decision_id"):
        Decision.model_validate(body)


ENTRIES: list[tuple[str, dict[str, Any]]] = [
    ("restart", {}),
    ("restart", {"ref": "a"}),
    ("restart", {"name": "n", "ref": "r", "resumed": True}),
    ("respond", {"name": "n"}),
    ("respond", {"text": "a", "data": 1}),
    ("respond", {"text": None}),
    ("restart", {"name": "n", "ref": "r", "resumed": {"approved": True}}),
    ("respond", {"name": "n", "ref": "r", "output": {"ok": True}}),
    ("restart", Part(text="x").model_dump(mode="json")),
    (
        "respond",
        {"toolResponse": {"name": "n", "ref": "r", "output": 1}, "metadata": {"x": 1}},
    ),
]


@pytest.mark.parametrize(("where", "entry"), ENTRIES, ids=[str(e) for _, e in ENTRIES])
def test_the_decision_schema_accepts_what_the_model_accepts(
    where: str, entry: dict[str, Any]
) -> None:
    """A dashboard that validates against decision.schema.json before it sends gets the
    consumer's answer: what the schema accepts parses, and what it refuses does not."""
    body = {"schema_version": 1, "decision_id": "d", "snapshot_id": "s", where: [entry]}
    try:
        Decision.model_validate(body)
        parses = True
    except ValueError:
        parses = False
    errors = list(jsonschema.Draft202012Validator(load("decision.schema.json")).iter_errors(body))
    assert (not errors) == parses, (parses, [e.message for e in errors])


@pytest.mark.parametrize(
    ("given", "valid"),
    [
        ({"message": {"role": "user", "content": [{"text": "hi"}]}}, True),
        ({"resume": {"respond": [], "restart": []}}, True),
        ({}, False),
        ({"message": {"role": "user", "content": "hi"}}, False),
        ({"message": {"role": "user", "content": []}, "resume": {}}, False),
    ],
)
def test_the_run_turn_schema_types_the_input(given: dict[str, Any], valid: bool) -> None:
    body = {"schema_version": 1, "turn_id": "t", "agent": "a", "input": given}
    validator = jsonschema.Draft202012Validator(load("run_turn.schema.json"))
    assert validator.is_valid(body) is valid


@pytest.mark.parametrize(("size", "readable"), [(2, True), (8, True), (9, False)])
def test_a_decision_over_the_limit_keeps_its_id_up_to_8_mib(size: int, readable: bool) -> None:
    """Rejected for its size, it still names its decision_id so the sender can match the
    rejection; past 8 MiB it is not parsed at all."""
    from workers.decisions import ParseFailure, parse_decision

    body = {"schema_version": 1, "decision_id": "big-1", "snapshot_id": "s", "reviewer": ""}
    body["reviewer"] = "x" * (size * MAX_DECISION_BYTES - len(json.dumps(body)))
    raw = json.dumps(body).encode()
    assert len(raw) == size * MAX_DECISION_BYTES
    failure = parse_decision(raw, "application/json")
    assert isinstance(failure, ParseFailure)
    assert failure.reason == f"decision is {len(raw)} bytes; the limit is {MAX_DECISION_BYTES}"
    assert failure.decision_id == ("big-1" if readable else None)


def test_an_oversized_decision_with_nan_still_names_its_id() -> None:
    from workers.decisions import ParseFailure, parse_decision

    body = '{"schema_version": 1, "decision_id": "big-nan", "reviewer": NaN, "pad": "%s"}'
    raw = (body % ("x" * MAX_DECISION_BYTES)).encode()
    failure = parse_decision(raw, "application/json")
    assert isinstance(failure, ParseFailure) and failure.decision_id == "big-nan"


BASE = b'{"schema_version": 1, "decision_id": "deep-2", "snapshot_id": "s", "respond": []'


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (BASE + b', "n": ' + b"7" * 5000 + b"}", "decision is not JSON: Exceeds the limit"),
        (
            BASE + b', "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
            "decision is not JSON that can be read: it is nested too deeply",
        ),
        (
            BASE + b', "reviewer": "a\xffb"}',
            f"decision is not JSON: it is not UTF-8 text (byte 0xff at offset {len(BASE) + 16})",
        ),
        (
            b'{"n": ' + b"9" * 5000 + b' , "decision_id" :  "sp\\u0061ced", "s": "}{,\\""}',
            "decision is not JSON: Exceeds the limit",
        ),
    ],
    ids=["a-5000-digit-integer", "nested-100000-deep", "a-byte-that-is-no-utf-8", "spaced"],
)
def test_a_decision_no_json_reader_takes_still_names_its_id(raw: bytes, reason: str) -> None:
    """Valid JSON that Python's reader refuses (an integer too long to convert, nesting
    too deep) and a stray byte that is no UTF-8: the rejection still carries the
    top-level decision_id, found by scanning the text, so that the sender can match it
    and a resend under that id gets the same outcome, not a second evaluation."""
    from workers.decisions import ParseFailure, parse_decision

    failure = parse_decision(raw, "application/json")
    assert isinstance(failure, ParseFailure)
    assert failure.reason.startswith(reason), failure.reason
    assert failure.decision_id == ("spaced" if raw.startswith(b'{"n"') else "deep-2")


def test_a_byte_that_is_no_utf_8_is_said_at_its_offset_in_the_body() -> None:
    """The offset counts from the body's first byte, a byte order mark included."""
    from workers.decisions import ParseFailure, parse_decision

    for body in (
        b'{"decision_id": "d", "a": "\xff"}',
        b'\xef\xbb\xbf{"decision_id": "d", "a": "\xff"}',
    ):
        failure = parse_decision(body, "application/json")
        assert isinstance(failure, ParseFailure)
        at = body.index(b"\xff")
        assert (
            failure.reason
            == f"decision is not JSON: it is not UTF-8 text (byte 0xff at offset {at})"
        )
        assert failure.decision_id == "d"


@pytest.mark.parametrize(
    ("body", "kind"),
    [
        (b"null", "null"),
        (b"[1, 2]", "an array"),
        (b'"approve"', "a string"),
        (b"7", "a number"),
        (b"2.5", "a number"),
        (b"true", "a boolean"),
    ],
)
def test_a_decision_that_is_no_object_is_named_by_its_json_kind(body: bytes, kind: str) -> None:
    """Said as JSON names it, for a dashboard in any language: not Python's type."""
    from workers.decisions import ParseFailure, parse_decision

    failure = parse_decision(body, "application/json")
    assert isinstance(failure, ParseFailure)
    assert failure.reason == f"decision must be a JSON object, not {kind}"


def test_a_decision_id_nested_below_the_top_level_is_not_taken_for_its_id() -> None:
    from workers.decisions import ParseFailure, parse_decision

    raw = b'{"x": {"decision_id": "inner"}, "y": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    failure = parse_decision(raw, "application/json")
    assert isinstance(failure, ParseFailure) and failure.decision_id is None


@pytest.mark.parametrize(
    "rest",
    [b'"x": ' + b"[" * 5000 + b"]" * 5000, b'"n": ' + b"7" * 5000],
    ids=["nested-too-deeply", "a-5000-digit-integer"],
)
def test_the_decision_log_keeps_no_token_of_a_body_no_json_reader_takes(rest: bytes) -> None:
    """Such a body is rejected and recorded under its id: the text kept must not hold
    the resume token, which is stored only as a hash."""
    from events.decision_log import without_token

    body = (b'{"decision_id": "d", "resume_token" : "s3cr\\"et", ' + rest + b"}").decode()
    kept = without_token(body)
    assert "s3cr" not in kept
    assert kept.startswith('{"decision_id": "d", "resume_token" : null, ')


@pytest.mark.parametrize(
    ("version", "reason"),
    [
        (None, "schema_version is missing; this consumer reads 1"),
        ("null", "unknown schema_version null; this consumer reads 1"),
        ("2", "unknown schema_version 2; this consumer reads 1"),
        ('"1"', 'unknown schema_version "1"; this consumer reads 1'),
    ],
    ids=["missing", "null", "two", "a-string"],
)
def test_a_refused_decision_names_what_it_gave(version: str | None, reason: str) -> None:
    """Refused at the first check, a JSON object still gives its decision_id, reviewer
    and snapshot_id to the rejection, where they are text a decision could hold; and the
    reason says whether schema_version was missing or wrong."""
    from workers.decisions import ParseFailure, parse_decision

    given = "" if version is None else f'"schema_version": {version}, '
    raw = (
        "{" + given + '"decision_id": "d-1", "snapshot_id": "s-1", "reviewer": "ann@example.com"}'
    ).encode()
    failure = parse_decision(raw, "application/json")
    assert failure == ParseFailure(reason, "d-1", reviewer="ann@example.com", snapshot_id="s-1")
    long = json.dumps({"decision_id": "d-2", "snapshot_id": "s" * 201, "reviewer": "r" * 501})
    refused = parse_decision(long.encode(), "application/json")
    assert refused == ParseFailure("schema_version is missing; this consumer reads 1", "d-2")


@pytest.mark.parametrize(
    ("lists", "reason"),
    [
        ({"restart": [{"name": "x", "resumed": {}}]}, "restart.0.ref: Field required"),
        ({"respond": [{"name": 5, "ref": "r"}]}, "respond.0.name: Input should be a valid string"),
        ({"restart": ["oops"]}, "restart.0: Input should be a valid dictionary"),
        (
            {"respond": [{"toolResponse": {"ref": "r"}}]},
            "respond.0.toolResponse.name: Field required",
        ),
    ],
)
def test_a_bad_entry_is_said_by_the_form_it_was_meant_as(
    lists: dict[str, Any], reason: str
) -> None:
    """An entry of respond or restart that fits neither form (a JSON entry, a Part) is
    said as the form it was meant as, in the wire's words: one complaint, no pydantic
    names of the forms (a dashboard author reads it)."""
    from workers.decisions import ParseFailure, parse_decision

    body = {"schema_version": 1, "decision_id": "d", "snapshot_id": "s", "resume_token": "t"}
    failure = parse_decision(json.dumps({**body, **lists}), "application/json")
    assert isinstance(failure, ParseFailure)
    assert failure.reason == f"decision does not match the schema: {reason}"


def test_a_dead_letter_carries_its_version_and_only_the_fields_given() -> None:
    """Kept decisions name a decision_id (null when none could be read) and an event_id;
    kept tasks name their content type instead: each leaves out what does not apply,
    and every one carries `schema_version`, as the schema requires."""
    from schemas import DeadLetter

    schema = load("dead_letter.schema.json")
    decision = json.loads(
        DeadLetter(
            reason="r", headers={}, decision_id=None, event_id="e", body="x", body_base64="eA=="
        ).to_wire()
    )
    assert decision == {
        "schema_version": 1,
        "reason": "r",
        "headers": {},
        "decision_id": None,
        "event_id": "e",
        "body": "x",
        "body_base64": "eA==",
    }
    task = json.loads(
        DeadLetter(
            reason="r", headers={"a": 1}, content_type="application/json", body="", body_base64=""
        ).to_wire()
    )
    assert set(task) == {
        "schema_version",
        "reason",
        "headers",
        "content_type",
        "body",
        "body_base64",
    }
    for letter in (decision, task):
        jsonschema.validate(letter, schema)
        without = {k: v for k, v in letter.items() if k != "schema_version"}
        with pytest.raises(jsonschema.ValidationError, match="schema_version"):
            jsonschema.validate(without, schema)


def test_a_dead_letter_keeps_text_no_encoder_takes() -> None:
    """What a dead letter quotes (the reason, a header, an id read from the message) may
    hold a lone surrogate, which a UTF-8 encoder refuses: it is written escaped, and the
    letter is kept."""
    from schemas import DeadLetter

    letter = DeadLetter(
        reason="bad text: \ud800",
        headers={"x": "\udfff"},
        decision_id="d-\ud800",
        body="?",
        body_base64="Pw==",
    )
    wire = letter.to_wire()
    assert wire.isascii(), wire
    back = json.loads(wire)
    assert (back["reason"], back["headers"]["x"], back["decision_id"]) == (
        "bad text: \ud800",
        "\udfff",
        "d-\ud800",
    )
