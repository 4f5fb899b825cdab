"""The `interlock decide` line that `submit --wait` and `resend` print for a pause:
what it repeats, what it leaves to the environment, and what it says it hid."""

from __future__ import annotations

import re

from workers.cli.waiter import decide_hint
from workers.settings import DEFAULT_BROKER, DEFAULT_STORE, Settings

BROKER = "amqp://guest:s3cret@mq.internal:5672/prod"
STORE = "postgresql+psycopg://app@db.internal/interlock"


def _command(hint: str) -> str:
    found = re.search(r"`(interlock decide [^`]+)`", hint)
    assert found is not None, hint
    return found.group(1)


def test_urls_given_as_flags_are_repeated_and_a_password_is_hidden_and_said() -> None:
    hint = decide_hint(Settings(broker_url=BROKER, store_url=STORE), "snap-1", "tok", env={})
    command = _command(hint)
    assert command == (
        "interlock decide snap-1 --token tok --broker amqp://guest:***@mq.internal:5672/prod "
        f"--store {STORE} --approve"
    )
    assert "s3cret" not in hint
    assert "put the password back where *** stands" in hint
    assert "your workers' store" not in hint, "the store was named"


def test_what_decide_reads_from_the_environment_is_not_repeated() -> None:
    env = {"INTERLOCK_BROKER_URL": BROKER, "INTERLOCK_STORE_URL": STORE}
    hint = decide_hint(Settings(broker_url=BROKER, store_url=STORE), "snap-2", "tok", env=env)
    assert _command(hint) == "interlock decide snap-2 --token tok --approve"
    assert "***" not in hint and "password" not in hint
    assert hint.endswith("(or --deny, --respond JSON)"), hint


def test_a_store_left_at_its_default_is_named_as_a_maybe() -> None:
    hint = decide_hint(
        Settings(broker_url=DEFAULT_BROKER, store_url=DEFAULT_STORE), "snap-3", "tok", env={}
    )
    assert _command(hint) == "interlock decide snap-3 --token tok --approve"
    assert f"add --store URL if your workers' store is not {DEFAULT_STORE}" in hint
    plain = "redis://mq.internal:6379/0"
    hint = decide_hint(Settings(broker_url=plain, store_url=DEFAULT_STORE), "s", "t", env={})
    assert f"--broker {plain} --approve" in _command(hint), "no password: repeated as it is"
    assert "password" not in hint
