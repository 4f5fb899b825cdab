"""A busy turn whose lease holder was a process of this machine that has died (a pool
process killed mid-turn) is taken over at once; a live holder, or one elsewhere, keeps
its lease until it runs out."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from examples.banking import ai
from interlock import AgentInput, Message, Part
from workers.holders import died_here, process_id
from workers.runtime import Runtime
from workers.settings import Settings
from workers.turns import TurnBusy, new_turn_request, run_turn


def _exited_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # reaped: its pid names no process now
    return child.pid


def _owner(pid: int) -> str:
    """A lease owner as a process `pid` of this machine would write it."""
    host, namespace, _ = process_id().split(":")
    return f"{host}:{namespace}:{pid}:deadbeef"


@pytest.fixture
def live() -> Iterator[int]:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        yield child.pid
    finally:
        child.kill()
        child.wait()


def test_died_here_only_for_a_dead_process_of_this_machine(live: int) -> None:
    assert process_id().startswith(f"{socket.gethostname()}:")
    assert died_here(_owner(_exited_pid()))
    assert not died_here(_owner(live))
    assert not died_here(f"{process_id()}:cafe"), "this process runs"
    host, namespace, _ = process_id().split(":")
    dead = _exited_pid()
    assert not died_here(f"another-{host}:{namespace}:{dead}:x"), "another machine"
    assert not died_here(f"{host}:1{namespace}:{dead}:x"), "another PID namespace"
    assert not died_here(f"{host}::{dead}:x"), "a namespace not known"
    assert not died_here(f"{host}:{dead}:x"), "an owner of an older form"
    assert not died_here("w1")


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]


def test_an_exited_child_not_yet_reaped_counts_as_dead() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 30
        while _state(child.pid) != "Z":  # exited; its parent (this test) has not reaped it
            assert time.monotonic() < deadline, "the child did not exit"
            time.sleep(0.01)
        assert died_here(_owner(child.pid))
    finally:
        child.wait()


@pytest.fixture
def rt(tmp_path: Path, redis_url: str) -> Iterator[Runtime]:
    settings = Settings(broker_url=redis_url, store_url=f"sqlite:///{tmp_path}/t.db")
    runtime = Runtime(settings, ai)
    try:
        yield runtime
    finally:
        runtime.close()


def _turn(text: str) -> dict[str, Any]:
    said = AgentInput(message=Message(role="user", content=[Part(text=text)]))
    return new_turn_request("bankingAgent", said, session_id="s-1").model_dump(mode="json")


def test_a_turn_leased_by_a_dead_process_here_runs_at_once(rt: Runtime) -> None:
    request = _turn("Transfer $5 to savings")
    dead = _owner(_exited_pid())
    assert rt.journal.acquire(request["turn_id"], dead, ttl=600)  # a live lease, for long
    result = run_turn(rt, request)
    assert result["finish_reason"] == "interrupted" and result["snapshot_id"], result
    assert rt.journal.holder(request["turn_id"]) is None, "the snapshot gave the lease up"


def test_a_turn_leased_by_a_live_process_stays_busy(rt: Runtime, live: int) -> None:
    request = _turn("Transfer $6 to savings")
    holder = _owner(live)
    assert rt.journal.acquire(request["turn_id"], holder, ttl=600)
    with pytest.raises(TurnBusy):
        run_turn(rt, request)
    held = rt.journal.holder(request["turn_id"])
    assert held is not None and held[0] == holder
    assert rt.store.list_snapshots(session_id="s-1") == []


def test_taking_from_a_holder_fails_once_another_took_it(rt: Runtime) -> None:
    dead = _owner(_exited_pid())
    assert rt.journal.acquire("t-1", dead, ttl=600)
    assert rt.journal.take_from("t-1", dead, "w-2", ttl=30)
    assert not rt.journal.take_from("t-1", dead, "w-3", ttl=30), "w-2 holds it now"
    held = rt.journal.holder("t-1")
    assert held is not None and held[0] == "w-2"


def test_a_session_leased_by_a_dead_process_here_is_let_go(rt: Runtime) -> None:
    """A pool process killed mid-turn leaves its session's lease: the next message to
    the session is told to wait once (SessionBusy) and lets that lease run out, so that
    its retry runs at once, not after the lease's time."""
    from interlock.stores.sql_journal import session_lease
    from workers.turns import SessionBusy

    dead = _owner(_exited_pid())
    assert rt.journal.acquire(session_lease("s-1"), dead, ttl=600)
    request = _turn("Transfer $7 to savings")
    with pytest.raises(SessionBusy):
        run_turn(rt, request)
    result = run_turn(rt, request)  # the retry
    assert result["finish_reason"] == "interrupted" and result["snapshot_id"], result
    assert rt.journal.holder(session_lease("s-1")) is None, "the snapshot gave it up"
