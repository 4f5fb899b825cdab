"""A broker that answers and refuses us (a wrong password, a vhost that does not
exist): every command says so in one line, with its status, and stops at once; none
waits it out or prints a traceback."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.queue_helpers import APP, decisions_only_user, rabbitmq_vhost, run_cli

LOGIN = "error: UNAUTHENTICATED: the broker refused the login: "
ACCESS = "error: PERMISSION_DENIED: the broker refused access: "

COMMANDS = [
    ["submit", "--agent", "bankingAgent", "--text", "hi"],
    ["worker", "--concurrency", "1"],
    ["worker", "--burst"],
    ["resume-consumer"],
    ["resume-consumer", "--burst"],
]


@pytest.fixture
def wrong_password(redis_url: str) -> Iterator[str]:
    """The private Redis, with a user of its own logging in with the wrong password."""
    user = f"u{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(redis_url)
    client.acl_setuser(
        user, enabled=True, passwords=["+right"], keys=["*"], channels=["*"], commands=["+@all"]
    )
    try:
        yield redis_url.replace("redis://", f"redis://{user}:wrong@", 1)
    finally:
        client.acl_deluser(user)
        client.close()


@pytest.fixture
def no_writes(redis_url: str) -> Iterator[str]:
    """The private Redis, with a user of its own that logs in but may run no command
    that writes."""
    user = f"r{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(redis_url)
    client.acl_setuser(
        user,
        enabled=True,
        passwords=["+right"],
        keys=["*"],
        channels=["*"],
        commands=["+@all", "-@write"],
    )
    try:
        yield redis_url.replace("redis://", f"redis://{user}:right@", 1)
    finally:
        client.acl_deluser(user)
        client.close()


def refused(args: list[str], broker: str, store: str) -> str:
    """The stderr of `interlock ARGS` refused by `broker`: exit 1, no traceback."""
    ran = run_cli(*args, "--app", APP, "--broker", broker, "--store", store, timeout=60)
    assert ran.returncode == 1, ran.describe()
    assert "Traceback" not in ran.stderr, ran.describe()
    assert "trying again" not in ran.stderr, ran.describe()
    return ran.stderr


@pytest.mark.parametrize("args", COMMANDS, ids=" ".join)
def test_a_wrong_redis_password(args: list[str], wrong_password: str, tmp_path: Path) -> None:
    said = refused(args, wrong_password, f"sqlite:///{tmp_path}/i.db")
    assert LOGIN + "invalid username-password pair" in said, said


@pytest.mark.parametrize("args", COMMANDS[1:], ids=" ".join)
def test_a_user_who_may_not_declare_the_queues(
    args: list[str], no_writes: str, tmp_path: Path
) -> None:
    """Let in, then refused Interlock's declarations for want of permission: that is the
    broker's users to fix (PERMISSION_DENIED, at once), not a refusal to wait out as
    Redis out of memory is."""
    said = refused(args, no_writes, f"sqlite:///{tmp_path}/i.db")
    assert ACCESS in said and "no permissions to run the 'sadd' command" in said, said


def test_a_wrong_rabbitmq_password_or_vhost(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path}/i.db"
    with rabbitmq_vhost() as url:
        wrong = url.replace("guest:guest@", "guest:wrong@", 1)
        for args in COMMANDS:
            said = refused(args, wrong, store)
            assert LOGIN + "(403) ACCESS_REFUSED - Login was refused" in said, said
    unknown = f"amqp://guest:guest@127.0.0.1:5672/no_such_vhost_{uuid.uuid4().hex[:8]}"
    for args in (COMMANDS[0], COMMANDS[1], COMMANDS[3]):
        said = refused(args, unknown, store)
        assert ACCESS in said and "(530) NOT_ALLOWED - vhost no_such_vhost_" in said, said


def test_health_says_which_refusal(wrong_password: str, tmp_path: Path) -> None:
    ran = run_cli("health", "--broker", wrong_password, "--store", f"sqlite:///{tmp_path}/h.db")
    assert ran.returncode == 1, ran.describe()
    [report] = ran.json_lines()
    assert report["broker"].startswith("error: UNAUTHENTICATED: the broker refused the login")
    assert report["store"] == "ok"


def test_a_rabbitmq_user_who_may_only_publish_decisions(tmp_path: Path) -> None:
    """docs/operations.md, "Who may publish where": a reviewer's user that may write to
    `interlock.decisions` alone publishes a decision as a dashboard does, and is refused
    `submit`, which declares `interlock.turns` before it publishes there:
    PERMISSION_DENIED naming what it may not touch, at once, nothing sent."""
    from kombu.connection import Connection
    from kombu.messaging import Producer

    from events.publisher import declare

    decision_id = f"narrow-{uuid.uuid4().hex[:8]}"
    with rabbitmq_vhost() as url, decisions_only_user(url) as narrow:
        with Connection(url) as admin:
            declare(admin)
        said = refused(COMMANDS[0], narrow, f"sqlite:///{tmp_path}/i.db")
        assert "error: PERMISSION_DENIED: " in said, said
        assert "ACCESS_REFUSED - access to exchange 'interlock.turns'" in said, said
        body = json.dumps({"schema_version": 1, "decision_id": decision_id, "snapshot_id": "s"})
        with Connection(narrow, transport_options={"confirm_publish": True}) as conn:
            Producer(conn.channel()).publish(
                body,
                exchange="interlock.decisions",
                routing_key="interlock.decisions",
                content_type="application/json",
            )
        with Connection(url) as admin, admin.SimpleQueue("interlock.decisions") as queue:
            message = queue.get(timeout=10)
            assert json.loads(message.body)["decision_id"] == decision_id
            message.ack()
