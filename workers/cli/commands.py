"""The `interlock` group and the table of its commands. A command's module (and what it
imports: the runtime, kombu, SQLAlchemy, ...) is loaded when the command runs or shows its
own help; `interlock --help` and `interlock --version` load none (`LazyGroup`)."""

from __future__ import annotations

import click

from ..console import started
from .lazy import Lazy, LazyGroup

__all__ = ["COMMANDS", "main"]

COMMANDS = {
    "audit": Lazy("workers.cli.admin:audit", "A session's interrupts, decisions and outcomes."),
    "decide": Lazy("workers.cli.turns:decide", "Answer a paused turn: approve, deny or respond."),
    "demo": Lazy("workers.cli.admin:demo", "The banking agent end to end; no server needed."),
    "health": Lazy(
        "workers.cli.admin:health", "Check the broker, the store and a process's heartbeat."
    ),
    "migrate": Lazy(
        "workers.cli.admin:migrate", "Create the store's tables (once per deployment)."
    ),
    "pending": Lazy("workers.cli.turns:pending", "List the open interrupts."),
    "prune": Lazy("workers.cli.prune:prune", "Delete sessions idle for longer than a retention."),
    "resend": Lazy(
        "workers.cli.resend:resend", "Announce an open interrupt again, with a new token."
    ),
    "resume-consumer": Lazy(
        "workers.cli.serve:resume_consumer",
        "Run the resume consumer: decisions in, resumed turns out.",
    ),
    "schemas": Lazy(
        "workers.cli.admin:schemas", "Write or check the JSON Schemas of the queue messages."
    ),
    "submit": Lazy("workers.cli.turns:submit", "Enqueue a turn (or a file of them)."),
    "worker": Lazy("workers.cli.serve:worker", "Run a Celery worker for interlock.run_turn."),
}
"""Each command of `interlock`: where it is, and its short help as `--help` lists it."""


@click.group(
    cls=LazyGroup,
    lazy=COMMANDS,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(package_name="interlock")
@click.pass_context
def main(ctx: click.Context) -> None:
    """Interlock: agents that pause for a human and resume where they stopped.

    Start with `interlock demo`. In production run `interlock worker` and
    `interlock resume-consumer` (after `interlock migrate`, once, to create the store's
    tables), submit turns with `interlock submit`, list what waits with `interlock
    pending` and answer with `interlock decide`."""
    _start_command(ctx)


def _start_command(ctx: click.Context) -> None:
    """Before the command `ctx` names starts: the console script has ended the process
    on Ctrl-C and SIGTERM as a stopped command ends since it began (`workers.console`).
    A `terminable` command goes on so until it sets its own handling. Any other keeps
    the start-up's SIGTERM (`terminated`, 143, wherever it comes: it loads pydantic,
    SQLAlchemy and kombu once it runs; the worker and the resume consumer until they set
    their own, as they start serving) and gets Python's Ctrl-C back (its `clear_errors`
    ends it with `interrupted`)."""
    name = ctx.invoked_subcommand
    group = ctx.command
    command = group.get_command(ctx, name) if name and isinstance(group, click.Group) else None
    if not getattr(getattr(command, "callback", None), "terminable", False):
        started()
