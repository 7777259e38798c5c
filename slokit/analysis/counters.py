"""Cumulative counters read from samples already in memory."""

from __future__ import annotations


def increase(values: list[float]) -> tuple[float | None, int]:
    """Increase of a cumulative counter over consecutive samples, and the resets seen.

    Prometheus ``increase`` semantics: a decrease is a reset, and the increase over it is the
    new value. None with fewer than two samples."""
    total, resets, prev = 0.0, 0, None
    for v in values:
        if prev is not None:
            if v < prev:
                resets += 1
                total += v
            else:
                total += v - prev
        prev = v
    return (total if len(values) >= 2 else None), resets
