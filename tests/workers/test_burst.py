"""Burst mode, as a batch job or a test runs it: `interlock worker --burst` runs the turns
queued and exits; `interlock resume-consumer --burst` handles the decisions queued and
exits, saying how many. Real redis-server, real `celery worker` processes, a SQLite
store."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from kombu.connection import Connection
from kombu.messaging import Producer

from events.publisher import declare
from events.topology import event_queue
from interlock import FinishReason, SqlSessionStore
from interlock.journal import session_for_turn
from tests.queue_helpers import Service, child_env, decision, interlock_bin, run_cli
from tests.services import free_port, start_redis
from workers.burst import BURST_CONNECT_RETRIES

APP = "examples.banking:ai"


class Batch:
    """A private broker and store, and a queue of the test's own bound to every turn
    event before anything runs."""

    def __init__(self, directory: Path) -> None:
        self.server = start_redis(directory / "redis")
        self.store_url = f"sqlite:///{directory / 'store.db'}"
        self.flags = ["--app", APP, "--broker", self.server.url, "--store", self.store_url]
        self.conn = Connection(self.server.url)
        declare(self.conn)
        self.events = self.conn.SimpleQueue(event_queue(f"test.burst.{uuid.uuid4()}", "turn.#"))

    def read_events(self, count: int, timeout: float = 30.0) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout
        while len(found) < count and time.monotonic() < deadline:
            try:
                message = self.events.get(timeout=1)
            except self.events.Empty:
                continue
            message.ack()
            found.append(json.loads(message.body))
        return found

    def waiting(self) -> int:
        with self.conn.channel() as channel:
            return int(channel.client.llen("interlock.turns"))

    def close(self) -> None:
        self.events.close()
        self.conn.release()
        self.server.stop()


@pytest.fixture
def batch(tmp_path: Path) -> Iterator[Batch]:
    made = Batch(tmp_path)
    try:
        yield made
    finally:
        made.close()


def test_burst_worker_and_consumer_serve_what_is_queued_then_exit(batch: Batch) -> None:
    for amount in (5, 6):
        sent = run_cli(
            "submit",
            *batch.flags,
            "--agent",
            "bankingAgent",
            "--text",
            f"Transfer ${amount} to savings",
        )
        assert sent.returncode == 0, sent.describe()
    assert batch.waiting() == 2, "queued before any worker runs"

    first = run_cli("worker", "--burst", "--pool", "solo", *batch.flags, timeout=120)
    assert first.returncode == 0, first.describe()
    assert first.json_lines()[-1] == {"worker": "drained", "handled": 2}, first.describe()
    assert batch.waiting() == 0
    paused = batch.read_events(2)
    assert [e["type"] for e in paused] == ["turn.interrupted"] * 2, paused
    store = SqlSessionStore(batch.store_url)
    try:
        waiting = store.list_snapshots(finish_reason=FinishReason.INTERRUPTED, claimed=False)
        assert len(waiting) == 2

        producer = Producer(batch.conn)
        for event in paused:
            restart = [
                {"name": i["name"], "ref": i["ref"], "resumed": {"approved": True}}
                for i in event["interrupts"]
            ]
            body = decision(event["snapshot_id"], event["resume_token"], restart=restart)
            producer.publish(
                json.dumps(body),
                exchange="",
                routing_key="interlock.decisions",
                content_type="application/json",
            )
        consumer = run_cli("resume-consumer", "--burst", *batch.flags, timeout=120)
        assert consumer.returncode == 0, consumer.describe()
        assert consumer.json_lines()[-1] == {"resume_consumer": "drained", "handled": 2}
        assert batch.waiting() == 2, "the two resumes, for a worker to run"

        second = run_cli(
            "worker", "--burst", "--pool", "prefork", "-c", "1", *batch.flags, timeout=120
        )
        assert second.returncode == 0, second.describe()
        assert [line["worker"] for line in second.json_lines()] == ["starting", "drained"]
        assert second.json_lines()[-1]["handled"] == 2, "counted in the prefork parent"
        assert batch.waiting() == 0
        done = batch.read_events(2)
        assert [e["type"] for e in done] == ["turn.completed"] * 2, done
        assert {e["session_id"] for e in done} == {e["session_id"] for e in paused}
    finally:
        store.dispose()


@pytest.mark.parametrize("events_on", [True, False], ids=["-E", "default"])
def test_task_events_go_out_only_with_dash_e(batch: Batch, events_on: bool) -> None:
    """`interlock worker -E` sends Celery's task events, as `celery worker -E` does, and
    a monitor reads them as Flower does (Celery's event receiver; on Redis they go out
    on a pub/sub channel, read only while the monitor listens); without it, none."""
    import threading

    from workers.app import create_app
    from workers.settings import Settings

    sent = run_cli("submit", *batch.flags, "--agent", "bankingAgent", "--text", "Transfer $7 to x")
    assert sent.returncode == 0, sent.describe()
    [turn] = sent.json_lines()
    monitor = create_app(Settings(broker_url=batch.server.url))
    seen: list[dict[str, Any]] = []
    listening = threading.Event()
    with monitor.connection_for_read() as conn:
        receiver = monitor.events.Receiver(conn, handlers={"*": seen.append})
        subscribed = receiver.on_consume_ready

        def ready(*args: Any, **kwargs: Any) -> None:
            subscribed(*args, **kwargs)
            listening.set()

        receiver.on_consume_ready = ready
        thread = threading.Thread(target=receiver.capture, kwargs={"wakeup": False}, daemon=True)
        thread.start()
        assert listening.wait(10)
        time.sleep(0.5)  # its first poll subscribes; the worker takes seconds to start
        flags = ["-E"] if events_on else []
        ran = run_cli("worker", "--burst", "--pool", "solo", *flags, *batch.flags, timeout=120)
        receiver.should_stop = True
        thread.join(10)
    assert ran.returncode == 0, ran.describe()
    assert ran.json_lines()[0]["task_events"] is events_on
    assert [e["type"] for e in batch.read_events(1)] == ["turn.interrupted"]
    kinds = [e["type"] for e in seen if e["type"].startswith("task-")]
    if not events_on:
        assert kinds == [], "no task event without -E"
        assert any(e["type"].startswith("worker-") for e in seen), "the monitor listened"
        return
    assert {"task-received", "task-started", "task-succeeded"} <= set(kinds), kinds
    [received] = [e for e in seen if e["type"] == "task-received"]
    assert received["name"] == "interlock.run_turn"
    assert turn["turn_id"] in received["args"], "the turn's summary, as the log shows it"


# ------------------------------------------------------------ no broker


@pytest.mark.parametrize(
    ("command", "logger"),
    [("worker", "interlock.worker"), ("resume-consumer", "interlock.consumer")],
)
def test_a_burst_process_with_no_broker_exits_unavailable(
    tmp_path: Path, command: str, logger: str
) -> None:
    """A batch job whose broker is not there: a line per attempt, then exit 1 with a
    one-line reason, instead of waiting for ever; the worker before it starts (no
    "starting" line: its Celery would print a screenful of traceback)."""
    broker = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    store = f"sqlite:///{tmp_path / 'store.db'}"
    flags = ["--app", APP, "--broker", broker, "--store", store]
    extra = ["--idle", "1", "--pool", "solo"] if command == "worker" else []
    result = run_cli(command, "--burst", *extra, *flags)
    assert result.returncode == 1, result.describe()
    assert result.stderr.splitlines()[-1].startswith(
        "error: UNAVAILABLE: cannot reach the broker"
    ), result.describe()
    retries = [line for line in result.stderr.splitlines() if "); trying again in" in line]
    assert len(retries) == BURST_CONNECT_RETRIES, result.describe()
    for line in retries:  # stamped as log lines are
        stamp = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} "
        assert re.match(stamp + re.escape(logger) + r" WARNING cannot reach the broker \(", line), (
            line
        )
    assert "Traceback" not in result.stderr + result.stdout, result.describe()
    lines = [line.get("resume_consumer") for line in result.json_lines()]
    assert lines == (["starting"] if command == "resume-consumer" else []), result.describe()


@pytest.mark.parametrize(
    ("command", "logger"),
    [("worker", "interlock.worker"), ("resume-consumer", "interlock.consumer")],
)
def test_the_starting_line_names_the_agents_and_an_app_with_none_is_warned_of(
    tmp_path: Path, command: str, logger: str
) -> None:
    """An --app that defines no agent (the wrong object, a module that defines them
    elsewhere) would start and refuse every turn or decision NOT_FOUND: the "starting"
    line lists the agents, and an empty list is said on stderr at once."""
    (tmp_path / "bare_app.py").write_text("from interlock import Interlock\nai = Interlock()\n")
    store = f"sqlite:///{tmp_path / 'store.db'}"
    extra = ["--idle", "1", "--pool", "solo"] if command == "worker" else ["--idle", "1"]
    with start_redis(tmp_path / "redis") as server:
        for app, agents in (("bare_app", []), (APP, ["bankingAgent", "guardedBankingAgent"])):
            result = run_cli(
                command, "--burst", *extra, "--app", app, "--broker", server.url,
                "--store", store, cwd=tmp_path,
            )  # fmt: skip
            assert result.returncode == 0, result.describe()
            starting = result.json_lines()[0]
            assert starting["agents"] == agents, result.describe()
            warned = (
                f"{logger} WARNING the app {app} defines no agent: every turn and "
                "decision will be refused (NOT_FOUND); check --app or INTERLOCK_APP"
            )
            assert (warned in result.stderr) == (not agents), result.describe()


@pytest.mark.parametrize(
    ("command", "ready", "logger"),
    [
        ("worker", " ready.", "interlock.worker"),
        ("resume-consumer", "consuming interlock.decisions", "interlock.consumer"),
    ],
)
def test_a_broker_out_of_memory_at_start_ends_a_burst_and_is_waited_out_when_served(
    batch: Batch, tmp_path: Path, command: str, ready: str, logger: str
) -> None:
    """Redis at its `maxmemory` refuses Interlock's declarations (commands that may add
    data). A batch job (--burst) ends at once in one line, UNAVAILABLE, where a
    traceback used to end it; a served process says so in one log line, starts, and
    serves once Redis has room."""
    client = redis.Redis(host="127.0.0.1", port=batch.server.port)
    extra = ["--pool", "solo"] if command == "worker" else []
    served = None
    try:
        client.config_set("maxmemory", 1)
        result = run_cli(command, "--burst", "--idle", "1", *extra, *batch.flags)
        assert result.returncode == 1, result.describe()
        last = result.stderr.splitlines()[-1]
        assert last.startswith(
            "error: UNAVAILABLE: the broker refuses Interlock's declarations: "
        ), result.describe()
        assert "maxmemory" in last, last
        assert "Traceback" not in result.stderr + result.stdout, result.describe()
        assert result.stdout == "", "it never started"

        served = Service(command, [command, *extra, *batch.flags], tmp_path / f"{command}.log")
        served.wait_for("the broker refuses Interlock's declarations")
        said = next(
            line
            for line in served.output().splitlines()
            if "the broker refuses Interlock's declarations" in line
        )
        assert f" {logger} WARNING the broker refuses" in said, said
        assert served.alive, served.tail()
        client.config_set("maxmemory", 0)
        served.wait_for(ready)
    finally:
        client.config_set("maxmemory", 0)
        client.close()
        if served is not None:
            served.stop()


@pytest.mark.parametrize(
    ("burst", "sig"),
    [(False, signal.SIGTERM), (True, signal.SIGTERM), (False, signal.SIGINT)],
    ids=["served", "burst", "served-ctrl-c"],
)
def test_sigterm_stops_a_consumer_waiting_for_the_broker(
    tmp_path: Path, burst: bool, sig: signal.Signals
) -> None:
    """kombu's connection retries never look at the stop flag: SIGTERM (`docker stop`,
    systemd) used to leave the consumer waiting for the broker until it was killed. A
    first Ctrl-C stops it the same way (exit 0, as the worker's warm shutdown)."""
    broker = f"redis://127.0.0.1:{free_port()}/0"
    store = f"sqlite:///{tmp_path / 'store.db'}"
    args = ["resume-consumer", "--app", APP, "--broker", broker, "--store", store]
    consumer = Service("resume-consumer", args + (["--burst"] if burst else []), tmp_path / "log")
    try:
        consumer.wait_for("trying again in")  # kombu's retries have begun
        how = consumer.stop(timeout=20, sig=sig)
    finally:
        consumer.kill()
    assert how == "exit 0", consumer.tail()
    assert "stopped while waiting for the broker" in consumer.output() or burst, consumer.tail()


# ------------------------------------------------------------ a store it cannot use


NOT_A_DATABASE = b"this is no SQLite database\n" * 200


@pytest.mark.parametrize("command", ["worker", "resume-consumer"])
def test_a_burst_process_whose_store_is_no_database_exits_unavailable_keeping_its_work(
    batch: Batch, tmp_path: Path, command: str
) -> None:
    """A store URL pointing at a file that is no database: the worker used to take the
    turn, fail it inside Celery (logged, exit 0) and drop it; the consumer to requeue
    its decision every second for ever. Both now say why in one line, exit 1, and leave
    the turn or the decision queued for a run with the right store."""
    wrong = tmp_path / "wrong.db"
    wrong.write_bytes(NOT_A_DATABASE)
    flags = ["--app", APP, "--broker", batch.server.url, "--store", f"sqlite:///{wrong}"]
    if command == "worker":
        sent = run_cli("submit", *batch.flags, "--agent", "bankingAgent", "--text", "Hi")
        assert sent.returncode == 0, sent.describe()
        extra = ["--pool", "solo"]
    else:
        Producer(batch.conn).publish(
            json.dumps(decision("snap-1", "token", respond=[])),
            exchange="",
            routing_key="interlock.decisions",
            content_type="application/json",
        )
        extra = []
    result = run_cli(command, "--burst", *flags, *extra, timeout=60)
    assert result.returncode == 1, result.describe()
    assert result.stderr.splitlines()[-1] == (
        f"error: UNAVAILABLE: cannot use the store: file is not a database (sqlite:///{wrong})"
    ), result.describe()
    assert "Traceback" not in result.stderr + result.stdout, result.describe()
    with batch.conn.channel() as channel:
        kept = "interlock.turns" if command == "worker" else "interlock.decisions"
        assert int(channel.client.llen(kept)) == 1, f"{kept} keeps its message"
    assert wrong.read_bytes() == NOT_A_DATABASE, "the file is left as it was"


def test_a_worker_retries_a_turn_until_its_store_can_be_used(batch: Batch, tmp_path: Path) -> None:
    """A served worker whose store is unusable (not only unreachable) does not drop the
    turn: its task is retried, backing off, and runs once the store is right."""
    store = tmp_path / "later.db"
    store.write_bytes(NOT_A_DATABASE)
    flags = ["--app", APP, "--broker", batch.server.url, "--store", f"sqlite:///{store}"]
    worker = Service("worker", ["worker", "--pool", "solo", *flags], tmp_path / "worker.log")
    try:
        worker.wait_for("ready")
        sent = run_cli(
            "submit", *batch.flags, "--agent", "bankingAgent", "--text", "Transfer $3 to savings"
        )
        assert sent.returncode == 0, sent.describe()
        worker.wait_for("file is not a database")
        worker.wait_for("Retry in")  # Celery's line for a retried task
        assert batch.read_events(1, timeout=2) == [], "nothing ran, nothing was answered"
        store.unlink()  # the operator mends it: the next try makes a new store there
        [event] = batch.read_events(1, timeout=60)
        assert event["type"] == "turn.interrupted", event
        assert event["turn_id"] == sent.json_lines()[0]["turn_id"]
    finally:
        assert worker.stop(timeout=30) == "exit 0", worker.tail()


def test_a_burst_worker_whose_store_fails_while_it_serves_requeues_the_turn_and_exits_1(
    batch: Batch, tmp_path: Path
) -> None:
    """The store goes away after the burst worker checked it: a batch job should not
    wait a quarter of an hour, as a served worker does, nor exit 0. After its few tries
    (prefork: the give-up crosses the pool's pipe) the turn is back on its queue, no
    dead letter, no event; the worker says why and exits 1. A later run serves it."""
    from events.topology import TURNS_DEAD

    folder = tmp_path / "store"
    folder.mkdir()
    store_url = f"sqlite:///{folder / 'store.db'}"
    flags = ["--app", APP, "--broker", batch.server.url, "--store", store_url]
    worker = Service(
        "worker", ["worker", "--burst", "--idle", "60", "-c", "1", *flags], tmp_path / "w.log"
    )
    try:
        worker.wait_for("ready")  # the store was checked (and made) before Celery started
        for made in sorted(folder.iterdir()):
            made.unlink()
        folder.rmdir()  # and now it is gone: the pool's first open fails, every try
        sent = run_cli("submit", *flags, "--agent", "bankingAgent", "--text", "Transfer $4 to x")
        assert sent.returncode == 0, sent.describe()
        [turn] = sent.json_lines()
        assert worker.proc.wait(timeout=90) == 1, worker.tail()
    finally:
        worker.stop()
    lines = worker.output().splitlines()
    said = [line for line in lines if line.startswith("error: UNAVAILABLE:")]
    assert "(retry 3 of 3)" in worker.output(), worker.tail()
    assert f"turn {turn['turn_id']} (task " in worker.output(), "retries name the turn"
    assert said == [
        f"error: UNAVAILABLE: the store or broker failed {BURST_CONNECT_RETRIES + 1} times in "
        "a row: OperationalError: unable to open database file "
        f"(turn {turn['turn_id']} requeued, and still queued on interlock.turns); "
        "the worker stops"
    ], worker.tail()
    assert batch.waiting() == 1, "the turn is back on interlock.turns"
    with batch.conn.channel() as channel:
        assert int(channel.client.llen(TURNS_DEAD.name)) == 0, "no dead letter"
    assert batch.read_events(1, timeout=1) == [], "nothing ran, nothing was answered"
    folder.mkdir()  # the store is back: the next run serves the turn
    again = run_cli("worker", "--burst", "--pool", "solo", *flags, timeout=90)
    assert again.returncode == 0, again.describe()
    [event] = batch.read_events(1)
    assert (event["type"], event["turn_id"]) == ("turn.interrupted", turn["turn_id"])
    assert batch.waiting() == 0


# ------------------------------------------------------------ the worker's own output


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_served_worker_stops_gracefully_on_ctrl_c_with_json_alone_on_stdout(
    batch: Batch, tmp_path: Path, sig: signal.Signals
) -> None:
    """A first Ctrl-C is a warm shutdown that exits 0, as SIGTERM's and the resume
    consumer's (Celery's own exits 1); Celery's banner and shutdown lines go to stderr,
    so that stdout holds the worker's JSON lines alone, as every command's holds JSON:
    "starting", and "stopped" with the count of turns it took."""
    err = tmp_path / "worker.err"
    with open(tmp_path / "worker.out", "wb") as out, open(err, "wb") as errors:
        proc = subprocess.Popen(
            [interlock_bin(), "worker", "--pool", "solo", *batch.flags],
            env=child_env(),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=errors,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 60
        while "ready." not in err.read_text(errors="replace"):
            assert proc.poll() is None and time.monotonic() < deadline, err.read_text()
            time.sleep(0.05)
        proc.send_signal(sig)
        assert proc.wait(timeout=30) == 0, err.read_text()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    first, last = (tmp_path / "worker.out").read_text().splitlines()
    said = json.loads(first)
    assert (said["worker"], said["pool"], said["concurrency"]) == ("starting", "solo", 1)
    assert json.loads(last) == {"worker": "stopped", "handled": 0}
    logged = err.read_text()
    assert "celery@" in logged or "[config]" in logged, "the banner went to stderr"
    assert "Warm shutdown" in logged


# ------------------------------------------------------------ many turns from a file


def write_lines(path: Path, *lines: str) -> str:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def test_submit_file_sends_every_line_then_a_burst_worker_runs_them(
    batch: Batch, tmp_path: Path
) -> None:
    """A batch job's two commands: every line of the file becomes a turn (blank lines
    skipped; a JSON line may name its session), then `worker --burst` runs them."""
    turns = write_lines(
        tmp_path / "turns.txt",
        "Transfer $5 to savings",
        "",
        '{"text": "Transfer $6 to checking", "session_id": "batch-session-6"}',
        "Hello",
    )
    sent = run_cli("submit", *batch.flags, "--agent", "bankingAgent", "--file", turns)
    assert sent.returncode == 0, sent.describe()
    printed = sent.json_lines()
    assert [p["line"] for p in printed] == [1, 3, 4], sent.describe()
    assert printed[1]["session_id"] == "batch-session-6"
    assert len({p["session_id"] for p in printed}) == 3
    assert "submitted 3 of 3 turns" in sent.stderr, sent.describe()
    assert batch.waiting() == 3, "queued before any worker runs"

    ran = run_cli("worker", "--burst", "--pool", "solo", *batch.flags, timeout=120)
    assert ran.returncode == 0, ran.describe()
    ended = {e["turn_id"]: e for e in batch.read_events(3)}
    assert set(ended) == {p["turn_id"] for p in printed}
    kinds = [ended[p["turn_id"]]["type"] for p in printed]
    assert kinds == ["turn.interrupted", "turn.interrupted", "turn.completed"], ended
    assert ended[printed[1]["turn_id"]]["session_id"] == "batch-session-6"


def test_submit_file_wait_prints_how_each_turn_ended(batch: Batch, tmp_path: Path) -> None:
    """With --wait, the event that ends each turn, as they come; a failed one makes the
    command exit 1 once every turn has ended, saying how many failed."""
    worker = Service("worker", ["worker", *batch.flags, "--pool", "solo"], tmp_path / "worker.log")
    try:
        worker.wait_for(" ready.")
        first = write_lines(tmp_path / "first.txt", "Transfer $7 to savings", "Hello")
        waited = run_cli(
            "submit", *batch.flags, "--agent", "bankingAgent", "--file", first, "--wait"
        )
        assert waited.returncode == 0, waited.describe()
        lines = waited.json_lines()
        sent, ended = lines[:2], lines[2:]
        assert {e["turn_id"] for e in ended} == {s["turn_id"] for s in sent}, waited.describe()
        kinds = {e["turn_id"]: e["type"] for e in ended}
        assert [kinds[s["turn_id"]] for s in sent] == ["turn.interrupted", "turn.completed"]
        assert "2 of 2 turns ended" in waited.stderr, waited.describe()
        assert (
            f"1 paused: list those still open with `interlock pending --store {batch.store_url}`"
        ) in waited.stderr, waited.describe()

        # A new message to the paused session fails (FAILED_PRECONDITION): exit 1.
        paused = sent[0]["session_id"]
        second = write_lines(
            tmp_path / "second.txt", json.dumps({"text": "Hello", "session_id": paused}), "Hello"
        )
        failing = run_cli(
            "submit", *batch.flags, "--agent", "bankingAgent", "--file", second, "--wait"
        )
        assert failing.returncode == 1, failing.describe()
        types = sorted(e["type"] for e in failing.json_lines() if "type" in e)
        assert types == ["turn.completed", "turn.failed"], failing.describe()
        assert "error: FAILED_PRECONDITION: 1 of 2 turns failed; the first: " in failing.stderr
    finally:
        worker.stop()


def test_a_file_sent_again_with_wait_says_at_once_which_turns_had_ended(
    batch: Batch, tmp_path: Path
) -> None:
    """A file with turn ids, sent again after its turns ended: each runs once, so no
    event comes for them. The store says how each ended, before the wait: they are
    counted at once, a refused one counts as failed, and only the new line's turn is
    waited for."""
    worker = Service("worker", ["worker", *batch.flags, "--pool", "solo"], tmp_path / "worker.log")
    try:
        worker.wait_for(" ready.")
        lines = [
            json.dumps({"text": "Hello", "turn_id": "again-hello-1"}),
            json.dumps({"text": "Transfer $4 to savings", "turn_id": "again-transfer-2"}),
        ]
        args = ("submit", *batch.flags, "--agent", "bankingAgent", "--wait")
        first = run_cli(*args, "--file", write_lines(tmp_path / "first.txt", *lines))
        assert first.returncode == 0, first.describe()
        paused = next(e for e in first.json_lines() if e.get("type") == "turn.interrupted")
        # A message to the paused session: refused before it runs (no snapshot).
        lines.append(
            json.dumps({"text": "Hi", "session_id": paused["session_id"], "turn_id": "again-3"})
        )
        second = run_cli(*args, "--file", write_lines(tmp_path / "second.txt", *lines))
        assert second.returncode == 1, second.describe()
        assert "turn again-hello-1 had ended before: completed (snapshot " in second.stderr
        sid = paused["snapshot_id"]
        assert (
            f"turn again-transfer-2 had ended before: paused (snapshot {sid}): `interlock "
            f"pending --store {batch.store_url}` lists it while it waits; `interlock resend "
            f"{sid} --broker {batch.server.url} --store {batch.store_url}` announces it "
            "again with a new resume_token"
        ) in second.stderr, second.describe()
        assert (
            "2 of 3 turns had ended before they were sent again (1 completed, 1 paused): "
            "each runs once"
        ) in second.stderr, second.describe()
        assert "waiting for 1 turns to end" in second.stderr, second.describe()
        events = [e for e in second.json_lines() if "type" in e]
        assert [(e["type"], e["turn_id"]) for e in events] == [("turn.failed", "again-3")]

        lines.append(json.dumps({"text": "Hello", "turn_id": "again-4"}))
        third = run_cli(
            *args, "--timeout", "60", "--file", write_lines(tmp_path / "third.txt", *lines)
        )
        assert third.returncode == 1, third.describe()
        assert "turn again-3 had ended before: refused, FAILED_PRECONDITION: " in third.stderr
        assert "3 of 4 turns had ended before" in third.stderr, third.describe()
        events = [e for e in third.json_lines() if "type" in e]
        assert [(e["type"], e["turn_id"]) for e in events] == [("turn.completed", "again-4")]
        assert "4 of 4 turns ended" in third.stderr, third.describe()
        assert "waiting for 1 turns to end" in third.stderr, third.describe()
        last = third.stderr.splitlines()[-1]
        assert last.startswith("error: FAILED_PRECONDITION: 1 of 4 turns failed; the first: "), (
            third.describe()
        )
        assert "answer the pending interrupts first" in last, third.describe()
        fourth = run_cli(*args, "--file", str(tmp_path / "second.txt"))
        assert fourth.returncode == 1, fourth.describe()
        assert "3 of 3 turns had ended before" in fourth.stderr, fourth.describe()
        assert "waiting for" not in fourth.stderr, "nothing left to wait for"
        assert "error: FAILED_PRECONDITION: 1 of 3 turns failed" in fourth.stderr
        worker.wait_for(f"again-transfer-2 already ended (paused, snapshot {sid})")
        worker.wait_for("again-3 already ended (refused)")
        # The pause answered since (claimed by a decision): no resend is offered for it.
        store = SqlSessionStore(batch.store_url)
        try:
            assert store.claim(sid, "decision-7")
        finally:
            store.dispose()
        fifth = run_cli(*args, "--file", str(tmp_path / "second.txt"))
        assert (
            f"turn again-transfer-2 had ended before: paused, and answered since by decision "
            f"decision-7 (snapshot {sid})\n"
        ) in fifth.stderr, fifth.describe()
        assert "resend" not in fifth.stderr, fifth.describe()
        assert (
            "3 of 3 turns had ended before they were sent again (1 completed, 1 paused and "
            "answered, 1 refused)"
        ) in fifth.stderr, fifth.describe()
        assert len(batch.read_events(9, timeout=5)) == 4, "each turn announced once"
    finally:
        worker.stop()


def test_one_turn_sent_again_with_its_turn_id_runs_once(batch: Batch, tmp_path: Path) -> None:
    """`submit --text ... --turn-id T`: sent twice, the turn runs once, in a session
    named after its id; with --wait, the second send says at once how the turn had
    ended (no event comes for it), and one that failed exits 1 as it did. A reserved
    or empty id is refused before anything is sent."""
    worker = Service("worker", ["worker", *batch.flags, "--pool", "solo"], tmp_path / "worker.log")
    try:
        worker.wait_for(" ready.")
        args = ("submit", *batch.flags, "--agent", "bankingAgent")
        first = run_cli(*args, "--text", "Hello", "--turn-id", "once-1", "--wait")
        assert first.returncode == 0, first.describe()
        sent, ended = first.json_lines()
        assert sent == {"turn_id": "once-1", "session_id": session_for_turn("once-1")}
        assert (ended["type"], ended["turn_id"]) == ("turn.completed", "once-1")
        again = run_cli(*args, "--text", "Hello", "--turn-id", "once-1", "--wait")
        assert again.returncode == 0, again.describe()
        assert again.json_lines() == [sent], again.describe()
        assert (
            f"turn once-1 had ended before: completed (snapshot {ended['snapshot_id']})"
        ) in again.stderr, again.describe()
        assert "1 of 1 turns had ended before they were sent again (1 completed)" in again.stderr
        worker.wait_for("once-1 already ended (completed")

        # A message to a paused session is refused before it runs: sent again, it fails
        # again from the store's record, without running.
        paused = run_cli(*args, "--text", "Transfer $4 to savings", "--wait")
        pause = paused.json_lines()[-1]
        assert pause["type"] == "turn.interrupted", paused.describe()
        refused = (*args, "--text", "Hi", "--session", pause["session_id"], "--turn-id", "once-2")
        failed = run_cli(*refused, "--wait")
        assert failed.returncode == 1, failed.describe()
        failed_again = run_cli(*refused, "--wait")
        assert failed_again.returncode == 1, failed_again.describe()
        assert "turn once-2 had ended before: refused, FAILED_PRECONDITION: " in (
            failed_again.stderr
        ), failed_again.describe()
        assert failed_again.stderr.splitlines()[-1].startswith(
            "error: FAILED_PRECONDITION: turn failed: "
        ), failed_again.describe()
        assert len(batch.read_events(9, timeout=5)) == 3, "each turn announced once"

        for bad, said in (
            ("resume:x", "--turn-id: turn_id 'resume:x' is reserved"),
            (" ", "the turn id is empty"),
        ):
            refused_id = run_cli(*args, "--text", "Hello", "--turn-id", bad)
            assert refused_id.returncode in (1, 2), refused_id.describe()
            assert said in refused_id.stderr, refused_id.describe()
            assert refused_id.stdout == "", "nothing sent"
        with_file = run_cli(*args, "--file", "-", "--turn-id", "x", stdin="Hello\n")
        assert with_file.returncode == 2, with_file.describe()
        assert "--turn-id goes with --text" in with_file.stderr, with_file.describe()
    finally:
        worker.stop()


@pytest.mark.parametrize("store", ["missing", "unreachable"])
def test_a_file_sent_again_with_wait_and_no_store_to_read_names_the_unannounced(
    batch: Batch, tmp_path: Path, store: str
) -> None:
    """When the command cannot read the workers' store (another store given, not there
    yet; or one that cannot be reached: said), a turn that had ended before cannot be
    told from one still running: the wait ends at its timeout naming them and why."""
    worker = Service("worker", ["worker", *batch.flags, "--pool", "solo"], tmp_path / "worker.log")
    try:
        worker.wait_for(" ready.")
        turns = write_lines(
            tmp_path / "turns.txt",
            json.dumps({"text": "Hello", "turn_id": "batch-hello-1"}),
            json.dumps({"text": "Transfer $4 to savings", "turn_id": "batch-transfer-2"}),
        )
        args = ("submit", *batch.flags, "--agent", "bankingAgent", "--file", turns, "--wait")
        first = run_cli(*args)
        assert first.returncode == 0, first.describe()
        assert "2 of 2 turns ended" in first.stderr, first.describe()

        other = (
            f"sqlite:///{tmp_path / 'not-yet.db'}"
            if store == "missing"
            else f"postgresql+psycopg://nobody@127.0.0.1:{free_port()}/interlock"
        )
        again = run_cli(*args, "--store", other, "--timeout", "2")
        assert again.returncode == 1, again.describe()
        sent = again.json_lines()
        assert [s["turn_id"] for s in sent] == ["batch-hello-1", "batch-transfer-2"]
        assert all("type" not in s for s in sent), "no turn was announced again"
        why = (
            f"no store at {tmp_path / 'not-yet.db'}: check --store or INTERLOCK_STORE_URL"
            if store == "missing"
            else "could not read the store postgresql+psycopg://nobody@127.0.0.1:"
        )
        assert f"cannot tell which of the turns sent had ended before ({why}" in again.stderr
        assert "had ended before:" not in again.stderr, again.describe()
        last = again.stderr.splitlines()[-1]
        assert last == (
            "error: DEADLINE_EXCEEDED: 0 of 2 turns ended; no end of the other 2 within 2s "
            "(turn ids batch-hello-1, batch-transfer-2): is `interlock worker` running on "
            "this broker and store? What was sent stays queued, and runs once one is. A turn "
            "id that had ended before it was sent again runs "
            f"once and is not announced again: `interlock pending --store {other}` lists "
            "the paused turns"
        ), again.describe()
        worker.wait_for("batch-transfer-2 already ended")
        assert len(batch.read_events(4, timeout=5)) == 2, "the first run's two events only"
        assert not (tmp_path / "not-yet.db").exists(), "reading made no store"
    finally:
        worker.stop()


def test_a_bad_line_sends_no_turn_at_all(batch: Batch, tmp_path: Path) -> None:
    turns = write_lines(
        tmp_path / "turns.txt", "Transfer $8 to savings", "Hello", '{"text": "cut short'
    )
    result = run_cli("submit", *batch.flags, "--agent", "bankingAgent", "--file", turns)
    assert result.returncode == 1, result.describe()
    assert f"error: INVALID_ARGUMENT: {turns}, line 3: not a JSON object" in result.stderr
    assert result.json_lines() == [], "nothing was sent"
    assert batch.waiting() == 0


def _dead_letter(batch: Batch) -> dict[str, Any]:
    """The one message kept on `interlock.turns.dead` (acked)."""
    from events.topology import TURNS_DEAD

    dead = batch.conn.SimpleQueue(TURNS_DEAD)
    try:
        message = dead.get(timeout=10)
        envelope: dict[str, Any] = json.loads(message.body)
        message.ack()
    finally:
        dead.close()
    return envelope


def test_a_turn_whose_store_fails_at_every_try_is_kept_on_the_dead_letter_queue(
    batch: Batch, tmp_path: Path
) -> None:
    """Retries do not go on for ever (a tool whose outcome cannot be journaled would run
    at each): past `STORE_RETRIES` the task is kept on `interlock.turns.dead`, with the
    reason and the turn's request, and ends; nothing is dropped."""
    from interlock import AgentInput, Message, Part
    from workers.app import RUN_TURN, STORE_RETRIES, create_app
    from workers.settings import Settings
    from workers.turns import new_turn_request

    wrong = tmp_path / "wrong.db"
    wrong.write_bytes(NOT_A_DATABASE)
    app = create_app(Settings(broker_url=batch.server.url, store_url=f"sqlite:///{wrong}", app=APP))
    said = AgentInput(message=Message(role="user", content=[Part(text="Transfer $4 to x")]))
    request = new_turn_request("bankingAgent", said).model_dump(mode="json")
    # Run eagerly, each retry runs at once: from the 5th try (past Celery's default of 3
    # retries, which `retry(max_retries=None)` falls back to) to the last.
    ran = app.tasks[RUN_TURN].apply(args=[request], retries=4)
    assert isinstance(ran.result, dict), ran.result
    assert ran.result["turn_id"] == request["turn_id"], ran.result
    assert "file is not a database" in ran.result["dead_lettered"]
    envelope = _dead_letter(batch)
    assert envelope["schema_version"] == 1, envelope
    assert envelope["turn_id"] == request["turn_id"]
    assert envelope["reason"].startswith(
        f"the store or broker failed {STORE_RETRIES + 1} times: DatabaseError: file is not a"
    ), envelope["reason"]
    assert json.loads(envelope["body"]) == {"args": [request], "kwargs": {}}


def test_an_unexpected_error_outside_the_turn_is_retried_then_kept_not_dropped(
    batch: Batch, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An error that is neither the turn's answer nor a store or broker failure (a bug
    in taking the turn's lease, say) would fail the task, and Celery would ack it: the
    turn gone without an event. It is logged with its traceback, retried as a store
    failure is, and past `STORE_RETRIES` kept on `interlock.turns.dead`."""
    from interlock import AgentInput, Message, Part
    from interlock.stores.sql_journal import SqlTurnJournal
    from workers.app import RUN_TURN, STORE_RETRIES, create_app
    from workers.settings import Settings
    from workers.turns import new_turn_request

    calls: list[str] = []

    def broken(self: SqlTurnJournal, turn_id: str, *args: Any, **kwargs: Any) -> Any:
        calls.append(turn_id)
        raise RuntimeError("lease bookkeeping broke")

    monkeypatch.setattr(SqlTurnJournal, "begin", broken)
    store = f"sqlite:///{tmp_path}/ok.db"
    app = create_app(Settings(broker_url=batch.server.url, store_url=store, app=APP))
    said = AgentInput(message=Message(role="user", content=[Part(text="Transfer $6 to x")]))
    request = new_turn_request("bankingAgent", said).model_dump(mode="json")
    with caplog.at_level(logging.ERROR, logger="interlock.worker"):
        ran = app.tasks[RUN_TURN].apply(args=[request], retries=STORE_RETRIES - 1)
    assert ran.state == "SUCCESS", (ran.state, ran.result)
    assert calls == [request["turn_id"]] * 2, "tried, retried once, then kept"
    assert "lease bookkeeping broke" in ran.result["dead_lettered"]
    assert any(r.exc_info and "unexpected RuntimeError" in r.getMessage() for r in caplog.records)
    envelope = _dead_letter(batch)
    assert envelope["turn_id"] == request["turn_id"]
    assert envelope["reason"].startswith(
        f"running the turn failed {STORE_RETRIES + 1} times: RuntimeError: lease bookkeeping"
    ), envelope["reason"]
    assert json.loads(envelope["body"]) == {"args": [request], "kwargs": {}}


def test_a_burst_worker_gives_up_on_an_unexpected_error_as_internal(
    batch: Batch, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In burst mode an unexpected error outside the turn is tried as often as a store
    failure, then the turn goes back on its queue (no dead letter, no event) and the
    worker is told to stop, with INTERNAL, not UNAVAILABLE: no outage explains it."""
    from interlock import AgentInput, Message, Part
    from interlock.stores.sql_journal import SqlTurnJournal
    from workers.app import RUN_TURN, create_app
    from workers.burst import BURST_ENV, BurstGaveUp
    from workers.settings import Settings
    from workers.turns import new_turn_request

    def broken(self: SqlTurnJournal, turn_id: str, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("lease bookkeeping broke")

    monkeypatch.setattr(SqlTurnJournal, "begin", broken)
    monkeypatch.setenv(BURST_ENV, "5")
    store = f"sqlite:///{tmp_path}/ok.db"
    app = create_app(Settings(broker_url=batch.server.url, store_url=store, app=APP))
    said = AgentInput(message=Message(role="user", content=[Part(text="Transfer $3 to x")]))
    request = new_turn_request("bankingAgent", said).model_dump(mode="json")
    ran = app.tasks[RUN_TURN].apply(args=[request], retries=BURST_CONNECT_RETRIES)
    assert ran.state == "REJECTED", (ran.state, ran.result)
    assert isinstance(ran.result, BurstGaveUp), ran.result
    assert ran.result.requeue is True
    assert ran.result.reason == (
        f"INTERNAL: running the turn failed {BURST_CONNECT_RETRIES + 1} times in a row: "
        f"RuntimeError: lease bookkeeping broke (turn {request['turn_id']} requeued, and "
        "still queued on interlock.turns)"
    )
    with batch.conn.channel() as channel:
        assert int(channel.client.llen("interlock.turns.dead")) == 0, "no dead letter"
    assert batch.read_events(1, timeout=1) == [], "nothing was answered"


def test_a_dead_letter_that_cannot_be_published_leaves_the_turn_on_its_queue(
    batch: Batch, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the dead letter cannot be published either (the broker is away too), the
    task is rejected with requeue: the message goes back on `interlock.turns` rather
    than being dropped, and no half-written dead letter is left."""
    from celery.exceptions import Reject

    from events.topology import TURNS_DEAD
    from interlock import AgentInput, Message, Part
    from workers.app import RUN_TURN, STORE_RETRIES, create_app, runtime_of
    from workers.settings import Settings
    from workers.turns import new_turn_request

    wrong = tmp_path / "wrong.db"
    wrong.write_bytes(NOT_A_DATABASE)
    app = create_app(Settings(broker_url=batch.server.url, store_url=f"sqlite:///{wrong}", app=APP))
    tried: list[str] = []

    def broker_away(*args: Any, **kwargs: Any) -> None:
        tried.append(str(kwargs.get("turn_id")))
        raise ConnectionRefusedError(111, "Connection refused")

    monkeypatch.setattr(runtime_of(app).publisher, "dead_letter", broker_away)
    said = AgentInput(message=Message(role="user", content=[Part(text="Transfer $5 to x")]))
    request = new_turn_request("bankingAgent", said).model_dump(mode="json")
    ran = app.tasks[RUN_TURN].apply(args=[request], retries=STORE_RETRIES)
    assert tried == [request["turn_id"]], "the dead letter was tried once"
    assert ran.state == "REJECTED", (ran.state, ran.result)
    assert isinstance(ran.result, Reject), ran.result
    assert ran.result.requeue is True
    assert "Connection refused" in str(ran.result.reason)
    dead = batch.conn.SimpleQueue(TURNS_DEAD)
    try:
        with pytest.raises(dead.Empty):
            dead.get(timeout=1)  # no dead letter was kept
    finally:
        dead.close()


@pytest.mark.parametrize("command", ["worker", "resume-consumer"])
def test_a_served_process_says_at_start_that_it_cannot_use_its_store(
    batch: Batch, tmp_path: Path, command: str
) -> None:
    """Served, a store that cannot be reached does not stop the process (it may come up
    later) but is said at once on stderr, naming the flag to check; in burst mode it is
    one error line (exit 1)."""
    store = f"postgresql+psycopg://nobody:secret@127.0.0.1:{free_port()}/interlock"
    flags = ["--app", APP, "--broker", batch.server.url, "--store", store]
    served = Service(command, [command, *flags], tmp_path / f"{command}.log")
    try:
        served.wait_for("starting", timeout=60)
        said = served.output()
        assert "warning: cannot reach the store: " in said, said
        assert (
            "starts anyway, and what it serves waits and is retried while the store cannot "
            "be used: check --store or INTERLOCK_STORE_URL"
        ) in said, said
        assert "secret" not in said, "the password is hidden"
        assert served.alive, said
    finally:
        served.stop()
    burst = run_cli(command, "--burst", *flags, timeout=120)
    assert burst.returncode == 1, burst.describe()
    assert "error: UNAVAILABLE: cannot reach the store: " in burst.stderr, burst.describe()


def test_the_consumer_says_it_consumes_before_it_handles_a_queued_decision(
    tmp_path: Path,
) -> None:
    """On RabbitMQ, the queues' declaration used to come after the consumer had started:
    decisions queued before were handled while it waited for the broker's answers, and
    logged before the line that says it consumes. It declares them first now."""
    from tests.queue_helpers import rabbitmq_vhost

    with rabbitmq_vhost() as url:
        with Connection(url) as conn:
            declare(conn)
            Producer(conn).publish(
                b"not json", routing_key="interlock.decisions", content_type="application/json"
            )
        store = f"sqlite:///{tmp_path / 'store.db'}"
        ran = run_cli(
            "resume-consumer", "--burst", "--app", APP, "--broker", url, "--store", store,
            timeout=120,
        )  # fmt: skip
    assert ran.returncode == 0, ran.describe()
    assert ran.json_lines()[-1] == {"resume_consumer": "drained", "handled": 1}
    lines = ran.stderr.splitlines()
    consuming = next(i for i, line in enumerate(lines) if "; consuming interlock.decisions" in line)
    kept = next(i for i, line in enumerate(lines) if "kept an unreadable decision" in line)
    assert consuming < kept, ran.describe()
