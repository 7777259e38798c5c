"""Errors that carry context; the CLI maps them to exit codes."""

from __future__ import annotations


class SlokitError(Exception):
    """Base class. ``exit_code`` is what the CLI exits with."""

    exit_code = 1


class BadInput(SlokitError):
    """Malformed or unusable input (a file, a flag, a spec). Exit 2."""

    exit_code = 2


class NotFound(SlokitError):
    """The request or the data asked for is not there. Exit 3."""

    exit_code = 3


class StoreBusy(SlokitError):
    """The DuckDB file is held by another process (a running sidecar). Exit 4."""

    exit_code = 4
