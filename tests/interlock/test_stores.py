"""One test suite for every session store: memory, SQLite and PostgreSQL."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any, cast

import pytest
from sqlalchemy import event, func, make_url, select, text
from sqlalchemy.exc import DBAPIError
from sqlmodel import SQLModel

from interlock import StatusError
from interlock.stores import (
    InMemorySessionStore,
    LatestSnapshotId,
    SessionStore,
    SnapshotHeads,
    SqlSessionStore,
)
from schemas import (
    ErrorInfo,
    FinishReason,
    Message,
    Part,
    Snapshot,
    SnapshotStatus,
    Status,
    ToolRequest,
)
from tests.sql_helpers import terminate_backends

T0 = datetime(2025, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)


def msg(text_: str, role: str = "user") -> Message:
    return Message.model_validate({"role": role, "content": [{"text": text_}]})


def snap(
    snapshot_id: str,
    session_id: str = "s1",
    *,
    status: SnapshotStatus = SnapshotStatus.COMPLETED,
    finish_reason: FinishReason | None = FinishReason.INTERRUPTED,
    messages: list[Message] | None = None,
    **kw: Any,
) -> Snapshot:
    return Snapshot(
        snapshot_id=snapshot_id,
        session_id=session_id,
        agent="a",
        status=status,
        finish_reason=finish_reason,
        messages=messages if messages is not None else [msg("hi")],
        **kw,
    )


def sql_url(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    url: str = request.getfixturevalue("pg_url")
    return url


@pytest.fixture(params=["memory", "sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SessionStore]:
    if request.param == "memory":
        yield InMemorySessionStore()
        return
    sql = SqlSessionStore(sql_url(request.param, request, tmp_path))
    try:
        yield sql
    finally:
        sql.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def sql_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SqlSessionStore]:
    sql = SqlSessionStore(sql_url(request.param, request, tmp_path))
    try:
        yield sql
    finally:
        sql.close()


def ids(snaps: list[Snapshot]) -> list[str]:
    return [s.snapshot_id for s in snaps]


# ------------------------------------------------------------------ every store


def test_is_a_session_store(store: SessionStore) -> None:
    assert isinstance(store, SessionStore)


def test_round_trip(store: SessionStore) -> None:
    messages = [
        Message(role="system", content=[Part(text="be brief")]),
        msg("Transfer $500 to savings."),
        Message(
            role="model",
            content=[
                Part(text="Sure."),
                Part(
                    tool_request=ToolRequest(
                        name="transferMoney", ref="r1", input={"amount": 500.0, "to": "sav"}
                    ),
                    metadata={"interrupt": {"action": "transferMoney", "n": [1, 2.5, None]}},
                ),
            ],
            metadata={"k": "ü ✓"},
        ),
        Message(role="tool", content=[Part(data={"nested": {"x": [True, False]}})]),
    ]
    s = snap(
        "snap-1",
        parent_id="snap-0",
        messages=messages,
        error=ErrorInfo(status=Status.INTERNAL, message="tool 'x' failed"),
        created_at=T0,
        updated_at=T0 + timedelta(seconds=1),
        expires_at=T0 + timedelta(days=1),
        resume_token_hash="abc123",
    )
    store.save_snapshot(s)
    got = store.get_snapshot("snap-1")
    assert got == s
    assert got.messages == messages
    assert got.error == ErrorInfo(status=Status.INTERNAL, message="tool 'x' failed")
    assert got.created_at == T0
    assert got.updated_at == T0 + timedelta(seconds=1)
    assert got.expires_at == T0 + timedelta(days=1)
    for ts in (got.created_at, got.updated_at, got.expires_at):
        assert ts is not None
        assert ts.utcoffset() == timedelta(0)
    # A copy: changing it does not change the store.
    got.messages.append(msg("extra"))
    again = store.get_snapshot("snap-1")
    assert again is not None
    assert len(again.messages) == 4


def test_timestamps_in_other_zones_keep_their_instant(store: SessionStore) -> None:
    plus2 = timezone(timedelta(hours=2))
    store.save_snapshot(snap("z", created_at=T0.astimezone(plus2), updated_at=T0))
    got = store.get_snapshot("z")
    assert got is not None
    assert got.created_at == T0
    assert got.created_at.utcoffset() is not None


def test_unknown_ids(store: SessionStore) -> None:
    assert store.get_snapshot("nope") is None
    assert store.get_latest_snapshot("nope") is None
    assert store.list_snapshots() == []
    assert store.list_snapshots(session_id="nope") == []
    assert store.claim("nope", "w1") is False
    store.release("nope", "w1")  # no error


def test_get_latest_snapshot_is_newest_of_any_status(store: SessionStore) -> None:
    store.save_snapshot(snap("a", "s1"))
    store.save_snapshot(snap("x", "s2"))
    store.save_snapshot(
        snap("b", "s1", status=SnapshotStatus.FAILED, finish_reason=FinishReason.FAILED)
    )
    store.save_snapshot(snap("y", "s2"))
    latest = store.get_latest_snapshot("s1")
    assert latest is not None
    assert latest.snapshot_id == "b"
    # Saving an older snapshot again does not make it the newest.
    store.save_snapshot(snap("a", "s1", status=SnapshotStatus.EXPIRED))
    latest = store.get_latest_snapshot("s1")
    assert latest is not None
    assert latest.snapshot_id == "b"
    latest2 = store.get_latest_snapshot("s2")
    assert latest2 is not None
    assert latest2.snapshot_id == "y"
    # Both stores name the newest without reading a history, in the same order.
    assert isinstance(store, LatestSnapshotId)
    assert [store.latest_snapshot_id(s) for s in ("s1", "s2", "nope")] == ["b", "y", None]


def test_heads_are_snapshots_without_their_history(store: SessionStore) -> None:
    """`SnapshotHeads`: every field as the whole read has it, `messages` empty."""
    assert isinstance(store, SnapshotHeads)
    store.save_snapshot(
        snap("a", messages=[msg("one"), msg("two", "model")], finish_reason=FinishReason.STOP)
    )
    store.save_snapshot(
        snap(
            "b",
            parent_id="a",
            inherited=2,
            messages=[msg("one"), msg("two", "model"), msg("three")],
            expires_at=datetime.now(UTC) + timedelta(hours=1),
            resume_token_hash="h",
            turn_id="t-b",
        )
    )
    store.save_snapshot(
        snap("x", "s2", status=SnapshotStatus.FAILED, finish_reason=FinishReason.FAILED)
    )
    assert store.claim("b", "w1")

    def headed(s: Snapshot | None) -> Snapshot | None:
        return None if s is None else s.model_copy(update={"messages": []})

    for sid in ("a", "b", "x", "nope"):
        assert store.get_snapshot_head(sid) == headed(store.get_snapshot(sid)), sid
    head = store.get_snapshot_head("b")
    assert head is not None and head.messages == [] and head.resumed_by == "w1"
    listings: list[dict[str, Any]] = [
        {},
        {"session_id": "s1"},
        {"session_id": "s1", "limit": 1},
        {"session_id": "s1", "status": SnapshotStatus.COMPLETED, "claimed": False},
        {"finish_reason": FinishReason.FAILED},
        {"claimed": True},
        {"limit": 0},
    ]
    for kwargs in listings:
        heads = store.list_snapshot_heads(**kwargs)
        assert heads == [headed(s) for s in store.list_snapshots(**kwargs)], kwargs
    with pytest.raises(StatusError) as info:
        store.list_snapshot_heads(status="paused")  # type: ignore[arg-type]
    assert info.value.status is Status.INVALID_ARGUMENT


def test_list_filters_order_and_limit(store: SessionStore) -> None:
    # Same timestamps everywhere: order must come from insertion, not from clocks.
    same: dict[str, Any] = {"created_at": T0, "updated_at": T0}
    store.save_snapshot(snap("p1", "s1", **same))
    store.save_snapshot(snap("done", "s1", finish_reason=FinishReason.STOP, **same))
    store.save_snapshot(snap("p2", "s2", **same))
    store.save_snapshot(
        snap("f", "s1", status=SnapshotStatus.FAILED, finish_reason=FinishReason.FAILED, **same)
    )
    store.save_snapshot(snap("p3", "s1", **same))
    assert store.claim("p3", "w1")

    assert ids(store.list_snapshots()) == ["p3", "f", "p2", "done", "p1"]
    assert ids(store.list_snapshots(session_id="s1")) == ["p3", "f", "done", "p1"]
    assert ids(store.list_snapshots(session_id="s2")) == ["p2"]
    assert ids(store.list_snapshots(status=SnapshotStatus.FAILED)) == ["f"]
    assert ids(store.list_snapshots(status=SnapshotStatus.COMPLETED)) == [
        "p3",
        "p2",
        "done",
        "p1",
    ]
    assert ids(store.list_snapshots(finish_reason=FinishReason.INTERRUPTED)) == ["p3", "p2", "p1"]
    assert ids(store.list_snapshots(finish_reason=FinishReason.STOP)) == ["done"]
    # `interlock pending`: interrupted and not claimed.
    pending = store.list_snapshots(finish_reason=FinishReason.INTERRUPTED, claimed=False)
    assert ids(pending) == ["p2", "p1"]
    assert ids(store.list_snapshots(claimed=True)) == ["p3"]
    assert ids(
        store.list_snapshots(
            session_id="s1",
            status=SnapshotStatus.COMPLETED,
            finish_reason=FinishReason.INTERRUPTED,
            claimed=False,
        )
    ) == ["p1"]
    assert ids(store.list_snapshots(limit=2)) == ["p3", "f"]
    assert ids(store.list_snapshots(session_id="s1", limit=1)) == ["p3"]
    assert store.list_snapshots(limit=0) == []
    # Listed snapshots carry their whole history too.
    assert all(s.messages == [msg("hi")] for s in store.list_snapshots())


def test_list_filters_take_known_values_only(store: SessionStore) -> None:
    store.save_snapshot(snap("p1"))
    statuses = "pending, completed, failed, aborted, expired"
    with pytest.raises(StatusError) as paused:
        store.list_snapshots(status="interrupted")  # type: ignore[arg-type]
    assert paused.value.status is Status.INVALID_ARGUMENT
    assert paused.value.message == (
        f"unknown snapshot status 'interrupted' (valid: {statuses}); a paused snapshot has "
        "status 'completed' and finish_reason 'interrupted' "
        "(list_snapshots(status='completed', finish_reason='interrupted'))"
    )
    with pytest.raises(StatusError) as done:
        store.list_snapshots(status="done", limit=0)  # type: ignore[arg-type]
    assert done.value.status is Status.INVALID_ARGUMENT
    assert done.value.message == f"unknown snapshot status 'done' (valid: {statuses})"
    with pytest.raises(StatusError) as reason:
        store.list_snapshots(finish_reason="paused")  # type: ignore[arg-type]
    assert reason.value.status is Status.INVALID_ARGUMENT
    assert reason.value.message == (
        "unknown finish_reason 'paused' (valid: stop, length, blocked, interrupted, other, "
        "unknown, aborted, failed, expired)"
    )
    # The values as strings are fine: what the hint says finds the paused snapshot.
    found = store.list_snapshots(status="completed", finish_reason="interrupted")  # type: ignore[arg-type]
    assert ids(found) == ["p1"]


def test_claim_is_once_only(store: SessionStore) -> None:
    store.save_snapshot(snap("s"))
    assert store.claim("s", "w1") is True
    assert store.claim("s", "w2") is False
    assert store.claim("s", "w1") is True  # idempotent for the holder
    got = store.get_snapshot("s")
    assert got is not None
    assert got.resumed_by == "w1"
    assert got.updated_at.tzinfo is not None


@pytest.mark.parametrize(
    ("status", "finish_reason"),
    [
        (SnapshotStatus.COMPLETED, FinishReason.STOP),
        (SnapshotStatus.COMPLETED, None),
        (SnapshotStatus.FAILED, FinishReason.INTERRUPTED),
        (SnapshotStatus.EXPIRED, FinishReason.INTERRUPTED),
        (SnapshotStatus.EXPIRED, FinishReason.EXPIRED),
        (SnapshotStatus.PENDING, FinishReason.INTERRUPTED),
        (SnapshotStatus.ABORTED, FinishReason.ABORTED),
    ],
)
def test_claim_refused_unless_completed_and_interrupted(
    store: SessionStore, status: SnapshotStatus, finish_reason: FinishReason | None
) -> None:
    store.save_snapshot(snap("s", status=status, finish_reason=finish_reason))
    assert store.claim("s", "w1") is False
    got = store.get_snapshot("s")
    assert got is not None
    assert got.resumed_by is None


def test_claim_refused_after_marked_expired(store: SessionStore) -> None:
    store.save_snapshot(snap("s"))
    store.save_snapshot(snap("s", status=SnapshotStatus.EXPIRED))
    assert store.claim("s", "w1") is False


def test_release_only_by_the_holder(store: SessionStore) -> None:
    store.save_snapshot(snap("s"))
    assert store.claim("s", "w1")
    store.release("s", "w2")  # not the holder: no-op
    got = store.get_snapshot("s")
    assert got is not None
    assert got.resumed_by == "w1"
    assert store.claim("s", "w2") is False

    store.release("s", "w1")
    got = store.get_snapshot("s")
    assert got is not None
    assert got.resumed_by is None
    assert ids(store.list_snapshots(claimed=False)) == ["s"]
    assert store.claim("s", "w2") is True
    assert store.claim("s", "w1") is False


def test_a_snapshot_built_without_validation_comes_back_valid(store: SessionStore) -> None:
    """`model_copy(update=...)` skips pydantic's checks: a status given as a plain
    string is read back as the enum, and one that is no status is refused."""
    built = snap("u").model_copy(update={"status": "failed", "finish_reason": "stop"})
    store.save_snapshot(built)
    got = store.get_snapshot("u")
    assert got is not None
    assert (got.status, got.finish_reason) == (SnapshotStatus.FAILED, FinishReason.STOP)
    assert type(got.status) is SnapshotStatus and type(got.finish_reason) is FinishReason
    with pytest.raises(ValueError, match="bogus"):
        store.save_snapshot(snap("v").model_copy(update={"status": "bogus"}))
    assert store.get_snapshot("v") is None


def test_resave_replaces(store: SessionStore) -> None:
    store.save_snapshot(snap("a", messages=[msg("1"), msg("2"), msg("3")]))
    store.save_snapshot(snap("b"))
    assert store.claim("a", "w1")
    replaced = snap(
        "a",
        status=SnapshotStatus.FAILED,
        finish_reason=FinishReason.FAILED,
        messages=[msg("1"), msg("two")],
        error=ErrorInfo(status=Status.DEADLINE_EXCEEDED, message="late"),
        resumed_by=None,
    )
    store.save_snapshot(replaced)
    # all but the claim, which only `claim` and `release` change
    assert store.get_snapshot("a") == replaced.model_copy(update={"resumed_by": "w1"})
    assert ids(store.list_snapshots()) == ["b", "a"]  # still in first-save order
    assert ids(store.list_snapshots(status=SnapshotStatus.FAILED)) == ["a"]
    assert store.claim("a", "w2") is False


# --------------------------------------------------------------- SQL store only


def message_rows(store: SqlSessionStore) -> int:
    with store.engine.connect() as conn:
        n = conn.execute(select(func.count()).select_from(text("interlock_message"))).scalar_one()
    return int(n)


def child(
    parent: Snapshot, snapshot_id: str, new: list[Message], *, keep: int | None = None
) -> Snapshot:
    """A child of `parent` that keeps its first `keep` messages (all by default)."""
    keep = len(parent.messages) if keep is None else keep
    return snap(
        snapshot_id,
        parent.session_id,
        parent_id=parent.snapshot_id,
        messages=[*parent.messages[:keep], *new],
        inherited=keep,
    )


def _chain_and_forks(store: SessionStore) -> list[Snapshot]:
    """A chain of six snapshots, a resume that replaces the last message, a grandchild
    of it and a fork from the middle; every one saved. Returns them all."""
    root = snap("t0", messages=[msg("sys", "system"), msg("u0")])
    store.save_snapshot(root)
    chain = [root]
    for i in range(1, 6):
        chain.append(child(chain[-1], f"t{i}", [msg(f"m{i}", "model"), msg(f"u{i}")]))
        store.save_snapshot(chain[-1])
    assert len(chain[-1].messages) == 12
    # The resume replaces the last message (an interrupt became resolved) and adds one.
    resolved = child(chain[-1], "t6", [msg("u5 resolved"), msg("tool out", "tool")], keep=11)
    grand = child(resolved, "t7", [msg("m7", "model")])
    fork = child(chain[2], "fork", [msg("other way")], keep=3)
    for s in (resolved, grand, fork):
        store.save_snapshot(s)
    return [*chain, resolved, grand, fork]


def test_histories_round_trip_through_chains_and_forks(store: SessionStore) -> None:
    """Every store gives each snapshot back with its whole history, whatever it keeps
    (the SQL store and the memory store keep only what a snapshot added)."""
    saved = _chain_and_forks(store)
    for s in saved:
        got = store.get_snapshot(s.snapshot_id)
        assert got is not None
        assert got.messages == s.messages, s.snapshot_id
        assert got.inherited == 0, "what is read back owes nothing to a parent"
    listed = {s.snapshot_id: s for s in store.list_snapshots()}
    assert all(listed[s.snapshot_id].messages == s.messages for s in saved)
    resolved = store.get_snapshot("t6")
    parent = store.get_snapshot("t5")
    assert resolved is not None and parent is not None
    assert [m.text for m in resolved.messages[-3:]] == ["m5", "u5 resolved", "tool out"]
    assert parent.messages[-1].text == "u5", "the parent keeps its own version"


def test_a_returned_history_is_the_callers_to_change(store: SessionStore) -> None:
    saved = _chain_and_forks(store)
    got = store.get_snapshot("t7")
    assert got is not None
    got.messages[0].content[0].text = "changed"
    got.messages.append(msg("extra"))
    for s in saved:
        again = store.get_snapshot(s.snapshot_id)
        assert again is not None and again.messages == s.messages, s.snapshot_id


def test_resave_with_inherited_keeps_its_history(store: SessionStore) -> None:
    a = snap("a", messages=[msg("1"), msg("2")])
    b = child(a, "b", [msg("3")])
    store.save_snapshot(a)
    store.save_snapshot(b)
    assert store.claim("b", "w1")
    store.save_snapshot(b.model_copy(update={"status": SnapshotStatus.EXPIRED}))
    got = store.get_snapshot("b")
    assert got is not None
    assert got.status == SnapshotStatus.EXPIRED
    assert got.messages == b.messages


def test_an_edited_history_saved_again_is_kept_as_edited(store: SessionStore) -> None:
    """A snapshot read back, its inherited messages edited (a redaction), saved again:
    it reads back as saved, and its parent is left as it was."""
    saved = _chain_and_forks(store)
    got = store.get_snapshot("t7")
    assert got is not None
    got.messages[1] = msg("[redacted]")
    store.save_snapshot(got)
    again = store.get_snapshot("t7")
    assert again is not None and again.messages == got.messages
    assert again.messages[1].text == "[redacted]"
    by_id = {s.snapshot_id: s for s in saved}
    for sid in ("t0", "t5", "t6", "fork"):
        kept = store.get_snapshot(sid)
        assert kept is not None and kept.messages == by_id[sid].messages, sid


def test_replacing_a_snapshot_changes_no_other(store: SessionStore) -> None:
    """A snapshot replaced with a history edited and made shorter: its children,
    grandchildren and forks keep the histories they were saved with (the SQL store
    gives them their own rows of what they inherited first), and the session goes on
    from its latest snapshot."""
    saved = _chain_and_forks(store)
    t2 = store.get_snapshot("t2")
    assert t2 is not None
    t2.messages = [msg("[redacted]")]
    store.save_snapshot(t2)
    got = store.get_snapshot("t2")
    assert got is not None and [m.text for m in got.messages] == ["[redacted]"]
    for s in saved:
        if s.snapshot_id != "t2":
            kept = store.get_snapshot(s.snapshot_id)
            assert kept is not None and kept.messages == s.messages, s.snapshot_id
    latest = store.get_latest_snapshot("s1")
    assert latest is not None and latest.snapshot_id == "fork"
    listed = {x.snapshot_id: x.messages for x in store.list_snapshots(session_id="s1")}
    assert all(listed[s.snapshot_id] == s.messages for s in saved if s.snapshot_id != "t2")
    # saved again as it was: nothing else changes either
    store.save_snapshot(saved[2])
    for s in saved:
        kept = store.get_snapshot(s.snapshot_id)
        assert kept is not None and kept.messages == s.messages, s.snapshot_id


def test_a_save_does_not_undo_a_claim(store: SessionStore) -> None:
    """A copy read before a claim, saved after it (a sweeper, a repair script): the
    claim stands, and no second claimer gets it. Claims change only through `claim`
    and `release`."""
    store.save_snapshot(snap("p"))
    stale = store.get_snapshot("p")
    assert stale is not None and stale.resumed_by is None
    assert store.claim("p", "first")
    store.save_snapshot(stale)
    got = store.get_snapshot("p")
    assert got is not None and got.resumed_by == "first"
    assert not store.claim("p", "second"), "exactly one claimer"
    store.release("p", "first")
    claimed = stale.model_copy(update={"resumed_by": "forged"})
    store.save_snapshot(claimed)
    got = store.get_snapshot("p")
    assert got is not None and got.resumed_by is None, "nor does a save make one"
    assert store.claim("p", "second")


def test_inherited_from_unknown_parent_keeps_everything(store: SessionStore) -> None:
    orphan = snap("o", parent_id="gone", messages=[msg("1"), msg("2"), msg("3")], inherited=2)
    store.save_snapshot(orphan)
    got = store.get_snapshot("o")
    assert got is not None
    assert got.messages == orphan.messages
    assert got.inherited == 0, "nothing was left to a parent the store does not have"


def test_a_replace_waits_for_a_child_saved_on_its_length(
    sql_store: SqlSessionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A child's save counts on its parent's length (it leaves that many messages to
    the parent's rows); a replace of the parent made shorter meanwhile, through another
    store object (another process), waits until the child is saved, then gives it rows
    of its own: the child's history stays whole. (On SQLite writes run one at a time;
    on PostgreSQL the child's read locks the parent's row.)"""
    import threading

    other = SqlSessionStore(str(sql_store.engine.url.render_as_string(hide_password=False)))
    parent = snap("P", messages=[msg("a"), msg("b"), msg("c")])
    sql_store.save_snapshot(parent)
    counted, go = threading.Event(), threading.Event()
    base = SqlSessionStore._storage_base

    def held(self: SqlSessionStore, conn: Any, snapshot: Snapshot) -> int:
        kept = base(self, conn, snapshot)
        if snapshot.snapshot_id == "C":
            counted.set()
            go.wait(30)
        return kept

    monkeypatch.setattr(SqlSessionStore, "_storage_base", held)
    kid = child(parent, "C", [msg("d")])
    saving = threading.Thread(target=sql_store.save_snapshot, args=(kid,))
    saving.start()
    try:
        assert counted.wait(30)
        replacing = threading.Thread(
            target=other.save_snapshot, args=(snap("P", messages=[msg("[redacted]")]),)
        )
        replacing.start()
        replacing.join(0.5)
        assert replacing.is_alive(), "the replace waits for the child's save"
    finally:
        go.set()
        saving.join(30)
    replacing.join(30)
    try:
        got, replaced = sql_store.get_snapshot("C"), sql_store.get_snapshot("P")
        assert got is not None and [m.text for m in got.messages] == ["a", "b", "c", "d"]
        assert replaced is not None and [m.text for m in replaced.messages] == ["[redacted]"]
    finally:
        other.close()


def test_sql_store_keeps_each_message_once(sql_store: SqlSessionStore) -> None:
    _chain_and_forks(sql_store)
    assert message_rows(sql_store) == 12 + 2 + 1 + 1
    a = snap("a", messages=[msg("1"), msg("2")])
    sql_store.save_snapshot(a)
    sql_store.save_snapshot(child(a, "b", [msg("3")]))
    sql_store.save_snapshot(child(a, "b", [msg("3")]))  # saved again: replaced, not added
    assert message_rows(sql_store) == 16 + 3
    sql_store.save_snapshot(snap("o", parent_id="gone", messages=[msg("x")] * 3, inherited=2))
    assert message_rows(sql_store) == 16 + 3 + 3
    # t1 saved again as read back: it owes nothing to t0 then, and is stored whole (4
    # rows where it had 2); its child t2 first gets rows of its own for the 4 it took
    # from t1; the snapshots below t2 still read through it
    t1 = sql_store.get_snapshot("t1")
    assert t1 is not None
    sql_store.save_snapshot(t1)
    assert message_rows(sql_store) == 16 + 3 + 3 + (4 - 2) + 4


def test_memory_store_shares_inherited_texts_with_the_parent() -> None:
    """The memory store keeps each message's JSON once: a child holds the very text
    objects of the messages it inherited, and serializes only the ones it added."""
    store = InMemorySessionStore()
    _chain_and_forks(store)
    kept = store._snapshots
    t5, t6, fork, t2 = kept["t5"].texts, kept["t6"].texts, kept["fork"].texts, kept["t2"].texts
    assert all(a is b for a, b in zip(t6[:11], t5[:11], strict=True))
    assert t6[11] is not t5[11], "the replaced message has a text of its own"
    assert all(a is b for a, b in zip(fork[:3], t2[:3], strict=True))
    assert all(kept["t7"].texts[i] is t6[i] for i in range(13))


def test_history_is_read_in_a_bounded_number_of_queries(sql_store: SqlSessionStore) -> None:
    chain = [snap("c0", messages=[msg("0")])]
    sql_store.save_snapshot(chain[0])
    for i in range(1, 30):
        chain.append(child(chain[-1], f"c{i}", [msg(str(i))]))
        sql_store.save_snapshot(chain[-1])

    selects: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "SELECT" in statement.upper():
            selects.append(statement)

    event.listen(sql_store.engine, "before_cursor_execute", count)
    try:
        got = sql_store.get_snapshot("c29")
        assert got is not None
        assert [m.text for m in got.messages] == [str(i) for i in range(30)]
        assert len(selects) <= 2
        selects.clear()
        listed = sql_store.list_snapshots(limit=30)
        assert [len(s.messages) for s in listed] == list(range(30, 0, -1))
        assert len(selects) <= 2
    finally:
        event.remove(sql_store.engine, "before_cursor_execute", count)


def test_tables_live_in_their_own_metadata(sql_store: SqlSessionStore) -> None:
    assert set(SqlSessionStore.metadata.tables) == {"interlock_snapshot", "interlock_message"}
    assert sql_store.metadata is SqlSessionStore.metadata
    assert "interlock_snapshot" not in SQLModel.metadata.tables
    sql_store.create_tables()  # idempotent


def test_two_stores_share_one_database(sql_store: SqlSessionStore) -> None:
    other = SqlSessionStore(sql_store.engine.url.render_as_string(hide_password=False))
    try:
        sql_store.save_snapshot(snap("shared"))
        got = other.get_snapshot("shared")
        assert got is not None
        assert other.claim("shared", "w1")
        assert sql_store.claim("shared", "w2") is False
    finally:
        other.close()


def test_a_thread_gets_the_connection_it_gave_back_last(sql_store: SqlSessionStore) -> None:
    """The pool hands out the most recently returned connection first, so one thread
    doing transaction after transaction keeps using one warm connection."""
    engine = sql_store.engine
    first, second = engine.connect(), engine.connect()
    a, b = first.connection.dbapi_connection, second.connection.dbapi_connection
    assert a is not b
    first.close()
    second.close()  # returned last
    for _ in range(3):
        with engine.connect() as conn:
            assert conn.connection.dbapi_connection is b
        with sql_store.writer().begin() as conn:
            assert conn.connection.dbapi_connection is b


def test_in_memory_sqlite_url() -> None:
    with SqlSessionStore("sqlite://") as mem:
        mem.save_snapshot(snap("m", messages=[msg("1"), msg("2")]))
        got = mem.get_snapshot("m")
        assert got is not None
        assert len(got.messages) == 2


@pytest.mark.parametrize(("query", "expected"), [("", 2), ("?synchronous=normal", 1)])
def test_sqlite_synchronous_from_the_url(tmp_path: Path, query: str, expected: int) -> None:
    """SQLite's default (FULL: every commit waits for the disk) unless the URL opts out."""
    with SqlSessionStore(f"sqlite:///{tmp_path}/s.db{query}") as store:
        store.save_snapshot(snap("s", messages=[msg("1")]))
        with store.engine.connect() as conn:
            assert conn.execute(text("PRAGMA synchronous")).scalar() == expected
        assert store.get_snapshot("s") is not None
    assert (tmp_path / "s.db").exists(), "the option is not part of the file name"


def test_sqlite_synchronous_must_be_known(tmp_path: Path) -> None:
    with pytest.raises(StatusError) as info:
        SqlSessionStore(f"sqlite:///{tmp_path}/s.db?synchronous=sometimes")
    assert info.value.status is Status.INVALID_ARGUMENT
    assert "synchronous='sometimes'" in info.value.message
    assert "off, normal, full, extra" in info.value.message


@pytest.mark.parametrize(
    ("query", "ordinary", "relaxed"),
    [("", 2, 1), ("?synchronous=normal", 1, 1), ("?synchronous=off", 0, 0)],
)
def test_relaxed_writes_do_not_wait_for_the_disk_sqlite(
    tmp_path: Path, query: str, ordinary: int, relaxed: int
) -> None:
    """A relaxed write commits without waiting for the disk; every other transaction
    keeps the database's level (a connection goes back to it after a relaxed one)."""
    with SqlSessionStore(f"sqlite:///{tmp_path}/s.db{query}") as store:
        levels = []
        for engine in (store.writer(relaxed=True), store.writer(), store.writer(relaxed=True)):
            for _ in range(2):
                with engine.begin() as conn:
                    levels.append(conn.execute(text("PRAGMA synchronous")).scalar())
        assert levels == [relaxed, relaxed, ordinary, ordinary, relaxed, relaxed]
        with store.writer().begin() as conn:
            assert conn.execute(text("PRAGMA synchronous")).scalar() == ordinary
        with store.writer(relaxed=True).begin() as conn:  # and it writes, of course
            conn.execute(text("CREATE TABLE t (x INTEGER)"))
            conn.execute(text("INSERT INTO t VALUES (1)"))
        with store.engine.connect() as conn:
            assert conn.execute(text("SELECT x FROM t")).scalar() == 1


def test_relaxed_writes_do_not_wait_for_the_disk_postgresql(pg_url: str) -> None:
    with SqlSessionStore(pg_url) as store:
        with store.writer(relaxed=True).begin() as conn:
            assert conn.execute(text("SHOW synchronous_commit")).scalar() == "off"
            conn.execute(text("CREATE TABLE t (x INTEGER)"))
            conn.execute(text("INSERT INTO t VALUES (1)"))
        with store.writer().begin() as conn:
            assert conn.execute(text("SHOW synchronous_commit")).scalar() == "on"
            assert conn.execute(text("SELECT x FROM t")).scalar() == 1
        with store.engine.connect() as conn:
            assert conn.execute(text("SHOW synchronous_commit")).scalar() == "on"


# --------------------------------------------------------------- PostgreSQL connections


def test_postgres_pings_only_connections_that_sat_idle(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A busy store reuses its pooled connections without a ping (a round trip per
    transaction); one that sat idle for `PING_AFTER` is pinged first."""
    import interlock.stores.engine as engine_module

    store = SqlSessionStore(pg_url)
    pings: list[int] = []
    ping = store.engine.dialect.do_ping

    def counting(dbapi_conn: Any) -> bool:
        pings.append(1)
        return bool(ping(dbapi_conn))

    monkeypatch.setattr(store.engine.dialect, "do_ping", counting)
    try:
        store.save_snapshot(snap("p1"))
        for _ in range(5):
            assert store.get_snapshot("p1") is not None
        assert pings == [], "used a moment ago: no ping"
        monkeypatch.setattr(engine_module, "PING_AFTER", 0.0)
        for _ in range(3):
            assert store.get_snapshot("p1") is not None
        assert len(pings) == 3, "idle long enough (here: at all): pinged at each checkout"
    finally:
        store.close()


def test_postgres_connections_give_up_on_a_host_gone_silent(pg_url: str) -> None:
    """Every connection's socket carries TCP keepalives and a user timeout
    (`PG_KEEPALIVES`, set in the kernel through libpq): a host that has gone is given up
    on within a minute and a half, not two hours. A URL's own value wins."""
    import socket

    from interlock.stores.engine import PG_KEEPALIVES

    def socket_options(url: str) -> dict[str, int]:
        store = SqlSessionStore(url)
        try:
            with store.engine.connect() as conn:
                fd = cast(Any, conn.connection.dbapi_connection).fileno()
                sock = socket.socket(fileno=socket.dup(fd))
                try:
                    return {
                        "keepalives": sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
                        "keepalives_idle": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
                        "keepalives_interval": sock.getsockopt(
                            socket.IPPROTO_TCP, socket.TCP_KEEPINTVL
                        ),
                        "keepalives_count": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT),
                        "tcp_user_timeout": sock.getsockopt(
                            socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT
                        ),
                    }
                finally:
                    sock.close()
        finally:
            store.close()

    assert socket_options(pg_url) == PG_KEEPALIVES
    assert PG_KEEPALIVES["keepalives_idle"] != 7
    own = socket_options(f"{pg_url}?keepalives_idle=7")
    assert own == {**PG_KEEPALIVES, "keepalives_idle": 7}


def test_postgres_replaces_an_idle_connection_the_server_dropped(
    pg_url: str, pg_admin: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server ends the pool's connections (a restart, an idle timeout); once they sat
    idle for `PING_AFTER`, the next call gets a new connection and succeeds."""
    import interlock.stores.engine as engine_module

    store = SqlSessionStore(pg_url)
    try:
        store.save_snapshot(snap("d1"))
        assert store.get_snapshot("d1") is not None
        terminate_backends(pg_admin, make_url(pg_url).database)
        monkeypatch.setattr(engine_module, "PING_AFTER", 0.0)
        got = store.get_snapshot("d1")
        assert got is not None and got.snapshot_id == "d1"
    finally:
        store.close()


def test_postgres_a_relaxed_write_on_a_dropped_connection_is_a_store_failure(
    pg_url: str, pg_admin: str
) -> None:
    """A relaxed write begins with `SET LOCAL synchronous_commit`, sent from SQLAlchemy's
    `begin` event. On a connection the server dropped a moment ago (too recent to be
    pinged), that statement fails: it is SQLAlchemy's error, a store failure (the turn
    is retried, not failed or dropped), and the connection is not handed out again."""
    from interlock.stores.failures import is_store_failure

    store = SqlSessionStore(pg_url)
    try:
        store.save_snapshot(snap("r1"))
        with store.writer(relaxed=True).begin() as conn:
            assert conn.execute(text("SHOW synchronous_commit")).scalar_one() == "off"
        terminate_backends(pg_admin, make_url(pg_url).database)
        caught: Exception | None = None
        try:
            with store.writer(relaxed=True).begin() as conn:
                conn.execute(text("SELECT 1"))
        except Exception as exc:  # which type is the point: not the driver's own
            caught = exc
        assert isinstance(caught, DBAPIError), repr(caught)
        assert caught.connection_invalidated
        assert is_store_failure(caught)
        with store.writer(relaxed=True).begin() as conn:  # a new connection
            assert conn.execute(text("SHOW synchronous_commit")).scalar_one() == "off"
        assert store.get_snapshot("r1") is not None
    finally:
        store.close()


def test_postgres_a_failed_ping_retires_the_older_connections_too(
    pg_url: str, pg_admin: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server dropped every connection; the first one checked out sat idle long
    enough to be pinged, the second counts as used a moment ago (no ping). The failed
    ping retires both, so neither call fails."""
    import interlock.stores.engine as engine_module

    store = SqlSessionStore(pg_url)
    try:
        store.save_snapshot(snap("m1"))
        first, second = store.engine.connect(), store.engine.connect()
        first.close()
        second.close()
        time.sleep(0.2)
        terminate_backends(pg_admin, make_url(pg_url).database)
        monkeypatch.setattr(engine_module, "PING_AFTER", 0.1)  # idle long enough: pinged
        with store.engine.connect() as a:
            monkeypatch.setattr(engine_module, "PING_AFTER", 3600.0)  # recent enough: not
            with store.engine.connect() as b:
                assert a.execute(text("SELECT 1")).scalar_one() == 1
                assert b.execute(text("SELECT 1")).scalar_one() == 1
    finally:
        store.close()


def test_an_in_memory_sqlite_store_serves_threads_one_at_a_time() -> None:
    """`sqlite://` is one shared connection: threads racing to resume one pause get one
    winner and "already resumed" for the others, never a driver error such as "cannot
    start a transaction within a transaction"."""
    import threading

    from examples.banking import ApprovalReply, ai, transferMoney
    from interlock import AgentInput, ToolResume

    store = SqlSessionStore("sqlite://")
    try:
        agent = ai.lookup_agent("bankingAgent").with_store(store)
        paused = agent.run_text("Transfer $9 to threads")
        [ask] = paused.interrupts
        resume = AgentInput(
            resume=ToolResume(restart=[transferMoney.resume(ask, ApprovalReply(approved=True))])
        )
        start = threading.Barrier(8)
        outcomes: list[str] = []

        def race() -> None:
            start.wait()
            try:
                agent.run(resume, snapshot_id=paused.snapshot_id)
                outcomes.append("resumed")
            except StatusError as exc:
                outcomes.append(f"{exc.status.value}: {exc.message}")
            except Exception as exc:
                outcomes.append(f"unexpected {type(exc).__name__}: {exc}")

        threads = [threading.Thread(target=race) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert outcomes.count("resumed") == 1, outcomes
        refused = [o for o in outcomes if o != "resumed"]
        assert len(refused) == 7 and all(
            o.startswith("FAILED_PRECONDITION") and "already resumed" in o for o in refused
        ), outcomes
    finally:
        store.dispose()


def test_an_in_memory_sqlite_connection_given_back_by_another_thread_frees_it() -> None:
    """The connection of `sqlite://` taken in one thread and left for the garbage
    collector of another to give back is free again for a third."""
    import gc
    import threading

    store = SqlSessionStore("sqlite://")
    park = threading.Event()
    try:
        leaked: list[Any] = []

        def leak() -> None:
            conn = store.engine.connect()
            conn.exec_driver_sql("SELECT 1")
            leaked.append(conn)

        first = threading.Thread(target=leak)
        first.start()
        first.join()
        # Threads that stay alive meanwhile, so the third does not reuse the first's id.
        parked = [threading.Thread(target=park.wait, daemon=True) for _ in range(3)]
        for t in parked:
            t.start()
        leaked.clear()
        gc.collect()  # given back here, in the main thread
        got: list[bool] = []

        def third() -> None:
            with store.engine.connect() as conn:
                got.append(conn.exec_driver_sql("SELECT 1").scalar() == 1)

        worker = threading.Thread(target=third, daemon=True)
        worker.start()
        worker.join(timeout=10)
        assert got == [True]
    finally:
        park.set()
        store.dispose()


def test_a_stores_repr_hides_the_secrets_of_its_url(tmp_path: Path) -> None:
    """The password of the URL's user and the value of a query parameter holding one
    (libpq's `password`, `sslpassword`) are shown as ***; the rest as given."""
    store = SqlSessionStore(
        "postgresql+psycopg://bob:hunter2@127.0.0.1:1/db"
        "?sslpassword=opensesame&application_name=app&password=swordfish",
        create_tables=False,
    )
    try:
        shown = repr(store)
    finally:
        store.dispose()
    for secret in ("hunter2", "opensesame", "swordfish"):
        assert secret not in shown, shown
    assert "bob:***@127.0.0.1:1/db" in shown and "application_name=app" in shown, shown
    assert "sslpassword=***" in shown and "password=***" in shown, shown
    plain = SqlSessionStore(f"sqlite:///{tmp_path / 'r.db'}")
    try:
        assert repr(plain) == f"SqlSessionStore('sqlite:///{tmp_path / 'r.db'}')"
    finally:
        plain.dispose()
