"""`interlock --help` and `--version` load no command's module, and a command's `--help`
loads its module alone: neither the runtime nor kombu, redis, Celery or SQLAlchemy. The
list of commands comes from a table (`workers.cli.commands.COMMANDS`), and reads as
click's own list of the commands, all loaded, reads."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import click
import pytest

from tests.queue_helpers import APP, child_env, interlock_bin
from tests.services import free_port, start_redis
from workers.cli import main
from workers.cli.commands import COMMANDS
from workers.cli.lazy import Lazy, LazyGroup

LOADS = """
import json, sys

before = set(sys.modules)
sys.argv = ["interlock", *json.loads(sys.argv[1])]
from workers.console import main

try:
    main()
finally:
    print(json.dumps(sorted(set(sys.modules) - before)), file=sys.stderr)
"""
"""Run `interlock ARGS` (a JSON list) in process, as the console script does; the last
line on stderr lists the modules it loaded."""

LISTING = {"workers", "workers.console", "workers.cli", "workers.cli.commands", "workers.cli.lazy"}
"""Our modules that `interlock --help` needs."""


def loads(*args: str) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """Run `interlock ARGS` in a fresh interpreter; what it did, and the modules it loaded."""
    done = subprocess.run(
        [sys.executable, "-c", LOADS, json.dumps(args)],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    lines = done.stderr.splitlines()
    assert lines, "no list of the modules loaded"
    return done, set(json.loads(lines[-1]))


def beyond_the_command_line(loaded: set[str]) -> list[str]:
    """The packages in `loaded` other than the standard library's, click and ours."""
    packages = {name.partition(".")[0] for name in loaded}
    return sorted(packages - set(sys.stdlib_module_names) - {"click", "workers"})


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["-h"]], ids=" ".join)
def test_the_group_loads_no_command(args: list[str]) -> None:
    done, loaded = loads(*args)
    assert done.returncode == 0, done.stderr
    assert beyond_the_command_line(loaded) == [], "e.g. celery, kombu, redis, sqlalchemy"
    assert {name for name in loaded if name.startswith("workers")} <= LISTING
    if args != ["--version"]:
        assert all(f"\n  {name} " in done.stdout for name in COMMANDS), done.stdout


def test_a_command_that_is_none_loads_none() -> None:
    done, loaded = loads("pendng")
    assert done.returncode == 2, done.stderr
    assert "No such command 'pendng'." in done.stderr
    assert {name for name in loaded if name.startswith("workers")} <= LISTING


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_commands_help_loads_its_module_and_no_service_client(name: str) -> None:
    done, loaded = loads(name, "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"Usage: interlock {name} "), done.stdout
    assert COMMANDS[name].where.partition(":")[0] in loaded
    assert beyond_the_command_line(loaded) == [], "e.g. celery, kombu, redis, sqlalchemy"


def loaded_group(group: click.Group) -> click.Group:
    """A plain click group holding `group`'s commands, every one loaded: `interlock` as it
    was when it imported every command's module up front."""
    ctx = click.Context(group)
    commands: dict[str, click.Command] = {}
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None, name
        commands[name] = command
    return click.Group(
        group.name,
        commands=commands,
        params=group.params,
        callback=group.callback,
        help=group.help,
        context_settings=group.context_settings,
    )


def test_the_table_names_each_command_with_its_own_short_help() -> None:
    ctx = click.Context(main)
    assert main.list_commands(ctx) == sorted(COMMANDS)
    for name, lazy in COMMANDS.items():
        command = main.get_command(ctx, name)
        assert command is not None, name
        assert (command.name, command.hidden) == (name, False)
        assert lazy.short_help == command.get_short_help_str(), name


def test_help_completion_and_a_wrong_name_read_as_with_every_command_loaded() -> None:
    loaded = loaded_group(main)
    for group in (main, loaded):  # `main` loads its commands' modules only when asked
        assert group.list_commands(click.Context(group)) == sorted(COMMANDS)
    said: list[list[str]] = []
    for group in (main, loaded):
        ctx = group.make_context("interlock", [], resilient_parsing=True, terminal_width=80)
        completions = [
            f"{item.value}: {item.help}"
            for incomplete in ("", "re", "-")
            for item in group.shell_complete(ctx, incomplete)
        ]
        with pytest.raises(click.UsageError) as wrong:
            group.main(["pendng"], prog_name="interlock", standalone_mode=False)
        said.append([group.get_help(ctx), *completions, wrong.value.format_message()])
    assert said[0] == said[1]
    assert "audit            A session's interrupts, decisions and outcomes." in said[0][0]


def test_a_lazy_group_lists_its_commands_without_importing_them() -> None:
    group = LazyGroup("tool", lazy={"later": Lazy("tests.workers.no_such:later", "Runs later.")})
    ctx = group.make_context("tool", [], resilient_parsing=True, terminal_width=80)
    assert "  later  Runs later." in group.get_help(ctx)
    assert [(i.value, i.help) for i in group.shell_complete(ctx, "la")] == [
        ("later", "Runs later.")
    ]
    assert "later" in group.commands and "other" not in group.commands
    assert list(group.commands) == ["later"] and len(group.commands) == 1
    with pytest.raises(ModuleNotFoundError, match=r"tests\.workers\.no_such"):
        group.get_command(ctx, "later")

    @group.command("later", short_help="Runs now.")
    def now() -> None:
        """Runs now."""

    assert group.get_command(ctx, "later") is now
    assert "  later  Runs now." in group.get_help(ctx)
    del group.commands["later"]
    assert group.list_commands(ctx) == [] and group.get_command(ctx, "later") is None


SIGNAL_ON_IMPORT = """
import os, signal, sys


class Stop:
    # The signal named by INTERLOCK_TEST_SIGNAL the moment the command starts loading
    # pydantic, as a user's Ctrl-C (or a supervisor's SIGTERM) may come while a command
    # loads what it runs on (a few tenths of a second after its arguments are read).
    def find_spec(self, name, path=None, target=None):
        within = os.environ.get("INTERLOCK_TEST_SIGNAL_IN")  # only where this is set
        if within and within not in os.environ:
            return None
        if name == os.environ.get("INTERLOCK_TEST_SIGNAL_ON", "pydantic"):
            sys.meta_path.remove(self)
            os.kill(os.getpid(), getattr(signal, os.environ["INTERLOCK_TEST_SIGNAL"]))
        return None


sys.meta_path.insert(0, Stop())
"""
"""A `sitecustomize` that sends the process a signal as it starts importing pydantic (or
the module INTERLOCK_TEST_SIGNAL_ON names; with INTERLOCK_TEST_SIGNAL_IN, only in a
process whose environment has the variable it names)."""


def signalled(
    tmp_path: Path, argv: list[str], *, ignore_ctrl_c: bool = False, **env: str
) -> subprocess.CompletedProcess[str]:
    """`interlock ARGV`, run to its end with `SIGNAL_ON_IMPORT` as its `sitecustomize`
    (`env`: the INTERLOCK_TEST_SIGNAL variables, and any other); `ignore_ctrl_c`: started
    with Ctrl-C ignored, as a shell starts a script's background job (`&`)."""
    hook = tmp_path / "hook"
    hook.mkdir(exist_ok=True)
    (hook / "sitecustomize.py").write_text(SIGNAL_ON_IMPORT)
    return subprocess.run(
        [interlock_bin(), *argv],
        env=child_env(PYTHONPATH=str(hook), **env),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
        if ignore_ctrl_c
        else None,
    )


def assert_ended_by(done: subprocess.CompletedProcess[str], code: int, said: str) -> None:
    """`done` ended as a command stopped by a signal ends: `said` (`interrupted`,
    `terminated`) as its last line on stderr, exit `code`; no "Aborted!", no traceback."""
    assert done.returncode == code, done.stderr
    assert "Traceback" not in done.stderr and "Aborted" not in done.stderr, done.stderr
    assert done.stderr.splitlines()[-1] == said, done.stderr


@pytest.mark.parametrize(
    ("signame", "code", "said"), [("SIGINT", 130, "interrupted"), ("SIGTERM", 143, "terminated")]
)
@pytest.mark.parametrize(
    "args",
    [
        ["schemas", "--check"],
        ["pending"],
        ["audit", "s-1"],
        ["migrate"],
        ["resume-consumer", "--app", APP],  # until it sets its own handling
        ["demo", "--deny"],
    ],
    ids=lambda args: args[0],
)
def test_a_signal_while_a_command_loads_what_it_runs_on_ends_it_as_any_command(
    tmp_path: Path, args: list[str], signame: str, code: int, said: str
) -> None:
    """Ctrl-C or SIGTERM while a command imports pydantic, SQLAlchemy and the runtime
    (once its arguments are read) ends it as either ends any command: `interrupted`,
    exit 130, or `terminated`, exit 143; no "Aborted!", no traceback, not silently."""
    store = f"sqlite:///{tmp_path}/c.db"
    flags = {"schemas": ["--out", str(tmp_path / "schemas")], "demo": []}.get(
        args[0], ["--store", store]
    )
    done = signalled(tmp_path, [*args, *flags], INTERLOCK_TEST_SIGNAL=signame)
    assert_ended_by(done, code, said)
    assert done.stdout == ""


@pytest.mark.parametrize(
    ("args", "on", "said"),
    [
        pytest.param(
            ["schemas", "--check"],
            "workers.cli.commands",
            "error: NOT_FOUND: no schema files in ",
            id="schemas",
        ),
        pytest.param(
            ["submit", "--app", APP, "--agent", "bankingAgent", "--text", "hi"],
            "pydantic",
            "error: UNAVAILABLE: cannot reach the broker: ",
            id="submit",
        ),
    ],
)
def test_ctrl_c_that_the_command_was_started_with_ignored_stays_ignored(
    tmp_path: Path, args: list[str], on: str, said: str
) -> None:
    """A shell runs a background job (`interlock submit ... &` in a script) with Ctrl-C
    ignored, so that the Ctrl-C meant for the script leaves it running. It stays
    ignored: while the command line starts (`schemas`, signalled as its commands load)
    and in a command that handles Ctrl-C itself (`submit`), where both used to end the
    command with `interrupted`. The command runs on, and ends as it would have."""
    where = (
        ["--out", str(tmp_path / "schemas")]
        if args[0] == "schemas"
        else ["--broker", f"redis://127.0.0.1:{free_port()}/0"]
    )
    done = signalled(
        tmp_path,
        [*args, *where],
        ignore_ctrl_c=True,
        INTERLOCK_TEST_SIGNAL="SIGINT",
        INTERLOCK_TEST_SIGNAL_ON=on,
    )
    assert done.returncode == 1, done.stderr
    assert "interrupted" not in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.splitlines()[-1].startswith(said), done.stderr


@pytest.mark.parametrize(
    ("signame", "code", "said"), [("SIGINT", 130, "interrupted"), ("SIGTERM", 143, "terminated")]
)
@pytest.mark.parametrize(
    "on",
    [
        pytest.param("workers.celery_main", id="as-it-execs"),  # before any handler is set
        pytest.param("celery.apps.worker", id="as-celery-loads"),  # before Celery's are
    ],
)
def test_a_signal_while_the_worker_becomes_celery_ends_it_as_any_command(
    tmp_path: Path, on: str, signame: str, code: int, said: str
) -> None:
    """`interlock worker` becomes a Celery process (an exec) that takes a second or two to
    load before Celery sets its own handling of Ctrl-C and SIGTERM. A signal in that time
    (as the process starts afresh, or as Celery loads) ends it as it ends any command,
    after the worker's last line: no traceback, no "Aborted!", not silently."""
    with start_redis(tmp_path) as server:
        done = signalled(
            tmp_path,
            ["worker", "--app", APP, "--broker", server.url],
            INTERLOCK_STORE_URL=f"sqlite:///{tmp_path}/w.db",
            INTERLOCK_TEST_SIGNAL=signame,
            INTERLOCK_TEST_SIGNAL_ON=on,
            INTERLOCK_TEST_SIGNAL_IN="INTERLOCK_WORKER_REPORT_FD",  # the Celery process
        )
    assert_ended_by(done, code, said)
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert [line["worker"] for line in lines] == ["starting", "stopped"], done.stdout
    assert lines[-1] == {"worker": "stopped", "handled": 0}
