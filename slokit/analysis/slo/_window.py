"""The window of a report: which records belong to it and how long it lasted."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from slokit.analysis.slo._classify import as_number, measurement


@dataclass(frozen=True)
class Window:
    """The evaluated span. ``duration_s`` is None when the records carry no times."""

    since: float | None
    until: float | None
    duration_s: float | None
    basis: str  # "window" | "data" | "given" | "none"


def arrival(r: Mapping[str, Any]) -> float | None:
    return as_number(r.get("arrival_ts"))


def finish(r: Mapping[str, Any]) -> float | None:
    f = as_number(r.get("finish_ts"))
    if f is not None:
        return f
    a, e = arrival(r), measurement(r, "e2e")
    return a + e if a is not None and e is not None else a


def in_window(
    records: Iterable[Mapping[str, Any]], since: float | None, until: float | None
) -> list[Mapping[str, Any]]:
    """Records arriving in ``[since, until)``; with no bounds, all of them."""
    if since is None and until is None:
        return list(records)
    out = []
    for r in records:
        a = arrival(r)
        if a is None:
            continue
        if since is not None and a < since:
            continue
        if until is not None and a >= until:
            continue
        out.append(r)
    return out


def resolve_window(
    records: Sequence[Mapping[str, Any]],
    since: float | None = None,
    until: float | None = None,
    duration_s: float | None = None,
) -> Window:
    """The window's duration: explicit ``duration_s``, else since..until, else the data span."""
    if duration_s is not None:
        return Window(since, until, duration_s, "given")
    arrivals = [a for r in records if (a := arrival(r)) is not None]
    finishes = [f for r in records if (f := finish(r)) is not None]
    lo = since if since is not None else (min(arrivals) if arrivals else None)
    hi = until if until is not None else (max(finishes) if finishes else None)
    if lo is None or hi is None or hi <= lo:
        return Window(lo, hi, None, "none")
    basis = "window" if since is not None and until is not None else "data"
    return Window(lo, hi, hi - lo, basis)
