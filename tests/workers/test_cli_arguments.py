"""Arguments that cannot work are one line, before any store is read or anything is
sent: ids and other text holding bytes that are no UTF-8 (they reach Python as lone
surrogates), and a demo pointed at a broker of its own process."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.queue_helpers import run_cli

NOWHERE = "redis://127.0.0.1:1/0"
"""A broker no command may reach: each refusal comes before any connection."""


@pytest.fixture
def store(tmp_path: Path) -> str:
    """A store with Interlock's tables, so that each command would go on to read it."""
    url = f"sqlite:///{tmp_path / 'interlock.db'}"
    made = run_cli("migrate", "--store", url, timeout=60)
    assert made.returncode == 0, made.describe()
    return url


DECIDE = ("decide", "--broker", NOWHERE, "--approve")
"""`interlock decide` up to its snapshot, its token and what varies."""


SURROGATE = "a lone surrogate (\\udcff), which is not text"


@pytest.mark.parametrize(
    ("args", "said"),
    [
        pytest.param(
            ("audit", "s\udcff"),
            f"SESSION_ID contains {SURROGATE}: no session id holds one",
            id="audit SESSION_ID",
        ),
        pytest.param(
            ("pending", "--session", "s\udcff"),
            f"--session contains {SURROGATE}: no session id holds one",
            id="pending --session",
        ),
        pytest.param(
            ("resend", "--broker", NOWHERE, "s\udcff"),
            f"SNAPSHOT_ID contains {SURROGATE}; nothing was sent",
            id="resend SNAPSHOT_ID",
        ),
        pytest.param(
            (*DECIDE, "s\udcff", "--token", "t"),
            f"SNAPSHOT_ID contains {SURROGATE}; nothing was sent",
            id="decide SNAPSHOT_ID",
        ),
        pytest.param(
            (*DECIDE, "s", "--token", "t\udcff"),
            f"--token contains {SURROGATE}; nothing was sent",
            id="decide --token",
        ),
        pytest.param(
            (*DECIDE, "s", "--token", "t", "--reviewer", "r\udcff"),
            f"--reviewer contains {SURROGATE}; nothing was sent",
            id="decide --reviewer",
        ),
        pytest.param(
            (*DECIDE, "s", "--token", "t", "--ref", "r\udcff"),
            f"--ref contains {SURROGATE}; nothing was sent",
            id="decide --ref",
        ),
        pytest.param(
            (*DECIDE, "s", "--token", "t", "--feedback", "f\udcff"),
            f"--feedback contains {SURROGATE}; nothing was sent",
            id="decide --feedback",
        ),
        pytest.param(
            ("decide", "--broker", NOWHERE, "s", "--token", "t", "--respond", '{"a": "\\ud800"}'),
            "--respond contains a lone surrogate (\\ud800), which is not text; nothing was sent",
            id="decide --respond escaped surrogate",
        ),
        pytest.param(
            ("decide", "--broker", NOWHERE, "s", "--token", "t", "--respond", '{"a": "\\u0000"}'),
            "--respond contains a NUL character (\\u0000); nothing was sent",
            id="decide --respond NUL",
        ),
    ],
)
def test_an_argument_that_is_no_text_is_one_line(
    store: str, args: tuple[str, ...], said: str
) -> None:
    result = run_cli(*args, "--store", store, timeout=60)
    # (a report holding the surrogate itself could not be sent back by xdist)
    assert result.returncode == 1, ascii(result.describe())
    assert result.stderr == f"error: INVALID_ARGUMENT: {said}\n", ascii(result.describe())
    assert result.stdout == "", ascii(result.describe())


def test_demo_given_a_memory_broker_says_to_leave_broker_out() -> None:
    """`--broker` points the demo at running processes, which no `memory://` broker
    reaches; the demo's own in-process broker is what leaving the flag out gives."""
    result = run_cli("demo", "--approve", "--broker", "memory://", timeout=60)
    assert result.returncode == 1, result.describe()
    assert result.stderr == (
        "error: INVALID_ARGUMENT: a memory:// broker lives inside one process: nothing sent "
        "there reaches a worker or a resume consumer; use redis://HOST:6379/0 or "
        "amqp://HOST:5672//; or leave --broker out: the demo then runs everything in this "
        "process, on a memory:// broker of its own\n"
    ), result.describe()


def test_audit_of_no_session_names_the_store_and_an_empty_id_is_refused(store: str) -> None:
    unknown = run_cli("audit", "no-such-session", "--store", store, timeout=60)
    assert unknown.returncode == 1, unknown.describe()
    assert unknown.stderr == (
        "error: NOT_FOUND: no session no-such-session in the store at "
        f"{store} (check --store or INTERLOCK_STORE_URL)\n"
    ), unknown.describe()
    empty = run_cli("audit", "", "--store", store, timeout=60)
    assert empty.returncode == 1, empty.describe()
    assert empty.stderr == ("error: INVALID_ARGUMENT: SESSION_ID is empty: give a session id\n"), (
        empty.describe()
    )
