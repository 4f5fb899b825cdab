"""The `interlock` command line as a user runs it: the embedded demo (no server at
all), and `submit` / `pending` / `decide` against a real worker and resume consumer.
Errors must be one clear line and a non-zero exit, never a traceback."""

from __future__ import annotations

import getpass
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from schemas import TurnInterrupted
from tests.queue_helpers import (
    AGENT,
    APP,
    CliResult,
    Dashboard,
    QueueStack,
    child_env,
    cli_submit,
    dashboard_for,
    module_stack,
    run_cli,
)
from tests.services import free_port
from workers.settings import redact_url

# -------------------------------------------------------------------------- the demo

DEMOS = {
    "approve": ("demo", "--approve"),
    "deny": ("demo", "--deny"),
    "in-process": ("demo", "--in-process", "--approve"),
}


@pytest.fixture(scope="module")
def demo_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[CliResult, Path]]:
    """The three demos, run at once (each takes seconds, mostly waiting), each in an
    empty directory of its own and with no INTERLOCK_* variable set; but for the deny
    demo's INTERLOCK_BROKER_URL, a broker that is not there, which the demo does not
    read (it needs no server)."""
    folders = {name: tmp_path_factory.mktemp(f"demo-{name}") for name in DEMOS}
    env = child_env()
    env.pop("INTERLOCK_SECRET")
    envs = {name: env for name in DEMOS}
    envs["deny"] = {**env, "INTERLOCK_BROKER_URL": f"redis://127.0.0.1:{free_port()}/0"}
    with ThreadPoolExecutor(len(DEMOS)) as pool:
        futures = {
            name: pool.submit(run_cli, *args, env=envs[name], cwd=folders[name], timeout=100)
            for name, args in DEMOS.items()
        }
        return {name: (future.result(), folders[name]) for name, future in futures.items()}


def test_demo_approve_runs_end_to_end_with_no_server(
    demo_runs: dict[str, tuple[CliResult, Path]],
) -> None:
    result, folder = demo_runs["approve"]
    assert result.returncode == 0, result.describe()
    [line] = result.json_lines()
    assert line["type"] == "turn.completed", result.describe()
    assert list(line) == ["type", "finish_reason", "session_id", "snapshot_id", "text"]
    assert line["finish_reason"] == "stop"
    assert line["text"].startswith("Done: transferred $500.00 to savings, transaction txn-")
    # every hop is shown: the pause, the human's answer, the resume
    for hop in ("turn.interrupted", "Transfer $500.00 to savings", "decision.accepted"):
        assert hop in result.stdout, result.describe()
    assert "Traceback" not in result.stderr, result.describe()
    assert list(folder.iterdir()) == []  # its SQLite store was a temporary one


def test_demo_deny_ends_declined(demo_runs: dict[str, tuple[CliResult, Path]]) -> None:
    result, _ = demo_runs["deny"]
    assert result.returncode == 0, result.describe()
    [line] = result.json_lines()
    assert line["type"] == "turn.completed"
    assert line["text"] == "The transfer of $500.00 to savings was declined.", result.describe()
    assert "human: deny" in result.stdout
    assert "embedded: broker memory://" in result.stdout, "INTERLOCK_BROKER_URL is not read"


def test_demo_in_process(demo_runs: dict[str, tuple[CliResult, Path]]) -> None:
    result, _ = demo_runs["in-process"]
    assert result.returncode == 0, result.describe()
    [line] = result.json_lines()
    assert line["finish_reason"] == "stop", result.describe()
    # One shape, in process or through the queues
    assert list(line) == ["type", "finish_reason", "session_id", "snapshot_id", "text"]
    assert line["type"] == "turn.completed" and line["snapshot_id"] and line["session_id"]
    assert line["text"].startswith("Done: transferred $500.00 to savings, transaction txn-")


@pytest.mark.parametrize(
    ("piped", "ends"),
    [
        ("n\n", "was declined."),
        ("yes\n", "transaction txn-"),
        ("\n", "was declined."),
        ("", "transaction txn-"),
    ],
)
def test_demo_reads_the_answer_from_a_pipe(tmp_path: Path, piped: str, ends: str) -> None:
    """No terminal: a line y or n on standard input answers, an empty line declines (as
    Enter does at the terminal's [y/N]); the end of input approves (said so)."""
    result = run_cli("demo", "--in-process", cwd=tmp_path, timeout=60, stdin=piped)
    assert result.returncode == 0, result.describe()
    [line] = result.json_lines()
    assert ends in line["text"], result.describe()
    said = "(read from standard input)" if piped else "(no terminal to ask: approving"
    assert said in result.stdout, result.describe()


def test_demo_refuses_a_piped_answer_it_cannot_read(tmp_path: Path) -> None:
    result = run_cli("demo", "--in-process", cwd=tmp_path, timeout=60, stdin="maybe\n")
    assert result.returncode == 2, result.describe()
    assert (
        "error: INVALID_ARGUMENT: answer y (yes) or n (no) on standard input, not 'maybe'"
        in result.stderr
    )
    assert "Usage:" not in result.stderr, "the flow ran up to the question: no usage banner"


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--approve", "--deny"], "give --approve or --deny, not both"),
        (["--in-process", "--text", " "], "Invalid value for --text: the message is empty"),
    ],
)
def test_demo_refuses_a_usage_mistake_before_it_runs(
    tmp_path: Path, args: list[str], said: str
) -> None:
    result = run_cli("demo", *args, cwd=tmp_path, timeout=60)
    assert result.returncode == 2, result.describe()
    assert said in result.stderr
    assert result.stdout == "", "nothing ran"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("store", "said"),
    [
        ("sqlite:///:memory:", "INVALID_ARGUMENT: the store sqlite:///:memory: is a SQLite"),
        (
            "sqlite:///{tmp}/junk.db",
            "UNAVAILABLE: cannot use the store: file is not a database (sqlite:///{tmp}/junk.db)",
        ),
        ("sqlite:///{tmp}/nodir/x.db", "NOT_FOUND: no folder {tmp}/nodir for the store"),
    ],
    ids=["in-memory", "no-database", "no-folder"],
)
def test_demo_checks_its_store_before_anything_runs(tmp_path: Path, store: str, said: str) -> None:
    """A store the demo's worker and consumer cannot use is said at once, exit 1: it
    used to hang (in memory), or retry until a hop timed out blaming the worker."""
    (tmp_path / "junk.db").write_bytes(b"no database " * 400)
    url = store.format(tmp=tmp_path)
    result = run_cli("demo", "--approve", "--store", url, cwd=tmp_path, timeout=60)
    assert result.returncode == 1, result.describe()
    assert result.stderr.splitlines()[-1].startswith("error: " + said.format(tmp=tmp_path)), (
        result.describe()
    )
    assert result.stdout == "", "nothing ran"


def test_demo_shows_its_store_without_a_password_in_the_query(tmp_path: Path, pg_url: str) -> None:
    """The embedded demo names the store it runs on: a secret its URL holds in the
    query (libpq's `sslpassword`, unused here) shows as `***`, as in every message."""
    url = f"{pg_url}{'&' if '?' in pg_url else '?'}sslpassword=hunter2"
    result = run_cli("demo", "--approve", "--store", url, cwd=tmp_path, timeout=90)
    assert result.returncode == 0, result.describe()
    assert "hunter2" not in result.stdout + result.stderr, result.describe()
    assert f"store {redact_url(pg_url)}" in result.stdout, result.describe()
    assert "sslpassword=***" in result.stdout, result.describe()


@pytest.mark.parametrize("mode", [(), ("--in-process",)], ids=["queued", "in-process"])
def test_demo_checks_the_model_variable_before_anything_runs(
    tmp_path: Path, mode: tuple[str, ...]
) -> None:
    """A model the registry cannot make, named by INTERLOCK_BANKING_MODEL, is said at
    once and names the variable: it used to submit the turn and fail it."""
    env = {**child_env(), "INTERLOCK_BANKING_MODEL": "garbage"}
    result = run_cli("demo", "--approve", *mode, env=env, cwd=tmp_path, timeout=60)
    assert result.returncode == 1, result.describe()
    assert result.stderr.splitlines()[-1].startswith(
        "error: NOT_FOUND: INTERLOCK_BANKING_MODEL=garbage: model 'garbage' is not defined"
    ), result.describe()
    assert result.stdout == "", "nothing ran"
    assert list(tmp_path.iterdir()) == []


# -------------------------------------------------------------------------- against a stack


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, pg_admin: str) -> Iterator[QueueStack]:
    with module_stack(tmp_path_factory.mktemp("cli"), pg_admin) as queue_stack:
        yield queue_stack


@pytest.fixture
def dash(stack: QueueStack, request: pytest.FixtureRequest) -> Iterator[Dashboard]:
    with dashboard_for(stack, request) as dashboard:
        yield dashboard


def test_pending_lists_the_open_interrupt_and_decide_answers_it(
    stack: QueueStack, dash: Dashboard
) -> None:
    submitted = cli_submit(stack, "Transfer $250 to rent")
    session_id = submitted["session_id"]
    paused = dash.turn_event(session_id)
    assert isinstance(paused, TurnInterrupted), paused.model_dump_json()
    assert paused.snapshot_id is not None and paused.resume_token is not None

    listed = run_cli("pending", "--store", stack.store_url, "--session", session_id)
    assert listed.returncode == 0, listed.describe()
    [line] = listed.json_lines()
    [item] = paused.interrupts
    assert line["snapshot_id"] == paused.snapshot_id
    assert (line["session_id"], line["agent"], line["expires_at"]) == (session_id, AGENT, None)
    assert line["created_at"].endswith("Z"), "UTC as the events write it"
    assert line["interrupts"] == [
        {
            "name": "transferMoney",
            "ref": item.ref,
            "input": {"amount": 250.0, "toAccount": "rent"},
            "payload": {"action": "transferMoney", "details": "Transfer $250.00 to rent"},
        }
    ]
    everything = run_cli("pending", "--store", stack.store_url)
    assert paused.snapshot_id in {x["snapshot_id"] for x in everything.json_lines()}

    decided = run_cli(
        "decide", paused.snapshot_id, "--token", paused.resume_token, "--approve",
        "--reviewer", "cli@example.com", "--store", stack.store_url, "--broker", stack.broker_url,
    )  # fmt: skip
    assert decided.returncode == 0, decided.describe()
    [out] = decided.json_lines()
    assert out["snapshot_id"] == paused.snapshot_id
    accepted = dash.outcome(out["decision_id"])
    assert accepted.type == "decision.accepted", accepted.model_dump_json()
    assert accepted.model_dump()["reviewer"] == "cli@example.com"
    done = dash.resumed_turn(accepted)
    assert done.type == "turn.completed"
    assert done.message.text.startswith(  # type: ignore[attr-defined]
        "Done: transferred $250.00 to rent, transaction txn-"
    )

    after = run_cli("pending", "--store", stack.store_url, "--session", session_id)
    assert after.returncode == 0, after.describe()
    assert after.json_lines() == []
    assert "no open interrupts" in after.stderr


def test_decide_deny_with_the_token_from_the_environment(
    stack: QueueStack, dash: Dashboard
) -> None:
    paused = dash.paused("Transfer $40 to gym")
    decided = run_cli(
        "decide", paused.snapshot_id, "--deny", "--store", stack.store_url,
        "--broker", stack.broker_url,
        env=child_env(INTERLOCK_RESUME_TOKEN=paused.resume_token, INTERLOCK_REVIEWER="ops@x.io"),
    )  # fmt: skip
    assert decided.returncode == 0, decided.describe()
    [out] = decided.json_lines()
    accepted = dash.outcome(out["decision_id"])
    assert accepted.model_dump()["reviewer"] == "ops@x.io"
    done = dash.resumed_turn(accepted)
    assert done.message.text == "The transfer of $40.00 to gym was declined."  # type: ignore[attr-defined]


def test_decide_with_a_wrong_token_is_refused_before_anything_is_sent(
    stack: QueueStack, dash: Dashboard
) -> None:
    """The token is checked against the stored hash as the consumer would (rule 3, before
    the snapshot's state): a wrong one exits 1 with PERMISSION_DENIED, names the way to a
    new token, and sends nothing; the pause stays open for the right one."""
    paused = dash.paused("Transfer $41 to nowhere")
    where = ["--store", stack.store_url, "--broker", stack.broker_url]
    for token in ("guessed", ""):
        decided = run_cli("decide", paused.snapshot_id, "--token", token, "--approve", *where)
        assert decided.returncode == 1, decided.describe()
        assert decided.stdout == "", "no decision id: nothing was published"
        assert "error: PERMISSION_DENIED: " in decided.stderr, decided.describe()
        assert "nothing was sent" in decided.stderr
        resend = (
            f"`interlock resend {paused.snapshot_id} --broker {stack.broker_url} "
            f"--store {stack.store_url}`"
        )
        assert resend in decided.stderr, "the way to a new token, with the flags it needs"
        assert "Traceback" not in decided.stderr
    right = run_cli(
        "decide", paused.snapshot_id, "--token", paused.resume_token, "--approve", *where
    )  # fmt: skip
    assert right.returncode == 0, right.describe()
    [out] = right.json_lines()
    accepted = dash.outcome(out["decision_id"])
    assert accepted.type == "decision.accepted", accepted.model_dump_json()
    assert accepted.model_dump()["reviewer"] == getpass.getuser(), "by default, the login name"
    history = run_cli("audit", paused.session_id, "--store", stack.store_url)
    decisions = [e for e in history.json_lines() if "decision_id" in e]
    assert {e["decision_id"] for e in decisions} == {out["decision_id"]}, history.describe()
    # Answered: still PERMISSION_DENIED to a wrong token (the consumer's order), but no
    # resend is offered, since an answered pause gets no new token either.
    late = run_cli("decide", paused.snapshot_id, "--token", "guessed", "--approve", *where)
    assert late.returncode == 1, late.describe()
    assert late.stderr.strip().splitlines()[-1] == (
        f"error: PERMISSION_DENIED: resume_token does not match snapshot "
        f"{paused.snapshot_id}; nothing was sent"
    ), late.describe()


def test_decide_with_the_app_checks_the_answer_before_sending_it(
    stack: QueueStack, dash: Dashboard
) -> None:
    """Given --app (or INTERLOCK_APP), decide checks a decision as the consumer does,
    with the tools' types: an output of the wrong shape is INVALID_ARGUMENT, exit 1,
    nothing sent. Without it, the same decision goes out and only the consumer refuses
    it. A module that cannot be imported says that decide needs none."""
    paused = dash.paused("Transfer $44 to checked")
    where = ["--store", stack.store_url, "--broker", stack.broker_url]
    answer = [paused.snapshot_id, "--token", paused.resume_token, "--respond", '{"nope": 1}']
    checked = run_cli("decide", *answer, "--app", APP, *where)
    assert checked.returncode == 1, checked.describe()
    assert checked.stdout == "", "no decision id: nothing was published"
    assert checked.stderr.strip().splitlines()[-1] == (
        "error: INVALID_ARGUMENT: invalid output for tool 'transferMoney': success: Field "
        "required; nothing was sent"
    ), checked.describe()
    missing = run_cli("decide", *answer, "--app", "no_such_module_here", *where)
    assert missing.returncode == 1, missing.describe()
    assert "cannot import app module 'no_such_module_here'" in missing.stderr
    assert "decide needs no app: without --app and INTERLOCK_APP" in missing.stderr
    unchecked = run_cli("decide", *answer, *where)
    assert unchecked.returncode == 0, unchecked.describe()
    [out] = unchecked.json_lines()
    rejected = dash.outcome(out["decision_id"])
    assert rejected.type == "decision.rejected", rejected.model_dump_json()
    assert "invalid output for tool 'transferMoney'" in rejected.error.message  # type: ignore[attr-defined]
    right = run_cli(
        "decide", paused.snapshot_id, "--token", paused.resume_token, "--approve",
        *where, env=child_env(INTERLOCK_APP=APP),
    )  # fmt: skip
    assert right.returncode == 0, right.describe()
    [sent] = right.json_lines()
    assert dash.outcome(sent["decision_id"]).type == "decision.accepted"


def test_decide_with_an_empty_reviewer_sends_none(stack: QueueStack, dash: Dashboard) -> None:
    paused = dash.paused("Transfer $43 to savings")
    decided = run_cli(
        "decide", paused.snapshot_id, "--token", paused.resume_token, "--approve",
        "--reviewer", "", "--store", stack.store_url, "--broker", stack.broker_url,
    )  # fmt: skip
    assert decided.returncode == 0, decided.describe()
    [out] = decided.json_lines()
    accepted = dash.outcome(out["decision_id"])
    assert accepted.type == "decision.accepted", accepted.model_dump_json()
    assert accepted.model_dump()["reviewer"] is None


# -------------------------------------------------------------------------- errors


def _clear_failure(result: CliResult, *words: str) -> None:
    assert result.returncode != 0, result.describe()
    assert "Traceback" not in result.stderr, result.describe()
    assert result.stderr.startswith("error: ") or result.returncode == 2, result.describe()
    for word in words:
        assert word in result.stderr, result.describe()


def test_worker_with_an_unknown_app_exits_clearly(stack: QueueStack) -> None:
    for command in ("worker", "resume-consumer"):
        result = run_cli(
            command, "--app", "nosuch.module:ai",
            "--broker", stack.broker_url, "--store", stack.store_url, timeout=60,
        )  # fmt: skip
        _clear_failure(result, "cannot import", "nosuch.module")


def test_decide_on_an_unknown_snapshot_exits_not_found(stack: QueueStack) -> None:
    result = run_cli(
        "decide", "no-such-snapshot", "--token", "t", "--approve",
        "--store", stack.store_url, "--broker", stack.broker_url,
    )  # fmt: skip
    _clear_failure(result, "NOT_FOUND", "no-such-snapshot")


def test_submit_with_an_unknown_agent_exits_not_found(stack: QueueStack) -> None:
    result = run_cli(
        "submit", "--app", APP, "--agent", "nosuchAgent", "--text", "hi",
        "--broker", stack.broker_url, "--store", stack.store_url,
    )  # fmt: skip
    _clear_failure(result, "NOT_FOUND", "nosuchAgent")


def test_waiting_reads_past_messages_that_are_no_event_it_knows(stack: QueueStack) -> None:
    """Another program publishing to interlock.events while `submit --wait` waits: a
    type it does not know is skipped (a newer release's, or a dashboard's own), bodies
    that are no event are skipped with one warning line; the wait goes on to the turn's
    event. It used to end in a traceback at the first such message."""
    from kombu.connection import Connection
    from kombu.messaging import Producer

    from events.topology import EVENTS

    stop = threading.Event()
    sent: list[int] = []

    def chatter() -> None:
        with Connection(stack.broker_url) as conn:
            producer = Producer(conn.channel(), exchange=EVENTS)
            while not stop.is_set():
                for body, key in [
                    ('{"schema_version": 1, "type": "dash.note"}', "dash.note"),
                    ("no json", "turn.completed"),
                ]:
                    producer.publish(body, routing_key=key, content_type="application/json")
                sent.append(1)
                stop.wait(0.01)

    thread = threading.Thread(target=chatter, daemon=True)
    thread.start()
    try:
        result = run_cli(
            "submit", "--app", APP, "--agent", AGENT, "--text", "Transfer $7 to savings",
            "--broker", stack.broker_url, "--store", stack.store_url, "--wait",
        )  # fmt: skip
    finally:
        stop.set()
        thread.join(10)
    assert len(sent) > 1, "nothing was published while the command waited"
    assert result.returncode == 0, result.describe()
    assert "Traceback" not in result.stderr, result.describe()
    assert [line.get("type") for line in result.json_lines()][-1] == "turn.interrupted"
    skipped = [line for line in result.stderr.splitlines() if "is no Interlock event" in line]
    assert len(skipped) == 1, result.describe()
    assert "the body: Invalid JSON" in skipped[0], skipped
    assert "dash.note" not in result.stderr, "an unknown type is skipped quietly"


def test_decide_needs_exactly_one_verdict(stack: QueueStack) -> None:
    result = run_cli(
        "decide", "snap", "--token", "t", "--store", stack.store_url,
        "--broker", stack.broker_url,
    )  # fmt: skip
    assert result.returncode == 2, result.describe()
    assert "give exactly one of --approve, --deny, --respond" in result.stderr
    feedback = run_cli(
        "decide", "snap", "--token", "t", "--respond", '{"success": false}', "--feedback", "no",
        "--store", stack.store_url, "--broker", stack.broker_url,
    )  # fmt: skip
    assert feedback.returncode == 2, feedback.describe()
    assert "--feedback goes with --approve or --deny" in feedback.stderr


def test_unreachable_broker_or_store_is_one_clear_line(stack: QueueStack) -> None:
    nobody = f"127.0.0.1:{free_port()}"
    submit = run_cli(
        "submit", "--app", APP, "--agent", AGENT, "--text", "hi",
        "--broker", f"redis://{nobody}/0", "--store", stack.store_url, timeout=60,
    )  # fmt: skip
    _clear_failure(submit, "UNAVAILABLE", "broker", nobody)
    pending = run_cli(
        "pending", "--store", f"postgresql+psycopg://nobody@{nobody}/interlock", timeout=60
    )
    _clear_failure(pending, "UNAVAILABLE", "store")
    decided = run_cli(
        "decide", "snap", "--token", "t", "--approve", "--broker", stack.broker_url,
        "--store", f"postgresql+psycopg://nobody@{nobody}/interlock", timeout=60,
    )  # fmt: skip
    _clear_failure(decided, "UNAVAILABLE", "store", "; nothing was sent")
    assert decided.stdout == ""


def test_waiting_on_or_deciding_through_a_dead_broker_is_one_clear_line(
    stack: QueueStack, dash: Dashboard
) -> None:
    """`--wait` binds its queue with redis-py, whose errors are no kombu errors; and a
    decision's publish gives up after a few tries (about two seconds, as `submit`; before,
    kombu's own ten retries took from twenty seconds to two minutes, in silence), whatever
    --timeout says. The paused turn is still there to answer."""
    nobody = f"127.0.0.1:{free_port()}"
    waited = run_cli(
        "submit", "--app", APP, "--agent", AGENT, "--text", "hi", "--wait",
        "--broker", f"redis://{nobody}/0", "--store", stack.store_url, timeout=60,
    )  # fmt: skip
    _clear_failure(waited, "UNAVAILABLE", "cannot reach the broker", nobody)
    paused = dash.paused("Transfer $42 to a dead end")
    decided = run_cli(
        "decide", paused.snapshot_id, "--token", paused.resume_token, "--approve",
        "--store", stack.store_url, "--broker", f"redis://{nobody}/0", timeout=60,
    )  # fmt: skip
    _clear_failure(decided, "UNAVAILABLE", "cannot reach the broker", "; nothing was sent")
    assert decided.stdout == "", "no decision id is printed for a decision never sent"
    listed = run_cli("pending", "--store", stack.store_url, "--session", paused.session_id)
    assert [x["snapshot_id"] for x in listed.json_lines()] == [paused.snapshot_id]


@pytest.mark.parametrize(
    ("flag", "url", "words"),
    [
        (
            "--broker",
            "bogus://x",
            (
                "broker URL 'bogus://x' names no broker transport",
                "use redis://HOST:6379/0 or amqp://USER:PASSWORD@HOST:5672// (memory:// "
                "serves one process alone",
            ),
        ),
        ("--broker", "amqp-ish", ("broker URL 'amqp-ish' is not a URL",)),
        ("--store", "notaurl", ("store URL 'notaurl' is not a database URL",)),
        ("--store", "postgresql+nodriver://u:secret@h/db", ("u:***@h/db", "Can't load plugin")),
        (
            "--store",
            "mysql://u:secret@h/db",
            ("u:***@h/db", "the store runs on SQLite or PostgreSQL, not mysql"),
        ),
        (
            "--store",
            "postgres://u:secret@h/db",
            ("u:***@h/db", "write postgresql+psycopg:// in place of postgres://"),
        ),
        ("--broker", "memory://", ("a memory:// broker lives inside one process",)),
    ],
)
def test_a_url_that_cannot_work_is_invalid_argument(
    tmp_path: Path, flag: str, url: str, words: tuple[str, ...]
) -> None:
    """Checked before anything connects, by every command; a password is not shown."""
    urls = {"--broker": "redis://127.0.0.1:1/0", "--store": f"sqlite:///{tmp_path}/i.db", flag: url}
    for command in (
        ["submit", "--app", APP, "--agent", AGENT, "--text", "hi"],
        ["worker", "--app", APP],
        ["resume-consumer", "--app", APP],
    ):
        result = run_cli(*command, "--broker", urls["--broker"], "--store", urls["--store"])
        _clear_failure(result, "INVALID_ARGUMENT", *words)
        assert "secret" not in result.stderr, result.describe()
        assert result.stderr.count("\n") == 1, result.describe()


def test_empty_variables_count_as_unset(tmp_path: Path) -> None:
    """`INTERLOCK_STORE_URL=` (a compose file's empty default) is the default store,
    not an unreadable URL."""
    env = child_env(INTERLOCK_STORE_URL="", INTERLOCK_BROKER_URL="")
    result = run_cli("audit", "some-session", env=env, cwd=tmp_path)
    _clear_failure(result, "NOT_FOUND", "no store at interlock.db (sqlite:///interlock.db)")
    assert run_cli("migrate", env=env, cwd=tmp_path).returncode == 0
    assert (tmp_path / "interlock.db").exists(), "the default store, in the current directory"
    result = run_cli("pending", env=env, cwd=tmp_path)
    assert result.returncode == 0, result.describe()
    assert "no open interrupts" in result.stderr


def test_reading_commands_do_not_make_a_store_that_is_not_there(tmp_path: Path) -> None:
    """A SQLite path with no store yet (or a mistyped one) is not made on the spot:
    `decide` and `audit` say NOT_FOUND, naming it; `pending` lists nothing and says
    why."""
    url = f"sqlite:///{tmp_path}/typo.db"
    for command in (["decide", "some-snapshot", "--token", "t", "--approve"], ["audit", "s"]):
        result = run_cli(*command, "--store", url)
        _clear_failure(result, "NOT_FOUND", f"no store at {tmp_path}/typo.db")
        sent = "; nothing was sent" in result.stderr
        assert sent == (command[0] == "decide"), result.describe()
    listed = run_cli("pending", "--store", url)
    assert listed.returncode == 0 and listed.stdout == "", listed.describe()
    assert f"no open interrupts: no store at {tmp_path}/typo.db yet" in listed.stderr
    assert not (tmp_path / "typo.db").exists()


def test_decide_refuses_a_ref_that_is_not_pending(stack: QueueStack, dash: Dashboard) -> None:
    """Refused before anything is sent: no decision id printed, the pause still open."""
    paused = dash.paused("Transfer $43 to a typo")
    [item] = paused.interrupts
    decided = run_cli(
        "decide", paused.snapshot_id, "--token", paused.resume_token, "--approve",
        "--ref", "nope", "--store", stack.store_url, "--broker", stack.broker_url,
    )  # fmt: skip
    _clear_failure(
        decided,
        "INVALID_ARGUMENT",
        f"--ref nope is no pending interrupt of snapshot {paused.snapshot_id} "
        f"(pending: {item.ref}); nothing was sent",
    )
    assert decided.stdout == ""
    twice = run_cli(
        "decide", paused.snapshot_id, "--token", paused.resume_token, "--approve",
        "--ref", item.ref, "--ref", item.ref, "--store", stack.store_url,
        "--broker", stack.broker_url,
    )  # fmt: skip
    _clear_failure(twice, "INVALID_ARGUMENT", f"--ref {item.ref} is given twice; nothing was sent")
    assert twice.stdout == ""
    listed = run_cli("pending", "--store", stack.store_url, "--session", paused.session_id)
    assert [x["snapshot_id"] for x in listed.json_lines()] == [paused.snapshot_id]


def test_decide_refuses_a_pause_already_answered_before_sending(
    stack: QueueStack, dash: Dashboard
) -> None:
    """A second decide of a pause the consumer has claimed is refused at once, with the
    consumer's words, nothing sent (no decision id printed, exit 1): without --wait it
    used to send and exit 0, so a script run again took it for answered."""
    paused = dash.paused("Transfer $44 to twice")
    flags = ["--store", stack.store_url, "--broker", stack.broker_url, "--token"]
    first = run_cli("decide", paused.snapshot_id, *flags, paused.resume_token, "--approve")
    assert first.returncode == 0, first.describe()
    done = dash.resumed_turn(dash.outcome(first.json_lines()[0]["decision_id"]))
    assert done.type == "turn.completed", done.model_dump_json()
    again = run_cli("decide", paused.snapshot_id, *flags, paused.resume_token, "--deny")
    _clear_failure(
        again,
        "FAILED_PRECONDITION",
        f"snapshot {paused.snapshot_id} was already resumed (session {paused.session_id} goes "
        "on from its latest snapshot); nothing was sent",
    )
    assert again.stdout == ""
    ended = run_cli("decide", str(done.snapshot_id), *flags, "t", "--approve")
    _clear_failure(
        ended,
        "FAILED_PRECONDITION",
        f"snapshot {done.snapshot_id} is not interrupted: nothing to resume; nothing was sent",
    )


def test_decide_refuses_refs_that_leave_an_interrupt_unanswered(
    stack: QueueStack, dash: Dashboard
) -> None:
    """Two transfers at once pause together: `--ref` naming one of them would be
    rejected by the consumer (every pending interrupt at once), so it is refused here,
    naming the one left out. Both named: sent."""
    paused = dash.paused("Transfer $44 to a and $45 to b")
    first, second = paused.interrupts
    where = ["--store", stack.store_url, "--broker", stack.broker_url]
    decide = ["decide", paused.snapshot_id, "--token", paused.resume_token, "--approve"]
    decided = run_cli(*decide, "--ref", first.ref, *where)
    _clear_failure(
        decided,
        "INVALID_ARGUMENT",
        f"a decision answers every pending interrupt at once: add --ref {second.ref} "
        f"({second.name}) or leave --ref out; to answer them differently, publish a "
        "decision's JSON (docs/queues.md); nothing was sent",
    )
    assert decided.stdout == ""
    both = run_cli(*decide, "--ref", first.ref, "--ref", second.ref, *where)
    assert both.returncode == 0, both.describe()
    [out] = both.json_lines()
    assert out["refs"] == [first.ref, second.ref]
    assert dash.outcome(out["decision_id"]).type == "decision.accepted"


def test_app_module_in_the_current_directory(stack: QueueStack, tmp_path: Path) -> None:
    """`--app myapp` finds `myapp.py` where the command runs, as `celery -A` does."""
    (tmp_path / "myapp.py").write_text(
        "from interlock import Interlock\n"
        "ai = Interlock()\n"
        "ai.define_agent('bankingAgent', model='scripted/banking')\n"
    )
    result = run_cli(
        "submit", "--app", "myapp", "--agent", "bankingAgent", "--text", "hi",
        "--broker", stack.broker_url, "--store", stack.store_url, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.describe()
    [sent] = result.json_lines()
    assert set(sent) == {"turn_id", "session_id"}
    missing = run_cli(
        "submit", "--app", "nosuchapp", "--agent", "bankingAgent", "--text", "hi",
        "--broker", stack.broker_url, "--store", stack.store_url, cwd=tmp_path,
    )  # fmt: skip
    _clear_failure(missing, "NOT_FOUND", "cannot import app module 'nosuchapp'")


def test_demo_against_running_worker_and_consumer(stack: QueueStack) -> None:
    """`interlock demo --broker URL`: the same flow, through the running processes."""
    result = run_cli(
        "demo", "--approve", "--broker", stack.broker_url, "--store", stack.store_url,
        timeout=90,
    )  # fmt: skip
    assert result.returncode == 0, result.describe()
    [line] = result.json_lines()
    assert line["type"] == "turn.completed", result.describe()
    assert "transferred $500.00 to savings, transaction txn-" in line["text"]
    assert "embedded" not in result.stdout, "no in-process worker with --broker"
    for hop in ("turn.interrupted", "decision.accepted", "turn.completed"):
        assert hop in result.stdout, result.describe()
