"""The interrupt-and-resume cycle through the queues: Interlock's worker and resume
consumer against a bare-Celery two-hop baseline, on a private redis-server.

One cycle (ours), on a new session each time:

1. submit: `interlock.run_turn` enqueued with `workers.app.send_turn` (what
   `interlock submit` does, in this process, so that no CLI start-up is measured);
2. the worker (`interlock worker --app examples.banking:ai --pool prefork
   --concurrency 2`) runs the turn; it pauses for approval; `turn.interrupted` is read
   from a queue of the bench's own bound to `interlock.events`;
3. a decision (plain JSON, restart approved) is published to `interlock.decisions`;
   the resume consumer (`interlock resume-consumer`) validates and claims it and
   enqueues the resume;
4. the worker resumes the turn; `turn.completed` is read (its text names the
   transaction).

The baseline (bench/queue_baseline.py) has the same shape with nothing but Celery and
kombu: task A publishes a message, the bench replies on a second queue, a kombu
consumer thread (of the bench's process) enqueues task B, B publishes "done". It runs a
second time with that consumer in a process of its own, like the resume consumer
(`celery_baseline_process`): a reference, not the target's.

All run with 1 and with 8 cycles in flight (a pipeline that starts a new cycle as soon
as one ends; one connection reads the events and dispatches them by session id), in
interleaved rounds, after a warm-up.

    python -m bench.queue_cycle [--cycles N] [--rounds R] [--quick] [--pg | --store URL]
                                [--pool prefork|threads|solo] [--concurrency N]

The target is measured with prefork workers, `--pool prefork --concurrency 2`
(the default). Another pool, or another concurrency, is a reference: both systems'
workers run with it, the ratios are printed, and `targets` says `met: null`.

Prints one JSON line: cycles/s, median and p99 ms per cycle for each system and
in-flight level, ours divided by the baseline (ratios; goal >= 0.8) and by the
process-consumer baseline, the versions.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack, suppress
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from kombu.connection import Connection
from kombu.entity import Queue
from kombu.message import Message as KombuMessage
from kombu.messaging import Consumer, Producer

from ._common import approval_decision, emit, git_state, percentile, round_order
from ._services import (
    Process,
    Processes,
    StartError,
    group_cpu_seconds,
    pg_database,
    redis_server,
    redis_server_version,
)

__all__ = ["main", "run"]

TARGET = 0.8
"""Goal: ours at least this fraction of the baseline's cycle rate, at each level."""

APP = "examples.banking:ai"
AGENT = "bankingAgent"
PROMPT = "Transfer $500 to savings"
IN_FLIGHT = (1, 8)
POOL = "prefork"
CONCURRENCY = 2
"""The target's workers: both systems' run `--pool prefork --concurrency 2`."""
POOLS = ("prefork", "threads", "solo")
EVENT_TIMEOUT = 60.0
"""Seconds one cycle may wait for its next event before the run fails."""

ROOT = Path(__file__).resolve().parent.parent

_PACKAGES = (
    "interlock",
    "celery",
    "kombu",
    "billiard",
    "redis",
    "sqlalchemy",
    "sqlmodel",
    "pydantic",
    "psycopg",
)

FIRST, DONE, FAILED, OTHER = "first", "done", "failed", "other"

BASELINE = "celery_baseline"
"""Bare Celery as specified: its reply consumer a thread of the benchmark's process. The
target's ratios (`ratios`) are against it."""
BASELINE_PROCESS = "celery_baseline_process"
"""Bare Celery with its reply consumer in a process of its own, like Interlock's resume
consumer (`ratios_vs_process_consumer`)."""


# ---------------------------------------------------------------- reading and replying


class Reader:
    """One broker connection with a queue of the bench's own: every message is parsed
    as plain JSON (as a dashboard in any language would) and acked; replies go out on
    the same connection."""

    def __init__(self, broker_url: str, queue: Queue, transport_options: dict[str, Any]) -> None:
        self.conn = Connection(broker_url, transport_options=transport_options)
        self.conn.ensure_connection(max_retries=3)
        self.queue = queue
        channel = self.conn.channel()
        queue.bind(channel).declare()
        self.consumer = Consumer(channel, queues=[queue], on_message=self._on_message)
        self.consumer.qos(prefetch_count=64)
        self.consumer.consume()
        self.producer = Producer(self.conn.channel())
        self.buffer: list[dict[str, Any]] = []

    def _on_message(self, message: KombuMessage) -> None:
        self.buffer.append(json.loads(message.body))
        message.ack()

    def poll(self, timeout: float) -> list[dict[str, Any]]:
        """What was read (waiting up to `timeout` when nothing is buffered)."""
        if not self.buffer:
            with suppress(TimeoutError):
                self.conn.drain_events(timeout=timeout)
        got, self.buffer = self.buffer, []
        return got

    def publish(self, body: str, routing_key: str) -> None:
        """Plain JSON to a queue, through the default exchange."""
        self.producer.publish(
            body,
            exchange="",
            routing_key=routing_key,
            content_type="application/json",
            content_encoding="utf-8",
            delivery_mode=2,
        )

    def close(self) -> None:
        try:
            self.consumer.cancel()
            self.queue.bind(self.conn.default_channel).delete()
        finally:
            self.conn.release()


# ---------------------------------------------------------------- the two systems


class System:
    """A system under test: how to start a cycle, read its events, reply."""

    name: str
    reader: Reader
    processes: list[Process]
    cpu_groups: dict[str, Process]
    """Process groups whose CPU time is counted per cycle: worker, consumer, redis."""

    def submit(self) -> str:
        raise NotImplementedError

    def classify(self, body: dict[str, Any]) -> tuple[str | None, str]:
        raise NotImplementedError

    def reply(self, key: str, body: dict[str, Any]) -> None:
        raise NotImplementedError

    def check_done(self, body: dict[str, Any]) -> None:
        """Raise when a completed cycle is not what it should be."""

    def thread_cpu(self) -> dict[str, float]:
        """CPU seconds so far of this system's threads in the benchmark's process, by
        group (counted there, not as the benchmark's own)."""
        return {}

    def close(self) -> None:
        self.reader.close()

    def check_alive(self) -> None:
        for process in self.processes:
            process.check()

    def logs(self) -> str:
        return "\n".join(f"===== {p.name} ({p.log})\n{p.tail()}" for p in self.processes)


class Ours(System):
    name = "interlock"

    def __init__(
        self, broker_url: str, store_url: str, processes: list[Process], redis: Process
    ) -> None:
        from events.publisher import declare
        from events.topology import event_queue
        from interlock import AgentInput, Message, Part
        from workers.app import create_app, send_turn
        from workers.settings import Settings
        from workers.turns import new_turn_request

        settings = Settings(broker_url=broker_url, store_url=store_url, app=APP)
        self.app = create_app(settings)
        self.processes = processes
        self.cpu_groups = {"worker": processes[0], "consumer": processes[1], "redis": redis}
        queue = event_queue(f"bench.events.{uuid.uuid4().hex[:12]}", "turn.*", durable=False)
        self.reader = Reader(broker_url, queue, settings.transport_options)
        declare(self.reader.conn)  # as a client would: make sure the topology exists
        self._send = send_turn
        self._request = new_turn_request
        self._input = lambda: AgentInput(message=Message(role="user", content=[Part(text=PROMPT)]))

    def submit(self) -> str:
        session_id = str(uuid.uuid4())
        request = self._request(AGENT, self._input(), session_id=session_id)
        self._send(self.app, request)
        return session_id

    def classify(self, body: dict[str, Any]) -> tuple[str | None, str]:
        kind = body.get("type")
        if kind == "turn.interrupted":
            return body.get("session_id"), FIRST
        if kind == "turn.completed":
            return body.get("session_id"), DONE
        if kind == "turn.failed":
            return body.get("session_id"), FAILED
        return body.get("session_id"), OTHER

    def reply(self, key: str, body: dict[str, Any]) -> None:
        decision = approval_decision(body)
        self.reader.publish(json.dumps(decision), "interlock.decisions")

    def check_done(self, body: dict[str, Any]) -> None:
        content = (body.get("message") or {}).get("content") or []
        text = "".join(p.get("text") or "" for p in content if isinstance(p, dict))
        if "transaction txn-" not in text:
            raise AssertionError(f"the completed turn does not name a transaction: {body}")


class Baseline(System):
    """Bare Celery. Its reply consumer is a thread of this process (`consumer=None`: the
    baseline as the benchmark's specification has it, "a consumer thread enqueues task
    B") or the given process (a process of its own, like Interlock's resume consumer)."""

    def __init__(
        self, broker_url: str, worker: Process, redis: Process, consumer: Process | None = None
    ) -> None:
        from . import queue_baseline as qb

        self.app = qb.make_app(broker_url)
        self.thread: qb.ConsumerThread | None = None
        self.cpu_groups = {"worker": worker, "redis": redis}
        options = self.app.conf.broker_transport_options
        if consumer is None:
            self.name = BASELINE
            self.processes = [worker]
            events, self._replies = qb.EVENTS_THREAD_QUEUE, qb.REPLIES_THREAD
        else:
            self.name = BASELINE_PROCESS
            self.processes = [worker, consumer]
            self.cpu_groups["consumer"] = consumer
            events, self._replies = qb.EVENTS_QUEUE, qb.REPLIES
        self.reader = Reader(broker_url, events, options)
        with self.reader.conn.channel() as channel:
            for queue in qb.QUEUES:
                queue.bind(channel).declare()
        self._events = events.name
        if consumer is None:
            self.thread = qb.ConsumerThread(broker_url)

    def submit(self) -> str:
        cycle_id = str(uuid.uuid4())
        self.app.send_task("bench.a", args=[cycle_id, self._events])
        return cycle_id

    def check_alive(self) -> None:
        super().check_alive()
        if self.thread is not None and not self.thread.alive():
            raise RuntimeError(f"{self.name}: the reply consumer thread stopped")

    def thread_cpu(self) -> dict[str, float]:
        seconds = None if self.thread is None else self.thread.cpu_seconds()
        return {} if seconds is None else {"consumer": seconds}

    def close(self) -> None:
        try:
            if self.thread is not None:
                self.thread.stop()
        finally:
            self.reader.close()

    def classify(self, body: dict[str, Any]) -> tuple[str | None, str]:
        kind = body.get("kind")
        return body.get("cycle_id"), FIRST if kind == "first" else DONE if kind == "done" else OTHER

    def reply(self, key: str, body: dict[str, Any]) -> None:
        self.reader.publish(json.dumps({"cycle_id": key}), self._replies)


# ---------------------------------------------------------------- the pipeline


@dataclass
class Batch:
    latencies: list[float] = field(default_factory=list)
    window_s: float = 0.0
    duplicates: int = 0
    strays: int = 0
    completed: int = 0  # every cycle of the batch: ramp, timed and drained
    cpu_s: dict[str, float] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return len(self.latencies) / self.window_s if self.window_s > 0 else 0.0


def pipeline(system: System, in_flight: int, cycles: int, ramp: int) -> Batch:
    """Keep `in_flight` cycles outstanding until `ramp + cycles` have completed; time
    the last `cycles` of them (their latency, submit to completed, and the window from
    the ramp-th completion to the last), then let the `in_flight - 1` still outstanding
    finish, untimed: the timed window always has `in_flight` cycles in flight."""
    clock = time.perf_counter
    batch = Batch()
    started: dict[str, list[float]] = {}  # key -> [t0, phase]
    wanted = ramp + cycles
    completed = 0
    window_start = clock()

    def start() -> None:
        t0 = clock()
        started[system.submit()] = [t0, 0]

    cpu_before = _cpu(system)
    for _ in range(in_flight):
        start()
    last_progress = time.monotonic()
    while started:
        events = system.reader.poll(1.0)
        if not events:
            system.check_alive()
            if time.monotonic() - last_progress > EVENT_TIMEOUT:
                raise TimeoutError(
                    f"{system.name}: no event for {EVENT_TIMEOUT:.0f}s with {len(started)} "
                    f"cycles in flight\n{system.logs()}"
                )
            continue
        last_progress = time.monotonic()
        for body in events:
            key, kind = system.classify(body)
            state = started.get(key) if key is not None else None
            if key is None or state is None:
                batch.strays += 1  # a late duplicate of an earlier cycle, or no cycle's
                continue
            if kind == FIRST and state[1] == 0:
                state[1] = 1
                system.reply(key, body)
            elif kind == DONE and state[1] == 1:
                now = clock()
                del started[key]
                system.check_done(body)
                completed += 1
                if completed == ramp:
                    window_start = now
                elif completed > ramp and completed <= wanted:
                    batch.latencies.append(now - state[0])
                    if completed == wanted:
                        batch.window_s = now - window_start
                if completed < wanted:
                    start()
            elif kind == FAILED:
                raise AssertionError(f"{system.name}: a turn failed: {body}\n{system.logs()}")
            else:
                batch.duplicates += 1
    batch.completed = completed
    after = _cpu(system)
    batch.cpu_s = {k: after[k] - v for k, v in cpu_before.items() if k in after}
    return batch


def _cpu(system: System) -> dict[str, float]:
    """CPU seconds used so far by each process group of `system`, redis and the bench."""
    found: dict[str, float] = {}
    for name, process in system.cpu_groups.items():
        seconds = group_cpu_seconds(process.pid)
        if seconds is not None:
            found[name] = seconds
    times = os.times()
    found["bench"] = times.user + times.system
    for name, seconds in system.thread_cpu().items():
        found[name] = seconds
        found["bench"] -= seconds
    return found


def _figures(batches: list[Batch]) -> dict[str, Any]:
    latencies = sorted(x for b in batches for x in b.latencies)
    window = sum(b.window_s for b in batches)
    cycles = sum(b.completed for b in batches)
    cpu: dict[str, float] = {}
    for b in batches:
        for name, seconds in b.cpu_s.items():
            cpu[name] = cpu.get(name, 0.0) + seconds
    order = ("worker", "consumer", "redis", "bench")
    names = sorted(cpu, key=lambda n: order.index(n) if n in order else len(order))
    cpu_ms = {name: round(cpu[name] * 1000 / cycles, 2) for name in names}
    if cpu_ms:
        cpu_ms["total"] = round(sum(cpu.values()) * 1000 / cycles, 2)
    return {
        "cycles": len(latencies),
        "cycles_per_s": round(len(latencies) / window, 1) if window > 0 else None,
        "median_ms": round(percentile(latencies, 50) * 1000, 2),
        "p99_ms": round(percentile(latencies, 99) * 1000, 2),
        "duplicate_events": sum(b.duplicates + b.strays for b in batches),
        "cpu_ms_per_cycle": cpu_ms or None,
    }


# ---------------------------------------------------------------- processes


def _child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("INTERLOCK_")}
    env.update(PYTHONUNBUFFERED="1", INTERLOCK_SECRET="bench-secret")
    pythonpath = [str(ROOT), *filter(None, [env.get("PYTHONPATH")])]
    env["PYTHONPATH"] = os.pathsep.join(pythonpath)
    env.update(extra)
    return env


def _interlock_bin() -> str:
    candidate = Path(sys.executable).with_name("interlock")
    if not candidate.exists():
        raise StartError(f"{candidate} not found: pip install -e . into this interpreter's venv")
    return str(candidate)


@dataclass(frozen=True)
class Pool:
    """How both systems' Celery workers run their tasks."""

    kind: str = POOL
    concurrency: int = CONCURRENCY

    @property
    def is_target(self) -> bool:
        return (self.kind, self.concurrency) == (POOL, CONCURRENCY)


def _start_ours(
    procs: Processes, logs: Path, broker_url: str, store_url: str, loglevel: str, pool: Pool
) -> list[Process]:
    common = ["--app", APP, "--broker", broker_url, "--store", store_url]
    worker = procs.start(
        "interlock worker",
        [
            _interlock_bin(), "worker", *common,
            "--pool", pool.kind, "--concurrency", str(pool.concurrency), "--loglevel", loglevel,
        ],
        logs / "interlock-worker.log",
        env=_child_env(),
        cwd=ROOT,
    )  # fmt: skip
    consumer = procs.start(
        "interlock resume-consumer",
        [_interlock_bin(), "resume-consumer", *common],
        logs / "interlock-consumer.log",
        env=_child_env(),
        cwd=ROOT,
    )
    return [worker, consumer]


def _start_baseline(
    procs: Processes, logs: Path, broker_url: str, loglevel: str, pool: Pool
) -> list[Process]:
    worker = procs.start(
        "baseline celery worker",
        [
            sys.executable, "-m", "celery", "-A", "bench.queue_baseline:app", "worker",
            "-Q", "bench.baseline.tasks", "-c", str(pool.concurrency), "-P", pool.kind,
            "-l", loglevel, "-n", f"baseline-{uuid.uuid4().hex[:8]}@%h",
            "--without-gossip", "--without-mingle",
        ],
        logs / "baseline-worker.log",
        env=_child_env(BENCH_BROKER_URL=broker_url),
        cwd=ROOT,
    )  # fmt: skip
    consumer = procs.start(
        "baseline reply consumer",
        [sys.executable, "-m", "bench.queue_baseline", "consumer", "--broker", broker_url],
        logs / "baseline-consumer.log",
        env=_child_env(),
        cwd=ROOT,
    )
    return [worker, consumer]


# ---------------------------------------------------------------- the run


def _redact(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def _versions(pg_version: str | None) -> dict[str, str | None]:
    import sqlite3

    found: dict[str, str | None] = {
        "python": platform.python_version(),
        "implementation": sys.implementation.name,
        "redis-server": redis_server_version(),
        "sqlite": sqlite3.sqlite_version,
    }
    if pg_version is not None:
        found["postgresql"] = pg_version
    for name in _PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def run(
    *,
    cycles: int,
    warmup: int,
    rounds: int,
    levels: tuple[int, ...] = IN_FLIGHT,
    store_url: str | None = None,
    pg: bool = False,
    logs_dir: Path | None = None,
    loglevel: str = "INFO",
    pool: Pool = Pool(),
    log: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    started_at = time.perf_counter()
    procs = Processes()
    with ExitStack() as stack:
        stack.callback(procs.stop_all)
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="interlock-qbench-")))
        logs = logs_dir or tmp
        logs.mkdir(parents=True, exist_ok=True)
        pg_version: str | None = None
        if store_url is not None:
            store_kind = "postgresql" if store_url.startswith("postgresql") else "given"
            if store_url.startswith("sqlite"):
                store_kind = "sqlite"
        elif pg:
            store_url, pg_version = stack.enter_context(pg_database())
            store_kind = "postgresql"
        else:
            store_url = f"sqlite:///{tmp / 'interlock.db'}"
            store_kind = "sqlite"
        broker_url = redis_server(procs, tmp / "redis")
        log(f"redis-server at {broker_url}; store {_redact(store_url)}; logs in {logs}")

        ours_procs = _start_ours(procs, logs, broker_url, store_url, loglevel, pool)
        base_procs = _start_baseline(procs, logs, broker_url, loglevel, pool)
        ours_procs[0].wait_for(" ready.")
        ours_procs[1].wait_for("Connected to ")
        base_procs[0].wait_for(" ready.")
        base_procs[1].wait_for("baseline consumer ready")
        log("pids: " + ", ".join(f"{p.name}={p.pid}" for p in procs.started))

        redis = procs.started[0]
        ours = Ours(broker_url, store_url, ours_procs, redis)
        stack.callback(ours.close)
        base = Baseline(broker_url, base_procs[0], redis)
        stack.callback(base.close)
        base_process = Baseline(broker_url, base_procs[0], redis, consumer=base_procs[1])
        stack.callback(base_process.close)
        systems: list[System] = [ours, base, base_process]

        for level in levels if warmup else ():  # connections, imports, caches, pages
            for system in systems:
                pipeline(system, level, warmup, 0)
        log("warm-up done")

        by_level: dict[int, dict[str, list[Batch]]] = {
            level: {s.name: [] for s in systems} for level in levels
        }
        counts = [cycles // rounds + (1 if r < cycles % rounds else 0) for r in range(rounds)]
        for r, count in enumerate(counts):
            for level in levels:
                for system in round_order(systems, r):
                    batch = pipeline(system, level, count, ramp=level)
                    by_level[level][system.name].append(batch)
            log(f"round {r + 1}/{rounds} done")

    results: dict[str, Any] = {}
    ratios: dict[str, float | None] = {}
    round_medians: dict[str, float | None] = {}
    vs_process: dict[str, float | None] = {}
    targets: dict[str, Any] = {}

    def ratio_of(figures: dict[str, Any], other: str) -> float | None:
        a, b = figures[ours.name]["cycles_per_s"], figures[other]["cycles_per_s"]
        return round(a / b, 2) if a and b else None

    for level in levels:
        label = f"in_flight_{level}"
        figures = {name: _figures(batches) for name, batches in by_level[level].items()}
        results[label] = figures
        ratio = ratio_of(figures, base.name)
        per_round = [
            o.rate / p.rate
            for o, p in zip(by_level[level][ours.name], by_level[level][base.name], strict=True)
            if o.rate and p.rate
        ]
        ratios[label] = ratio
        round_medians[label] = round(statistics.median(per_round), 2) if per_round else None
        vs_process[label] = ratio_of(figures, base_process.name)
        targets[label] = {
            "goal": f">= {TARGET}x",
            "ratio": ratio,
            "ratio_round_median": round_medians[label],
            "met": None if ratio is None or not pool.is_target else ratio >= TARGET,
        }
    return {
        "benchmark": "queue_cycle",
        "cycles": cycles,
        "warmup": warmup,
        "rounds": rounds,
        "in_flight": list(levels),
        "broker": "redis-server, private, --save '' --appendonly no",
        "store": {"kind": store_kind, "url": _redact(store_url).replace(str(tmp), "<tmp>")},
        "workers": {
            "pool": pool.kind,
            "concurrency": pool.concurrency,
            "loglevel": loglevel,
            "target_setting": pool.is_target,
        },
        "results": results,
        "ratios": ratios,
        "ratios_round_median": round_medians,
        "ratios_vs_process_consumer": vs_process,
        "targets": targets,
        "notes": [
            "cycles_per_s: completed cycles over the wall time of the timed window "
            "(steady state: the first `in_flight` completions of each batch are a ramp, "
            "and the last `in_flight - 1` a drain, both untimed; new cycles start until "
            "the window closes); median_ms/p99_ms: submit to completed, per cycle",
            f"ratios: interlock cycles/s divided by {BASELINE}'s (reply consumer: a thread "
            f"of the benchmark's process); ratios_vs_process_consumer: by {BASELINE_PROCESS}'s "
            "(reply consumer: a process of its own, like the resume consumer)",
            "cpu_ms_per_cycle: CPU time (user + system) of each process group over whole "
            "batches (ramp and drain included) per cycle: worker (parent and pool), consumer "
            f"(for {BASELINE}, its thread), redis-server (shared: the other systems are idle "
            "meanwhile), bench (this process, without that thread)",
        ],
        "git": git_state(),
        "versions": _versions(pg_version),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "elapsed_s": round(time.perf_counter() - started_at, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.queue_cycle", description=__doc__)
    parser.add_argument(
        "--cycles", type=int, default=400, help="timed cycles per system and in-flight level"
    )
    parser.add_argument(
        "--warmup", type=int, default=30, help="untimed cycles per system and level first"
    )
    parser.add_argument("--rounds", type=int, default=4, help="interleaved batches")
    parser.add_argument(
        "--in-flight", default=",".join(map(str, IN_FLIGHT)), help="levels, comma-separated"
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run (16 cycles a level)")
    store = parser.add_mutually_exclusive_group()
    store.add_argument(
        "--store", help="store URL (default: a SQLite file in a temp dir); its rows are kept"
    )
    store.add_argument(
        "--pg",
        action="store_true",
        help="a fresh PostgreSQL database on 127.0.0.1:5432, dropped after "
        "(admin URL: INTERLOCK_BENCH_PG_URL, else postgres/root/$USER without password)",
    )
    parser.add_argument("--logs", type=Path, help="keep the processes' logs in this folder")
    parser.add_argument("--loglevel", default="INFO", help="the workers' log level")
    parser.add_argument(
        "--pool",
        choices=POOLS,
        default=POOL,
        help=f"both systems' worker pool (default {POOL}, the target's; another is a reference)",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=CONCURRENCY,
        help=f"both systems' worker concurrency (default {CONCURRENCY}, the target's)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="progress on stderr")
    args = parser.parse_args(argv)
    if args.quick:
        args.cycles, args.warmup, args.rounds = 16, 4, 2
    try:
        levels = tuple(int(x) for x in args.in_flight.split(",") if x.strip())
    except ValueError:
        parser.error("--in-flight takes numbers, e.g. 1,8")
    if args.cycles < 1 or args.rounds < 1 or args.warmup < 0 or not levels or min(levels) < 1:
        parser.error("--cycles, --rounds and --in-flight must be positive, --warmup not negative")
    if args.concurrency < 1:
        parser.error("--concurrency must be positive")

    def log(text: str) -> None:
        if args.verbose:
            print(f"[queue_cycle] {text}", file=sys.stderr, flush=True)

    # SIGTERM and SIGHUP end the run like Ctrl-C: the clean-up stops every process.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda signum, _frame: sys.exit(128 + signum))
    try:
        figures = run(
            cycles=args.cycles,
            warmup=args.warmup,
            rounds=min(args.rounds, args.cycles),
            levels=levels,
            store_url=args.store,
            pg=args.pg,
            logs_dir=args.logs,
            loglevel=args.loglevel,
            pool=Pool(args.pool, args.concurrency),
            log=log,
        )
    except StartError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # every process was stopped on the way out
        print("interrupted", file=sys.stderr)
        return 130
    emit(figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
