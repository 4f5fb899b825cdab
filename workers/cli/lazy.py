"""A click group whose commands are imported when one is looked up, not before: the list
in `--help` (and the names shell completion offers) comes from a table of each command's
name, short help and place ("module:attribute"), so that showing it loads no command's
module, nor what that module needs."""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping, MutableMapping
from gettext import gettext
from typing import TYPE_CHECKING, Any, NamedTuple

import click

if TYPE_CHECKING:
    from click.shell_completion import CompletionItem

__all__ = ["Lazy", "LazyCommands", "LazyGroup"]


class Lazy(NamedTuple):
    """Where a command is (`module:attribute`) and its short help, as `--help` lists it
    (the command's own `short_help`: a test holds the two equal)."""

    where: str
    short_help: str


def load(where: str) -> click.Command:
    """The command at `where` (`module:attribute`), its module imported."""
    module, _, attribute = where.partition(":")
    command = getattr(importlib.import_module(module), attribute)
    if not isinstance(command, click.Command):
        raise TypeError(f"{where} is no click command")
    return command


class LazyCommands(MutableMapping[str, click.Command]):
    """A group's commands by name (click's `Group.commands`), each of the table `lazy`
    imported on first use. Its names are known without importing any: listing them,
    `in` and `len` load nothing (nor click's "Did you mean ...?", which reads them); a
    command is loaded when looked up by its name (`get_command`) or its value read. A
    command added (`add_command`) takes the place of the table's entry of its name."""

    def __init__(
        self, lazy: Mapping[str, Lazy], loaded: Mapping[str, click.Command] | None = None
    ) -> None:
        self.lazy = dict(lazy)
        """The table's entries not replaced by a command added."""
        self._loaded: dict[str, click.Command] = dict(loaded or {})
        for name in self._loaded:
            self.lazy.pop(name, None)

    def __getitem__(self, name: str) -> click.Command:
        command = self._loaded.get(name)
        if command is None:
            command = self._loaded[name] = load(self.lazy[name].where)
        return command

    def __setitem__(self, name: str, command: click.Command) -> None:
        self._loaded[name] = command
        self.lazy.pop(name, None)

    def __delitem__(self, name: str) -> None:
        if name not in self:
            raise KeyError(name)
        self._loaded.pop(name, None)
        self.lazy.pop(name, None)

    def __contains__(self, name: object) -> bool:
        return name in self.lazy or name in self._loaded

    def __iter__(self) -> Iterator[str]:
        return iter({**dict.fromkeys(self.lazy), **dict.fromkeys(self._loaded)})

    def __len__(self) -> int:
        return len(self.lazy.keys() | self._loaded.keys())


class LazyGroup(click.Group):
    """A click group with the commands of the table `lazy` (name: `Lazy`), imported when
    one runs or shows its own help (`LazyCommands`). Its `--help` and shell completion
    take each one's short help from the table; they read as click's would."""

    def __init__(self, *args: Any, lazy: Mapping[str, Lazy], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.commands = LazyCommands(lazy, self.commands)

    def _listed(self, ctx: click.Context, incomplete: str = "") -> list[tuple[str, str | None]]:
        """The commands `--help` lists whose name starts with `incomplete`: each with
        its short help where the table gives it (None: a command added, which is loaded
        and asked, once the width it may take is known). Hidden ones are left out."""
        lazy = self.commands.lazy if isinstance(self.commands, LazyCommands) else {}
        listed: list[tuple[str, str | None]] = []
        for name in self.list_commands(ctx):
            if not name.startswith(incomplete):
                continue
            if name in lazy:
                listed.append((name, lazy[name].short_help))
                continue
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                listed.append((name, None))
        return listed

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """click's list of commands, with the table's short helps (no command loaded)."""
        listed = self._listed(ctx)
        if not listed:
            return
        limit = formatter.width - 6 - max(len(name) for name, _ in listed)
        rows = [(name, self._short_help(ctx, name, said, limit)) for name, said in listed]
        with formatter.section(gettext("Commands")):
            formatter.write_dl(rows)

    def shell_complete(self, ctx: click.Context, incomplete: str) -> list[CompletionItem]:
        """click's completions (the commands, then the group's options), with the
        table's short helps (no command loaded)."""
        from click.shell_completion import CompletionItem

        results = [
            CompletionItem(name, help=self._short_help(ctx, name, said))
            for name, said in self._listed(ctx, incomplete)
        ]
        results.extend(click.Command.shell_complete(self, ctx, incomplete))
        return results

    def _short_help(self, ctx: click.Context, name: str, said: str | None, limit: int = 45) -> str:
        """The short help of the command `name`: `said` (the table's), else its own."""
        if said is not None:
            return said
        command = self.get_command(ctx, name)
        return "" if command is None else command.get_short_help_str(limit)
