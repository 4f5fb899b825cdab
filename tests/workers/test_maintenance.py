"""The resume consumer's upkeep deletes old outbox rows, but not every round."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import text

import workers.maintenance
from examples.banking import ai
from schemas import TurnInterrupted, utcnow
from tests.services import eventually
from workers.maintenance import Maintenance
from workers.runtime import Runtime
from workers.settings import Settings


@pytest.fixture
def runtime(tmp_path: Path, redis_url: str) -> Iterator[Runtime]:
    settings = Settings(broker_url=redis_url, store_url=f"sqlite:///{tmp_path}/s.db")
    rt = Runtime(settings, ai)
    yield rt
    rt.close()


def old_sent_row(rt: Runtime) -> str:
    """The id of an event published (its row marked sent) two weeks ago."""
    event = TurnInterrupted(
        agent="a", session_id="s", snapshot_id=str(uuid.uuid4()), interrupts=[], resume_token="t"
    )
    rt.outbox.add_now(event)
    rt.relay.flush()

    def marked() -> bool:
        with rt.store.engine.begin() as conn:
            done = conn.execute(
                text(
                    "UPDATE interlock_outbox SET sent_at = :t "
                    "WHERE event_id = :e AND sent_at IS NOT NULL"
                ),
                {"t": utcnow() - timedelta(days=14), "e": event.event_id},
            )
        return bool(done.rowcount)

    eventually(marked, "the row marked sent", 10)
    return event.event_id


def kept(rt: Runtime, *event_ids: str) -> list[str]:
    with rt.store.engine.connect() as conn:
        rows = conn.execute(text("SELECT event_id FROM interlock_outbox")).scalars().all()
    return [e for e in event_ids if e in rows]


def test_old_rows_go_a_batch_a_round_then_every_prune_interval(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A round that deletes a full batch is followed by another at the next round;
    once the backlog is gone, the next deletion waits `PRUNE_INTERVAL`."""
    monkeypatch.setattr(workers.maintenance, "PRUNE_BATCH", 1)
    upkeep = Maintenance(runtime)
    first, second = old_sent_row(runtime), old_sent_row(runtime)
    upkeep.run_once()
    assert len(kept(runtime, first, second)) == 1, "one batch of one row"
    upkeep.run_once()
    assert kept(runtime, first, second) == [], "a full batch: the next round goes on"
    upkeep.run_once()  # deletes nothing: the backlog is gone
    third = old_sent_row(runtime)
    upkeep.run_once()
    assert kept(runtime, third) == [third], "within PRUNE_INTERVAL of the last deletion"
    later = time.monotonic() + workers.maintenance.PRUNE_INTERVAL + 1
    monkeypatch.setattr(workers.maintenance, "monotonic", lambda: later)
    upkeep.run_once()
    assert kept(runtime, third) == []
