"""Inline SVG charts for the HTML report: line/scatter charts and stacked bars, drawn as
text with no JavaScript, fonts or fetched resources. Every data point is one element with
``class="mark"``, so a reader (or a test) can tell an empty plot from a drawn one."""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from slokit.timeutil import iso

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#17becf")


@dataclass
class Series:
    name: str
    points: list[tuple[float, float]]
    color: str = PALETTE[0]
    line: bool = True


@dataclass
class Chart:
    name: str
    title: str
    x_label: str
    y_label: str
    series: list[Series] = field(default_factory=list)
    x_time: bool = False
    note: str = ""


def _nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step) * step
    ticks = []
    t = start
    while t <= hi + step * 1e-9:
        ticks.append(round(t, 12))
        t += step
    return ticks


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.3g}"


def esc(s: Any) -> str:
    return html.escape(str(s), quote=True)


def svg_chart(chart: Chart, width: int = 640, height: int = 300) -> str:
    """A line/scatter chart with axes, ticks and a legend, as an SVG string."""
    pts = [p for s in chart.series for p in s.points]
    ml, mr, mt, mb = 64, 16, 16, 44
    pw, ph = width - ml - mr, height - mt - mb
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{esc(chart.title)}">'
    ]
    if not pts:
        parts.append(
            f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle" '
            'class="empty">no data</text></svg>'
        )
        return "".join(parts)
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    x0, x1 = min(xs), max(xs)
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    y1 = max(ys) * 1.08 if max(ys) > 0 else 1.0
    yt = _nice_ticks(0.0, y1)
    y1 = max(y1, yt[-1])

    def sx(x: float) -> float:
        return ml + (x - x0) / (x1 - x0) * pw

    def sy(y: float) -> float:
        return mt + ph - (y / y1) * ph

    parts.append(f'<rect x="{ml}" y="{mt}" width="{pw}" height="{ph}" class="plot"/>')
    for t in yt:
        parts.append(
            f'<line x1="{ml}" x2="{ml + pw}" y1="{sy(t):.1f}" y2="{sy(t):.1f}" class="grid"/>'
        )
        parts.append(f'<text x="{ml - 6}" y="{sy(t) + 4:.1f}" text-anchor="end">{_fmt(t)}</text>')
    for t in _nice_ticks(x0, x1):
        if t < x0 or t > x1:
            continue
        label = (iso(t) or "")[11:19] if chart.x_time else _fmt(t)
        parts.append(
            f'<text x="{sx(t):.1f}" y="{mt + ph + 16}" text-anchor="middle">{esc(label)}</text>'
        )
    parts.append(
        f'<text x="{ml + pw / 2}" y="{height - 6}" text-anchor="middle" class="axis">'
        f"{esc(chart.x_label)}</text>"
    )
    parts.append(
        f'<text x="14" y="{mt + ph / 2}" text-anchor="middle" class="axis" '
        f'transform="rotate(-90 14 {mt + ph / 2})">{esc(chart.y_label)}</text>'
    )
    for i, s in enumerate(chart.series):
        ordered = sorted(s.points)
        if s.line and len(ordered) > 1:
            path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in ordered)
            parts.append(
                f'<polyline points="{path}" fill="none" stroke="{s.color}" stroke-width="1.5"/>'
            )
        r = 3 if s.line else 2.5
        for x, y in ordered:
            parts.append(
                f'<circle class="mark" cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="{r}" '
                f'fill="{s.color}"><title>{esc(s.name)}: {_fmt(x)}, {_fmt(y)}'
                "</title></circle>"
            )
        lx = ml + 10 + i * 150
        parts.append(f'<rect x="{lx}" y="{mt + 6}" width="10" height="10" fill="{s.color}"/>')
        parts.append(f'<text x="{lx + 14}" y="{mt + 15}">{esc(s.name)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def svg_stacked_bars(
    rows: Sequence[tuple[str, Mapping[str, float]]], parts_order: Sequence[str], width: int = 640
) -> str:
    """Horizontal stacked bars (one per row), seconds on the x axis, with a legend."""
    row_h, ml, mr, mt = 22, 150, 60, 30
    height = mt + row_h * max(1, len(rows)) + 30
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="latency decomposition">'
    ]
    if not rows:
        out.append(
            f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle" class="empty">'
            "no data</text></svg>"
        )
        return "".join(out)
    total = max(sum(p.values()) for _, p in rows) or 1.0
    pw = width - ml - mr
    for i, name in enumerate(parts_order):
        lx = ml + i * 110
        out.append(f'<rect x="{lx}" y="8" width="10" height="10" fill="{PALETTE[i]}"/>')
        out.append(f'<text x="{lx + 14}" y="17">{esc(name)}</text>')
    for j, (label, comp) in enumerate(rows):
        y = mt + j * row_h
        out.append(f'<text x="{ml - 6}" y="{y + 14}" text-anchor="end">{esc(label)}</text>')
        x = float(ml)
        for i, name in enumerate(parts_order):
            v = comp.get(name, 0.0)
            if v <= 0:
                continue
            w = v / total * pw
            out.append(
                f'<rect class="mark" x="{x:.1f}" y="{y + 3}" width="{w:.1f}" '
                f'height="{row_h - 6}" fill="{PALETTE[i]}"><title>{esc(label)} '
                f"{esc(name)}: {v * 1000:.0f} ms</title></rect>"
            )
            x += w
        out.append(f'<text x="{x + 4:.1f}" y="{y + 14}">{sum(comp.values()):.2f} s</text>')
    out.append(
        f'<text x="{ml + pw / 2}" y="{height - 6}" text-anchor="middle" class="axis">'
        "seconds (bar length relative to the slowest)</text></svg>"
    )
    return "".join(out)
