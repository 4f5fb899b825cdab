"""`interlock resend`: announce an open interrupt again, with a new resume token."""

from __future__ import annotations

import click

from .base import (
    broker_option,
    clear_errors,
    emit,
    error_line,
    no_tables,
    not_in,
    reach_broker,
    read_store,
    refuse_non_text,
    settings_of,
    shared_broker,
    store_option,
    store_read,
    store_tables,
    unused,
)
from .waiter import decide_hint

__all__ = ["resend"]


@click.command(short_help="Announce an open interrupt again, with a new token.")
@click.argument("snapshot_id")
@broker_option
@store_option
@unused("--app")
@clear_errors
def resend(snapshot_id: str, broker: str | None, store: str | None) -> None:
    """Publish a new turn.interrupted for the open interrupt SNAPSHOT_ID, with a new
    resume_token, for when its event was lost (a reader took it off its queue and
    died). The store keeps only a hash of each token, so the old one cannot be shown
    again: it stops working, and only the new event's token answers the pause. The
    deadline, if any, stays what it was. Prints the new event's ids and its
    resume_token, which `interlock decide --token` takes."""
    from events.outbox import Outbox, OutboxRelay
    from events.publisher import Publisher
    from events.snapshot_events import event_for_snapshot
    from interlock import Status, StatusError
    from interlock.resume import check_resumable
    from schemas import TurnInterrupted

    refuse_non_text((("SNAPSHOT_ID", snapshot_id),), "; nothing was sent")
    settings = shared_broker(settings_of(broker=broker, store=store))
    within = settings.server_timeout
    sql = read_store(settings.store_url, within)
    try:
        empty = store_read(lambda: no_tables(store_tables(sql), settings.store_url), within)
        found = store_read(lambda: sql.get_snapshot(snapshot_id), within) if empty is None else None
        if found is None:
            raise StatusError(
                Status.NOT_FOUND,
                f"snapshot {snapshot_id} not found{not_in(settings.store_url, empty)}",
            )
        check_resumable(found)  # an open pause: interrupted, unclaimed, not expired
        event = event_for_snapshot(found)  # a new token; its hash set on `found`
        assert isinstance(event, TurnInterrupted) and event.resume_token is not None
        assert found.resume_token_hash is not None
        outbox = Outbox(sql)
        relay = OutboxRelay(outbox, Publisher(settings.connection(), timeout=within))
        try:
            # The broker first: one that cannot be reached ends the command before the
            # token is replaced (nothing changed; run it again later).
            reach_broker(relay.publisher.connection, within)
            with sql.writer().begin() as conn:
                if not sql.replace_token_hash_in(conn, snapshot_id, found.resume_token_hash):
                    raise StatusError(
                        Status.FAILED_PRECONDITION,
                        f"snapshot {snapshot_id} was resumed or expired meanwhile",
                    )
                outbox.add(conn, event)
            try:
                relay.flush()
            except Exception as exc:
                said = error_line(exc)
                if said is None:
                    raise
                raise StatusError(
                    said[0],
                    f"{said[1]}. The new token is in force (the old one no longer works), "
                    f"and event {event.event_id} waits in the outbox: a worker or the "
                    "resume consumer publishes it once the broker answers. Running resend "
                    "again would replace the token once more",
                ) from exc
        finally:
            relay.publisher.close()
            relay.publisher.connection.release()
            outbox.close()
    finally:
        sql.dispose()
    emit(
        {
            "resent": event.type,
            "snapshot_id": snapshot_id,
            "event_id": event.event_id,
            "resume_token": event.resume_token,
        }
    )
    click.echo(decide_hint(settings, snapshot_id, event.resume_token), err=True)
