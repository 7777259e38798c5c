"""Multi-window multi-burn-rate alerting, kept as data.

A window pair says: alert with ``severity`` when, over both the ``long`` and the ``short``
window, errors arrive fast enough to spend ``budget_spent`` of the period's error budget
within ``long``. The burn-rate factor follows from the period, as sloth derives it::

    factor = budget_spent * period / long

so a 30-day period gives the SRE workbook's numbers (14.4x over 1h/5m, 6x over 6h/30m,
3x over 1d/2h, 1x over 3d/6h) and a 28-day period scales them (13.44x, 5.6x, 2.8x,
0.93x). The windows themselves stay as they are; ``scale`` shrinks every duration by the
same factor (tests run a "30-day" period in minutes), which leaves the factors unchanged.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from slokit.errors import BadInput

#: The reference period the workbook windows are written for.
REFERENCE_PERIOD_S = 30 * 86400.0


@dataclass(frozen=True)
class WindowPair:
    """One multi-window condition: ``budget_spent`` of the budget within ``long_s``."""

    severity: str  # "page" or "ticket": the Alertmanager routing key
    budget_spent: float  # fraction of the period's error budget, e.g. 0.02
    long_s: float
    short_s: float

    def factor(self, period_s: float) -> float:
        """The burn-rate threshold: how many times faster than "exactly on budget"."""
        return round(self.budget_spent * period_s / self.long_s, 6)


#: Google SRE workbook, chapter 5 ("Alerting on SLOs"), table 5-8: 2% of the budget in 1h,
#: 5% in 6h page; 10% in 1d and 10% in 3d open a ticket.
DEFAULT_WINDOWS: tuple[WindowPair, ...] = (
    WindowPair("page", 0.02, 3600.0, 300.0),
    WindowPair("page", 0.05, 6 * 3600.0, 1800.0),
    WindowPair("ticket", 0.10, 86400.0, 7200.0),
    WindowPair("ticket", 0.10, 3 * 86400.0, 6 * 3600.0),
)

_UNITS: tuple[tuple[str, int], ...] = (
    ("d", 86_400_000),
    ("h", 3_600_000),
    ("m", 60_000),
    ("s", 1_000),
    ("ms", 1),
)


#: The longest duration Prometheus parses (a Go ``time.Duration``: int64 nanoseconds).
MAX_PROM_DURATION_MS = (2**63 - 1) // 1_000_000
#: A Prometheus duration as ``model.ParseDuration`` reads it: units largest first, each once.
PROM_DURATION = re.compile(
    r"(?:[0-9]+y)?(?:[0-9]+w)?(?:[0-9]+d)?(?:[0-9]+h)?(?:[0-9]+m)?(?:[0-9]+s)?(?:[0-9]+ms)?"
)
_PROM_UNITS_MS = {"y": 365 * 86_400_000, "w": 7 * 86_400_000, "d": 86_400_000, "h": 3_600_000, "m": 60_000, "s": 1_000, "ms": 1}  # fmt: skip


def parse_prom_duration(text: str, what: str = "duration") -> str:
    """Check ``text`` is a Prometheus duration (``1m``, ``1h30m``, ``500ms``) above zero that
    Prometheus can hold; return it unchanged. Anything else is :class:`BadInput` naming ``what``."""
    if len(text) > 64 or not text or not PROM_DURATION.fullmatch(text):
        raise BadInput(
            f"{what}: not a Prometheus duration: {text[:64]!r} (expected e.g. 30s, 1m, 1h30m)"
        )
    ms = sum(
        int(n) * _PROM_UNITS_MS[unit] for n, unit in re.findall(r"([0-9]+)(ms|[ywdhms])", text)
    )
    if not 0 < ms <= MAX_PROM_DURATION_MS:
        raise BadInput(f"{what}: must be above 0 and at most 292y, got {text!r}")
    return text


def check_scale(scale: float) -> float:
    """A window scale (``--window-scale``) must be a finite number above 0."""
    if (
        isinstance(scale, bool)
        or not isinstance(scale, int | float)
        or not math.isfinite(scale)
        or scale <= 0
    ):
        raise BadInput(f"window scale (--window-scale) must be a finite number > 0, got {scale!r}")
    return scale


def prom_duration(seconds: float) -> str:
    """Seconds -> a Prometheus duration in the largest exact unit: 3600 -> ``1h``, 0.5 -> ``500ms``.

    Durations are whole milliseconds (what Prometheus accepts); anything shorter is refused,
    and so is anything longer than Prometheus can hold (292 years).
    """
    if not math.isfinite(seconds) or seconds * 1000 > MAX_PROM_DURATION_MS:
        raise BadInput(
            f"a window of {seconds:g}s is longer than a Prometheus duration can be (292y); "
            f"is the window scale too small?"
        )
    ms = round(seconds * 1000)
    if ms <= 0:
        raise BadInput(f"a window must be at least 1ms, got {seconds}s")
    for unit, size in _UNITS:
        if ms % size == 0:
            return f"{ms // size}{unit}"
    raise AssertionError("unreachable: 1ms divides every whole number of ms")


@dataclass(frozen=True)
class BurnRatePlan:
    """The windows of one SLO period, scaled: what the rule generator iterates over."""

    period_s: float
    windows: tuple[WindowPair, ...] = DEFAULT_WINDOWS
    scale: float = 1.0  # every duration is divided by this (tests: run "30d" in minutes)

    def __post_init__(self) -> None:
        check_scale(self.scale)
        if self.period_s <= 0:
            raise BadInput(f"SLO period must be > 0, got {self.period_s}s")
        for w in self.windows:
            if not 0 < w.short_s < w.long_s:
                raise BadInput(f"short window must be shorter than the long one: {w}")

    def duration(self, seconds: float) -> str:
        return prom_duration(seconds / self.scale)

    def rate_windows(self) -> list[str]:
        """Every window an error-ratio recording rule is needed for, shortest first."""
        secs = sorted({s for w in self.windows for s in (w.short_s, w.long_s)})
        return [self.duration(s) for s in secs]
