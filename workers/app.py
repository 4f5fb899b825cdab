"""The Celery app factory: JSON only, acks late, prefetch 1, explicit retries."""

from __future__ import annotations

import json
import logging
import time
from typing import Any, NoReturn

from amqp.exceptions import MessageNacked
from celery import Celery
from celery.exceptions import Reject
from celery.signals import before_task_publish
from celery.utils.time import get_exponential_backoff_interval
from kombu.exceptions import OperationalError as KombuOperationalError

from events.publisher import PublishRefused, give_up_after
from events.topology import TURNS, TURNS_DEAD, TURNS_QUEUE
from interlock import Interlock
from interlock.stores.failures import first_line as one_line
from schemas import Status, TurnRequest

from .burst import BURST_CONNECT_RETRIES, BurstGaveUp, BurstRequest, burst_idle
from .runtime import Runtime
from .settings import Settings
from .turns import SessionBusy, TurnBusy, request_of, retried, run_task

__all__ = ["RUN_TURN", "create_app", "delivery_config", "runtime_of", "send_turn", "turn_summary"]

RUN_TURN = "interlock.run_turn"

log = logging.getLogger("interlock.worker")


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
        # A broker that refuses a command (Redis out of memory or read-only) is waited
        # out as one that went away, not a reason for the worker to stop.
        "broker_channel_error_retry": True,
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

    # max_retries=None: `retry(max_retries=None)` falls back to the task's own (3 by
    # default); this task counts its store retries itself (`STORE_RETRIES`).
    # shared=False: a shared task joins every app finalized later in the process, and
    # a second app would then run this one's callable, with this app's settings.
    # Request: a burst worker stops (exit 1) once a turn's store or broker failed at each
    # of its tries, the turn requeued.
    @app.task(name=RUN_TURN, bind=True, max_retries=None, shared=False, Request=BurstRequest)  # type: ignore[untyped-decorator]
    def run_turn_task(self: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        try:
            return run_task(runtime, args, kwargs)
        except TurnBusy as busy:
            # Never two runs of one turn at once: look again once the lease may be free.
            # Another turn of the session ends in the time a turn takes: look soon.
            countdown = busy_retry_countdown(settings)
            if isinstance(busy, SessionBusy):
                countdown = min(countdown, 0.2 * 2 ** min(int(self.request.retries or 0), 8))
            _again(self, busy, countdown)
        except Exception as exc:
            if not retried(exc):
                # Not the turn's answer (run_task answers a turn's own failures): an
                # error taking, ending or recording the turn. Retried as a store failure
                # is, then kept on interlock.turns.dead: Celery would ack and drop it.
                log.exception(
                    "turn %s (task %s): unexpected %s",
                    _turn_id(args, kwargs), self.request.id, type(exc).__name__,
                )  # fmt: skip
            tries = int(self.request.retries or 0)
            burst = burst_idle() is not None  # a batch job gives up sooner
            limit = BURST_CONNECT_RETRIES if burst else STORE_RETRIES
            if tries >= limit:
                if burst:
                    _give_up(args, kwargs, exc, tries)
                return _keep_dead(runtime, args, kwargs, exc, tries)
            countdown = get_exponential_backoff_interval(1, tries, 30, full_jitter=True)
            log.warning(
                "turn %s (task %s): %s: %s; trying again in %.0f s (retry %d of %d)",
                _turn_id(args, kwargs), self.request.id, type(exc).__name__, one_line(exc),
                countdown, tries + 1, limit,
            )  # fmt: skip
            _again(self, exc, countdown)

    return app


STORE_RETRIES = 60
"""Retries of a turn whose store or broker fails (backing off to at most 30 s, about a
quarter of an hour in all): enough for a restart or a failover. A failure that lasts
longer (a store that is no database, an error that every try meets) then keeps the
task on `interlock.turns.dead`, with the reason, rather than retrying for ever (a tool
whose outcome cannot be journaled would run at every try)."""


REPUBLISH_PAUSES = (1.0, 2.0, 4.0, 8.0, 10.0)
"""Seconds between tries to publish a turn's retry while the broker is away (25 s in
all, the tries' own time aside): the pool process holds the turn meanwhile, and a
worker told to stop waits for it, so the whole stays within a container's usual grace
(30 s), as the journal's wait for its store does."""


def _again(task: Any, exc: BaseException, countdown: float) -> NoReturn:
    """Celery's retry (it raises `Retry`), except that a retry that cannot be published
    (the broker is away) is tried again, for about half a minute (`REPUBLISH_PAUSES`),
    and then leaves the message to be delivered again instead of dropping it (requeued).

    The tries matter: a requeue is the worker's main process's to make, on the channel
    the message came by, which the broker's loss closed; on Redis it then stays among
    the unacked until the visibility timeout (an hour by default). A retry published
    once the broker is back runs the turn at once; the original message, which that
    channel cannot ack either, comes back after the visibility timeout and is a
    duplicate of a turn that ran (nothing runs). A burst worker does not wait."""
    pauses = () if burst_idle() is not None else REPUBLISH_PAUSES
    for pause in (*pauses, None):
        try:
            task.retry(exc=exc, countdown=countdown, max_retries=None)
        except Reject as reject:
            if getattr(reject, "requeue", False):
                raise
            if pause is None:
                raise Reject(reject.reason, requeue=True) from exc
            why = reject.reason if isinstance(reject.reason, BaseException) else exc
            log.warning(
                "task %s: its retry could not be published (%s); trying again in %.0f s",
                task.request.id, one_line(why), pause,
            )  # fmt: skip
            time.sleep(pause)
            continue
        raise AssertionError("Celery's retry returned instead of raising")
    raise AssertionError("unreachable: the last try raises")


def _give_up(
    args: tuple[Any, ...], kwargs: dict[str, Any], exc: BaseException, tries: int
) -> NoReturn:
    """A burst worker (a batch job) does not wait a quarter of an hour for its store or
    broker: after its few tries the turn goes back on `interlock.turns`, for a later
    run, and the worker stops with exit 1 (`BurstRequest`)."""
    turn_id = _turn_id(args, kwargs)
    status = Status.UNAVAILABLE if retried(exc) else Status.INTERNAL
    raise BurstGaveUp(
        f"{status.value}: {_failed(exc)} {tries + 1} times in a row: {type(exc).__name__}: "
        f"{one_line(exc)} (turn {turn_id} requeued, and still queued on {TURNS})"
    ) from exc


def _failed(exc: BaseException) -> str:
    return "the store or broker failed" if retried(exc) else "running the turn failed"


def _turn_id(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    found, request = request_of(args, kwargs)
    if not found:  # the first argument's, where it has one (as turn.failed carries)
        request = args[0] if args else kwargs.get("request")
    return request.get("turn_id") if isinstance(request, dict) else None


def _keep_dead(
    runtime: Runtime, args: tuple[Any, ...], kwargs: dict[str, Any], exc: BaseException, tries: int
) -> dict[str, Any]:
    """Keep a turn whose store or broker failed at every try (or that met an unexpected
    error at every try) on `interlock.turns.dead`, with the reason (its body the task's
    arguments, as JSON), and end the task."""
    reason = f"{_failed(exc)} {tries + 1} times: {type(exc).__name__}: {one_line(exc)}"
    body = json.dumps({"args": list(args), "kwargs": kwargs}, default=str).encode()
    turn_id = _turn_id(args, kwargs)
    try:
        runtime.publisher.dead_letter(
            body,
            reason[:2000],
            {"task": RUN_TURN},
            queue=TURNS_DEAD,
            turn_id=turn_id if isinstance(turn_id, str) else None,
        )
    except Exception as failed:  # the broker is away too: leave the task on its queue
        raise Reject(failed, requeue=True) from exc
    log.error("turn %s kept on %s, not run: %s", turn_id, TURNS_DEAD.name, reason)
    return {"turn_id": turn_id, "dead_lettered": reason}


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


def send_turn(app: Celery, request: TurnRequest, *, within: float | None = None) -> None:
    """Enqueue `request` as an `interlock.run_turn` task (JSON arguments). A task the
    broker turns away (RabbitMQ's nack: `interlock.turns` at a length limit with
    `reject-publish`) raises `PublishRefused` saying so; Celery gives it no reason.
    `within`: no try of the send starts once its tries took that many seconds (a command
    run by hand gives its server timeout); by default Celery's retry policy alone."""
    errback = give_up_after(within)
    try:
        app.send_task(
            RUN_TURN,
            args=[request.model_dump(mode="json")],
            argsrepr=turn_summary(request),
            kwargsrepr="{}",
            **({"retry_policy": {"errback": errback}} if errback is not None else {}),
        )
    except KombuOperationalError as exc:
        if not isinstance(exc.__cause__ or exc.__context__, MessageNacked):
            raise
        raise PublishRefused(
            f"the broker refused turn {request.turn_id} to {TURNS}: the queue takes no more "
            "(a length limit with reject-publish?); nothing was enqueued"
        ) from exc
