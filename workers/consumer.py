"""The resume consumer: reads decisions, validates and claims, enqueues the resume."""

from __future__ import annotations

import codecs
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from celery import Celery
from kombu.connection import Connection
from kombu.message import Message as KombuMessage
from kombu.messaging import Consumer
from kombu.mixins import W_CONN_LOST, ConsumerMixin
from sqlalchemy.exc import DataError, IntegrityError

from events.compression import bound_decompression
from events.decision_log import DecisionRecord
from events.publisher import TopologyConflict, declare
from events.redis_transport import UNREADABLE
from events.topology import DECISIONS, DECISIONS_DEAD
from interlock import StatusError
from interlock.stores.failures import first_line
from schemas import (
    MAX_DECISION_BYTES,
    Decision,
    DecisionAccepted,
    DecisionRejected,
    ErrorInfo,
    EventBase,
    Snapshot,
    Status,
    TurnRequest,
)

from .app import runtime_of, send_turn
from .decisions import (
    ParseFailure,
    answered_in_both,
    evaluate,
    lenient_failure,
    parse_decision,
    resume_request,
)
from .heartbeat import touch
from .turns import log_failure, retried

__all__ = ["EnqueueError", "ResumeConsumer", "StopRequested"]

log = logging.getLogger("interlock.consumer")

_CONTENT_ERRORS = (ValueError, TypeError, LookupError, RecursionError, DataError)
"""Errors a decision's content can cause (the database refusing a value included);
retrying the message cannot help. Any other error is taken for a failing store or broker."""


class _LostInOneLine(logging.Filter):
    """kombu logs "Connection to broker lost" with a traceback each time the broker
    drops or refuses the consumer, once a second while Redis is out of memory, say: one
    line that names the error instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if record.msg == W_CONN_LOST and exc is not None:
            record.msg = "connection to the broker lost (%s: %s); connecting again"
            record.args = (type(exc).__name__, first_line(exc))
            record.exc_info = record.exc_text = None
        return True


_LOST_IN_ONE_LINE = _LostInOneLine()


class StopRequested(Exception):
    """Raised out of the broker connection's retries once a stop was asked for (SIGTERM):
    kombu's retries never look at `should_stop`, and would wait for the broker forever."""


class EnqueueError(Exception):
    """The resume of a recorded, accepted decision could not be enqueued: the decision is
    requeued (never dead-lettered), and its next delivery enqueues the resume."""


class ResumeConsumer(ConsumerMixin):
    """Consumes `interlock.decisions`. Every message ends in exactly one outcome event
    (`decision.accepted` / `decision.rejected`); what cannot be parsed is also kept on
    `interlock.decisions.dead`. A decision is acked only once its outcome is recorded
    and, when accepted, its resumed turn is enqueued under a committed claim (the claim
    and the record commit together)."""

    connect_max_retries: int | None = None  # type: ignore[assignment]  # kombu: None only
    """Attempts to reach the broker after the first before giving up; None: for ever."""
    give_up_after: int | None = None
    """Failures of the store or the broker in a row, each requeueing its decision, after
    which the consumer stops (`gave_up` says why): a batch job's. None: never."""

    def __init__(self, app: Celery, *, heartbeat_file: str | None = None) -> None:
        self.app = app
        self.rt = runtime_of(app)
        # A decision this consumer took comes back as soon as another reader finds it
        # gone (killed mid-decision), not after the visibility timeout.
        self.connection: Connection = self.rt.settings.connection(restore_held=True)
        self.heartbeat = Path(heartbeat_file) if heartbeat_file else None
        self._beat_failed: str | None = None  # said once, not on every turn of the loop
        self.handled = 0
        self.failing = 0  # decisions requeued in a row because the store or broker failed
        self._repeated = False  # the decision in hand was decided before: `_repeat`
        self._settled = False  # ... and its resumed turn has run: nothing enqueued again
        self.gave_up: Exception | None = None
        # kombu inflates a compressed body before any check here: never past the limit.
        bound_decompression(MAX_DECISION_BYTES)
        kombu_log = logging.getLogger("kombu.mixins")
        if _LOST_IN_ONE_LINE not in kombu_log.filters:
            kombu_log.addFilter(_LOST_IN_ONE_LINE)

    def get_consumers(self, consumer_cls: Callable[..., Consumer], channel: Any) -> list[Consumer]:
        # Declared before any event is published, so a dashboard can bind its own
        # queue to `interlock.events` (or read `interlock.interrupted`) from the start;
        # and before consuming, so that no decision is handled before it is said.
        try:
            declare(channel.connection.client)
        except TopologyConflict as exc:  # kombu would reconnect and refuse it for ever
            raise StatusError(Status.FAILED_PRECONDITION, str(exc)) from exc
        return [
            consumer_cls(
                queues=[DECISIONS], on_message=self.on_message, prefetch_count=1, no_ack=False
            )
        ]

    def on_connection_revived(self) -> None:
        log.info("connected to the broker")

    @contextmanager
    def establish_connection(self) -> Iterator[Connection]:
        """kombu's, with retries a stop ends (`StopRequested`): checked every second of
        the wait between two attempts."""
        with self.create_connection() as conn:
            conn.ensure_connection(
                self.on_connection_error, self.connect_max_retries, callback=self._check_stop
            )
            yield conn

    def _check_stop(self) -> None:
        if self.should_stop:
            raise StopRequested("stopped while waiting for the broker")

    def on_connection_error(self, exc: Exception, interval: float) -> None:
        """One line per failed attempt (kombu's logs a traceback every time)."""
        log.warning("cannot reach the broker (%s); trying again in %.0f s", exc, interval)

    def run(self, _tokens: int = 1, **kwargs: Any) -> Any:
        """Serve until stopped; a stop while the broker is unreachable ends it too."""
        try:
            return super().run(_tokens, **kwargs)
        except StopRequested as exc:
            log.info("%s", exc)
            return None

    def on_consume_ready(
        self, connection: Connection, channel: Any, consumers: list[Consumer], **kw: Any
    ) -> None:
        log.info("declared Interlock's exchanges and queues; consuming %s", DECISIONS.name)

    def on_iteration(self) -> None:
        """Touch the heartbeat file. One that cannot be touched is said in the log (once,
        then again when it can be), and decisions go on being handled: a health check
        reports the stale file."""
        if self.heartbeat is None:
            return
        failed = touch(self.heartbeat)
        if failed is not None and failed != self._beat_failed:
            log.warning("%s; decisions go on being handled", failed)
        elif failed is None and self._beat_failed is not None:
            log.info("touching the heartbeat file %s again", self.heartbeat)
        self._beat_failed = failed

    def on_decode_error(self, message: KombuMessage, exc: Exception) -> None:
        """kombu could not build the message's body: its `compression` header names an
        unknown codec, the body is corrupt or inflates past the decision limit, or its
        text cannot take the declared encoding. kombu's own answer is to ack and drop
        it; this one refuses it (INVALID_ARGUMENT) and keeps it, as received, on the
        dead-letter queue, like any unreadable decision."""
        headers = dict(message.headers or {})
        compression = headers.get("compression")
        what = (
            f"compression {compression!r}"
            if compression
            else f"content encoding {message.content_encoding!r}"
        )
        headers[UNREADABLE] = f"the body cannot be decoded ({what}): {exc}"
        self._process(message, headers)

    def on_message(self, message: KombuMessage) -> None:
        headers = dict(message.headers or {})
        if self.connection.transport.driver_type == "amqp":
            wrong = _undecoded(message)
            if wrong is not None:  # py-amqp keeps the bytes of text it cannot decode
                encoding = f"content encoding {message.content_encoding!r}"
                headers[UNREADABLE] = f"the body cannot be decoded ({encoding}): {wrong}"
        self._process(message, headers)

    def _process(self, message: KombuMessage, headers: dict[str, Any]) -> None:
        body = message.body
        outcome: EventBase | None = None
        self._repeated = self._settled = False
        try:
            try:
                outcome = self.handle(body, message.content_type, headers)
            except _CONTENT_ERRORS as exc:
                # This message fails however often it is tried (a requeued one comes
                # straight back): keep it on the dead-letter queue instead.
                log.exception("decision could not be processed; dead-lettering it")
                self.unprocessable(body, headers, exc)
        except Exception as exc:
            # The store or the broker failed: leave the decision queued and try again.
            outage = retried(exc) or isinstance(exc, EnqueueError)
            log_failure(
                log, exc, "decision could not be processed", "; requeueing it", outage=outage
            )
            time.sleep(1)
            message.requeue()
            self.failing += 1
            if self.give_up_after is not None and self.failing > self.give_up_after:
                self.gave_up, self.should_stop = exc, True
            return
        message.ack()
        self.failing = 0
        self.handled += 1
        if outcome is not None:  # logged once it is settled: a log never requeues it
            _log_outcome(outcome, repeated=self._repeated, settled=self._settled)

    def unprocessable(self, body: bytes | str, headers: dict[str, Any], exc: Exception) -> None:
        """Dead-letter a message that raised, and reject it (INTERNAL), recorded as its
        decision's outcome where it names one."""
        raw = body.encode() if isinstance(body, str) else bytes(body or b"")
        reason = f"decision could not be processed: {type(exc).__name__}: {exc}"[:2000]
        parsed = parse_decision(raw, "application/json")
        ids = _ids(parsed) if isinstance(parsed, Decision) else {}
        event = DecisionRejected(**ids, error=ErrorInfo(status=Status.INTERNAL, message=reason))
        keep = self._dead_letter(raw, reason, headers, ids.get("decision_id"))
        if isinstance(parsed, Decision):  # its one outcome: a repeat gets it again
            try:
                self._record_and_publish(
                    parsed.decision_id, raw, event, parsed.reviewer, None, before=keep
                )
                return
            except _CONTENT_ERRORS:  # the log cannot keep it either: announced unrecorded
                log.exception(
                    "the outcome of decision %s could not be recorded", parsed.decision_id
                )
        keep(event)
        self.rt.publisher.publish_event(event)

    def _dead_letter(
        self, raw: bytes, reason: str, headers: dict[str, Any], decision_id: str | None
    ) -> Callable[[EventBase], None]:
        """What keeps `raw` on the dead-letter queue once its outcome is known: the dead
        letter names the decision_id read from it (or null) and the event_id of the
        outcome published for it, the same on every delivery of a decision_id (its
        first outcome), so that a reader can pair the two and drop a repeated one."""

        def keep(outcome: EventBase) -> None:
            self.rt.publisher.dead_letter(
                raw, reason, headers, decision_id=decision_id, event_id=outcome.event_id
            )
            log.warning("kept an unreadable decision on %s: %s", DECISIONS_DEAD.name, reason)

        return keep

    def handle(
        self, body: bytes | str, content_type: str | None, headers: dict[str, Any]
    ) -> EventBase:
        """Process one message; returns the outcome event it published."""
        raw = body.encode() if isinstance(body, str) else bytes(body or b"")
        wrong = headers.get(UNREADABLE)  # the broker's item was no message at all
        parsed = (
            lenient_failure(f"not a decision: {wrong}", raw)  # its ids, where it names them
            if isinstance(wrong, str)
            else parse_decision(raw, content_type)
        )
        if isinstance(parsed, ParseFailure):
            event: EventBase = DecisionRejected(
                decision_id=parsed.decision_id,
                reviewer=parsed.reviewer,
                snapshot_id=parsed.snapshot_id,
                error=ErrorInfo(status=Status.INVALID_ARGUMENT, message=parsed.reason),
            )
            keep = self._dead_letter(raw, parsed.reason, headers, parsed.decision_id)
            if parsed.decision_id is not None:
                return self._record_and_publish(
                    parsed.decision_id, raw, event, parsed.reviewer, None, before=keep
                )
            keep(event)
            self.rt.publisher.publish_event(event)
            return event
        return self._decide(parsed, raw)

    def _decide(self, decision: Decision, raw: bytes) -> EventBase:
        # One read transaction for the log and the snapshot: on PostgreSQL that saves a
        # pool checkout (its pre-ping) and a BEGIN/ROLLBACK, and both come from one view.
        # The log is built (its table checked or made) before the read: built inside
        # it, that would hold a second connection, which the pool then keeps.
        store, decisions = self.rt.store, self.rt.decisions
        with store.reader().connect() as conn, conn.begin():
            prior = decisions.get(decision.decision_id, conn=conn)
            snapshot = None if prior else store.get_snapshot_in(conn, decision.snapshot_id)
        if prior is not None:
            return self._repeat(prior)
        try:
            request = evaluate(self.rt, decision, snapshot)
        except StatusError as exc:
            return self._reject(decision, raw, snapshot, exc)
        assert snapshot is not None  # evaluate refuses a missing snapshot
        both = answered_in_both(decision)
        if both:
            log.warning(
                "decision %s answers %s in both respond and restart: the respond entry "
                "answers it, the restart entry is dropped",
                decision.decision_id,
                ", ".join(both),
            )
        return self._accept(decision, raw, snapshot, request)

    def _accept(
        self, decision: Decision, raw: bytes, snapshot: Snapshot, request: TurnRequest
    ) -> EventBase:
        """Claim the snapshot and record `decision.accepted` in one transaction, then
        publish it, then enqueue the resume: `decision.accepted` is published before any
        event of the resumed turn. A crash (or a failing broker) after the commit
        leaves the resume unsent: the decision is not acked, comes back, and `_repeat`
        publishes the outcome again and enqueues the resume then."""
        event = DecisionAccepted(
            **_ids(decision),
            agent=snapshot.agent,
            session_id=snapshot.session_id,
            turn_id=request.turn_id,
        )
        decisions = self.rt.decisions
        try:
            with decisions.begin() as conn:
                claimed = self.rt.store.claim_in(conn, snapshot.snapshot_id, decision.decision_id)
                if claimed:
                    decisions.record(
                        decision_id=decision.decision_id,
                        body=_text(raw),
                        event=event,
                        reviewer=decision.reviewer,
                        session_id=snapshot.session_id,
                        conn=conn,
                    )
        except IntegrityError:
            # Another consumer recorded this decision_id first; our claim rolled back.
            earlier = decisions.get(decision.decision_id)
            if earlier is None:
                raise
            return self._repeat(earlier)
        if not claimed:
            already = StatusError(
                Status.FAILED_PRECONDITION, f"snapshot {snapshot.snapshot_id} was already resumed"
            )
            return self._reject(decision, raw, snapshot, already)
        self.rt.publisher.publish_event(event)
        self._enqueue(request)
        return event

    def _reject(
        self, decision: Decision, raw: bytes, snapshot: Snapshot | None, exc: StatusError
    ) -> EventBase:
        """Record and publish `decision.rejected`; nothing was claimed."""
        session_id = snapshot.session_id if snapshot is not None else None
        event = DecisionRejected(
            **_ids(decision),
            agent=snapshot.agent if snapshot is not None else None,
            session_id=session_id,
            error=exc.to_info(),
        )
        return self._record_and_publish(
            decision.decision_id, raw, event, decision.reviewer, session_id
        )

    def _repeat(
        self, prior: DecisionRecord, before: Callable[[EventBase], None] | None = None
    ) -> EventBase:
        """A decision_id seen before gets its first outcome again, not a second
        evaluation. An accepted one then has its resume enqueued again: the delivery
        that accepted it may have died, or failed to enqueue, after the commit. It is the
        same turn (its id comes from the decision_id), and workers run a turn id once.
        `before` gets that outcome before it is published."""
        self._repeated = True
        event = _event(prior.event_body)
        if before is not None:
            before(event)
        self.rt.publisher.publish_raw_event(prior.event_type, prior.event_body)
        if prior.outcome == "accepted":
            self._enqueue_again(prior)
        return event

    def _enqueue_again(self, prior: DecisionRecord) -> None:
        decision = parse_decision(prior.body, "application/json", logged=True)
        if not isinstance(decision, Decision):
            log.warning("accepted decision %s has an unreadable body", prior.decision_id)
            return
        snapshot = self.rt.store.get_snapshot(decision.snapshot_id)
        if snapshot is None or snapshot.resumed_by != decision.decision_id:
            # Its turn failed and released the snapshot (maybe a later decision took it):
            # that turn has run, and must not run again.
            log.info(
                "decision %s: snapshot %s is gone or no longer claimed by it; "
                "not enqueueing its resume again",
                decision.decision_id,
                decision.snapshot_id,
            )
            self._settled = True
            return
        self._enqueue(resume_request(decision, snapshot))

    def _enqueue(self, request: TurnRequest) -> None:
        try:
            send_turn(self.app, request)
        except Exception as exc:
            # Whatever the error's type, retrying is the answer: the outcome is recorded,
            # so dead-lettering (a second, different outcome) must not happen.
            raise EnqueueError(f"enqueueing turn {request.turn_id} failed: {exc}") from exc

    def _record_and_publish(
        self,
        decision_id: str,
        raw: bytes,
        event: EventBase,
        reviewer: str | None,
        session_id: str | None,
        *,
        before: Callable[[EventBase], None] | None = None,
    ) -> EventBase:
        """Record `event` as the outcome of `decision_id` and publish it; or, if another
        delivery decided it first, publish that first outcome again. `before` gets the
        outcome before it is published (the dead letter that goes with it)."""
        earlier = self.rt.decisions.record(
            decision_id=decision_id,
            body=_text(raw),
            event=event,
            reviewer=reviewer,
            session_id=session_id,
        )
        if earlier is not None:  # another consumer decided it first: repeat its outcome
            return self._repeat(earlier, before)
        if before is not None:
            before(event)
        self.rt.publisher.publish_event(event)
        return event


def _log_outcome(event: EventBase, *, repeated: bool = False, settled: bool = False) -> None:
    """One line per decision handled, for the operator: what became of it (`repeated`:
    a decision_id decided before, whose first outcome went out again; `settled`: and
    whose resumed turn has run, so it is not enqueued again)."""
    again = " again (decided before)" if repeated else ""
    if isinstance(event, DecisionAccepted):
        log.info(
            "decision %s accepted%s: snapshot %s %s turn %s%s",
            event.decision_id,
            again,
            event.snapshot_id,
            "resumed as" if settled else "resumes as",
            event.turn_id,
            ", which has run" if settled else "",
        )
    elif isinstance(event, DecisionRejected):
        log.info(
            "decision %s rejected%s (snapshot %s): %s: %s",
            event.decision_id or "(without an id)",
            again,
            event.snapshot_id,
            event.error.status.value,
            event.error.message,
        )


def _ids(decision: Decision) -> dict[str, Any]:
    return {
        "snapshot_id": decision.snapshot_id,
        "decision_id": decision.decision_id,
        "reviewer": decision.reviewer,
    }


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace")


def _event(body: str) -> EventBase:
    from schemas import event_adapter

    parsed: EventBase = event_adapter.validate_json(body)
    return parsed


def _undecoded(message: KombuMessage) -> str | None:
    """Why a RabbitMQ message's text could not take its declared `content_encoding`, or
    None. py-amqp decodes a body by that encoding and, when it cannot (an unknown codec,
    bytes the codec refuses), keeps the bytes and says nothing. Bytes with no encoding,
    `binary`, or UTF-8 (whose text is checked as every decision's is) are no such case."""
    body, encoding = message.body, message.content_encoding
    if not isinstance(body, bytes | bytearray) or not isinstance(encoding, str):
        return None
    try:
        if encoding == "binary" or codecs.lookup(encoding).name == "utf-8":
            return None
        bytes(body).decode(encoding)
    except (LookupError, UnicodeError) as exc:
        return str(exc)
    return None
