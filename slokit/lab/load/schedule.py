"""Open-loop arrival schedules: the send offsets of a run, drawn from its seed.

Send times are precomputed (Poisson or constant spacing) and kept even when the server is
slow: a request is sent at its scheduled time whether or not earlier ones have answered.
"""

from __future__ import annotations

import math
import random
from typing import Literal

from slokit.errors import BadInput

Arrival = Literal["poisson", "constant"]


def poisson_schedule(rate: float, duration_s: float, rng: random.Random) -> list[float]:
    """Send offsets (seconds from start) of a Poisson process at ``rate`` over ``duration_s``.

    The process is conditioned on its count: exactly ``round(rate * duration_s)`` arrivals,
    placed uniformly at random (the order statistics of a Poisson process given its count),
    so the offered rate equals the target and the gaps are exponential.
    """
    check_rate(rate, duration_s)
    n = round(rate * duration_s)
    return sorted(rng.uniform(0.0, duration_s) for _ in range(n))


def constant_schedule(rate: float, duration_s: float) -> list[float]:
    """Send offsets ``0, 1/rate, 2/rate, ...`` below ``duration_s``."""
    check_rate(rate, duration_s)
    n = round(rate * duration_s)
    return [i / rate for i in range(n)]


def make_schedule(
    arrival: Arrival, rate: float, duration_s: float, rng: random.Random
) -> list[float]:
    if arrival == "poisson":
        return poisson_schedule(rate, duration_s, rng)
    if arrival == "constant":
        return constant_schedule(rate, duration_s)
    raise BadInput(f"unknown arrival process {arrival!r} (poisson or constant)")


def check_rate(rate: float, duration_s: float) -> None:
    """:class:`BadInput` unless ``rate`` over ``duration_s`` schedules at least one request."""
    if not rate > 0 or not math.isfinite(rate):
        raise BadInput(f"rate must be a positive number, got {rate!r}")
    if not duration_s > 0:
        raise BadInput(f"duration must be positive, got {duration_s!r}")
    if round(rate * duration_s) < 1:
        raise BadInput(f"rate {rate:g}/s over {duration_s:g}s schedules no request at all")
