"""`interlock prune`: delete what the store keeps of sessions idle past a retention."""

from __future__ import annotations

import re
from datetime import datetime
from typing import TYPE_CHECKING, Any

import click

from ..settings import PRUNE_BATCH, PRUNE_BATCH_MAX, redact_url
from .base import (
    clear_errors,
    emit,
    missing_sqlite_file,
    no_tables,
    read_store,
    server_timeout,
    store_option,
    store_tables,
    store_url_of,
    unused,
)

if TYPE_CHECKING:
    from ..retention import Pruned

__all__ = ["Duration", "prune"]

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_LONGEST_DAYS = 36_500
"""The longest retention (100 years): a cutoff a date can still hold."""
_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", re.IGNORECASE)


class Duration(click.ParamType):  # type: ignore[type-arg]  # (generic from click 8.2 only)
    """A length of time: a number of seconds, or a number with a unit (`90s`, `45m`,
    `12h`, `30d`, `2w`); more than zero, and at most `_LONGEST_DAYS` days."""

    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, int | float):
            seconds = float(value)
        else:
            found = _DURATION.fullmatch(str(value))
            if found is None:
                self.fail(
                    f"{value!r} is not a duration: give seconds, or a number and a unit "
                    "(s, m, h, d, w), such as 30d or 12h.",
                    param,
                    ctx,
                )
            seconds = float(found.group(1)) * _UNITS[found.group(2).lower() or "s"]
        if seconds <= 0:
            self.fail(f"{value!r} is no length of time: give more than zero.", param, ctx)
        if seconds > _LONGEST_DAYS * _UNITS["d"]:
            self.fail(f"{value!r} is too long: give at most {_LONGEST_DAYS}d.", param, ctx)
        return seconds


@click.command(short_help="Delete sessions idle for longer than a retention.")
@click.option(
    "--older-than",
    required=True,
    type=Duration(),
    help="Delete sessions idle for longer than this: seconds, or a number and a unit "
    "(s, m, h, d, w), such as 30d.",
)
@click.option("--dry-run", is_flag=True, help="Count what would be deleted; delete nothing.")
@click.option(
    "--batch",
    default=PRUNE_BATCH,
    show_default=True,
    type=click.IntRange(min=1, max=PRUNE_BATCH_MAX),
    help="Sessions deleted per transaction.",
)
@store_option
@unused("--app")
@unused("--broker")
@clear_errors
def prune(older_than: float, dry_run: bool, batch: int, store: str | None) -> None:
    """Delete the sessions idle for longer than --older-than (their newest snapshot
    was written before then) that wait for nothing: no open interrupt, no claimed one
    whose resume has not ended, no turn running or to be retried. Their snapshots,
    messages and decision records go, and so do the decision records and refused turns
    older than that which name no session, or one the store holds no snapshot of.
    Sessions that wait on a reviewer are kept, however old, and so are those a turn
    of a new message runs on (counted as kept busy).

    Prints its progress on stderr after each batch and, at the end, one JSON line of
    counts (`--dry-run`: what would be deleted)."""
    from ..retention import Pruned, cutoff_of, prune_sessions

    url = store_url_of(store)
    missing = missing_sqlite_file(url)
    if missing is not None:  # nothing has run on it (and none is made)
        click.echo(
            f"nothing to prune: no store at {missing} yet (a typo? check --store or "
            "INTERLOCK_STORE_URL)",
            err=True,
        )
        _report(url, cutoff_of(older_than), dry_run, Pruned())
        return
    sql = read_store(url, server_timeout())
    verb, kept = ("would delete", "would keep") if dry_run else ("deleted", "kept")

    def progress(total: Pruned) -> None:
        click.echo(
            f"prune: {verb} {total.sessions} sessions ({total.snapshots} snapshots, "
            f"{total.messages} messages, {total.decisions} decisions, "
            f"{total.refusals} refused turns) so far, and {kept} {total.kept_busy} sessions "
            "a turn runs on",
            err=True,
        )

    try:
        empty = no_tables(store_tables(sql), url)
        if empty is not None:
            click.echo(f"nothing to prune: {empty}", err=True)
            _report(url, cutoff_of(older_than), dry_run, Pruned())
            return
        done, cutoff = prune_sessions(
            sql, older_than, batch=batch, dry_run=dry_run, on_batch=progress
        )
    finally:
        sql.dispose()
    _report(url, cutoff, dry_run, done)


def _report(url: str, cutoff: datetime, dry_run: bool, done: Pruned) -> None:
    """The command's JSON line: the store, the cutoff, and what was (or would be) deleted."""
    from schemas import wire_time

    emit(
        {
            "store": redact_url(url),
            "cutoff": wire_time(cutoff, microseconds=True),
            "dry_run": dry_run,
            **done.as_dict(),
        }
    )
