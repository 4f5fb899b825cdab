"""The resume consumer: reads decisions, validates and claims, enqueues the resume."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from celery import Celery
from kombu.connection import Connection
from kombu.message import Message as KombuMessage
from kombu.messaging import Consumer
from kombu.mixins import ConsumerMixin
from sqlalchemy.exc import DataError

from events.topology import DECISIONS
from interlock import StatusError
from schemas import Decision, DecisionAccepted, DecisionRejected, ErrorInfo, EventBase, Status

from .app import RUN_TURN, runtime_of
from .decisions import ParseFailure, evaluate, parse_decision

__all__ = ["ResumeConsumer"]

log = logging.getLogger("interlock.consumer")

_CONTENT_ERRORS = (ValueError, TypeError, LookupError, RecursionError, DataError)
"""Errors a decision's content can cause (the database refusing a value included);
retrying the message cannot help. Any other error is taken for a failing store or broker."""


class ResumeConsumer(ConsumerMixin):
    """Consumes `interlock.decisions`. Every message ends in exactly one outcome event
    (`decision.accepted` / `decision.rejected`); what cannot be parsed is also kept on
    `interlock.decisions.dead`. A decision is acked only once its outcome is recorded
    and, when accepted, its resumed turn is enqueued under a committed claim."""

    def __init__(self, app: Celery, *, heartbeat_file: str | None = None) -> None:
        self.app = app
        self.rt = runtime_of(app)
        self.connection: Connection = self.rt.connection()
        self.heartbeat = Path(heartbeat_file) if heartbeat_file else None
        self.handled = 0

    def get_consumers(self, consumer_cls: Callable[..., Consumer], channel: Any) -> list[Consumer]:
        return [
            consumer_cls(
                queues=[DECISIONS], on_message=self.on_message, prefetch_count=1, no_ack=False
            )
        ]

    def on_connection_revived(self) -> None:
        log.info("connected to the broker")

    def on_iteration(self) -> None:
        if self.heartbeat is not None:
            self.heartbeat.touch()

    def on_message(self, message: KombuMessage) -> None:
        body, headers = message.body, dict(message.headers or {})
        try:
            try:
                self.handle(body, message.content_type, headers)
            except _CONTENT_ERRORS as exc:
                # This message fails however often it is tried (a requeued one comes
                # straight back): keep it on the dead-letter queue instead.
                log.exception("decision could not be processed; dead-lettering it")
                self.unprocessable(body, headers, exc)
        except Exception:
            # The store or the broker failed: leave the decision queued and try again.
            log.exception("decision could not be processed; requeueing it")
            time.sleep(1)
            message.requeue()
            return
        message.ack()
        self.handled += 1

    def unprocessable(self, body: bytes | str, headers: dict[str, Any], exc: Exception) -> None:
        """Dead-letter a message that raised, and reject it (INTERNAL) without the store."""
        raw = body.encode() if isinstance(body, str) else bytes(body or b"")
        reason = f"decision could not be processed: {type(exc).__name__}: {exc}"[:2000]
        self.rt.publisher.dead_letter(raw, reason, headers)
        parsed = parse_decision(raw, "application/json")
        ids: dict[str, Any] = (
            {
                "decision_id": parsed.decision_id,
                "snapshot_id": parsed.snapshot_id,
                "reviewer": parsed.reviewer,
            }
            if isinstance(parsed, Decision)
            else {}
        )
        self.rt.publisher.publish_event(
            DecisionRejected(**ids, error=ErrorInfo(status=Status.INTERNAL, message=reason))
        )

    def handle(
        self, body: bytes | str, content_type: str | None, headers: dict[str, Any]
    ) -> EventBase:
        """Process one message; returns the outcome event it published."""
        raw = body.encode() if isinstance(body, str) else bytes(body or b"")
        parsed = parse_decision(raw, content_type)
        if isinstance(parsed, ParseFailure):
            self.rt.publisher.dead_letter(raw, parsed.reason, headers)
            event: EventBase = DecisionRejected(
                decision_id=parsed.decision_id,
                error=ErrorInfo(status=Status.INVALID_ARGUMENT, message=parsed.reason),
            )
            if parsed.decision_id is not None:
                return self._record_and_publish(parsed.decision_id, raw, event, None, None)
            self.rt.publisher.publish_event(event)
            return event
        return self._decide(parsed, raw)

    def _decide(self, decision: Decision, raw: bytes) -> EventBase:
        prior = self.rt.decisions.get(decision.decision_id)
        if prior is not None:
            self.rt.publisher.publish_raw_event(prior.event_type, prior.event_body)
            return _event(prior.event_body)
        ids = {
            "snapshot_id": decision.snapshot_id,
            "decision_id": decision.decision_id,
            "reviewer": decision.reviewer,
        }
        session_id: str | None = None
        try:
            snapshot, request = evaluate(self.rt, decision)
        except StatusError as exc:
            known = self.rt.store.get_snapshot(decision.snapshot_id)
            session_id = known.session_id if known is not None else None
            event: EventBase = DecisionRejected(
                **ids,
                agent=known.agent if known is not None else None,
                session_id=session_id,
                error=exc.to_info(),
            )
        else:
            session_id = snapshot.session_id
            try:
                self.app.send_task(RUN_TURN, args=[request.model_dump(mode="json")])
            except Exception:
                self.rt.store.release(snapshot.snapshot_id, decision.decision_id)
                raise
            event = DecisionAccepted(
                **ids,
                agent=snapshot.agent,
                session_id=snapshot.session_id,
                turn_id=request.turn_id,
            )
        return self._record_and_publish(
            decision.decision_id, raw, event, decision.reviewer, session_id
        )

    def _record_and_publish(
        self,
        decision_id: str,
        raw: bytes,
        event: EventBase,
        reviewer: str | None,
        session_id: str | None,
    ) -> EventBase:
        earlier = self.rt.decisions.record(
            decision_id=decision_id,
            body=raw.decode("utf-8", errors="replace"),
            event=event,
            reviewer=reviewer,
            session_id=session_id,
        )
        if earlier is not None:  # another consumer decided it first: repeat its outcome
            self.rt.publisher.publish_raw_event(earlier.event_type, earlier.event_body)
            return _event(earlier.event_body)
        self.rt.publisher.publish_event(event)
        return event


def _event(body: str) -> EventBase:
    from schemas import event_adapter

    parsed: EventBase = event_adapter.validate_json(body)
    return parsed
