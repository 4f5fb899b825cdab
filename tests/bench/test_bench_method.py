"""How the benchmarks measure, checked piece by piece: the commits read from a SQLite
write-ahead log, the order systems run in from round to round, and the in-flight
pipeline of the queued benchmark (driven here by a system that answers at once, so
that its bookkeeping, not a broker, is what is checked)."""

from __future__ import annotations

import sqlite3
from collections import Counter, deque
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from bench import queue_cycle
from bench._common import percentile, round_order
from bench._wal import checkpoint, wal_bytes, wal_commits


@pytest.fixture
def wal(tmp_path: Path) -> Iterator[tuple[Path, sqlite3.Connection]]:
    """A SQLite file in WAL mode with one table, and a connection in autocommit."""
    db = tmp_path / "a.db"
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE t (x TEXT)")
    yield db, conn
    conn.close()


def test_the_commits_in_a_wal_are_its_transactions_that_wrote(
    wal: tuple[Path, sqlite3.Connection],
) -> None:
    db, conn = wal
    checkpoint(db)
    assert wal_bytes(db) == 0 and wal_commits(db) == 0
    conn.execute("INSERT INTO t VALUES ('one statement, one commit')")
    conn.execute("BEGIN")
    for i in range(50):  # many pages, one commit
        conn.execute("INSERT INTO t VALUES (?)", ("x" * 2000 + str(i),))
    conn.execute("COMMIT")
    conn.execute("SELECT count(*) FROM t").fetchone()  # a read commits nothing
    conn.execute("BEGIN")
    conn.execute("INSERT INTO t VALUES ('rolled back')")
    conn.execute("ROLLBACK")
    assert wal_commits(db) == 2


def test_after_a_checkpoint_the_frames_of_the_old_wal_are_not_counted(
    wal: tuple[Path, sqlite3.Connection],
) -> None:
    db, conn = wal
    for i in range(6):
        conn.execute("INSERT INTO t VALUES (?)", (str(i),))
    conn.execute("PRAGMA wal_checkpoint(PASSIVE)")  # the WAL restarts, not truncated
    conn.execute("INSERT INTO t VALUES ('after')")
    assert wal_bytes(db) > 0
    assert wal_commits(db) == 1


def test_a_checkpoint_held_back_by_a_reader_is_said(wal: tuple[Path, sqlite3.Connection]) -> None:
    db, conn = wal
    reader = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute("INSERT INTO t VALUES ('x')")
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM t").fetchone()  # holds a snapshot of the WAL
        conn.execute("INSERT INTO t VALUES ('y')")
        with pytest.raises(RuntimeError, match="the WAL checkpoint was held back"):
            checkpoint(db)
    finally:
        reader.close()


def test_not_a_wal_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "a.db"
    (tmp_path / "a.db-wal").write_bytes(b"\x00" * 64)
    with pytest.raises(ValueError, match="not a SQLite WAL"):
        wal_commits(db)


@pytest.mark.parametrize("count", [2, 3, 9])
def test_over_an_even_number_of_rounds_each_system_follows_another_as_often_as_it_precedes_it(
    count: int,
) -> None:
    systems = [f"s{i}" for i in range(count)]
    rounds = 2 * count
    follows: Counter[tuple[str, str]] = Counter()
    for r in range(rounds):
        order = round_order(systems, r)
        assert sorted(order) == systems  # every system, once a round
        follows.update(pairwise(order))
    for (a, b), n in follows.items():
        assert follows[(b, a)] == n, (a, b, follows)
    firsts = Counter(round_order(systems, r)[0] for r in range(rounds))
    assert set(firsts) == set(systems)  # and each runs first in some round


def test_the_median_of_an_even_count_is_the_mean_of_the_middle_two() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([1.0, 2.0, 3.0], 50) == 2.0
    assert percentile([float(i) for i in range(1, 101)], 99) == 99.0


class _Instant(queue_cycle.System):
    """A system whose cycles answer in the order they start: each poll delivers the
    first event of every cycle started, then the last event of the oldest one. It
    records how many cycles were in flight at each completion."""

    name = "instant"

    def __init__(self) -> None:
        self.reader: Any = self
        self.processes = []
        self.cpu_groups = {}
        self.serial = 0
        self.waiting: deque[str] = deque()
        self.replied: deque[str] = deque()
        self.in_flight_at_done: list[int] = []
        self.outstanding: set[str] = set()

    def submit(self) -> str:
        self.serial += 1
        key = f"c{self.serial}"
        self.waiting.append(key)
        self.outstanding.add(key)
        return key

    def poll(self, timeout: float) -> list[dict[str, Any]]:
        events = [{"key": k, "kind": queue_cycle.FIRST} for k in self.waiting]
        self.waiting.clear()
        if self.replied:
            key = self.replied.popleft()
            self.in_flight_at_done.append(len(self.outstanding))
            self.outstanding.discard(key)
            events.append({"key": key, "kind": queue_cycle.DONE})
        return events

    def classify(self, body: dict[str, Any]) -> tuple[str | None, str]:
        return body["key"], body["kind"]

    def reply(self, key: str, body: dict[str, Any]) -> None:
        self.replied.append(key)

    def close(self) -> None:
        pass


@pytest.mark.parametrize("in_flight", [1, 3, 8])
def test_every_timed_cycle_completes_with_the_level_in_flight(in_flight: int) -> None:
    system = _Instant()
    cycles = 20
    batch = queue_cycle.pipeline(system, in_flight, cycles, ramp=in_flight)
    assert len(batch.latencies) == cycles
    assert batch.completed == in_flight + cycles + in_flight - 1  # ramp, timed, drain
    assert system.outstanding == set()  # the drain finished every cycle started
    timed = system.in_flight_at_done[in_flight : in_flight + cycles]
    assert timed == [in_flight] * cycles, system.in_flight_at_done
