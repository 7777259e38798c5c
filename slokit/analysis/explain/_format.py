"""Numbers as a person reads them, shared by the cause sentence and the text rendering."""

from __future__ import annotations


def fmt_s(v: float | None) -> str:
    """Seconds as ``850 ms`` or ``2.65 s``; ``?`` when unknown."""
    if v is None:
        return "?"
    return f"{v * 1000:.0f} ms" if v < 1 else f"{v:.2f} s"


def pct(v: float | None) -> str:
    """A ratio as a whole percentage; ``?`` when unknown."""
    return "?" if v is None else f"{v * 100:.0f}%"


def ordinal(p: float) -> str:
    """``99`` -> ``99th``, ``21`` -> ``21st``."""
    n = round(p)
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"
