"""JSON that anyone may have written (a load tool's file, a client's body): every way
:func:`json.loads` fails on hostile text is one exception, :class:`NotJson`, with a message
and a line; numbers are read as finite floats or not at all.

:func:`json.loads` raises :class:`json.JSONDecodeError` for text that is not JSON, but a plain
:class:`ValueError` for an integer of more than 4,300 digits, :class:`RecursionError` for
arrays nested past the interpreter's stack, and :func:`float` an :class:`OverflowError` for an
integer past 1.8e308: each once escaped a reader that caught only the first.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from typing import Any

__all__ = ["NotJson", "finite", "lines", "loads", "shown"]


class NotJson(ValueError):
    """The text is not a JSON document Python can hold (``msg``, at ``lineno``)."""

    def __init__(self, msg: str, lineno: int = 1) -> None:
        super().__init__(msg)
        self.msg = msg
        self.lineno = lineno


def loads(text: str | bytes) -> Any:
    """``json.loads(text)``; :class:`NotJson` however it fails."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise NotJson(exc.msg, exc.lineno) from None
    except RecursionError:
        raise NotJson("nested too deeply") from None
    except ValueError as exc:  # an integer of more than 4,300 digits; bytes not UTF-8
        raise NotJson(str(exc).split("\n", 1)[0][:200]) from None


#: JSON Lines ends a line at ``\n`` (``\r\n`` too) only: not at the Unicode separators
#: (U+2028, U+0085, ...) that :meth:`str.splitlines` also splits at, which a JSON string may
#: hold raw.
_NEWLINE = re.compile(r"\r?\n")


def lines(text: str) -> Iterator[tuple[int, str]]:
    """``(line number, line)`` of a JSON Lines text, blank lines included."""
    for lineno, line in enumerate(_NEWLINE.split(text), start=1):
        yield lineno, line.removesuffix("\r")


def finite(v: Any) -> float | None:
    """``v`` as a float when it is a JSON number a float holds finitely (not a bool, NaN,
    an infinity or an integer past a float's range), else None."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    try:
        f = float(v)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None


def shown(v: Any, limit: int = 60) -> str:
    """A JSON value for an error message: an array or object by its kind (a deep one's
    ``repr`` can exhaust the stack), anything else as its ``repr``, cut at ``limit``."""
    if isinstance(v, list):
        return "an array"
    if isinstance(v, dict):
        return "an object"
    try:
        text = repr(v)
    except ValueError:  # an integer too long to print
        return "a number too long to show"
    return text if len(text) <= limit else text[: limit - 3] + "..."
