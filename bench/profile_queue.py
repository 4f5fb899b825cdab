"""Where the queued cycle's own work goes: the worker's and the consumer's code, in one
process, without Celery's worker loop, profiled with pyinstrument.

    pip install pyinstrument        # not a dependency of Interlock, nor of `.[bench]`
    python -m bench.profile_queue [--cycles N] [--store URL] [--no-profile]

A private redis-server carries the events and the enqueued resumes, as in
bench/queue_cycle.py; each cycle runs `run_turn` on the submitted request, reads
`turn.interrupted`, hands a decision to `ResumeConsumer.handle`, takes the resume it
enqueued off `interlock.turns` and runs it, and reads `turn.completed`. Prints the mean
milliseconds per cycle of each step (wall and CPU time), then pyinstrument's call tree (unless
`--no-profile`).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

from kombu.connection import Connection
from kombu.simple import SimpleQueue

from ._common import PROMPT, approval_decision
from ._services import Processes, redis_server

__all__ = ["main"]

APP = "examples.banking:ai"
AGENT = "bankingAgent"


class _Harness:
    def __init__(self, broker_url: str, store_url: str) -> None:
        from events.publisher import declare
        from events.topology import TURNS, event_queue
        from workers.app import create_app, runtime_of
        from workers.consumer import ResumeConsumer
        from workers.settings import Settings

        settings = Settings(broker_url=broker_url, store_url=store_url, app=APP)
        self.app = create_app(settings)
        self.rt = runtime_of(self.app)
        self.consumer = ResumeConsumer(self.app)
        self.conn = Connection(broker_url, transport_options=settings.transport_options)
        declare(self.conn)
        queue = event_queue(f"profile.events.{uuid.uuid4().hex[:12]}", "turn.*", durable=False)
        self.events = SimpleQueue(self.conn, queue)
        self.turns = SimpleQueue(self.conn.clone(), TURNS)
        self.times: dict[str, float] = defaultdict(float)
        self.cpu: dict[str, float] = defaultdict(float)

    def _timed(self, step: str, fn: Any, *args: Any) -> Any:
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            return fn(*args)
        finally:
            self.times[step] += time.perf_counter() - t0
            self.cpu[step] += time.process_time() - c0

    def _event(self, wanted: str) -> dict[str, Any]:
        message = self.events.get(timeout=10)
        message.ack()
        body: dict[str, Any] = json.loads(message.body)
        if body["type"] != wanted:
            raise AssertionError(f"expected {wanted}, read {body}")
        return body

    def cycle(self) -> None:
        from interlock import AgentInput, Message, Part
        from workers.turns import new_turn_request, run_turn

        request = new_turn_request(
            AGENT,
            AgentInput(message=Message(role="user", content=[Part(text=PROMPT)])),
            session_id=str(uuid.uuid4()),
        ).model_dump(mode="json")
        self._timed("worker: first turn", run_turn, self.rt, request)
        interrupted = self._timed("bench: read event", self._event, "turn.interrupted")
        decision = approval_decision(interrupted)
        body = json.dumps(decision).encode()
        self._timed("consumer: handle", self.consumer.handle, body, "application/json", {})
        message = self._timed("bench: take resume", self.turns.get, True, 10)
        message.ack()
        args = message.decode()[0]
        self._timed("worker: resume", run_turn, self.rt, args[0])
        done = self._timed("bench: read event", self._event, "turn.completed")
        if done["finish_reason"] != "stop":
            raise AssertionError(f"the resumed turn did not complete: {done}")

    def close(self) -> None:
        self.events.close()
        self.turns.close()
        self.conn.release()
        self.rt.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile_queue", description=__doc__)
    parser.add_argument("--cycles", type=int, default=300, help="timed cycles (300)")
    parser.add_argument("--warmup", type=int, default=30, help="untimed cycles first (30)")
    parser.add_argument("--store", help="store URL (default: a SQLite file in a temp dir)")
    parser.add_argument("--no-profile", action="store_true", help="step times only")
    parser.add_argument("--interval", type=float, default=0.0002, help="sampling seconds (0.0002)")
    args = parser.parse_args(argv)
    profiler: Any = None
    if not args.no_profile:
        try:
            from pyinstrument import Profiler
        except ImportError:
            print("pyinstrument is not installed: pip install pyinstrument", file=sys.stderr)
            return 2
        profiler = Profiler(interval=args.interval)
    processes = Processes()
    with tempfile.TemporaryDirectory(prefix="interlock-profile-") as tmp:
        try:
            broker_url = redis_server(processes, Path(tmp))
            store_url = args.store or f"sqlite:///{Path(tmp) / 'interlock.db'}"
            harness = _Harness(broker_url, store_url)
            try:
                for _ in range(args.warmup):
                    harness.cycle()
                harness.times.clear()
                harness.cpu.clear()
                if profiler is not None:
                    profiler.start()
                t0, c0 = time.perf_counter(), time.process_time()
                for _ in range(args.cycles):
                    harness.cycle()
                elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
                if profiler is not None:
                    profiler.stop()
            finally:
                harness.close()
        finally:
            processes.stop_all()

    cycles: int = args.cycles

    def per_cycle(seconds: float) -> float:
        return round(seconds * 1000 / cycles, 3)

    figures = {
        "ms_per_cycle": per_cycle(elapsed),
        "cpu_ms_per_cycle": per_cycle(cpu),
        "steps_ms": {k: per_cycle(v) for k, v in harness.times.items()},
        "steps_cpu_ms": {k: per_cycle(v) for k, v in harness.cpu.items()},
    }
    print(json.dumps(figures))
    if profiler is not None:
        print(profiler.output_text(unicode=False, color=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
