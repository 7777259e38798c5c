"""How the gate writes a fraction or a metric's value in check messages and summaries."""

from __future__ import annotations


def pct(v: float | None) -> str:
    """A fraction as a percentage with two decimals; ``-`` when unknown."""
    return "-" if v is None else f"{v * 100:.2f}%"


def fmt_metric(metric: str, v: float | None) -> str:
    """Attainment as a percentage, a latency (seconds) in milliseconds; ``-`` when unknown."""
    if v is None:
        return "-"
    return pct(v) if metric == "attainment" else f"{v * 1000:.1f} ms"
