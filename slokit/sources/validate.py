"""Plausibility bounds for the values that reach the store, and the checks that apply them.

One client's bad value must never cost another client its data. A value DuckDB refuses (a NaN
latency that the merge turns into a timestamp, a token count past int64) aborts the writer's
shared transaction, and one that DuckDB keeps (an infinite counter, a latency of 1e308 s, a
start time in year 2554) poisons every analysis that reads it. Both are caught here, before
the writer. Two rules, one per kind of input (docs/validation.md has the table):

- **Spans and request records** with such a value are rejected whole, with a reason: an OTLP
  span per span (``partial_success``, ``slokit_spans_rejected_total{reason}``), a record of a
  file with ``file:line`` (the file is all-or-nothing). Their sender can be told, and half a
  request is worse than none.
- **Scraped sample values** (vLLM and DCGM expositions, recorded metric files) that are not
  finite or are outside their field's range become a missing fact (None) and are counted; the
  rest of the scrape is kept, as Prometheus keeps a NaN or +Inf sample. NaN, +Inf, -Inf and
  1e308 are treated alike.

Reasons are short and fixed (they are metric labels): ``<name> is not finite``, ``<name> is
negative``, ``<name> is out of range``, ``<name> is not a whole number``, ``<name> before
2000``, ``<name> more than a day ahead``.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import TypeAlias

from slokit.records import FRAGMENT_FIELDS, RequestFragment

#: Oldest plausible timestamp: 2000-01-01T00:00:00Z.
MIN_TS = 946_684_800.0
#: How far ahead of the receiving clock a timestamp may be (clock skew, time zones gone wrong).
FUTURE_SLACK_S = 86_400.0
#: Longest plausible duration of one request (queue, TTFT, E2E...): a week.
MAX_DURATION_S = 7 * 86_400.0
#: Most tokens one request can have used (prompt, output, cached): far beyond any context.
MAX_TOKENS = 1_000_000_000
#: ``max_tokens`` is what the caller asked for, not a measurement: anything BIGINT holds.
MAX_INT64 = 2**63 - 1
#: HTTP status codes are three digits.
HTTP_STATUS_RANGE = (100, 999)
#: A counter or gauge past 2**53 cannot count by one in a double: not a real value.
MAX_COUNT = float(2**53)
#: Ratios are 0..1; a rounding error above 1 is tolerated.
MAX_RATIO = 1.001

# -- primitive checks: None when fine, else why (without the name) ------------------------


def float_problem(x: float, lo: float, hi: float) -> str | None:
    if not math.isfinite(x):
        return "is not finite"
    if x < lo:
        return "is negative" if lo == 0 else "is out of range"
    if x > hi:
        return "is out of range"
    return None


def duration_problem(x: float) -> str | None:
    """A duration in seconds: finite, 0 .. :data:`MAX_DURATION_S`."""
    return float_problem(x, 0.0, MAX_DURATION_S)


def int_problem(x: float | int, hi: int) -> str | None:
    """A whole count 0 .. ``hi`` (an integral double such as ``12.0`` is fine)."""
    if isinstance(x, float):
        if not math.isfinite(x):
            return "is not finite"
        if not x.is_integer():
            return "is not a whole number"
    if x < 0:
        return "is negative"
    if x > hi:
        return "is out of range"
    return None


def timestamp_problem(ts: float, now: float) -> str | None:
    """An epoch time: finite, from 2000 to a day after ``now``."""
    if not math.isfinite(ts):
        return "is not finite"
    if ts < MIN_TS:
        return "before 2000"
    if ts > now + FUTURE_SLACK_S:
        return "more than a day ahead"
    return None


# -- request fragments (files; OTLP checks each attribute as it reads it) -----------------

_DURATION_FIELDS = tuple(f for f in FRAGMENT_FIELDS if f.endswith("_s"))
_TIME_FIELDS = tuple(f for f in FRAGMENT_FIELDS if f.endswith("_ts"))
_INT_LIMITS: dict[str, int] = {
    "prompt_tokens": MAX_TOKENS,
    "output_tokens": MAX_TOKENS,
    "cached_tokens": MAX_TOKENS,
    "preemptions": MAX_TOKENS,
    "max_tokens": MAX_INT64,
}


def fragment_problem(frag: RequestFragment, now: float) -> str | None:
    """Why ``frag`` cannot be stored (``"e2e_s is negative"``), or None when it can."""
    for name in _DURATION_FIELDS:
        v = getattr(frag, name)
        if v is not None and (why := duration_problem(v)):
            return f"{name} {why}"
    for name in _TIME_FIELDS:
        v = getattr(frag, name)
        if v is not None and (why := timestamp_problem(v, now)):
            return f"{name} {why}"
    for name, hi in _INT_LIMITS.items():
        v = getattr(frag, name)
        if v is not None and (why := int_problem(v, hi)):
            return f"{name} {why}"
    status = frag.http_status
    if status is not None and not HTTP_STATUS_RANGE[0] <= status <= HTTP_STATUS_RANGE[1]:
        return "http_status is out of range"
    return None


# -- scraped samples: a bad value is a missing fact, counted --------------------------------

#: Field ranges of EngineSample; fields not named here are counts (0 .. MAX_COUNT).
ENGINE_RANGES: dict[str, tuple[float, float]] = {"kv_usage_ratio": (0.0, MAX_RATIO)}
#: Field ranges of GpuSample; fields not named here are 0 .. MAX_COUNT.
GPU_RANGES: dict[str, tuple[float, float]] = {
    "util_ratio": (0.0, MAX_RATIO),
    "dram_active_ratio": (0.0, MAX_RATIO),
    "tensor_active_ratio": (0.0, MAX_RATIO),
    "gr_engine_active_ratio": (0.0, MAX_RATIO),
    "temperature_c": (-273.15, MAX_COUNT),
}
_COUNT_RANGE = (0.0, MAX_COUNT)

#: What a parser fills with ``field -> values made missing`` (None: do not count).
Invalid: TypeAlias = "Counter[str] | None"


def sample_value(
    v: float, field: str, ranges: dict[str, tuple[float, float]], invalid: Invalid
) -> float | None:
    """``v`` when it is finite and inside ``field``'s range, else None (counted in ``invalid``)."""
    lo, hi = ranges.get(field, _COUNT_RANGE)
    if lo <= v <= hi:  # False for NaN
        return v
    if invalid is not None:
        invalid[field] += 1
    return None


def is_count(v: float) -> bool:
    """True when ``v`` can be a cumulative count (a histogram's bucket, sum or count)."""
    return 0.0 <= v <= MAX_COUNT
