"""`interlock resend`: a `turn.interrupted` that a reader lost is announced again, with a
new resume token; the old token stops working. Against a real worker and resume
consumer, on a private redis-server and PostgreSQL database."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from schemas import Status, TurnInterrupted
from tests.queue_helpers import (
    Dashboard,
    QueueStack,
    dashboard_for,
    module_stack,
    run_cli,
)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, pg_admin: str) -> Iterator[QueueStack]:
    with module_stack(tmp_path_factory.mktemp("resend"), pg_admin) as queue_stack:
        yield queue_stack


@pytest.fixture
def dash(stack: QueueStack, request: pytest.FixtureRequest) -> Iterator[Dashboard]:
    with dashboard_for(stack, request) as dashboard:
        yield dashboard


def test_a_lost_pause_is_announced_again_with_a_new_token(
    dash: Dashboard, stack: QueueStack
) -> None:
    lost = dash.paused("Transfer $31 to lost-event")
    sent = run_cli(
        "resend", lost.snapshot_id, "--broker", stack.broker_url, "--store", stack.store_url
    )
    assert sent.returncode == 0, sent.describe()
    [line] = sent.json_lines()
    assert (line["resent"], line["snapshot_id"]) == ("turn.interrupted", lost.snapshot_id)
    again = dash.wait(
        lambda e: e.type == "turn.interrupted" and e.event_id == line["event_id"],
        "the new turn.interrupted",
    )
    assert isinstance(again, TurnInterrupted)
    assert again.snapshot_id == lost.snapshot_id
    assert again.resume_token and again.resume_token != lost.resume_token
    assert line["resume_token"] == again.resume_token, "the terminal gets the token too"
    assert f"--token {again.resume_token}" in sent.stderr
    assert again.interrupts == lost.interrupts and again.expires_at == lost.expires_at

    stale = dash.approve_all(lost)  # the old token
    dash.publish_json(stale)
    refused = dash.outcome(stale["decision_id"])
    assert refused.type == "decision.rejected", refused.model_dump_json()
    assert refused.error.status == Status.PERMISSION_DENIED  # type: ignore[attr-defined]
    assert dash.resolve(again).type == "turn.completed"  # the new one answers it


@pytest.mark.parametrize("case", ["answered", "unknown"])
def test_only_an_open_pause_is_resent(dash: Dashboard, stack: QueueStack, case: str) -> None:
    if case == "answered":
        paused = dash.paused("Transfer $32 to answered")
        assert dash.resolve(paused).type == "turn.completed"
        snapshot_id, status, said = paused.snapshot_id, "FAILED_PRECONDITION", "already resumed"
    else:
        snapshot_id, status, said = "no-such-snapshot", "NOT_FOUND", "not found"
    ran = run_cli("resend", snapshot_id, "--broker", stack.broker_url, "--store", stack.store_url)
    assert ran.returncode == 1, ran.describe()
    assert ran.stderr.startswith(f"error: {status}: snapshot {snapshot_id} "), ran.describe()
    assert said in ran.stderr
    assert ran.json_lines() == []
    dash.consumer_barrier()  # what was published before now has been read
    announced = dash.events(lambda e: e.type == "turn.interrupted" and e.snapshot_id == snapshot_id)
    assert len(announced) == (1 if case == "answered" else 0), "nothing was announced again"


def test_a_broker_that_cannot_be_reached_changes_nothing(
    dash: Dashboard, stack: QueueStack
) -> None:
    """The broker is reached before the token is replaced: one that does not answer ends
    the command with UNAVAILABLE, and the old token still answers the pause."""
    from tests.services import free_port

    paused = dash.paused("Transfer $33 to broker-down")
    down = f"redis://127.0.0.1:{free_port()}/0"
    ran = run_cli("resend", paused.snapshot_id, "--broker", down, "--store", stack.store_url)
    assert ran.returncode == 1, ran.describe()
    assert ran.stderr.startswith("error: UNAVAILABLE: cannot reach the broker"), ran.describe()
    assert ran.json_lines() == []
    assert dash.resolve(paused).type == "turn.completed", "the old token still works"


def test_a_broker_that_fails_after_the_new_token_says_where_the_event_waits(
    dash: Dashboard, stack: QueueStack
) -> None:
    """Redis answers (the command's first check passes) but is full: the new token is
    already in force when the publish is refused. One line says so and where the event
    waits; once Redis has room the outbox's sweep announces it, and its token answers."""
    import redis

    paused = dash.paused("Transfer $34 to broker-full")
    client = redis.Redis.from_url(stack.broker_url)
    policy = str(client.config_get("maxmemory-policy")["maxmemory-policy"])
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", 1)  # below what Redis uses already: every write refused
    try:
        ran = run_cli(
            "resend", paused.snapshot_id, "--broker", stack.broker_url, "--store", stack.store_url
        )
    finally:
        client.config_set("maxmemory", 0)
        client.config_set("maxmemory-policy", policy)
        client.close()
    assert ran.returncode == 1, ran.describe()
    assert ran.stderr.startswith("error: UNAVAILABLE: the broker refused the command: "), (
        ran.describe()
    )
    assert "Traceback" not in ran.stderr, ran.describe()
    assert "The new token is in force" in ran.stderr and "waits in the outbox" in ran.stderr
    assert ran.json_lines() == []
    again = dash.wait(
        lambda e: (
            e.type == "turn.interrupted"
            and e.snapshot_id == paused.snapshot_id
            and e.event_id != paused.event_id
        ),
        "the new turn.interrupted, published from the outbox",
        timeout=60,
    )
    assert isinstance(again, TurnInterrupted)
    assert again.resume_token and again.resume_token != paused.resume_token
    assert dash.resolve(again).type == "turn.completed"  # the new token answers it
