"""The app `celery -A workers.celery_app worker` loads; configured by `INTERLOCK_*`."""

from __future__ import annotations

import functools
import logging
import os
from typing import Any

import celery.apps.worker as celery_worker
from celery.platforms import EX_FAILURE, EX_OK
from celery.signals import worker_process_shutdown, worker_ready, worker_shutdown
from celery.worker import state

from events.publisher import TopologyConflict, declare
from events.topology import TURNS

from .app import create_app, runtime_of
from .burst import BURST_CONNECT_RETRIES, WorkerBurst, burst_idle
from .heartbeat import WorkerHeartbeat
from .settings import Settings
from .worker_report import report_stop


def _graceful_ctrl_c() -> None:
    """A first Ctrl-C is a warm shutdown that exits 0, as SIGTERM's (and the resume
    consumer's), where Celery's exits 1; a second one still stops at once."""
    shutdown = getattr(celery_worker, "_shutdown_handler", None)
    on_sigint = getattr(celery_worker, "on_SIGINT", None)
    if shutdown is None or on_sigint is None:  # another Celery: leave its handler
        return
    celery_worker.install_worker_int_handler = functools.partial(
        shutdown, sig="SIGINT", callback=on_sigint, exitcode=EX_OK
    )


_graceful_ctrl_c()
app = create_app(Settings.from_env())
app.steps["consumer"].add(WorkerHeartbeat)  # INTERLOCK_HEARTBEAT_FILE, if set
if burst_idle() is not None:  # a batch job: give up on a broker that is not there,
    app.conf.broker_connection_max_retries = BURST_CONNECT_RETRIES
    app.conf.broker_channel_error_retry = False  # or that refuses its commands

log = logging.getLogger("interlock.worker")


def _declare_topology(**_: Any) -> None:
    """The exchanges and queues of `events.topology`, declared as the worker starts
    (Celery declares only `interlock.turns`): a dashboard can bind its own queue to
    `interlock.events` before the first event is published."""
    try:
        with runtime_of(app).connection() as connection:
            declare(connection)
    except TopologyConflict as exc:  # no event could be published: stop, exit 1
        os.write(2, f"error: FAILED_PRECONDITION: {exc}; the worker stops\n".encode())
        state.should_stop = EX_FAILURE
        return
    log.info("declared Interlock's exchanges and queues")


_bursts: list[WorkerBurst] = []


def _start_burst(**_: Any) -> None:
    """In burst mode (`interlock worker --burst`), stop once `interlock.turns` is drained."""
    idle = burst_idle()
    if idle is not None:
        burst = WorkerBurst(runtime_of(app).connection(), TURNS, idle)
        _bursts.append(burst)
        burst.start()
        log.info("burst mode: stopping once %s has been drained for %.1f s", TURNS, idle)


def _close_runtime(**_: Any) -> None:
    """A stopping worker process marks the events it published sent (and lets go of
    its connections): else the sweeps of others would publish them again."""
    runtime_of(app).close()


# In each prefork child as it exits, and in the main process (the solo and threads
# pools run turns there; a prefork parent has built nothing, and closes nothing).
worker_process_shutdown.connect(_close_runtime, weak=False)
worker_shutdown.connect(_close_runtime, weak=False)
worker_shutdown.connect(lambda **_: report_stop(any(b.drained for b in _bursts)), weak=False)
worker_ready.connect(_declare_topology, weak=False)
worker_ready.connect(_start_burst, weak=False)
