"""The ``slokit`` command line: a click group whose commands live one per module here.

Each module in this package exposes ``command`` (a click command or group); the group
discovers them, so adding a command is adding a file. Commands parse flags, call the
library, print, and map :class:`slokit.errors.SlokitError` to exit codes.
"""

from __future__ import annotations

import importlib
import pkgutil

import click

from slokit import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="slokit")
def main() -> None:
    """Observability and SLO toolkit for LLM inference serving."""


def _register() -> None:
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        cmd = getattr(module, "command", None)
        if isinstance(cmd, click.Command):
            main.add_command(cmd)


_register()
