"""Client-managed state (docs/concepts.md): a signed, opaque string; edits are refused."""

import base64
import json
import logging
import os
import subprocess
import sys
import warnings
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from examples.banking import (
    ApprovalAsk,
    ApprovalReply,
    TransferOutput,
    transferMoney,
)
from interlock import (
    FinishReason,
    Interlock,
    Part,
    RandomSecretWarning,
    Snapshot,
    SnapshotStatus,
    Status,
    StatusError,
    ToolResume,
    interrupt_as,
)
from interlock import registry as registry_module
from interlock.state import StateCodec


def store_less_bank(secret: str | None = "test", name: str = "bank") -> tuple[Any, Any]:
    ai = Interlock(secret=secret)
    tool = ai.define_interruptible_tool("transferMoney", "transfer", transferMoney.fn)
    return ai.define_agent(name, model="scripted/banking", tools=[tool]), tool


def decode_body(state: str) -> dict[str, Any]:
    _, body, _ = state.split(".")
    raw = zlib.decompress(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    data: dict[str, Any] = json.loads(raw)
    return data


def encode_body(data: dict[str, Any]) -> str:
    raw = json.dumps(data).encode()
    return base64.urlsafe_b64encode(zlib.compress(raw)).rstrip(b"=").decode()


def test_output_has_state_not_snapshot_id() -> None:
    agent, _tool = store_less_bank()
    out = agent.run_text("Transfer $500 to savings.")
    assert out.finish_reason is FinishReason.INTERRUPTED
    assert out.snapshot_id is None and out.session_id is not None
    assert isinstance(out.state, str) and out.state.startswith("v1.")
    assert out.state.count(".") == 2
    data = decode_body(out.state)
    assert data["sessionId"] == out.session_id and data["agent"] == "bank"
    assert data["status"] == "completed" and data["finishReason"] == "interrupted"
    assert "resumedBy" not in data


def test_resume_with_state() -> None:
    agent, tool = store_less_bank()
    out = agent.run_text("Transfer $500 to savings.")
    reply = tool.resume(out.interrupts[0], ApprovalReply(approved=True))
    final = agent.run(ToolResume(restart=[reply]), state=out.state)
    assert final.finish_reason is FinishReason.STOP
    assert final.text.startswith("Done: transferred $500.00 to savings, transaction txn-")
    assert final.snapshot_id is None and final.state is not None
    assert decode_body(final.state)["parentId"] == decode_body(out.state or "")["snapshotId"]


def test_repause_with_state() -> None:
    agent, tool = store_less_bank()
    out = agent.run_text("Transfer $1 to a then $2 to b")
    second = agent.run(
        ToolResume(respond=[tool.respond(out.interrupts[0], TransferOutput(success=True))]),
        state=out.state,
    )
    assert second.finish_reason is FinishReason.INTERRUPTED
    assert interrupt_as(second.interrupts[0], ApprovalAsk) == ApprovalAsk(
        action="transferMoney", details="Transfer $2.00 to b"
    )
    assert second.state != out.state


def test_forged_history_is_permission_denied() -> None:
    """A client re-encodes the state with the tool call already approved."""
    agent, tool = store_less_bank()
    out = agent.run_text("Transfer $500 to savings.")
    assert out.state is not None
    version, _body, signature = out.state.split(".")
    data = decode_body(out.state)
    call = data["messages"][-1]["content"][0]
    call["toolRequest"]["input"]["amount"] = 5_000_000
    forged = f"{version}.{encode_body(data)}.{signature}"
    assert forged != out.state
    reply = tool.resume(out.interrupts[0], ApprovalReply(approved=True))
    runs: tuple[Callable[[], object], ...] = (
        lambda: agent.run(ToolResume(restart=[reply]), state=forged),
        lambda: agent.run_text("hello", state=forged),
    )
    for run in runs:
        with pytest.raises(StatusError) as info:
            run()
        assert info.value.status is Status.PERMISSION_DENIED
        assert "state signature does not match" in info.value.message


@pytest.mark.parametrize("where", ["body", "signature"])
def test_flipped_character_is_permission_denied(where: str) -> None:
    agent, tool = store_less_bank()
    out = agent.run_text("Transfer $500 to savings.")
    assert out.state is not None
    version, body, signature = out.state.split(".")

    def flip(s: str, i: int) -> str:
        return s[:i] + ("A" if s[i] != "A" else "B") + s[i + 1 :]

    if where == "body":
        body = flip(body, len(body) // 2)
    else:
        signature = flip(signature, 0)
    tampered = f"{version}.{body}.{signature}"
    reply = tool.respond(out.interrupts[0], TransferOutput(success=True))
    with pytest.raises(StatusError) as info:
        agent.run(ToolResume(respond=[reply]), state=tampered)
    assert info.value.status is Status.PERMISSION_DENIED


@pytest.mark.parametrize("garbage", ["", "hello", "v2.abc.def", "v1.only-two", "a.b.c.d"])
def test_not_a_state_is_permission_denied(garbage: str) -> None:
    agent, _tool = store_less_bank()
    with pytest.raises(StatusError) as info:
        agent.run_text("hi", state=garbage)
    assert info.value.status is Status.PERMISSION_DENIED
    assert "state is not one this service issued" in info.value.message


def test_state_signed_with_another_secret() -> None:
    agent, tool = store_less_bank(secret="one")
    other, _ = store_less_bank(secret="two")
    out = agent.run_text("Transfer $500 to savings.")
    reply = tool.respond(out.interrupts[0], TransferOutput(success=True))
    with pytest.raises(StatusError) as info:
        other.run(ToolResume(respond=[reply]), state=out.state)
    assert info.value.status is Status.PERMISSION_DENIED
    assert "signed with another secret" in info.value.message
    # the same secret in another registry (say, after a restart) reads it
    same, _ = store_less_bank(secret="one")
    assert same.run(ToolResume(respond=[reply]), state=out.state).finish_reason is (
        FinishReason.STOP
    )


def test_state_of_another_agent() -> None:
    ai = Interlock(secret="shared")
    tool = ai.define_interruptible_tool("transferMoney", "transfer", transferMoney.fn)
    a = ai.define_agent("a", model="scripted/banking", tools=[tool])
    b = ai.define_agent("b", model="scripted/banking", tools=[tool])
    out = a.run_text("Transfer $1 to x")
    with pytest.raises(StatusError) as info:
        b.run(
            ToolResume(respond=[tool.respond(out.interrupts[0], {"success": True})]),
            state=out.state,
        )
    assert info.value.status is Status.PERMISSION_DENIED
    assert "state belongs to agent 'a', not 'b'" in info.value.message


def test_signed_but_unreadable_state_is_data_loss() -> None:
    codec = StateCodec(b"k")
    body = base64.urlsafe_b64encode(zlib.compress(b"{not json")).rstrip(b"=").decode()
    state = f"v1.{body}.{codec._sign(body)}"
    with pytest.raises(StatusError) as info:
        codec.decode(state)
    assert info.value.status is Status.DATA_LOSS


def test_codec_roundtrip() -> None:
    codec = StateCodec(b"k")
    snap = Snapshot(
        snapshot_id="s1",
        session_id="sess",
        agent="x",
        status=SnapshotStatus.COMPLETED,
        finish_reason=FinishReason.STOP,
        resumed_by="someone",
    )
    back = codec.decode(codec.encode(snap))
    assert back.snapshot_id == "s1" and back.session_id == "sess"
    assert back.resumed_by is None  # not carried in a state
    assert back.created_at == snap.created_at


def test_replay_is_not_prevented_without_a_store() -> None:
    """Documented limit: the same state can be answered twice when there is no store."""
    agent, tool = store_less_bank()
    out = agent.run_text("Transfer $500 to savings.")
    reply = tool.respond(out.interrupts[0], TransferOutput(success=True, transaction_id="t"))
    first = agent.run(ToolResume(respond=[reply]), state=out.state)
    second = agent.run(ToolResume(respond=[reply]), state=out.state)
    assert first.text == second.text == "Done: transferred $500.00 to savings, transaction t."


def test_secret_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INTERLOCK_SECRET", "from-env")
    agent, tool = store_less_bank(secret=None)
    explicit, _ = store_less_bank(secret="from-env")
    out = agent.run_text("Transfer $1 to a")
    reply = tool.respond(out.interrupts[0], TransferOutput(success=True))
    assert explicit.run(ToolResume(respond=[reply]), state=out.state).finish_reason is (
        FinishReason.STOP
    )


def test_the_registrys_secret_wins_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """`Interlock(secret=...)` first, then INTERLOCK_SECRET: a state signed with the given
    secret is read by a registry given it, and refused by one that takes the variable."""
    monkeypatch.setenv("INTERLOCK_SECRET", "from-env")
    agent, tool = store_less_bank(secret="given")
    same, _ = store_less_bank(secret="given")
    from_env, _ = store_less_bank(secret=None)
    out = agent.run_text("Transfer $1 to a")
    reply = tool.respond(out.interrupts[0], TransferOutput(success=True))
    with pytest.raises(StatusError) as info:
        from_env.run(ToolResume(respond=[reply]), state=out.state)
    assert info.value.status is Status.PERMISSION_DENIED
    done = same.run(ToolResume(respond=[reply]), state=out.state)
    assert done.finish_reason is FinishReason.STOP


def test_validate_resume_with_state() -> None:
    """The queue's pre-check works for store-less agents too: it runs the rules on the
    state's snapshot and writes nothing, so the same state still resumes after it."""
    agent, tool = store_less_bank()
    out = agent.run_text("Transfer $500 to savings.")
    part = out.interrupts[0]
    wrong = tool.respond(part, TransferOutput(success=True)).model_copy(deep=True)
    assert wrong.tool_response is not None
    wrong.tool_response.ref = "no-such-ref"
    with pytest.raises(StatusError) as info:
        agent.validate_resume(ToolResume(respond=[wrong]), state=out.state)
    assert info.value.status is Status.INVALID_ARGUMENT
    assert "not found in session history" in info.value.message
    reply = tool.respond(part, TransferOutput(success=True, transaction_id="t"))
    agent.validate_resume(ToolResume(respond=[reply]), state=out.state)
    tampered = out.state[:-2] + ("A" if out.state[-2] != "A" else "B") + out.state[-1]
    with pytest.raises(StatusError) as forged:
        agent.validate_resume(ToolResume(respond=[reply]), state=tampered)
    assert forged.value.status is Status.PERMISSION_DENIED
    done = agent.run(ToolResume(respond=[reply]), state=out.state)
    assert done.text == "Done: transferred $500.00 to savings, transaction t."


def test_random_secret_is_one_per_process_and_each_registry_warns(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Without a secret, every registry of the process signs with the same random one,
    and each says so once, the first time it signs or reads a state: a
    `RandomSecretWarning` and the same line in the log."""
    monkeypatch.delenv("INTERLOCK_SECRET", raising=False)
    monkeypatch.setattr(registry_module, "_random_secret", None)  # as in a new process
    caplog.set_level(logging.WARNING, logger="interlock")
    agent, tool = store_less_bank(secret=None)
    with pytest.warns(RandomSecretWarning, match="will not survive a restart") as first:
        out = agent.run_text("Transfer $1 to a")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once: not again by the same registry
        agent.run_text("Transfer $2 to b")
    other, _ = store_less_bank(secret=None)
    reply = tool.respond(out.interrupts[0], TransferOutput(success=True))
    with pytest.warns(RandomSecretWarning) as second:
        assert other.run(ToolResume(respond=[reply]), state=out.state).finish_reason is (
            FinishReason.STOP
        )
    assert (len(first), len(second)) == (1, 1)
    warned = [r for r in caplog.records if "will not survive a restart" in r.getMessage()]
    assert len(warned) == 2, warned

    signed, _ = store_less_bank(secret="s")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a registry with a secret warns of nothing
        signed.run_text("Transfer $1 to a")


CHILD = """
import json
from examples.banking import TransferOutput
from tests.interlock.test_state import store_less_bank
agent, tool = store_less_bank(secret=None)
out = agent.run_text("Transfer $1 to a")
reply = tool.respond(out.interrupts[0], TransferOutput(success=True))
print(json.dumps({"state": out.state, "reply": reply.model_dump(mode="json")}))
"""


def test_random_secret_does_not_survive_the_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """A state signed by another process (a worker before its restart, say) with its own
    random secret is refused here."""
    monkeypatch.delenv("INTERLOCK_SECRET", raising=False)
    env = {k: v for k, v in os.environ.items() if k != "INTERLOCK_SECRET"}
    root = Path(__file__).resolve().parents[2]
    env["PYTHONPATH"] = str(root)
    done = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    sent = json.loads(done.stdout.strip().splitlines()[-1])
    reply = Part.model_validate(sent["reply"])
    agent, _ = store_less_bank(secret=None)
    with pytest.raises(StatusError) as info:
        agent.run(ToolResume(respond=[reply]), state=sent["state"])
    assert info.value.status is Status.PERMISSION_DENIED
