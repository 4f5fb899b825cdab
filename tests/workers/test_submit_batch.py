"""`interlock submit` as a batch pipeline runs it, against a private redis-server (and
a SQLite store): a file that starts with a byte order mark, turn ids that make sending a
file again harmless, a broker that goes away part-way, and the queue of its own that
`--wait` reads, deleted with its binding however the command ends. And `pending`
saying when its --limit cut the list."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import redis
from kombu.connection import Connection

from events.publisher import Publisher, declare
from events.stream import EventStream
from interlock import SqlSessionStore
from schemas import EventBase, FinishReason, TurnCompleted
from tests.queue_helpers import AGENT, APP, child_env, interlock_bin, run_cli
from tests.services import RedisServer, eventually, start_redis
from workers.settings import Settings

BINDINGS = "_kombu.binding.interlock.events"
PERMANENT = "_kombu.binding_permanent.interlock.events"
SEP = b"\x06\x16"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of the test's own that keeps its data across a restart."""
    made = start_redis(tmp_path / "redis", appendonly=True)
    try:
        yield made
    finally:
        made.stop()


def flags(server: RedisServer, tmp_path: Path) -> list[str]:
    return ["--app", APP, "--broker", server.url, "--store", f"sqlite:///{tmp_path}/store.db"]


def client(server: RedisServer) -> redis.Redis:
    return redis.Redis.from_url(server.url)


def connection(server: RedisServer) -> Connection:
    """A kombu connection to `server`, as Interlock's processes make theirs."""
    return Settings(broker_url=server.url).connection()


def queued(server: RedisServer) -> list[dict[str, Any]]:
    """The turn requests waiting on `interlock.turns`, oldest first."""
    requests = []
    for item in reversed(client(server).lrange("interlock.turns", 0, -1)):
        message = json.loads(item)
        args, _, _ = json.loads(base64.b64decode(message["body"]))
        requests.append(args[0])
    return requests


def texts(requests: list[dict[str, Any]]) -> list[str]:
    return [r["input"]["message"]["content"][0]["text"] for r in requests]


def spawn(
    *args: str, stdin: bytes | None = None, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    # Unbuffered: a test reads some lines, then `communicate` reads the rest from the
    # pipe itself, and what a buffered `readline` had read ahead would be lost.
    return subprocess.Popen(
        [interlock_bin(), *args],
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env if env is not None else child_env(),
        bufsize=0,
    )


def finish(proc: subprocess.Popen[bytes], stdin: bytes | None = None) -> tuple[str, str]:
    """What `proc` prints from now on, once it has exited."""
    try:
        out, err = proc.communicate(stdin, timeout=60)
    finally:
        proc.kill()
    return out.decode(), err.decode()


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


# ------------------------------------------------------------------ what a file may hold


@pytest.mark.parametrize("where", ["file", "stdin"])
def test_a_byte_order_mark_is_no_part_of_the_first_line(
    server: RedisServer, tmp_path: Path, where: str
) -> None:
    """A file saved by an editor that writes a BOM: its JSON first line is still JSON
    (it was sent as the literal text, BOM and braces)."""
    data = b'\xef\xbb\xbf{"text": "Hi", "session_id": "bom-1"}\nHello\n'
    path = tmp_path / "turns.txt"
    path.write_bytes(data)
    source = ["--file", str(path)] if where == "file" else ["--file", "-"]
    stdin = data if where == "stdin" else None
    proc = spawn("submit", *flags(server, tmp_path), "--agent", AGENT, *source, stdin=stdin)
    out, err = finish(proc, stdin)
    assert proc.returncode == 0, err
    assert json_lines(out)[0]["session_id"] == "bom-1", out
    assert texts(queued(server)) == ["Hi", "Hello"]


def test_a_lone_surrogate_in_an_argument_is_refused_before_anything_is_sent(
    server: RedisServer, tmp_path: Path
) -> None:
    """Bytes that are no UTF-8 in `--text` reach Python as a lone surrogate, which a
    worker refuses before the turn runs: refused here, nothing sent."""
    result = run_cli("submit", *flags(server, tmp_path), "--agent", AGENT, "--text", "caf\udce9")
    # (a report holding the surrogate itself could not be sent back by xdist)
    assert result.returncode == 1, ascii(result.describe())
    assert result.stderr == (
        "error: INVALID_ARGUMENT: --text contains a lone surrogate (\\udce9), which is not "
        "text: a worker would refuse the turn\n"
    )
    assert queued(server) == []


def test_a_file_sent_again_with_turn_ids_runs_each_turn_once(
    server: RedisServer, tmp_path: Path
) -> None:
    """The file of a batch cut short, sent again as a whole: its lines name their turns,
    so each runs once, and a line without a session names the same one both times."""
    run_id = uuid.uuid4().hex[:8]
    path = tmp_path / "turns.txt"
    lines = [
        json.dumps({"text": "Hello", "turn_id": f"{run_id}.1"}),
        json.dumps({"text": "Hello", "turn_id": f"{run_id}.2", "session_id": f"{run_id}-s"}),
        json.dumps({"text": "Hello", "turn_id": f"{run_id}.3"}),
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with connection(server) as conn:
        declare(conn)
        events = EventStream.bind(conn, f"test.{run_id}", "turn.#")
        try:
            first, again = (
                run_cli("submit", *flags(server, tmp_path), "--agent", AGENT, "--file", str(path))
                for _ in range(2)
            )
            assert first.returncode == 0 and again.returncode == 0, first.describe()
            assert first.json_lines() == again.json_lines()
            ids = [p["turn_id"] for p in first.json_lines()]
            assert ids == [f"{run_id}.{n}" for n in (1, 2, 3)]
            assert [r["turn_id"] for r in queued(server)] == ids * 2

            ran = run_cli("worker", "--burst", "--pool", "solo", *flags(server, tmp_path))
            assert ran.returncode == 0, ran.describe()
            ended = ending_events(events, set(ids))
        finally:
            events.close(delete=True)
    assert all(isinstance(e, TurnCompleted) for e in ended.values()), ended
    assert ran.stderr.count("already ended") == 3, ran.stderr
    store = SqlSessionStore(f"sqlite:///{tmp_path}/store.db", create_tables=False)
    try:
        for sent in first.json_lines():
            assert len(store.list_snapshots(session_id=sent["session_id"])) == 1
    finally:
        store.dispose()


def ending_events(events: EventStream, turn_ids: set[str]) -> dict[str, EventBase]:
    """The first event of each of `turn_ids` (an event may come twice: same event_id)."""
    found: dict[str, EventBase] = {}
    while set(found) != turn_ids:
        event = events.next(30, match=lambda e: e.turn_id in turn_ids)
        assert event.turn_id is not None
        found.setdefault(event.turn_id, event)
    return found


# ------------------------------------------------------------------ cut short


def numbered_file(path: Path, count: int) -> list[int]:
    """`count` turns, a blank line after every tenth (so lines and turns differ); the
    line of each turn."""
    text, lines, number = [], [], 0
    for i in range(count):
        number += 1
        text.append(f"Hello {i}")
        lines.append(number)
        if i % 10 == 9:
            number += 1
            text.append("")
    path.write_text("\n".join(text) + "\n", encoding="utf-8")
    return lines


def start_batch(
    server: RedisServer, tmp_path: Path, *extra: str
) -> tuple[subprocess.Popen[bytes], list[int], list[bytes]]:
    """`submit --file` of 3000 turns, read until it has printed five: it goes on
    sending until its output fills the pipe, then waits for the test to read on."""
    lines = numbered_file(tmp_path / "turns.txt", 3000)
    proc = spawn(
        "submit", *flags(server, tmp_path), "--agent", AGENT,
        "--file", str(tmp_path / "turns.txt"), *extra,
    )  # fmt: skip
    assert proc.stdout is not None
    return proc, lines, [proc.stdout.readline() for _ in range(5)]


def test_a_stop_while_a_batch_waits_says_how_many_turns_had_ended(
    server: RedisServer, tmp_path: Path
) -> None:
    """No worker: every turn is sent and none ends. SIGTERM during the wait used to print
    only "terminated"; it now says how far the wait got first."""
    path = tmp_path / "turns.txt"
    path.write_text("".join(f"turn {n}\n" for n in range(3)))
    proc = spawn(
        "submit", *flags(server, tmp_path), "--agent", AGENT, "--file", str(path), "--wait",
    )  # fmt: skip
    assert proc.stderr is not None
    assert proc.stderr.readline() == b"submitted 3 of 3 turns\n"
    assert b"waiting for 3 turns to end" in proc.stderr.readline()
    proc.send_signal(signal.SIGTERM)
    out, err = finish(proc)
    assert proc.returncode == 143, err
    *_, said, last = err.splitlines()
    assert last == "terminated", err
    assert said == (
        "0 of 3 turns had ended when the wait stopped; the others were sent and go on: "
        f"`interlock pending --store sqlite:///{tmp_path}/store.db` lists the paused turns"
    ), err
    assert len(json_lines(out)) == 3, "each sent turn was printed"


def test_a_broker_that_goes_away_part_way_is_said_with_how_far_the_file_got(
    server: RedisServer, tmp_path: Path
) -> None:
    proc, lines, read = start_batch(server, tmp_path)
    server.stop()
    out, err = finish(proc)
    printed = json_lines(b"".join(read).decode() + out)
    sent = len(printed)
    assert proc.returncode == 1, err
    assert 5 <= sent < 3000, err
    assert [p["line"] for p in printed] == lines[:sent]
    *progress, last = err.splitlines()
    assert last.startswith("error: UNAVAILABLE: cannot reach the broker: "), err
    assert last.endswith(
        f" ({sent} of 3000 turns sent, through line {lines[sent - 1]}; the rest, from line "
        f"{lines[sent]}, were not sent)"
    ), err
    assert progress[-1] == f"submitted {sent} of 3000 turns", "the last count is the true one"

    server.start()
    waiting = [r["turn_id"] for r in queued(server)]
    # Each turn printed was taken by Redis; the one that failed may have been too, its
    # answer lost: the reason to give lines a turn_id.
    assert waiting[:sent] == [p["turn_id"] for p in printed]
    assert len(waiting) in (sent, sent + 1)


# ------------------------------------------------------------------ the queue --wait reads


def cli_queues(server: RedisServer) -> list[bytes]:
    """What a command's queue (`interlock.cli.*`) left in Redis: bindings of
    `interlock.events` in either set, keys, reading lists that hold a message (Redis
    drops an empty list). Not its entry in the readers' registry: a wait cut by a signal
    mid-reply may leave it, and the next worker or consumer clears it (docs/operations.md)."""
    r = client(server)
    found: list[object] = [*r.smembers(BINDINGS), *r.smembers(PERMANENT), *r.keys("*")]
    return [item for item in found if isinstance(item, bytes) and b"interlock.cli." in item]


def test_wait_deletes_its_queue_and_binding_when_the_turn_ends(
    server: RedisServer, tmp_path: Path
) -> None:
    proc = spawn("submit", *flags(server, tmp_path), "--agent", AGENT, "--text", "Hello", "--wait")
    assert proc.stdout is not None
    assert b'"turn_id"' in proc.stdout.readline()
    assert any(b"interlock.cli." in m for m in client(server).smembers(BINDINGS))
    ran = run_cli("worker", "--burst", "--pool", "solo", *flags(server, tmp_path))
    assert ran.returncode == 0, ran.describe()
    out, err = finish(proc)
    assert proc.returncode == 0, err
    assert json_lines(out)[-1]["type"] == "turn.completed"
    assert cli_queues(server) == []


@pytest.mark.parametrize(
    ("how", "code", "said"),
    [
        ("timeout", 1, "error: DEADLINE_EXCEEDED: no turn "),
        ("SIGINT", 130, "interrupted"),
        ("SIGTERM", 143, "terminated"),
    ],
)
def test_wait_deletes_its_queue_and_binding_on_an_error_or_a_signal(
    server: RedisServer, tmp_path: Path, how: str, code: int, said: str
) -> None:
    """No worker: the turn never ends. The command gives up (--timeout), or is stopped
    with Ctrl-C or SIGTERM (which used to end it on the spot, its binding left to route
    every event to its key for good)."""
    proc = spawn(
        "submit", *flags(server, tmp_path), "--agent", AGENT, "--text", "Hello", "--wait",
        "--timeout", "1" if how == "timeout" else "60",
    )  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    assert b'"turn_id"' in proc.stdout.readline()
    assert b"waiting for turn" in proc.stderr.readline()
    if how != "timeout":
        proc.send_signal(getattr(signal, how))
    _, err = finish(proc)
    assert proc.returncode == code, err
    assert err.splitlines()[-1].startswith(said), err
    if how != "timeout":  # the turn went out: a stop of the wait says so
        assert " stopped; the turn was sent and goes on: `interlock pending --store " in err
    if how == "timeout":  # a turn needs a worker; the resume consumer is no help
        assert err.splitlines()[-1].endswith(
            "within 1s: is `interlock worker` running on this broker and store? What was sent "
            "stays queued, and runs once one is"
        ), err
    assert cli_queues(server) == []


def test_a_stopped_decide_wait_says_the_decision_was_sent(
    server: RedisServer, tmp_path: Path
) -> None:
    """No resume consumer: `decide --wait` waits for an outcome that does not come. A
    stop (SIGTERM) says that the decision went out, as `submit --wait` says of its turn,
    and leaves no queue of its own behind."""
    text = "Transfer $5 to savings"
    proc = spawn("submit", *flags(server, tmp_path), "--agent", AGENT, "--text", text, "--wait")
    assert proc.stdout is not None
    assert b'"turn_id"' in proc.stdout.readline()
    ran = run_cli("worker", "--burst", "--pool", "solo", *flags(server, tmp_path))
    assert ran.returncode == 0, ran.describe()
    out, err = finish(proc)
    paused = json_lines(out)[-1]
    assert paused["type"] == "turn.interrupted", out + err
    decide = spawn(
        "decide", paused["snapshot_id"], "--token", paused["resume_token"], "--approve",
        "--wait", *flags(server, tmp_path),
    )  # fmt: skip
    assert decide.stdout is not None and decide.stderr is not None
    sent = json.loads(decide.stdout.readline())
    assert b"waiting for the outcome of decision" in decide.stderr.readline()
    decide.send_signal(signal.SIGTERM)
    _, err = finish(decide)
    assert decide.returncode == 143, err
    assert err.splitlines()[-1] == "terminated", err
    assert (
        f"the wait for the outcome of decision {sent['decision_id']} stopped; the decision "
        "was sent, and the resume consumer decides it"
    ) in err, err
    assert client(server).llen("interlock.decisions") == 1, "the decision waits, queued"
    assert cli_queues(server) == []


def test_sigterm_part_way_through_a_batch_says_how_far_it_got_and_deletes_the_queue(
    server: RedisServer, tmp_path: Path
) -> None:
    proc, lines, read = start_batch(server, tmp_path, "--wait")
    proc.send_signal(signal.SIGTERM)
    out, err = finish(proc)
    assert proc.returncode == 143, err
    *_, count, last = err.splitlines()
    assert last == "terminated", err
    sent = int(count.split(" of ")[0])
    assert count == (
        f"{sent} of 3000 turns sent, through line {lines[sent - 1]}; the rest, from line "
        f"{lines[sent]}, were not sent"
    ), err
    # SIGTERM waits while a turn goes out: a turn the broker took is counted and printed
    # (it used to be left out of both, so that "from line N" sent it twice).
    assert len(queued(server)) == sent
    assert len(json_lines(b"".join(read).decode() + out)) == sent
    assert cli_queues(server) == []


HOLD = """
import os, sys, time


class Hold:
    # Holds the start-up where it loads the command line, once it has said so (a
    # file), until a signal ends the wait.
    def find_spec(self, name, path=None, target=None):
        if name == "workers.cli":
            sys.meta_path.remove(self)
            open(os.environ["HOLD_FILE"], "w").close()
            time.sleep(60)
        return None


sys.meta_path.insert(0, Hold())
"""
"""A `sitecustomize` that holds `interlock` as it starts loading the command line."""


def catches(pid: int, signum: int) -> bool:
    """Whether process `pid` has a handler of its own for `signum` (Linux's SigCgt)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False


@pytest.mark.parametrize("held", [True, False], ids=["while-loading", "first-moment"])
@pytest.mark.parametrize(
    ("sig", "code", "said"),
    [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")],
    ids=["ctrl-c", "sigterm"],
)
def test_a_signal_as_a_batch_starts_ends_it_as_a_later_one_does(
    server: RedisServer, tmp_path: Path, sig: int, code: int, said: str, held: bool
) -> None:
    """Ctrl-C or SIGTERM while `submit --file` is still loading the command line (its
    first few tenths of a second) ends it as a later one does: one line, `interrupted`
    (130) or `terminated` (143), nothing sent. Ctrl-C used to print a KeyboardInterrupt
    traceback there, and SIGTERM to end it on the spot with no line. Held: the start-up
    waits where it loads the command line (a `sitecustomize` of the test's) and the
    signal comes then; else it comes the moment the process handles SIGTERM, wherever
    the start-up has got to."""
    if not Path(f"/proc/{os.getpid()}/status").exists():
        pytest.skip("reads which signals a process handles from /proc (Linux)")
    path = tmp_path / "turns.txt"
    path.write_text("turn 0\nturn 1\n")
    env = child_env()
    if held:
        hook = tmp_path / "hook"
        hook.mkdir()
        (hook / "sitecustomize.py").write_text(HOLD)
        env.update(PYTHONPATH=str(hook), HOLD_FILE=str(tmp_path / "held"))
    proc = spawn(
        "submit", *flags(server, tmp_path), "--agent", AGENT, "--file", str(path), env=env
    )  # fmt: skip
    try:
        if held:
            eventually((tmp_path / "held").exists, "start-up held")
        else:
            eventually(lambda: catches(proc.pid, signal.SIGTERM), "SIGTERM handled", every=0.002)
        proc.send_signal(sig)
    finally:
        out, err = finish(proc)
    assert proc.returncode == code, err
    assert "Traceback" not in err and "Aborted" not in err, err
    assert err.splitlines()[-1] == said, err
    assert out == "", "nothing was sent"
    assert queued(server) == []


def test_a_queue_left_by_a_broker_gone_away_is_said_and_goes_as_the_docs_say(
    server: RedisServer, tmp_path: Path
) -> None:
    """The broker goes away while the command waits: its queue cannot be deleted, and
    the command says so. Once the broker is back, docs/operations.md's steps remove
    the binding and the key, and events no longer come to it."""
    proc = spawn("submit", *flags(server, tmp_path), "--agent", AGENT, "--text", "Hello", "--wait")
    assert proc.stdout is not None and proc.stderr is not None
    assert b'"turn_id"' in proc.stdout.readline()
    assert b"waiting for turn" in proc.stderr.readline()
    # The command is waiting on its queue once its reading list is in the registry.
    eventually(lambda: client(server).zcard("_interlock.readers"), "reader registered")
    server.stop()
    _, err = finish(proc)
    assert proc.returncode == 1, err
    note, last = err.splitlines()[-2:]
    assert last.startswith("error: UNAVAILABLE: cannot reach the broker"), err
    assert note.startswith("the queue interlock.cli."), err
    name = note.split()[2]
    assert " was not deleted (cannot reach the broker: " in note, err

    server.start()
    r = client(server)
    member = b"#" + SEP + b"^.*?$" + SEP + name.encode()  # SMEMBERS shows it so
    assert member in r.smembers(BINDINGS)
    assert r.srem(BINDINGS, member) == 1 and r.srem(PERMANENT, member) == 1
    r.delete(name)
    with connection(server) as conn:
        event = TurnCompleted(session_id="s", turn_id="t", finish_reason=FinishReason.STOP)
        Publisher(conn).publish_event(event)
    assert cli_queues(server) == [], "the event went nowhere: no list came back"
    # What remains is its reading list's entry in the readers' registry, which the
    # next Interlock worker or consumer that waits on this Redis clears.
    left = list(r.zrange("_interlock.readers", 0, -1))
    assert [item[32:] for item in left] == [name.encode()], left


# ------------------------------------------------------------------ pending --limit


def test_pending_says_which_deadlines_have_passed(tmp_path: Path) -> None:
    """A pause past its deadline is still listed until the resume consumer's sweep marks
    it expired, but an answer to it is refused: `expired` says so."""
    from examples.banking import bankingAgent

    url = f"sqlite:///{tmp_path}/deadlines.db"
    store = SqlSessionStore(url)
    try:
        lapsing = replace(bankingAgent, store=store, interrupt_expires_in=0.05)
        lapsed = lapsing.run_text("Transfer $4 to late").session_id
        waiting = replace(bankingAgent, store=store).run_text("Transfer $5 to open").session_id
    finally:
        store.dispose()
    time.sleep(0.1)
    listed = run_cli("pending", "--store", url)
    assert listed.returncode == 0, listed.describe()
    rows = {x["session_id"]: x for x in listed.json_lines()}
    assert rows[lapsed]["expired"] is True and rows[lapsed]["expires_at"] is not None
    assert (rows[waiting]["expired"], rows[waiting]["expires_at"]) == (False, None)


def test_pending_says_when_its_limit_cut_the_list(tmp_path: Path) -> None:
    from examples.banking import bankingAgent

    url = f"sqlite:///{tmp_path}/pending.db"
    store = SqlSessionStore(url)
    try:
        agent = replace(bankingAgent, store=store)
        sessions = [str(agent.run_text(f"Transfer ${n} to savings").session_id) for n in (1, 2, 3)]
    finally:
        store.dispose()
    cut = run_cli("pending", "--store", url, "--limit", "2")
    assert cut.returncode == 0, cut.describe()
    assert [x["session_id"] for x in cut.json_lines()] == sessions[:0:-1], "the newest two"
    assert cut.stderr == (
        "showing the newest 2; more are pending: pass a larger --limit to see them\n"
    )
    for args in (["--limit", "3"], ["--session", sessions[0], "--limit", "1"]):
        whole = run_cli("pending", "--store", url, *args)
        assert whole.returncode == 0, whole.describe()
        assert len(whole.json_lines()) == int(args[-1])
        assert whole.stderr == "", whole.describe()


@pytest.mark.parametrize(
    ("lines", "said"), [(1, "the turn was not sent"), (2, "none of the 2 turns was sent")]
)
def test_a_batch_that_sent_nothing_says_so(tmp_path: Path, lines: int, said: str) -> None:
    """No broker: the error says that nothing went out, in words that fit the count."""
    path = tmp_path / "turns.txt"
    path.write_text("".join(f"turn {n}\n" for n in range(lines)))
    result = run_cli(
        "submit", "--app", APP, "--broker", "redis://127.0.0.1:1/0", "--agent", AGENT,
        "--file", str(path),
    )  # fmt: skip
    assert result.returncode == 1, result.describe()
    last = result.stderr.splitlines()[-1]
    assert last.startswith("error: UNAVAILABLE: cannot reach the broker: "), last
    assert last.endswith(f"({said})"), last
    assert result.stdout == "", "no turn printed: none was sent"


def test_a_batch_wait_that_times_out_names_the_first_turns_it_waited_for(
    server: RedisServer, tmp_path: Path
) -> None:
    """No worker: nothing ends. The timeout names five of the seven turns, counts the
    rest, and (no turn id came from the file) says nothing of turns that ended before."""
    path = tmp_path / "turns.txt"
    path.write_text("".join(f"turn {n}\n" for n in range(7)))
    result = run_cli(
        "submit", *flags(server, tmp_path), "--agent", AGENT, "--file", str(path),
        "--wait", "--timeout", "1",
    )  # fmt: skip
    assert result.returncode == 1, result.describe()
    sent = [line["turn_id"] for line in result.json_lines()]
    assert len(sent) == 7
    last = result.stderr.splitlines()[-1]
    assert last == (
        "error: DEADLINE_EXCEEDED: 0 of 7 turns ended; no end of the other 7 within 1s "
        f"(turn ids {', '.join(sent[:5])} and 2 more): is `interlock worker` running on "
        "this broker and store? What was sent stays queued, and runs once one is"
    ), result.describe()
