"""The Celery app factory: JSON only, acks late, prefetch 1, explicit retries."""

from __future__ import annotations

from typing import Any

from celery import Celery
from celery.signals import before_task_publish

from events.topology import TURNS, TURNS_QUEUE
from interlock import Interlock
from schemas import TurnRequest

from .runtime import Runtime
from .settings import Settings
from .turns import RETRIED, TurnBusy, run_task

__all__ = ["RUN_TURN", "create_app", "delivery_config", "runtime_of", "send_turn", "turn_summary"]

RUN_TURN = "interlock.run_turn"


def delivery_config(settings: Settings) -> dict[str, Any]:
    """The Celery settings every Interlock worker and client shares: JSON only, acks
    after the work, prefetch 1, broker connection retried forever."""
    return {
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        "task_ignore_result": True,
        "broker_connection_retry": True,
        "broker_connection_retry_on_startup": True,
        "broker_connection_max_retries": None,
        "broker_transport_options": settings.transport_options,
        "worker_hijack_root_logger": False,
        "worker_send_task_events": False,
        "enable_utc": True,
    }


def create_app(settings: Settings, registry: Interlock | None = None) -> Celery:
    """A Celery app whose task `interlock.run_turn` runs turns of `registry` (or of the
    registry named by `settings.app`, loaded on first use)."""
    app = Celery("interlock", broker=settings.broker_url, set_as_current=False)
    app.conf.update(
        delivery_config(settings),
        broker_transport=settings.broker_transport,
        task_default_queue=TURNS,
        task_queues=[TURNS_QUEUE],
        task_routes={RUN_TURN: {"queue": TURNS}},
        # What a worker cannot run is kept on interlock.turns.dead, not dropped.
        worker_consumer="workers.task_consumer:TaskConsumer",
    )
    runtime = Runtime(settings, registry)
    app.interlock_runtime = runtime

    @app.task(  # type: ignore[untyped-decorator]
        name=RUN_TURN,
        bind=True,
        autoretry_for=RETRIED,
        retry_backoff=True,
        retry_backoff_max=30,
        max_retries=None,  # until the store and the broker are back: never dropped
    )
    def run_turn_task(self: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        try:
            return run_task(runtime, args, kwargs)
        except TurnBusy as busy:
            # Never two runs of one turn at once: look again once the lease may be free.
            raise self.retry(
                exc=busy, countdown=busy_retry_countdown(settings), max_retries=None
            ) from busy

    return app


def busy_retry_countdown(settings: Settings) -> float:
    """When a turn whose lease another worker holds is looked at again: half a lease,
    and within the visibility timeout, so that Redis does not hand the waiting retry
    to other workers again and again meanwhile."""
    return max(1.0, min(settings.turn_lease, settings.visibility_timeout) / 2)


def runtime_of(app: Celery) -> Runtime:
    runtime: Runtime = app.interlock_runtime
    return runtime


def turn_summary(request: TurnRequest) -> str:
    """What a task's `argsrepr` shows of a turn (worker logs, monitoring tools): its ids,
    never its input, which holds user text and reviewers' answers."""
    return _summary(vars(request))


def _summary(fields: dict[str, Any]) -> str:
    snapshot_id, session_id = fields.get("snapshot_id"), fields.get("session_id")
    where = f"snapshot={snapshot_id}" if snapshot_id is not None else f"session={session_id}"
    given = fields.get("input")
    kind = "resume" if isinstance(given, dict) and given.get("resume") is not None else "message"
    return f"(turn={fields.get('turn_id')} agent={fields.get('agent')} {where} {kind})"


def _summarize_turn(body: Any = None, headers: dict[str, Any] | None = None, **_: Any) -> None:
    """Every `interlock.run_turn` message shows the summary: also those published without
    `send_turn` (a client's own `send_task`, and a task's retries, which Celery
    republishes with a repr of the arguments)."""
    try:
        args, kwargs = body[0], body[1]
        request = args[0] if args else kwargs.get("request")
    except (TypeError, IndexError, KeyError, AttributeError):
        return
    if headers is not None and isinstance(request, dict):
        headers["argsrepr"] = _summary(request)
        headers["kwargsrepr"] = "{}"


before_task_publish.connect(_summarize_turn, sender=RUN_TURN, weak=False)


def send_turn(app: Celery, request: TurnRequest) -> None:
    """Enqueue `request` as an `interlock.run_turn` task (JSON arguments)."""
    app.send_task(
        RUN_TURN,
        args=[request.model_dump(mode="json")],
        argsrepr=turn_summary(request),
        kwargsrepr="{}",
    )
