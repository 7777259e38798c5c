"""The ``slokit`` command line: a click group whose commands live one per module here.

Each module in this package exposes ``command`` (a click command or group) named after the
module; the group lists the modules without importing them and imports a command's module
only when that command is resolved (run, or its help shown), so adding a command is adding a
file, and ``slokit sidecar`` loads the sidecar and nothing of the other commands (their
analysis stack, the lab). ``slokit --help`` imports them all to show each one's short help.
Commands parse flags, call the library, print, and map :class:`slokit.errors.SlokitError` to
exit codes.
"""

from __future__ import annotations

import importlib
import pkgutil

import click

from slokit import __version__


class LazyGroup(click.Group):
    """A group whose subcommands are this package's public modules, imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        names = {i.name for i in pkgutil.iter_modules(__path__) if not i.name.startswith("_")}
        return sorted(names | set(self.commands))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.commands:
            return self.commands[cmd_name]
        if cmd_name.startswith("_") or cmd_name not in self.list_commands(ctx):
            return None
        module = importlib.import_module(f"{__name__}.{cmd_name}")
        cmd = getattr(module, "command", None)
        if not isinstance(cmd, click.Command):
            return None
        self.add_command(cmd, cmd_name)
        return cmd


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="slokit")
def main() -> None:
    """Observability and SLO toolkit for LLM inference serving."""
