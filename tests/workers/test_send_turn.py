"""`send_turn` on a real Redis: the task message a worker reads, JSON arguments, and a
summary for logs and monitoring tools that shows ids, not what users wrote."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from celery import Celery
from kombu.connection import Connection
from kombu.message import Message as KombuMessage

from events.topology import TURNS_QUEUE
from examples.banking import ai
from interlock import AgentInput, Message, Part, SqlSessionStore
from schemas import TurnRequest
from workers.app import RUN_TURN, create_app, send_turn
from workers.settings import Settings
from workers.turns import new_turn_request


def _request(**where: Any) -> TurnRequest:
    text = Message(role="user", content=[Part(text="my PIN is 4321")])
    return new_turn_request("bankingAgent", AgentInput(message=text), **where)


def _sent(redis_url: str, send: Callable[[Celery], None]) -> KombuMessage:
    """The message `send(app)` put on `interlock.turns` (taken off it)."""
    app = create_app(Settings(broker_url=redis_url, store_url="sqlite://"), ai)
    with Connection(redis_url) as conn:
        turns = conn.SimpleQueue(TURNS_QUEUE)
        turns.clear()
        try:
            send(app)
            message: KombuMessage = turns.get(timeout=10)
            message.ack()
        finally:
            turns.close()
    return message


def test_a_submitted_turn_carries_json_arguments_and_an_id_summary(redis_url: str) -> None:
    session_id = str(uuid.uuid4())
    request = _request(session_id=session_id)
    message = _sent(redis_url, lambda app: send_turn(app, request))
    assert message.content_type == "application/json"
    assert message.headers["task"] == RUN_TURN
    [sent], kwargs, _embed = message.decode()
    assert kwargs == {}
    assert TurnRequest.model_validate(sent) == request
    summary = message.headers["argsrepr"]
    assert summary == f"(turn={request.turn_id} agent=bankingAgent session={session_id} message)"
    assert "PIN" not in summary  # the message text stays out (hex ids cannot hold it)


def test_a_turn_sent_without_send_turn_shows_the_summary_too(redis_url: str) -> None:
    """Celery republishes a retried task (and a client may call `send_task` itself) with a
    repr of the arguments in `argsrepr`; every `interlock.run_turn` message gets the
    summary instead."""
    request = _request(snapshot_id="snap-1")
    body = request.model_dump(mode="json")
    message = _sent(redis_url, lambda app: app.send_task(RUN_TURN, args=[body], countdown=0))
    assert message.headers["argsrepr"] == (
        f"(turn={request.turn_id} agent=bankingAgent snapshot=snap-1 message)"
    )
    assert message.headers["kwargsrepr"] == "{}"
    assert "4321" in str(message.decode()[0]), "the arguments themselves are unchanged"


def test_a_turn_sent_by_keyword_shows_the_summary_too(redis_url: str) -> None:
    request = _request(session_id="s-kw")
    body = request.model_dump(mode="json")
    message = _sent(redis_url, lambda app: app.send_task(RUN_TURN, kwargs={"request": body}))
    assert message.headers["argsrepr"] == (
        f"(turn={request.turn_id} agent=bankingAgent session=s-kw message)"
    )
    assert message.headers["kwargsrepr"] == "{}"


def test_two_apps_in_one_process_each_run_turns_with_their_own_settings(
    redis_url: str, tmp_path: Path
) -> None:
    """A process may build more than one app (an embedding, a test): each app's task
    runs with that app's store, not with that of the app built first."""
    first, second = tmp_path / "first.db", tmp_path / "second.db"
    apps = [
        create_app(Settings(broker_url=redis_url, store_url=f"sqlite:///{db}"), ai)
        for db in (first, second)
    ]
    session_id = str(uuid.uuid4())
    hello = Message(role="user", content=[Part(text="Hello")])
    request = new_turn_request("bankingAgent", AgentInput(message=hello), session_id=session_id)
    ran = apps[1].tasks[RUN_TURN].apply(args=[request.model_dump(mode="json")])
    assert ran.state == "SUCCESS", (ran.state, ran.result)
    kept = {db.name: SqlSessionStore(f"sqlite:///{db}") for db in (first, second)}
    assert kept["second.db"].get_latest_snapshot(session_id) is not None
    assert kept["first.db"].get_latest_snapshot(session_id) is None
