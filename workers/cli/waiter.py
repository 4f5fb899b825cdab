"""What `--wait` reads: a queue of the command's own, bound to every event."""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import click

from ..console import Terminated
from ..settings import (
    DEFAULT_BROKER,
    DEFAULT_STORE,
    NO_ANSWER_HINT,
    NO_WORKER_HINT,
    Settings,
    redact_url,
)
from .base import PROGRESS_EVERY, emit, error_line, reach_broker

if TYPE_CHECKING:
    from interlock import Status
    from interlock.stores.sql_journal import TurnEnding

__all__ = ["Waiter", "decide_hint", "pending_hint", "repeated_flags"]

_SHOWN = 5
"""How many of the turns a timed-out batch wait still waited for it names."""


class Waiter:
    """A queue of this command's own, bound to every event before anything is sent (so
    nothing it waits for can pass unseen), deleted at the end (`close`) with its
    binding: on Redis a binding left behind would route every event to the queue's key
    for good. Ctrl-C or SIGTERM (`terminable`) while it is being bound deletes it too."""

    def __init__(
        self, settings: Settings, timeout: float, keep: Callable[[Any], bool] = lambda e: False
    ) -> None:
        from events.stream import EventStream
        from events.topology import event_queue

        self.timeout = timeout
        self.keep = keep
        self.settings = settings
        self._kept: list[Any] = []
        self.connection = settings.connection()
        self.name = f"interlock.cli.{uuid.uuid4().hex[:12]}"
        queue = event_queue(self.name, "#", durable=False, auto_delete=True)
        try:
            # As `decide` and `resend` reach it: a broker that never answers is given up
            # on after one try (kombu's own connecting would try it twice, 2 s apart).
            reach_broker(self.connection, settings.server_timeout)
        except BaseException:
            self.connection.release()
            raise
        try:
            self.events = EventStream(self.connection, queue)
        except (KeyboardInterrupt, Terminated):  # it may be bound already
            with contextlib.suppress(Exception), self.connection.channel() as channel:
                queue.bind(channel).delete()
            self.connection.release()
            raise

    def next(
        self,
        what: str,
        match: Callable[[Any], bool],
        *,
        quiet: bool = False,
        hint: str = NO_ANSWER_HINT,
    ) -> Any:
        """The next event that matches; printed. Events this command waits for later
        (see `keep`) that arrive first are kept for then: a resumed turn may end before
        `decision.accepted` is read. `quiet`: no "waiting for" line on stderr."""
        from interlock import Status, StatusError

        if not quiet:
            click.echo(f"waiting for {what} (up to {self.timeout:.0f}s)...", err=True)
        event = next((e for e in self._kept if match(e)), None)
        if event is not None:
            self._kept.remove(event)
        deadline = time.monotonic() + self.timeout
        while event is None:
            remaining = deadline - time.monotonic()
            try:
                if remaining <= 0:
                    raise TimeoutError
                found = self.events.next(remaining, match=lambda e: match(e) or self.keep(e))
            except TimeoutError:
                raise StatusError(
                    Status.DEADLINE_EXCEEDED,
                    f"no {what.removeprefix('the ')} within {self.timeout:.0f}s: " + hint,
                ) from None
            if match(found):
                event = found
            else:
                self._kept.append(found)
        emit(event.model_dump(mode="json"))
        return event

    def turn_event(self, turn_id: str) -> Any:
        """The event that ends turn `turn_id`; a failed turn exits with an error."""
        from interlock import StatusError

        ends = ("turn.interrupted", "turn.completed", "turn.failed")
        try:
            event = self.next(
                f"turn {turn_id}",
                lambda e: e.type in ends and getattr(e, "turn_id", None) == turn_id,
                hint=NO_WORKER_HINT,
            )
        except (KeyboardInterrupt, Terminated):  # a stop says that the turn goes on
            click.echo(
                f"the wait for turn {turn_id} stopped; the turn was sent and goes on: "
                f"{pending_hint(self.settings)} lists it if it pauses",
                err=True,
            )
            raise
        if event.type == "turn.failed":
            raise StatusError(event.error.status, f"turn failed: {event.error.message}")
        if event.type == "turn.interrupted":
            click.echo(
                "paused: " + decide_hint(self.settings, event.snapshot_id, event.resume_token),
                err=True,
            )
        return event

    def ended_before(self, turn_id: str, ending: TurnEnding) -> None:
        """Say how turn `turn_id`, sent again, had ended before (no event comes for it);
        a failed one exits with an error, as `turn_event` does."""
        from interlock import StatusError

        failed = _said_ended({turn_id: ending}, 1, self.settings)
        if failed:
            status, message = failed[0]
            raise StatusError(status, f"turn failed: {message}")

    def turn_events(
        self,
        turn_ids: list[str],
        given: frozenset[str] = frozenset(),
        ended: Mapping[str, TurnEnding] | None = None,
    ) -> list[Any]:
        """The event that ends each of `turn_ids`, printed as they come (`timeout`: at
        most between two of them); then a failure if any turn failed. `given`: the ids
        the sender chose (a file's `turn_id`), which may name turns that ended before.
        `ended`: those of them the store says ended before they were sent (no event
        will come for them: each is said on stderr and counted at once); None when the
        store could not say."""
        from interlock import Status, StatusError

        ends = ("turn.interrupted", "turn.completed", "turn.failed")
        before = {t: ended[t] for t in dict.fromkeys(turn_ids) if t in ended} if ended else {}
        waiting = set(turn_ids) - before.keys()
        found: list[Any] = []
        failed_before = _said_ended(before, len(turn_ids), self.settings)
        if ended is not None:
            given = frozenset()  # a turn the store did not know had not ended: it will say
        try:  # the line is in: a stop right after it is printed says how far it got too
            if waiting:
                click.echo(
                    f"waiting for {len(waiting)} turns to end "
                    f"(up to {self.timeout:.0f}s between two)...",
                    err=True,
                )
            while waiting:
                try:
                    event = self.next(
                        f"{len(waiting)} more turns",
                        lambda e: e.type in ends and getattr(e, "turn_id", None) in waiting,
                        quiet=True,
                        hint=NO_WORKER_HINT,
                    )
                except StatusError as exc:
                    if exc.status is not Status.DEADLINE_EXCEEDED:
                        raise
                    left = [t for t in turn_ids if t in waiting]
                    raise StatusError(exc.status, self._unended(found, left, given)) from None
                waiting.discard(event.turn_id)
                found.append(event)
                if len(found) % PROGRESS_EVERY == 0 or not waiting:
                    done = len(found) + len(before)
                    click.echo(f"{done} of {len(turn_ids)} turns ended", err=True)
        except (KeyboardInterrupt, Terminated):  # a stop says how far the wait got
            click.echo(
                f"{len(found) + len(before)} of {len(turn_ids)} turns had ended when the wait "
                "stopped; the others were sent and go on: "
                f"{pending_hint(self.settings)} lists the paused turns",
                err=True,
            )
            raise
        paused = sum(e.type == "turn.interrupted" for e in found)
        failed = failed_before + [
            (e.error.status, e.error.message) for e in found if e.type == "turn.failed"
        ]
        if paused:
            hint = pending_hint(self.settings)
            click.echo(f"{paused} paused: list those still open with {hint}", err=True)
        if failed:
            status, message = failed[0]
            raise StatusError(
                status, f"{len(failed)} of {len(turn_ids)} turns failed; the first: {message}"
            )
        return found

    def _unended(self, found: list[Any], left: list[str], given: frozenset[str]) -> str:
        """What a batch wait that timed out says: how many turns ended, which did not (the
        first few), and why a turn id sent before may never be announced."""
        shown = ", ".join(left[:_SHOWN])
        more = f" and {len(left) - _SHOWN} more" if len(left) > _SHOWN else ""
        said = (
            f"{len(found)} of {len(found) + len(left)} turns ended; no end of the other "
            f"{len(left)} within {self.timeout:.0f}s (turn ids {shown}{more}): {NO_WORKER_HINT}"
        )
        if given.intersection(left):
            said += (
                ". A turn id that had ended before it was sent again runs once and is not "
                f"announced again: {pending_hint(self.settings)} lists the paused turns"
            )
        return said

    def close(self) -> None:
        """Delete the queue and its binding, and let go of the connection. A broker that
        cannot be reached keeps them: that is said on stderr, not raised, so the
        command's own outcome (or the error it is failing with) stands."""
        try:
            self.events.close(delete=True)
        except Exception as exc:
            said = error_line(exc)
            if said is None:
                raise
            self._left_behind(said[1])
        finally:
            with contextlib.suppress(Exception):
                self.connection.release()

    def _left_behind(self, reason: str) -> None:
        if self.connection.transport.driver_type != "redis":
            return  # RabbitMQ deletes it with the connection (auto-delete)
        click.echo(
            f"the queue {self.name} was not deleted ({reason}): it collects every event "
            "until it and its binding are removed (docs/operations.md, The command line)",
            err=True,
        )


def _said_ended(
    before: Mapping[str, TurnEnding], total: int, settings: Settings
) -> list[tuple[Status, str]]:
    """Say on stderr how the turns of `before` ended before they were sent again (the
    first few, then how many); the failures among them, as (status, message)."""
    failed: list[tuple[Status, str]] = []
    for shown, (turn_id, ending) in enumerate(before.items()):
        failure = _failure(ending)
        if failure is not None:
            failed.append(failure)
        if shown < _SHOWN:
            how = _how(ending, failure, settings)
            click.echo(f"turn {turn_id} had ended before: {how}", err=True)
    if before:
        more = f" ({len(before) - _SHOWN} more not shown)" if len(before) > _SHOWN else ""
        tally = Counter(_kind(ending) for ending in before.values())
        kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(tally.items()))
        click.echo(
            f"{len(before)} of {total} turns had ended before they were sent again ({kinds})"
            f"{more}: each runs once, and is not announced again",
            err=True,
        )
    return failed


def _kind(ending: TurnEnding) -> str:
    """A word for how a turn ended, for the count of `_said_ended`."""
    if ending.snapshot_id is None:
        return "refused"
    if ending.finish_reason == "interrupted":
        if ending.status == "expired":
            return "paused and expired"
        return "paused and answered" if ending.resumed_by is not None else "paused"
    return ending.status


def _failure(ending: TurnEnding) -> tuple[Status, str] | None:
    """The status and message of a turn that ended failed (or refused, or aborted)."""
    from interlock import Status

    if not isinstance(ending.error, dict):
        return None
    try:
        status = Status(str(ending.error.get("status")))
    except ValueError:
        status = Status.UNKNOWN
    return status, str(ending.error.get("message", ""))


def _how(ending: TurnEnding, failure: tuple[Status, str] | None, settings: Settings) -> str:
    """How a turn ended, in a few words, with its snapshot."""
    at = f" (snapshot {ending.snapshot_id})" if ending.snapshot_id else ""
    if failure is not None:
        word = "refused" if ending.snapshot_id is None else ending.status
        return f"{word}, {failure[0].name}: {failure[1]}{at}"
    if ending.status == "expired":
        return f"paused, and the pause has expired{at}"
    if ending.finish_reason == "interrupted" and ending.resumed_by is not None:
        return f"paused, and answered since by decision {ending.resumed_by}{at}"
    if ending.finish_reason == "interrupted":
        flags, _ = repeated_flags(settings, ("--broker", "--store"))
        return (
            f"paused{at}: {pending_hint(settings)} lists it while it waits; `interlock resend "
            f"{ending.snapshot_id}{flags}` announces it again with a new resume_token"
        )
    return f"{ending.status}{at}"


def decide_hint(
    settings: Settings, snapshot_id: str, token: str, env: Mapping[str, str] | None = None
) -> str:
    """How to answer a pause from the command line. It repeats the `--broker`/`--store`
    that `decide` would not find itself: not the defaults, nor what `env` (the process's
    environment) holds, which `decide` reads too. A password in a repeated URL is
    hidden, and the hint says so. A store left at its default may not be the workers':
    the hint says that too (the command reads no store for a single turn)."""
    flags, hidden = repeated_flags(settings, ("--broker", "--store"), env)
    notes = ["or --deny, --respond JSON"]
    if hidden:
        notes.append("put the password back where *** stands")
    if settings.store_url == DEFAULT_STORE:
        notes.append(f"add --store URL if your workers' store is not {DEFAULT_STORE}")
    return (
        f"answer with `interlock decide {snapshot_id} --token {token}{flags} --approve` "
        f"({'; '.join(notes)})"
    )


def pending_hint(settings: Settings, env: Mapping[str, str] | None = None) -> str:
    """The `interlock pending` command that lists this store's pauses, with the
    `--store` it would not find itself (as `decide_hint`)."""
    flags, hidden = repeated_flags(settings, ("--store",), env)
    note = " (put the password back where *** stands)" if hidden else ""
    return f"`interlock pending{flags}`{note}"


def repeated_flags(
    settings: Settings, wanted: tuple[str, ...], env: Mapping[str, str] | None = None
) -> tuple[str, bool]:
    """The `wanted` flags (`--broker`, `--store`) of `settings` that a command run next
    would not find itself (not the defaults, nor what `env` holds: the process's
    environment), as ` --flag URL` each with any password hidden; and whether one was."""
    env = os.environ if env is None else env
    given = (
        ("--broker", settings.broker_url, DEFAULT_BROKER, "INTERLOCK_BROKER_URL"),
        ("--store", settings.store_url, DEFAULT_STORE, "INTERLOCK_STORE_URL"),
    )
    flags, hidden = "", False
    for flag, url, default, variable in given:
        if flag not in wanted or url == default or env.get(variable) == url:
            continue
        shown = redact_url(url)
        hidden = hidden or shown != url
        flags += f" {flag} {shown}"
    return flags, hidden
