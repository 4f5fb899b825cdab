"""The registry of the fault tests (`--app tests.fault_app:ai`, with the repository root on
PYTHONPATH).

One agent, `faultAgent`, with one tool, `charge`. The user's message is a JSON plan
(`Plan`): a tag naming the turn, and how the turn should behave:

- the scripted model first asks for `charge` with the plan as its input, then (once the
  tool answered) writes "charged TAG: OUTPUT";
- `charge` pauses for a human first when `approval` is set (with `expires_in` as the
  interrupt's deadline); a resume with `{"approved": false}` ends it without charging;
- its side effect is a row in `fault_effects`, keyed by `ctx.idempotency_key` (primary
  key + ON CONFLICT DO NOTHING: the outside system deduplicates), and every attempt is
  counted in `fault_attempts` first, so a test sees both "attempted N times" and
  "happened once";
- `sleep`: after the effect, on its first attempt only, the tool sleeps that long (the
  window between an effect and its journal entry, where a test kills the worker);
- `after`: the model's answering step sleeps that long, on its first call only (the
  tool has returned and is journaled, the turn has not ended);
- every model call is counted in `fault_model_calls` (step 0: the tool call, step 1:
  the answer), so a test sees that a replayed step did not ask the model again.

The tables live in the test's PostgreSQL database, `FAULT_APP_DB_URL` (a SQLAlchemy
URL); `create_tables(url)` makes them.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import psycopg
from pydantic import BaseModel

from interlock import Interlock, Message, ModelRequest, ToolContext, interrupt, scripted

__all__ = ["AGENT", "Plan", "ai", "conninfo", "create_tables"]

AGENT = "faultAgent"
DB_ENV = "FAULT_APP_DB_URL"

TABLES = """
CREATE TABLE IF NOT EXISTS fault_attempts (
    id BIGSERIAL PRIMARY KEY,
    tag TEXT NOT NULL,
    key TEXT NOT NULL,
    session_id TEXT NOT NULL,
    turn_id TEXT NOT NULL,
    pid INTEGER NOT NULL,
    at TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS fault_effects (
    key TEXT PRIMARY KEY,
    tag TEXT NOT NULL,
    session_id TEXT NOT NULL,
    at TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS fault_model_calls (
    id BIGSERIAL PRIMARY KEY,
    tag TEXT NOT NULL,
    step INTEGER NOT NULL,
    pid INTEGER NOT NULL,
    at TIMESTAMPTZ NOT NULL DEFAULT now()
);
"""


class Plan(BaseModel):
    tag: str
    sleep: float = 0.0
    after: float = 0.0
    approval: bool = False
    expires_in: float | None = None


def conninfo(url: str) -> str:
    """A SQLAlchemy URL (`postgresql+psycopg://...`) as a libpq URI."""
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


def create_tables(url: str) -> None:
    with psycopg.connect(conninfo(url), autocommit=True) as conn:
        conn.execute(TABLES)


def _execute(sql: str, params: tuple[Any, ...]) -> Any:
    with psycopg.connect(conninfo(os.environ[DB_ENV]), autocommit=True) as conn:
        return conn.execute(sql, params).fetchone()


ai = Interlock()


@ai.interruptible_tool(name="charge", description="Charges once per call; may ask first.")
def charge(inp: Plan, res: dict[str, Any] | None, ctx: ToolContext) -> dict[str, Any]:
    if inp.approval and res is None:
        interrupt({"tag": inp.tag}, expires_in=inp.expires_in)
    if res is not None and not res.get("approved", False):
        return {"charged": False}
    key = ctx.idempotency_key
    (attempt,) = _execute(
        "WITH new AS (INSERT INTO fault_attempts (tag, key, session_id, turn_id, pid)"
        " VALUES (%s, %s, %s, %s, %s) RETURNING id)"
        " SELECT count(*) + 1 FROM fault_attempts WHERE key = %s",
        (inp.tag, key, ctx.session_id, ctx.turn_id, os.getpid(), key),
    )
    _execute(
        "INSERT INTO fault_effects (key, tag, session_id) VALUES (%s, %s, %s)"
        " ON CONFLICT (key) DO NOTHING RETURNING key",
        (key, inp.tag, ctx.session_id),
    )
    if inp.sleep and attempt == 1:
        time.sleep(inp.sleep)
    return {"charged": True, "key": key}


def fault_model(request: ModelRequest) -> Message:
    messages = request.messages
    last_user = max(i for i, m in enumerate(messages) if m.role == "user")
    plan = Plan.model_validate_json(messages[last_user].text)
    answered = [
        p.tool_response.output
        for m in messages[last_user + 1 :]
        for p in m.content
        if p.tool_response is not None
    ]
    step = 1 if answered else 0
    (calls,) = _execute(
        "WITH new AS (INSERT INTO fault_model_calls (tag, step, pid) VALUES (%s, %s, %s)"
        " RETURNING id) SELECT count(*) + 1 FROM fault_model_calls WHERE tag = %s AND step = %s",
        (plan.tag, step, os.getpid(), plan.tag, step),
    )
    if step == 0:
        return scripted.reply(scripted.tool_call("charge", plan.model_dump()))
    if plan.after and calls == 1:
        time.sleep(plan.after)
    return scripted.text(f"charged {plan.tag}: {json.dumps(answered[0], sort_keys=True)}")


scripted.define(ai, "fault", fault_model)

faultAgent = ai.define_agent(
    AGENT,
    model="scripted/fault",
    system="Charge what the plan says.",
    tools=[charge],
)
