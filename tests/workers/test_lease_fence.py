"""A run that stalled past its turn lease (a frozen process, a store outage longer than
the lease, a turn that outlived Redis's visibility timeout) while another run of the
same turn took the lease over keeps nothing once it wakes: its next journal entry and
the snapshot that would end the turn are refused (`LeaseLost`), so the turn has one
ending, one event and one chain of snapshots, and a tool call after the stall is not
run a second time. Its task is retried later, as a busy turn's is: the other run
answers the turn, and the retry's copy finds it ended (or takes it over, should that
run die too: on Redis its delivery is the stalled run's message, which is acked)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from events.outbox import outbox_table
from interlock import AgentInput, Interlock, Message, ModelRequest, Part, SqlSessionStore, scripted
from interlock.stores.sql_journal import LeaseLost, SqlTurnJournal
from workers.runtime import Runtime
from workers.settings import Settings
from workers.turns import TurnBusy, new_turn_request, run_turn

OTHER = "another-host:0:4242:cafe"
"""The owner of the run that took the turn over while this one stalled."""


class Stall:
    """Where the test's run stalls: at that point another run, of another process (a
    journal of its own on the same database), takes its lease over."""

    def __init__(self, store_url: str) -> None:
        self.other = SqlTurnJournal(SqlSessionStore(store_url))
        self.turn_id = ""

    def take_over(self) -> None:
        elsewhere(self._take_over)

    def _take_over(self) -> None:
        held = self.other.holder(self.turn_id)
        assert held is not None, "the stalled run holds the lease"
        assert self.other.take_from(self.turn_id, held[0], OTHER, ttl=600)


def elsewhere(do: Callable[[], object]) -> None:
    """`do()` in a thread of its own, as another run would be (its own context)."""
    failed: list[BaseException] = []

    def run() -> None:
        try:
            do()
        except BaseException as exc:
            failed.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(60)
    assert not failed, failed


def _registry(stall: Stall, ran: list[str], *, stall_in: str) -> Interlock:
    """An agent whose model asks for `first` then `second` (one call each, in two
    steps), then answers. The run stalls in the tool `first`, or in the model's last
    step (`stall_in="model"`: after every journal entry, before the snapshot)."""
    registry = Interlock(secret="t")

    @registry.tool(name="first", description="a side effect")
    def first(inp: dict[str, Any]) -> dict[str, Any]:
        ran.append("first")
        if stall_in == "first":
            stall.take_over()
        return {"ok": 1}

    @registry.tool(name="second", description="another side effect")
    def second(inp: dict[str, Any]) -> dict[str, Any]:
        ran.append("second")
        return {"ok": 2}

    def model(request: ModelRequest) -> Message:
        tools = sum(m.role == "tool" for m in request.messages)
        if tools == 0:
            return scripted.reply(scripted.tool_call("first", {"n": 1}))
        if tools == 1:
            return scripted.reply(scripted.tool_call("second", {"n": 2}))
        if stall_in == "model":
            stall.take_over()
        return scripted.text("done")

    scripted.define(registry, "steps", model)
    registry.define_agent("a", model="scripted/steps", tools=[first, second])
    return registry


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/fence.db"
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
def make(
    store_url: str, redis_url: str
) -> Iterator[Callable[[str], tuple[Runtime, Stall, list[str]]]]:
    made: list[Runtime] = []

    stalls: list[Stall] = []

    def build(stall_in: str) -> tuple[Runtime, Stall, list[str]]:
        stall, ran = Stall(store_url), list[str]()
        settings = Settings(broker_url=redis_url, store_url=store_url)
        runtime = Runtime(settings, _registry(stall, ran, stall_in=stall_in))
        made.append(runtime)
        stalls.append(stall)
        return runtime, stall, ran

    yield build
    for runtime in made:
        runtime.close()
    for stall in stalls:
        stall.other.store.dispose()


def _request(stall: Stall, session: str) -> dict[str, Any]:
    said = AgentInput(message=Message(role="user", content=[Part(text="go")]))
    request = new_turn_request("a", said, session_id=session)
    stall.turn_id = request.turn_id
    return request.model_dump(mode="json")


def _events(runtime: Runtime) -> list[dict[str, Any]]:
    with runtime.store.engine.connect() as conn:
        rows = conn.execute(select(outbox_table.c.body)).all()
    return [json.loads(r[0]) for r in rows]


@pytest.mark.parametrize("stall_in", ["first", "model"])
def test_a_run_whose_lease_was_taken_over_keeps_nothing(
    make: Callable[[str], tuple[Runtime, Stall, list[str]]],
    stall_in: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    runtime, stall, ran = make(stall_in)
    request = _request(stall, f"s-{stall_in}")
    with (
        caplog.at_level("WARNING", logger="interlock.worker"),
        pytest.raises(TurnBusy, match="another run took over its lease") as busy,
    ):
        run_turn(runtime, request)  # retried later, as a busy turn (not SessionBusy)
    assert type(busy.value) is TurnBusy, busy.value
    said = [r.getMessage() for r in caplog.records if "took over its lease" in r.getMessage()]
    assert said, "the stalled run says why it stopped"
    assert runtime.store.list_snapshots(session_id=request["session_id"]) == [], "no snapshot"
    assert _events(runtime) == [], "no event: the other run gives the turn its answer"
    held = runtime.journal.holder(request["turn_id"])
    assert held is not None and held[0] == OTHER, "the lease stays the other run's"
    journal = runtime.journal.load(request["session_id"], request["turn_id"])
    if stall_in == "first":
        # stalled inside `first`: its outcome is not journaled by this run, and the
        # call after the stall (`second`) did not run
        assert ran == ["first"], ran
        assert sorted(journal) == ["model:0"], journal
    else:
        assert ran == ["first", "second"], ran
        assert {"tool:" in k for k in journal} == {True, False}, "written before the stall"


def test_the_other_run_then_ends_the_turn_once(
    make: Callable[[str], tuple[Runtime, Stall, list[str]]],
) -> None:
    """The run that took the turn over replays what the stalled one journaled before
    the stall and ends the turn: one snapshot, one turn.completed."""
    runtime, stall, ran = make("model")
    request = _request(stall, "s-after")
    with pytest.raises(TurnBusy):
        run_turn(runtime, request)
    stall.take_over = lambda: None  # type: ignore[method-assign]
    with pytest.raises(TurnBusy, match="is running elsewhere"):
        run_turn(runtime, request)  # the retry, while the other run holds the turn
    # the other run dies (its lease runs out unused): the retry's copy takes over
    runtime.journal.expire(request["turn_id"], OTHER)
    done = run_turn(runtime, request)
    assert done.get("finish_reason") == "stop", done
    assert ran == ["first", "second"], "the journaled calls did not run again"
    [snapshot] = runtime.store.list_snapshots(session_id="s-after")
    assert snapshot.snapshot_id == done["snapshot_id"]
    assert [e["type"] for e in _events(runtime)] == ["turn.completed"]


def test_a_lease_run_out_but_not_taken_is_still_this_runs(store_url: str) -> None:
    """A lease that ran out while its run stalled, with no other run taking it, is still
    that run's: its journal entry is written (no run of the turn is beside it)."""
    store, other = SqlSessionStore(store_url), SqlSessionStore(store_url)
    try:
        journal = SqlTurnJournal(store)
        start = journal.begin("t-late", "w-1", 0.0)  # a lease that is out at once
        assert start.kind.name == "NEW", start
        journal.record("s-late", "t-late", "tool:r1", {"ok": True})
        assert journal.load("s-late", "t-late") == {"tool:r1": {"ok": True}}
        elsewhere(lambda: SqlTurnJournal(other).take_from("t-late", "w-1", "w-2", ttl=60))
        assert journal.holder("t-late") is not None
        assert journal.holder("t-late")[0] == "w-2"  # type: ignore[index]
        with pytest.raises(LeaseLost) as lost:
            journal.record("s-late", "t-late", "tool:r2", {"ok": True})
        assert lost.value.status.value == "ABORTED"
        assert str(lost.value) == (
            "ABORTED: turn t-late: another run took over its lease (this run, w-1, stalled "
            "past it); this run stops and keeps nothing"
        )
        assert journal.load("s-late", "t-late") == {"tool:r1": {"ok": True}}, "not written"
        journal.end("t-late", "w-1", snapshot_saved=False)
        held = journal.holder("t-late")
        assert held is not None and held[0] == "w-2", "ending the stalled run leaves it be"
    finally:
        store.dispose()
        other.dispose()


def _once(do: Callable[[], None]) -> Callable[[], None]:
    done: list[bool] = []

    def first_time() -> None:
        if not done:
            done.append(True)
            do()

    return first_time


def test_two_runs_of_a_turn_in_one_process_check_their_own_leases(
    make: Callable[[str], tuple[Runtime, Stall, list[str]]],
) -> None:
    """The thread pool: the run that takes a stalled turn over may be a thread of the
    same process. Each run checks its own lease, not the one `begin` took last there,
    so the stalled one still keeps nothing (its lease is gone: the other's snapshot
    ended the turn)."""
    from interlock.journal import session_for_turn

    runtime, stall, ran = make("first")
    request = {**_request(stall, "unused"), "session_id": None}  # no in-process session lock
    results: list[dict[str, Any]] = []

    def redelivered() -> None:
        turn = request["turn_id"]
        runtime.journal.expire(turn, runtime.journal.held()[turn])  # it stalled past it
        elsewhere(lambda: results.append(run_turn(runtime, request)))

    stall.take_over = _once(redelivered)  # type: ignore[method-assign]
    with pytest.raises(TurnBusy, match="another run took over its lease"):
        run_turn(runtime, request)
    [other] = results
    assert other.get("finish_reason") == "stop", other
    again = run_turn(runtime, request)  # the stalled run's retry finds the turn ended
    assert again.get("duplicate") is True and again["snapshot_id"] == other["snapshot_id"]
    assert ran == ["first", "first", "second"], "the call after the stall ran once"
    [snapshot] = runtime.store.list_snapshots(session_id=session_for_turn(request["turn_id"]))
    assert snapshot.snapshot_id == other["snapshot_id"]
    assert [e["type"] for e in _events(runtime)] == ["turn.completed"]


def test_a_foreign_task_meanwhile_leaves_the_stalled_run_its_lease(
    make: Callable[[str], tuple[Runtime, Stall, list[str]]],
) -> None:
    """A task reusing the turn id with another request, started while the turn's run
    stalled past its lease, is refused (ALREADY_EXISTS) and gives the lease back as it
    found it: the stalled run's, which goes on and ends the turn."""
    runtime, stall, ran = make("first")
    request = _request(stall, "s-foreign")
    forged = {**request, "input": {"message": {"role": "user", "content": [{"text": "x"}]}}}
    refused: list[dict[str, Any]] = []

    def foreign_meanwhile() -> None:
        turn = request["turn_id"]
        runtime.journal.expire(turn, runtime.journal.held()[turn])
        elsewhere(lambda: refused.append(run_turn(runtime, forged)))

    stall.take_over = _once(foreign_meanwhile)  # type: ignore[method-assign]
    done = run_turn(runtime, request)
    assert refused[0]["error"]["status"] == "ALREADY_EXISTS", refused
    assert done.get("finish_reason") == "stop", done
    assert ran == ["first", "second"]
    [snapshot] = runtime.store.list_snapshots(session_id="s-foreign")
    assert snapshot.snapshot_id == done["snapshot_id"]


def test_a_turn_whose_session_ran_another_turn_meanwhile_runs_again_after_it(
    make: Callable[[str], tuple[Runtime, Stall, list[str]]],
) -> None:
    """A run that stalled past its session's lease while another turn of the session
    ran and ended would fork the session with its snapshot: it keeps nothing and is
    retried (SessionBusy), and the retry replays its journal from where the session
    stands (its calls not run again): one chain of snapshots."""
    from interlock.stores.sql_journal import session_lease
    from workers.turns import SessionBusy

    runtime, stall, ran = make("first")
    worker2, _, ran2 = make("nowhere")  # another worker process: a runtime of its own
    first = _request(stall, "s-fork")
    said = AgentInput(message=Message(role="user", content=[Part(text="meanwhile")]))
    second = new_turn_request("a", said, session_id="s-fork").model_dump(mode="json")
    other: list[dict[str, Any]] = []

    def another_turn_meanwhile() -> None:
        owner = runtime.journal.held()[first["turn_id"]]
        runtime.journal.expire(session_lease("s-fork"), owner)  # it stalled past it
        elsewhere(lambda: other.append(run_turn(worker2, second)))

    stall.take_over = _once(another_turn_meanwhile)  # type: ignore[method-assign]
    with pytest.raises(SessionBusy, match="another turn of session s-fork took over"):
        run_turn(runtime, first)
    assert other[0].get("finish_reason") == "stop", other
    retried = run_turn(runtime, first)  # the task's retry
    assert retried.get("finish_reason") == "stop", retried
    assert (ran, ran2) == (["first", "second"], ["first", "second"]), "each call ran once"
    chain = runtime.store.list_snapshots(session_id="s-fork")
    assert len(chain) == 2, chain
    ends = {s.snapshot_id: s for s in chain}
    last = ends[retried["snapshot_id"]]
    assert last.parent_id == other[0]["snapshot_id"], "after the other turn: no fork"
    assert [e["type"] for e in _events(runtime)] == ["turn.completed", "turn.completed"]


def test_a_call_failing_after_the_stall_keeps_the_next_call_of_its_message_from_running(
    store_url: str, redis_url: str
) -> None:
    """Every call of a model message runs even when one fails, but not in a run that
    stalled past its lease meanwhile: the failure is checked against the lease before
    the next call runs (as a completed call's journal entry is), so the call after the
    stall runs once, in the run that took the turn over."""
    stall, ran = Stall(store_url), list[str]()
    registry = Interlock(secret="t")

    @registry.tool(name="first", description="stalls, then fails")
    def first(inp: dict[str, Any]) -> dict[str, Any]:
        ran.append("first")
        stall.take_over()
        raise RuntimeError("kaput")

    @registry.tool(name="second", description="a side effect")
    def second(inp: dict[str, Any]) -> dict[str, Any]:
        ran.append("second")
        return {"ok": 2}

    calls = [scripted.tool_call("first", {"n": 1}), scripted.tool_call("second", {"n": 2})]
    scripted.define(registry, "both", [scripted.reply(*calls), scripted.text("done")])
    registry.define_agent("a", model="scripted/both", tools=[first, second])
    runtime = Runtime(Settings(broker_url=redis_url, store_url=store_url), registry)
    try:
        request = _request(stall, "s-failed")
        with pytest.raises(TurnBusy, match="another run took over its lease"):
            run_turn(runtime, request)
        assert ran == ["first"], "the call after the stall did not run in the stalled run"
        assert runtime.store.list_snapshots(session_id="s-failed") == [], "no snapshot"
        assert _events(runtime) == [], "no event: the other run gives the turn its answer"
    finally:
        runtime.close()
        stall.other.store.dispose()
