"""Settings from `INTERLOCK_*` variables: numbers are checked, with a clear error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from events.outbox import RETENTION
from interlock import Status, StatusError
from tests.queue_helpers import child_env, run_cli
from workers.settings import OUTBOX_RETENTION, Settings


def test_numbers_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INTERLOCK_VISIBILITY_TIMEOUT", "120")
    monkeypatch.setenv("INTERLOCK_RELAY_INTERVAL", "0.5")
    monkeypatch.setenv("INTERLOCK_TURN_LEASE", " 30 ")
    settings = Settings.from_env()
    assert (settings.visibility_timeout, settings.relay_interval, settings.turn_lease) == (
        120,
        0.5,
        30.0,
    )
    monkeypatch.setenv("INTERLOCK_TURN_LEASE", "")
    assert Settings.from_env().turn_lease == 20.0, "empty means the default"
    assert Settings.from_env().outbox_retention == 7 * 24 * 3600.0, "a week by default"
    assert OUTBOX_RETENTION == RETENTION, "the settings' default is the outbox's own"
    monkeypatch.setenv("INTERLOCK_OUTBOX_RETENTION", "86400")
    assert Settings.from_env().outbox_retention == 86400.0
    assert Settings.from_env().to_env()["INTERLOCK_OUTBOX_RETENTION"] == "86400.0"


@pytest.mark.parametrize(
    ("name", "value", "kind"),
    [
        ("INTERLOCK_VISIBILITY_TIMEOUT", "abc", "a whole number"),
        ("INTERLOCK_VISIBILITY_TIMEOUT", "1.5", "a whole number"),
        ("INTERLOCK_VISIBILITY_TIMEOUT", "0", "a whole number"),
        ("INTERLOCK_RELAY_INTERVAL", "-1", "a number"),
        ("INTERLOCK_TURN_LEASE", "nan", "a number"),
        ("INTERLOCK_TURN_LEASE", "inf", "a number"),
    ],
)
def test_a_bad_number_names_its_variable(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, kind: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(StatusError) as info:
        Settings.from_env()
    assert info.value.status is Status.INVALID_ARGUMENT
    assert info.value.message == f"{name} must be {kind} of seconds greater than 0, got {value!r}"


def test_the_cli_says_which_variable_is_wrong(tmp_path: Path) -> None:
    env = child_env(INTERLOCK_VISIBILITY_TIMEOUT="soon")
    store = f"sqlite:///{tmp_path}/i.db"
    result = run_cli("worker", "--app", "examples.banking:ai", "--store", store, env=env)
    assert result.returncode == 1, result.describe()
    assert result.stderr.strip() == (
        "error: INVALID_ARGUMENT: INTERLOCK_VISIBILITY_TIMEOUT must be a whole number of "
        "seconds greater than 0, got 'soon'"
    )


def test_the_commands_that_read_only_the_store_read_only_its_variable(tmp_path: Path) -> None:
    """`pending` and `audit` read INTERLOCK_STORE_URL alone: a value they do not use, in
    another variable, cannot stop them; a bad store URL still does."""
    env = child_env(
        INTERLOCK_VISIBILITY_TIMEOUT="soon",
        INTERLOCK_BROKER_URL="bogus://x",
        INTERLOCK_STORE_URL=f"sqlite:///{tmp_path}/none.db",
    )
    pending = run_cli("pending", env=env, timeout=60)
    assert pending.returncode == 0, pending.describe()
    assert f"no open interrupts: no store at {tmp_path}/none.db yet" in pending.stderr
    audit = run_cli("audit", "some-session", env=env, timeout=60)
    assert audit.returncode == 1, audit.describe()
    assert f"error: NOT_FOUND: no store at {tmp_path}/none.db" in audit.stderr, audit.describe()
    bad = run_cli("pending", env={**env, "INTERLOCK_STORE_URL": "mysql://h/db"}, timeout=60)
    assert bad.returncode == 1 and "not mysql" in bad.stderr, bad.describe()


def test_a_busy_turn_is_looked_at_again_within_the_visibility_timeout() -> None:
    """Half a lease, but never past half the visibility timeout: a retry waiting longer
    than that would be handed by Redis to other workers again and again."""
    from workers.app import busy_retry_countdown

    assert Settings().turn_lease == 20.0, "a dead worker's turn is taken over within 20 s"
    assert busy_retry_countdown(Settings()) == 10.0
    assert busy_retry_countdown(Settings(visibility_timeout=5)) == 2.5
    assert busy_retry_countdown(Settings(turn_lease=1.0, visibility_timeout=1)) == 1.0


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:pw@h:6379/0", "redis://:***@h:6379/0"),
        ("amqp://guest:guest@h:5672//", "amqp://guest:***@h:5672//"),
        (
            "postgresql+psycopg://u:p@ss@h/db?sslmode=require",
            "postgresql+psycopg://u:***@h/db?sslmode=require",
        ),
        ("postgresql+psycopg://u@h/db", "postgresql+psycopg://u@h/db"),
        # libpq and psycopg take a password in the query string too
        ("postgresql://u@h/db?password=secret", "postgresql://u@h/db?password=***"),
        (
            "postgresql+psycopg://u@h/db?sslmode=verify-full&sslpassword=x&connect_timeout=3",
            "postgresql+psycopg://u@h/db?sslmode=verify-full&sslpassword=***&connect_timeout=3",
        ),
        (
            "postgresql://u:pw@h/db?application_name=me@there&PASSWORD=s",
            "postgresql://u:***@h/db?application_name=me@there&PASSWORD=***",
        ),
        ("redis://h:6379/0?password=pw", "redis://h:6379/0?password=***"),
        (
            "redis://:a@h1:6379/0;redis://:b@h2:6379/0",
            "redis://:***@h1:6379/0;redis://:***@h2:6379/0",
        ),
        ("sqlite:///x.db?mode=ro", "sqlite:///x.db?mode=ro"),
        ("sqlite:////tmp/x.db", "sqlite:////tmp/x.db"),
        ("not a url", "not a url"),
    ],
)
def test_urls_are_shown_without_their_password(url: str, shown: str) -> None:
    from workers.settings import redact_url

    assert redact_url(url) == shown


@pytest.mark.parametrize(
    "url",
    [
        "redis://127.0.0.1:6379/0",
        "redis://h1:6379/0;redis://h2:6379/0",
        "amqp://h1:5672;amqp://h2:5672//",
        "sentinel://h1:26379;sentinel://h2:26379",
        "redis+socket:///tmp/redis.sock",
    ],
)
def test_broker_urls_and_failover_lists_kombu_takes_are_accepted(url: str) -> None:
    from workers.settings import check_broker_url

    check_broker_url(url)  # raises on a URL it refuses


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("redis://h:99999/0", "has a bad port: Port out of range 0-65535"),
        ("redis://h:6379/abc", "names Redis database 'abc', which is no number"),
        ("redis://h1:6379/0;redis://h2:x/0", "has a bad port"),
    ],
)
def test_broker_urls_with_a_bad_port_or_database_are_refused(url: str, reason: str) -> None:
    from interlock import Status, StatusError
    from workers.settings import check_broker_url

    with pytest.raises(StatusError) as info:
        check_broker_url(url)
    assert info.value.status is Status.INVALID_ARGUMENT
    assert reason in info.value.message, info.value.message


@pytest.mark.parametrize(
    "url",
    [
        "postgres://u@h/db?password=hunter2",  # the short scheme: refused, the URL shown
        "postgresql+psycopg2://u@h/db?sslmode=require&sslpassword=hunter2",
        "mysql://u@h/db?password=hunter2",
        "redis://h:6379/abc?password=hunter2",
    ],
)
def test_a_refused_url_is_shown_without_a_password_in_its_query(url: str) -> None:
    from interlock import StatusError
    from workers.settings import check_broker_url, check_store_url

    check = check_broker_url if url.startswith("redis") else check_store_url
    with pytest.raises(StatusError) as info:
        check(url)
    assert "hunter2" not in info.value.message, info.value.message
    assert "password=***" in info.value.message, info.value.message


def test_only_the_resume_consumer_asks_for_its_held_messages_to_come_back_early() -> None:
    """On Redis the resume consumer's connection asks for `restore_held` (a decision it
    held when it was killed comes back once its reader is found gone); other clients,
    Celery workers included, keep kombu's visibility timeout; other brokers get no such
    option."""
    from examples.banking import ai
    from workers.app import create_app
    from workers.consumer import ResumeConsumer

    redis_settings = Settings(broker_url="redis://127.0.0.1:6399/0")
    consumer = ResumeConsumer(create_app(redis_settings, ai))
    assert (consumer.connection.transport_options or {}).get("restore_held") is True
    assert "restore_held" not in (redis_settings.connection().transport_options or {})
    assert "restore_held" not in redis_settings.transport_options  # Celery's options
    amqp = Settings(broker_url="amqp://guest:guest@127.0.0.1:5672//")
    assert "restore_held" not in (amqp.connection(restore_held=True).transport_options or {})


def test_help_and_the_settings_module_load_without_sqlalchemy() -> None:
    """`interlock --help` (and any command's) does not load SQLAlchemy: only a command
    that reads a store URL does, to check it."""
    code = (
        "import sys, workers.cli, workers.settings\n"
        "try:\n"
        "    workers.cli.main(['--help'], prog_name='interlock', standalone_mode=False)\n"
        "    workers.cli.main(['decide', '--help'], prog_name='interlock', standalone_mode=False)\n"
        "finally:\n"
        "    print('sqlalchemy' in sys.modules, file=sys.stderr)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "Usage: interlock decide" in done.stdout
    assert done.stderr.strip() == "False"
