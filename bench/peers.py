"""The banking cycle in the peers: LangGraph and Pydantic AI, with no network.

Each cycle does the work Interlock's does (see README.md, "Equivalent work"): a model
call that requests the `transferMoney` tool, a pause for approval, a resume carrying the
approval, the tool's result, a second model call that answers with text, and (where
the peer has a checkpointer) the state persisted at each step. Each builder returns a
`Peer`, or raises `PeerMissing` when the peer is not installed (`pip install '.[bench]'`).
"""

# No `from __future__ import annotations` here: LangGraph and Pydantic AI read the type
# hints of the node and tool functions below, which name locally imported classes.
import sqlite3
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._common import PROMPT

__all__ = [
    "Peer",
    "PeerMissing",
    "langgraph_memory",
    "langgraph_sqlite",
    "langgraph_sqlite_exit",
    "langgraph_sqlite_sync_normal",
    "pydantic_ai_memory",
    "pydantic_ai_sqlite",
]


class PeerMissing(Exception):
    """The peer's packages are not installed."""


@dataclass
class Peer:
    name: str
    cycle: Callable[[int], None]
    note: str
    close: Callable[[], None] = field(default=lambda: None)
    db: Path | None = None
    """The SQLite file it writes, if any: its commits a cycle are counted there."""


# -- LangGraph ------------------------------------------------------------------------


def _langgraph_app(checkpointer: Any) -> Any:
    """A two-node agent graph: `model` asks for the transfer (or answers once it has the
    tool's result), `tools` pauses with `interrupt()` and turns the resume value into the
    tool message. State is LangGraph's `MessagesState` (langchain-core messages)."""
    try:
        from langchain_core.messages import AIMessage, ToolMessage
        from langgraph.graph import END, START, MessagesState, StateGraph
        from langgraph.types import interrupt
    except ImportError as exc:
        raise PeerMissing(f"langgraph is not installed ({exc})") from exc

    def model(state: MessagesState) -> dict[str, Any]:
        last = state["messages"][-1]
        if isinstance(last, ToolMessage):
            result = last.artifact or {}
            text = f"Done: transferred $500.00 to savings, transaction {result['transaction_id']}."
            return {"messages": [AIMessage(content=text)]}
        call = {
            "name": "transferMoney",
            "args": {"amount": 500.0, "to_account": "savings"},
            "id": uuid.uuid4().hex,
        }
        return {"messages": [AIMessage(content="", tool_calls=[call])]}

    def tools(state: MessagesState) -> dict[str, Any]:
        last = state["messages"][-1]
        assert isinstance(last, AIMessage)
        call = last.tool_calls[0]
        args = call["args"]
        output = interrupt(
            {
                "action": "transferMoney",
                "details": f"Transfer ${args['amount']:.2f} to {args['to_account']}",
            }
        )
        return {
            "messages": [
                ToolMessage(
                    content=str(output),
                    artifact=output,
                    tool_call_id=call["id"],
                    name=call["name"],
                )
            ]
        }

    def route(state: MessagesState) -> str:
        last = state["messages"][-1]
        return "tools" if isinstance(last, AIMessage) and last.tool_calls else END

    graph = StateGraph(MessagesState)
    graph.add_node("model", model)
    graph.add_node("tools", tools)
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", route, ["tools", END])
    graph.add_edge("tools", "model")
    return graph.compile(checkpointer=checkpointer)


def _langgraph_cycle(app: Any, durability: str | None = None) -> Callable[[int], None]:
    """The cycle on `app`; `durability` is LangGraph's (None: its default, "async", a
    checkpoint after every step, written in the background)."""
    from langchain_core.messages import HumanMessage
    from langgraph.types import Command

    options = {} if durability is None else {"durability": durability}

    def cycle(i: int) -> None:
        config = {"configurable": {"thread_id": uuid.uuid4().hex}}
        paused = app.invoke({"messages": [HumanMessage(PROMPT)]}, config, **options)
        if not paused.get("__interrupt__"):
            raise AssertionError("langgraph: expected an interrupt")
        txn = f"txn-{i}"
        resume = Command(resume={"success": True, "transaction_id": txn})
        done = app.invoke(resume, config, **options)
        if txn not in done["messages"][-1].content:
            raise AssertionError("langgraph: final answer does not name the transaction")

    return cycle


def langgraph_memory(_tmp: Path) -> Peer:
    try:
        from langgraph.checkpoint.memory import InMemorySaver
    except ImportError as exc:
        raise PeerMissing(f"langgraph is not installed ({exc})") from exc
    app = _langgraph_app(InMemorySaver())
    return Peer("langgraph_memory", _langgraph_cycle(app), "StateGraph + InMemorySaver")


def langgraph_sqlite(tmp: Path) -> Peer:
    return _langgraph_sqlite(tmp, "langgraph_sqlite", synchronous=None)


def langgraph_sqlite_exit(tmp: Path) -> Peer:
    """Checkpointed only where a run stops (`durability="exit"`): at the pause and at the
    end, where ours saves its snapshots."""
    return _langgraph_sqlite(tmp, "langgraph_sqlite_exit", synchronous=None, durability="exit")


def langgraph_sqlite_sync_normal(tmp: Path) -> Peer:
    return _langgraph_sqlite(tmp, "langgraph_sqlite_sync_normal", synchronous="NORMAL")


def _langgraph_sqlite(
    tmp: Path, name: str, synchronous: str | None, durability: str | None = None
) -> Peer:
    try:
        from langgraph.checkpoint.sqlite import SqliteSaver
    except ImportError as exc:
        raise PeerMissing(f"langgraph-checkpoint-sqlite is not installed ({exc})") from exc
    conn = sqlite3.connect(tmp / f"{name}.db", check_same_thread=False)
    if synchronous is not None:
        conn.execute(f"PRAGMA synchronous={synchronous}")
    saver = SqliteSaver(conn)
    saver.setup()  # WAL journal; synchronous stays SQLite's default (FULL) unless set
    app = _langgraph_app(saver)
    when = (
        "a checkpoint after every step (durability 'async', the default)"
        if durability is None
        else f"durability {durability!r}"
    )
    return Peer(
        name,
        _langgraph_cycle(app, durability),
        "StateGraph + SqliteSaver on a file (WAL, synchronous="
        f"{synchronous or 'FULL, the default'}); {when}",
        close=conn.close,
        db=tmp / f"{name}.db",
    )


# -- Pydantic AI ----------------------------------------------------------------------


def _pydantic_ai_agent() -> tuple[Any, dict[str, str]]:
    """An agent whose `FunctionModel` asks for `transferMoney` (a tool with
    `requires_approval=True`), and answers with text once it has the tool's result;
    with the dict that tells the tool the transaction id to return next."""
    try:
        from pydantic import BaseModel
        from pydantic_ai import Agent, DeferredToolRequests
        from pydantic_ai.messages import (
            ModelMessage,
            ModelRequest,
            ModelResponse,
            TextPart,
            ToolCallPart,
            ToolReturnPart,
        )
        from pydantic_ai.models.function import AgentInfo, FunctionModel
    except ImportError as exc:
        raise PeerMissing(f"pydantic-ai-slim is not installed ({exc})") from exc

    class TransferOutput(BaseModel):
        success: bool
        transaction_id: str = ""

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        last = messages[-1]
        if isinstance(last, ModelRequest):
            for part in last.parts:
                if isinstance(part, ToolReturnPart):
                    out = part.content
                    txn = out.transaction_id if isinstance(out, TransferOutput) else out
                    text = f"Done: transferred $500.00 to savings, transaction {txn}."
                    return ModelResponse(parts=[TextPart(text)])
        args = {"amount": 500.0, "to_account": "savings"}
        return ModelResponse(parts=[ToolCallPart("transferMoney", args)])

    agent = Agent(
        FunctionModel(model),
        output_type=[str, DeferredToolRequests],
        system_prompt="You are a banking assistant. Use transferMoney to move funds; "
        "it will pause for user approval.",
    )
    txn_ids: dict[str, str] = {}

    @agent.tool_plain(requires_approval=True)  # type: ignore[untyped-decorator]
    def transferMoney(amount: float, to_account: str) -> TransferOutput:
        """Transfer money to a specified account, pausing for user approval."""
        return TransferOutput(success=True, transaction_id=txn_ids["next"])

    return agent, txn_ids


def _approve(paused: Any) -> Any:
    from pydantic_ai import DeferredToolRequests, DeferredToolResults

    requests = paused.output
    if not isinstance(requests, DeferredToolRequests) or not requests.approvals:
        raise AssertionError("pydantic-ai: expected a deferred approval")
    return DeferredToolResults(approvals={requests.approvals[0].tool_call_id: True})


def pydantic_ai_memory(_tmp: Path) -> Peer:
    agent, txn_ids = _pydantic_ai_agent()

    def cycle(i: int) -> None:
        txn = txn_ids["next"] = f"txn-{i}"
        paused = agent.run_sync(PROMPT)
        done = agent.run_sync(
            message_history=paused.all_messages(), deferred_tool_results=_approve(paused)
        )
        if txn not in done.output:
            raise AssertionError("pydantic-ai: final answer does not name the transaction")

    return Peer(
        "pydantic_ai_memory",
        cycle,
        "FunctionModel, requires_approval tool, DeferredToolResults; history kept in memory",
    )


def pydantic_ai_sqlite(tmp: Path) -> Peer:
    """Pydantic AI has no SQL checkpointer of its own: this is its documented way to keep
    a conversation, the history serialized with `ModelMessagesTypeAdapter`, here in one
    SQLite row per conversation (WAL, default synchronous), written after each run and
    read back before the resume."""
    agent, txn_ids = _pydantic_ai_agent()
    from pydantic_ai.messages import ModelMessagesTypeAdapter

    conn = sqlite3.connect(tmp / "pydantic_ai.db", isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE IF NOT EXISTS conversation (id TEXT PRIMARY KEY, messages BLOB)")

    def save(cid: str, messages: Any) -> None:
        conn.execute(
            "INSERT INTO conversation (id, messages) VALUES (?, ?) "
            "ON CONFLICT (id) DO UPDATE SET messages = excluded.messages",
            (cid, ModelMessagesTypeAdapter.dump_json(messages)),
        )

    def load(cid: str) -> Any:
        row = conn.execute("SELECT messages FROM conversation WHERE id = ?", (cid,)).fetchone()
        return ModelMessagesTypeAdapter.validate_json(row[0])

    def cycle(i: int) -> None:
        txn = txn_ids["next"] = f"txn-{i}"
        cid = uuid.uuid4().hex
        paused = agent.run_sync(PROMPT)
        save(cid, paused.all_messages())
        done = agent.run_sync(message_history=load(cid), deferred_tool_results=_approve(paused))
        save(cid, done.all_messages())
        if txn not in done.output:
            raise AssertionError("pydantic-ai: final answer does not name the transaction")

    return Peer(
        "pydantic_ai_sqlite",
        cycle,
        "as pydantic_ai_memory, the history saved as JSON (ModelMessagesTypeAdapter) in "
        "SQLite after each run and loaded before the resume",
        close=conn.close,
        db=tmp / "pydantic_ai.db",
    )
