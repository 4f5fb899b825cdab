"""How the public API types a user's code, checked by mypy (`make typecheck`, and
`test_api_types.py` in the suite). Never run: each `assert_type` states a type mypy must
infer, and each `type: ignore[code]` an error it must report there (`strict` warns of an
ignore that silences nothing)."""

from __future__ import annotations

from typing import Any, TypedDict, assert_type

from pydantic import BaseModel

from events.stream import EventStream
from interlock import (
    InMemorySessionStore,
    Interlock,
    InterruptibleTool,
    Part,
    ResumeValidationError,
    SnapshotStatus,
    StatusError,
    Tool,
    interrupt,
    scripted,
)
from interlock.stores import SqlSessionStore
from schemas import Event


class Ask(BaseModel):
    amount: float


class Done(BaseModel):
    ok: bool


class Reply(BaseModel):
    approved: bool


ai = Interlock(secret="types")


@ai.interruptible_tool(name="transfer", description="pauses first")
def transfer(inp: Ask, res: Reply | None) -> Done:
    if res is None:
        interrupt({"amount": inp.amount})  # never returns: `res` is a Reply below
    return Done(ok=res.approved)


@ai.tool
def lookup(inp: Ask) -> Done:
    return Done(ok=inp.amount > 0)


@ai.tool(name="later", description="async")
async def later(inp: Ask) -> Done:
    return Done(ok=True)


@ai.tool
def count(inp: Reply) -> int:
    return int(inp.approved)


async def gated_later(inp: Ask, res: Reply | None) -> Done:
    return Done(ok=res is not None)


def tools(part: Part) -> None:
    assert_type(transfer, InterruptibleTool[Ask, Done, Reply | None])
    assert_type(lookup, Tool[Ask, Done])
    assert_type(later, Tool[Ask, Done])
    gated = ai.define_interruptible_tool("gated", "async", gated_later)
    assert_type(gated, InterruptibleTool[Ask, Done, Reply | None])
    transfer.respond(part, Done(ok=True))
    transfer.respond(part, {"ok": True})  # the JSON form, validated when called
    transfer.respond(part, Reply(approved=True))  # type: ignore[arg-type]
    transfer.resume(part, Reply(approved=True))
    transfer.restart(part, {"approved": True})
    transfer.resume(part)
    transfer.resume(part, Done(ok=True))  # type: ignore[arg-type]


class DoneForm(TypedDict):
    ok: bool


def tool_lists(part: Part) -> None:
    # Tools of several types, bound to a name: annotated, or mypy joins them to `object`.
    listed: list[Tool[Any, Any]] = [lookup, transfer, count]
    agent = ai.define_agent("listed", model="scripted/types", tools=listed)
    ai.define_agent("inline", model="scripted/types", tools=[lookup, transfer, count])
    assert_type(agent.tools[0].name, str)
    assert [t.name for t in listed] == ["lookup", "transfer", "count"]
    form: DoneForm = {"ok": True}
    transfer.respond(part, form)  # a TypedDict is a JSON form too


def no_such_name() -> None:
    from interlock import NoSuchThing  # type: ignore[attr-defined]

    assert_type(SqlSessionStore, type[SqlSessionStore])
    print(NoSuchThing)


def run_text_keywords() -> None:
    agent = ai.define_agent("types", model="scripted/types", tools=[transfer])
    agent.run_text("hi", session_id="s")
    agent.run_text("hi", sesion_id="s")  # type: ignore[call-arg]


def listing(store: InMemorySessionStore, sql: SqlSessionStore) -> None:
    store.list_snapshots(status="completed", finish_reason="interrupted")
    sql.list_snapshots(status=SnapshotStatus.COMPLETED, finish_reason="interrupted")


def scripted_replies() -> None:
    scripted.define(ai, "types", [scripted.tool_call("lookup", {"amount": 1}), "done"])


def events(stream: EventStream) -> str | None:
    event = stream.next(1.0, match=lambda e: e.session_id == "s")
    assert_type(event, Event)
    if event.type == "turn.interrupted":
        return event.resume_token
    return None


def errors(data: dict[str, Any]) -> None:
    assert_type(ResumeValidationError.from_json(data), ResumeValidationError)
    assert_type(StatusError.from_json(data), StatusError)
