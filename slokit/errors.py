"""Errors that carry context; the CLI maps them to exit codes."""

from __future__ import annotations

import math
import reprlib
from typing import Any

_short = reprlib.Repr()
_short.maxstring = _short.maxother = 50
_short.maxlist = _short.maxdict = 4
_short.maxlevel = 2


def show(value: Any) -> str:
    """A value for an error message: its repr, cut short (a value read from a user's file
    can be megabytes long, or an integer of thousands of digits)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"an integer of about {int(value.bit_length() * math.log10(2)) + 1} digits"
    return _short.repr(value)


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
