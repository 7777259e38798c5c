"""Time parsing and formatting shared by the CLI and the library.

A time ``T`` is ISO 8601, Unix seconds, or a duration back from a reference (the newest
data, never wall-clock now) such as ``15m``, ``2h``, ``1d``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime

from slokit.errors import BadInput

Clock = Callable[[], float]

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)\s*$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


def parse_duration(text: str) -> float:
    """``'15m'`` -> 900.0. Raises :class:`BadInput` on anything else."""
    m = _DURATION.match(text)
    if not m:
        raise BadInput(f"not a duration: {text!r} (expected e.g. 30s, 15m, 2h, 30d)")
    return float(m.group(1)) * _UNIT_S[m.group(2)]


def is_duration(text: str) -> bool:
    """Whether ``text`` is a duration such as ``15m`` (as a time: back from the newest data)."""
    return _DURATION.match(text) is not None


def parse_time(text: str, reference_ts: float | None = None) -> float:
    """Parse ``T`` into epoch seconds; durations count back from ``reference_ts``."""
    t = text.strip()
    if _DURATION.match(t):
        if reference_ts is None:
            raise BadInput(f"relative time {text!r} needs data to count back from")
        return reference_ts - parse_duration(t)
    try:
        return float(t)
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(t.replace("Z", "+00:00"))
    except ValueError as exc:
        raise BadInput(f"not a time: {text!r} (ISO 8601, Unix seconds, or e.g. 15m)") from exc
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


def iso(ts: float | None) -> str | None:
    """Epoch seconds -> ISO 8601 UTC with milliseconds, or None."""
    if ts is None:
        return None
    return (
        datetime.fromtimestamp(ts, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    )
