"""The window a question is asked over, resolved once, by one function.

A bound is ISO 8601, Unix seconds, or a duration back from the newest data the reader holds
(``15m``: never wall-clock now, so a recording answers the same way next week). The CLI, the
sidecar API and the library all resolve ``--since``/``--until`` here, so ``slokit diagnose
--since 15m`` and ``/api/diagnose?since=15m`` ask about the same window.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

from slokit.errors import BadInput
from slokit.timeutil import is_duration, iso, parse_time

__all__ = ["Bounded", "Window", "resolve_window"]


class Bounded(Protocol):
    """Anything that knows the oldest and newest time of its data (every reader does)."""

    def bounds(self) -> tuple[float | None, float | None]: ...


@dataclass(frozen=True)
class Window:
    """``[since, until]`` in epoch seconds; ``None`` is open: from the oldest or to the
    newest data."""

    since: float | None = None
    until: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"since": iso(self.since), "until": iso(self.until)}


Bound = str | float | int | None


#: The latest time a bound may name: the end of year 9999 (what ISO 8601 can write).
MAX_TS = 253402300799.0


def _parse(name: str, value: Bound, newest: float | None) -> float | None:
    """One bound as epoch seconds: BadInput unless finite and within 1970..9999."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        if len(value) > 64:
            raise BadInput(f"{name}: not a time ({len(value)} characters)")
        ts = parse_time(value, newest)
    else:
        ts = float(value)
    if not math.isfinite(ts) or not 0 <= ts <= MAX_TS:
        raise BadInput(
            f"{name}={value!r} is out of range: expected ISO 8601, Unix seconds from 1970 to "
            "9999, or a duration such as 15m"
        )
    return ts


def resolve_window(data: Bounded, since: Bound = None, until: Bound = None) -> Window:
    """Parse ``since``/``until`` against ``data``'s newest time (asked only when a bound is a
    duration). Raises :class:`BadInput` on an unreadable bound or an empty window."""
    relative = any(isinstance(v, str) and is_duration(v) for v in (since, until))
    newest = data.bounds()[1] if relative else None
    lo, hi = _parse("since", since, newest), _parse("until", until, newest)
    if lo is not None and hi is not None and hi <= lo:
        raise BadInput(f"empty window: since={since!r} is not before until={until!r}")
    return Window(lo, hi)
