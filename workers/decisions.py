"""Reading a decision: parse it, check it against the stored snapshot, build its turn."""

from __future__ import annotations

import codecs
import json
import math
import re
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from events.tokens import token_matches
from interlock import (
    AgentInput,
    InMemorySessionStore,
    Interlock,
    Part,
    SnapshotNotFoundError,
    Status,
    StatusError,
    ToolRequest,
    ToolResume,
    respond,
)
from interlock.resume import check_resumable, pending_interrupts
from interlock.stores.base import SessionStore
from interlock.tools import brief
from schemas import (
    MAX_DECISION_BYTES,
    Decision,
    FinishReason,
    RespondEntry,
    RestartEntry,
    Snapshot,
    TurnRequest,
)

from .preloaded import Preloaded
from .runtime import Runtime

__all__ = [
    "RESUME_PREFIX",
    "WRONG_TOKEN",
    "ParseFailure",
    "check_decision",
    "check_token",
    "evaluate",
    "lenient_failure",
    "parse_decision",
    "resume_request",
    "to_tool_resume",
]

_ID_READ_LIMIT = 8 * MAX_DECISION_BYTES
"""A decision over the limit is still read for its decision_id, up to this size, so its
sender can match the rejection to what it sent."""

_JSON_TYPES = {"", "application/json", "text/json", "text/plain", "application/octet-stream"}


@dataclass(frozen=True)
class ParseFailure:
    """A message that is no decision: dead-lettered with `reason`."""

    reason: str
    decision_id: str | None = None
    reviewer: str | None = None
    snapshot_id: str | None = None
    """What the message said of its reviewer and snapshot, where it is a JSON object
    that names them as a decision would: its rejection carries them too."""


def parse_decision(
    body: bytes | str, content_type: str | None, *, logged: bool = False
) -> Decision | ParseFailure:
    """Rule 1: a JSON object, at most 1 MiB, a known schema_version, valid. A failure
    carries the decision_id where one can be read, so its sender can match the outcome.
    `logged`: `body` is the decision log's copy of one read before (its token taken out,
    its text escaped: it may have grown past the limit the message was within), read
    again whatever its size."""
    raw = body.encode() if isinstance(body, str) else bytes(body or b"")
    if len(raw) > MAX_DECISION_BYTES and not logged:
        reason = f"decision is {len(raw)} bytes; the limit is {MAX_DECISION_BYTES}"
        return lenient_failure(reason, raw) if len(raw) <= _ID_READ_LIMIT else ParseFailure(reason)
    data = _read_json(raw)
    kind = (content_type or "").split(";")[0].strip().lower()
    if kind not in _JSON_TYPES:
        reason = f"content type {content_type!r} is not accepted: send JSON"
        if isinstance(data, ParseFailure):
            return lenient_failure(reason, raw)
        return _failure(reason, data)
    if isinstance(data, ParseFailure):
        return lenient_failure(data.reason, raw)
    if not isinstance(data, dict):
        return ParseFailure(f"decision must be a JSON object, not {json_kind(data)}")
    if "schema_version" not in data:
        return _failure("schema_version is missing; this consumer reads 1", data)
    version = data["schema_version"]
    if isinstance(version, bool) or version != 1:  # true == 1 in Python, not in JSON
        return _failure(
            f"unknown schema_version {json.dumps(version)}; this consumer reads 1", data
        )
    bad = unstorable(data)
    if bad is not None:  # valid JSON, but no text column (PostgreSQL) can keep it
        return _failure(f"decision contains {bad}", data)
    try:
        return Decision.model_validate(data)
    except ValidationError as exc:
        return _failure(f"decision does not match the schema: {_schema_brief(exc, data)}", data)


_ENTRY_FORMS = {"respond": "RespondEntry", "restart": "RestartEntry"}
"""The lists whose entries are a JSON entry or a `Part`, and the entry form's name as
pydantic puts it in an error's location (the other form's is its validator's)."""
_INSTANCE_OF = re.compile(r" or instance of \w+")
_PART_KEYS = frozenset(
    {"toolRequest", "toolResponse", "tool_request", "tool_response", "text", "data", "media"}
    | {"reasoning", "custom", "resource"}
)


def _schema_brief(exc: ValidationError, data: dict[str, Any]) -> str:
    """`brief`, where an entry of `respond` or `restart` that fits neither form is
    said by the form it was meant as (a Part when it holds a part's field, else the
    JSON entry), without pydantic's names for the forms: `restart.0.ref: Field
    required`, not both forms' complaints under their validators' names."""
    said: list[str] = []
    for error in exc.errors():
        loc = error["loc"]
        if len(loc) >= 3 and loc[0] in _ENTRY_FORMS and isinstance(loc[1], int):
            entries = data.get(str(loc[0]))
            entry = entries[loc[1]] if isinstance(entries, list) else None
            as_part = isinstance(entry, dict) and not _PART_KEYS.isdisjoint(entry)
            if (loc[2] == _ENTRY_FORMS[str(loc[0])]) == as_part:
                continue  # the other form's complaint
            loc = (*loc[:2], *loc[3:])
        msg = _INSTANCE_OF.sub("", error["msg"])  # a Python caller's option, not the wire's
        line = f"{'.'.join(str(x) for x in loc) or 'value'}: {msg}"
        if line not in said:
            said.append(line)
    return "; ".join(said) or brief(exc)


def _failure(reason: str, data: Any) -> ParseFailure:
    """A refused JSON value, with the ids and reviewer it gives as a decision would."""
    return ParseFailure(
        reason,
        _readable_id(data),
        reviewer=_readable(data, "reviewer"),
        snapshot_id=_readable(data, "snapshot_id"),
    )


_JSON_KINDS = {type(None): "null", bool: "a boolean", int: "a number", float: "a number"}
_JSON_KINDS.update({str: "a string", list: "an array"})


def json_kind(value: Any) -> str:
    """What JSON calls the kind of `value` (a parsed JSON value): "an array", "null"."""
    return _JSON_KINDS.get(type(value), type(value).__name__)


def _read_json(raw: bytes) -> Any:
    """The JSON value of `raw`, or the ParseFailure saying why it is none."""
    try:
        # A leading byte order mark is ignored (RFC 8259 lets a reader do so); NaN and
        # Infinity, which Python's reader would take, are no JSON.
        return json.loads(raw.decode("utf-8-sig"), parse_constant=_no_constant, parse_float=_finite)
    except UnicodeDecodeError as exc:  # said as a reader in any language would say it
        byte = exc.object[exc.start : exc.start + 1].hex()
        at = exc.start + (len(codecs.BOM_UTF8) if raw.startswith(codecs.BOM_UTF8) else 0)
        return ParseFailure(
            f"decision is not JSON: it is not UTF-8 text (byte 0x{byte} at offset {at})"
        )
    except ValueError as exc:
        return ParseFailure(f"decision is not JSON: {exc}")
    except RecursionError:  # "[[[[...": a poison message, not a reason to retry
        return ParseFailure("decision is not JSON that can be read: it is nested too deeply")


def _readable_id(data: Any) -> str | None:
    """The decision_id of a JSON value, where it is one a decision could have."""
    return _readable(data, "decision_id")


def _max_length(key: str) -> int:
    """The longest text `Decision` takes in its field `key`."""
    limits = [m.max_length for m in Decision.model_fields[key].metadata if hasattr(m, "max_length")]
    return int(limits[0])


_LIMITS = {key: _max_length(key) for key in ("decision_id", "snapshot_id", "reviewer")}
"""Field -> the longest text a decision may give in it."""


def _readable(data: Any, key: str) -> str | None:
    """The text field `key` of a JSON value, where it is one a decision could have."""
    found = data.get(key) if isinstance(data, dict) else None
    if isinstance(found, str) and 0 < len(found) <= _LIMITS[key] and unstorable(found) is None:
        return found
    return None


def lenient_failure(reason: str, raw: bytes) -> ParseFailure:
    """A refused body with what it names, read as Python's reader reads JSON (which
    takes NaN and Infinity), else its decision_id scanned: its sender can still match
    the rejection."""
    try:
        data = json.loads(raw.decode("utf-8-sig"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return ParseFailure(reason, _scanned_id(raw))
    return _failure(reason, data)


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_PLAIN = re.compile(r'[^"{}\[\]]+')


def _scanned_id(raw: bytes) -> str | None:
    """The top-level decision_id of a body no JSON reader takes (nested too deeply, an
    integer too long to convert, a byte that is no UTF-8 elsewhere in it), found by
    scanning its text: strings skipped whole, brackets counted, no recursion. The last
    one wins, as for a reader. A byte that is no UTF-8 is read as a lone surrogate
    (which no decision_id may hold), not replaced: a decision_id with one is no id the
    sender sent."""
    text = raw.decode("utf-8-sig", errors="surrogateescape").lstrip()
    if not text.startswith("{"):
        return None
    found: str | None = None
    depth, last, i = 0, "", 0
    while i < len(text):
        char = text[i]
        if char == '"':
            string = _STRING.match(text, i)
            if string is None:
                return found
            i = string.end()
            if depth == 1 and last in "{," and string.group() == '"decision_id"':
                found = _value_id(text, i)
            last = '"'
            continue
        if char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
        else:  # anything else up to the next string or bracket, at once
            plain = _PLAIN.match(text, i)
            assert plain is not None  # `char` itself is plain
            i = plain.end()
            last = plain.group().rstrip()[-1:] or last
            continue
        last = char
        i += 1
    return found


_GAP = re.compile(r"[ \t\r\n]*:[ \t\r\n]*")


def _value_id(text: str, at: int) -> str | None:
    """The decision_id whose key ends at `at`: a string after the colon, if readable."""
    gap = _GAP.match(text, at)
    value = _STRING.match(text, gap.end()) if gap is not None else None
    try:
        return _readable_id({"decision_id": json.loads(value.group())}) if value else None
    except ValueError:
        return None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def _finite(text: str) -> float:
    """A JSON number as a float, refusing one past a double's range (`1e400`): it would
    be kept as Infinity, which is no JSON value, and no reader could read it back."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is out of the range of a JSON number (a double)")
    return value


def unstorable(data: Any) -> str | None:
    """What no text can hold, in any string (key or value): U+0000, or a lone surrogate
    (JSON may escape one, `\\ud800`; it is not Unicode text, and a resume carrying it
    would be accepted, then fail when its snapshot is saved). Iterative: no recursion
    limit."""
    todo = [data]
    while todo:
        item = todo.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return "a NUL character (\\u0000)"
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as exc:
                return f"a lone surrogate (\\u{ord(item[exc.start]):04x}), which is not text"
        elif isinstance(item, dict):
            todo.extend(item.keys())
            todo.extend(item.values())
        elif isinstance(item, list):
            todo.extend(item)
    return None


def to_tool_resume(decision: Decision, snapshot: Snapshot) -> ToolResume:
    """The decision's entries as respond/restart parts; one set of rules then applies."""
    inputs = {
        p.tool_request.ref: p.tool_request.input
        for p in pending_interrupts(snapshot.messages)
        if p.tool_request is not None
    }
    responds = [
        respond(Part(tool_request=ToolRequest(name=e.name, ref=e.ref)), e.output)
        if isinstance(e, RespondEntry)
        else e
        for e in decision.respond
    ]
    restarts = [
        _restart_part(e, inputs) if isinstance(e, RestartEntry) else e for e in decision.restart
    ]
    return ToolResume(respond=responds, restart=restarts)


def answered_in_both(decision: Decision) -> list[str]:
    """The refs that both `respond` and `restart` answer: `respond` wins (semantics rule
    5) and the restart entry is dropped, which a client may not have meant."""
    restarted = {_entry_ref(e) for e in decision.restart}
    both = [ref for ref in map(_entry_ref, decision.respond) if ref in restarted]
    return [ref for ref in dict.fromkeys(both) if ref is not None]


def _entry_ref(entry: RespondEntry | RestartEntry | Part) -> str | None:
    if isinstance(entry, RespondEntry | RestartEntry):
        return entry.ref
    call = entry.tool_request or entry.tool_response
    return None if call is None else call.ref


def _restart_part(entry: RestartEntry, inputs: dict[str | None, Any]) -> Part:
    given = entry.input if entry.has_input else inputs.get(entry.ref)
    return Part(
        tool_request=ToolRequest(name=entry.name, ref=entry.ref, input=given),
        metadata={"resumed": entry.resumed if entry.resumed is not None else True},
    )


def evaluate(rt: Runtime, decision: Decision, snapshot: Snapshot | None) -> TurnRequest:
    """Rules 2-5 (snapshot, token, status, parts) against `snapshot`, the one the
    decision names as the caller read it (None: there is none). Returns the resumed turn
    to run; raises a `StatusError` naming the first rule broken. It writes nothing: the
    claim (rule 6) is the caller's, in the transaction that records the outcome."""
    if snapshot is None:
        raise SnapshotNotFoundError(f"snapshot {decision.snapshot_id} not found")
    resume = check_decision(rt.registry, decision, snapshot, rt.store)
    return _request(decision, snapshot, resume)


def check_decision(
    registry: Interlock, decision: Decision, snapshot: Snapshot, store: SessionStore | None = None
) -> ToolResume:
    """Rules 3-5 (token, status, parts) of `decision` against `snapshot`, with the
    agents and tools of `registry`; returns the resume the decision makes. It writes
    nothing, and reads nothing but `snapshot` (`store`, default an empty one, serves
    any other read): `interlock decide` checks a decision so before it sends it."""
    check_token(snapshot, decision.resume_token)
    check_resumable(snapshot, claimed_by=decision.decision_id)
    base = store if store is not None else InMemorySessionStore()
    agent = registry.lookup_agent(snapshot.agent).with_store(Preloaded(base, snapshot))
    resume = to_tool_resume(decision, snapshot)
    agent.validate_resume(resume, snapshot_id=snapshot.snapshot_id, claimed_by=decision.decision_id)
    return resume


WRONG_TOKEN = "resume_token does not match snapshot {snapshot_id}"
"""How a wrong resume token is refused (PERMISSION_DENIED), before any hint."""


def check_token(snapshot: Snapshot, token: str | None) -> None:
    """Rule 3: `token` must be the resume token of `snapshot`'s pause, else
    PERMISSION_DENIED. A snapshot that never paused was issued no token and can never be
    resumed: it is left to rule 4 (FAILED_PRECONDITION) whatever token comes with it.
    One that paused (and has expired since, say) is refused so only to its token's
    holder: to anyone else, it is PERMISSION_DENIED like any pause."""
    paused = (
        snapshot.finish_reason == FinishReason.INTERRUPTED or snapshot.resume_token_hash is not None
    )
    if paused and not token_matches(token, snapshot.resume_token_hash):
        sid = snapshot.snapshot_id
        if not token:
            raise StatusError(
                Status.PERMISSION_DENIED,
                f"the decision has no resume_token for snapshot {sid}: send the one its "
                "turn.interrupted event carries",
            )
        # The same words whatever state the pause is in: a wrong token learns nothing of
        # it (open, answered or expired).
        raise StatusError(
            Status.PERMISSION_DENIED,
            f"{WRONG_TOKEN.format(snapshot_id=sid)}: send the one its latest "
            "turn.interrupted event carries (`interlock resend` announces an open pause "
            "again with a new one)",
        )


def resume_request(decision: Decision, snapshot: Snapshot) -> TurnRequest:
    """The resumed turn of an accepted `decision`, built again: equal to the one
    `evaluate` returned, its turn id included (it comes from the decision id), so a
    decision delivered again enqueues the very turn the first delivery did."""
    return _request(decision, snapshot, to_tool_resume(decision, snapshot))


RESUME_PREFIX = "resume:"
"""The start of a resume's turn id; no other task may take a turn id starting so."""


def resume_turn_id(decision_id: str) -> str:
    """The turn id of the resume an accepted decision enqueues (`resume:DECISION_ID`:
    the same on every delivery of the decision). Only that resume may run or end a
    turn of that id (workers/resume_check.py), so no other task can take its place."""
    return f"{RESUME_PREFIX}{decision_id}"


def _request(decision: Decision, snapshot: Snapshot, resume: ToolResume) -> TurnRequest:
    try:
        carried = AgentInput(resume=resume).to_json()
    except ValueError as exc:  # pydantic's serializer: answers nested past its depth
        raise StatusError(
            Status.INVALID_ARGUMENT, f"the decision's answers cannot be sent on as JSON: {exc}"
        ) from exc
    return TurnRequest(
        turn_id=resume_turn_id(decision.decision_id),
        agent=snapshot.agent,
        input=carried,
        snapshot_id=snapshot.snapshot_id,
        claimed_by=decision.decision_id,
        decision_id=decision.decision_id,
    )
