"""A rate sweep and its DistServe max goodput."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from slokit.analysis.slo._classify import INCOMPLETE, classify
from slokit.analysis.slo._window import arrival
from slokit.analysis.slo_spec import SloSpec
from slokit.errors import BadInput


@dataclass(frozen=True)
class SweepPoint:
    """One step of a rate sweep: offered rate and whether every class met its objective."""

    label: str
    offered_rps: float
    requests: int
    good: int
    attainment: dict[str, float]
    meets_objectives: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "step": self.label,
            "offered_rps": self.offered_rps,
            "requests": self.requests,
            "good": self.good,
            "attainment": self.attainment,
            "meets_objectives": self.meets_objectives,
        }


@dataclass(frozen=True)
class MaxGoodput:
    """DistServe max goodput: the highest offered rate whose step (and every slower step)
    met every class's objective. ``rate_rps`` is None when even the slowest step failed;
    ``bounded`` is False when every step met them (the true maximum lies above the fastest
    rate tried, so ``rate_rps`` is a lower bound)."""

    rate_rps: float | None
    points: tuple[SweepPoint, ...]
    bounded: bool = True

    def to_json(self) -> dict[str, Any]:
        return {
            "definition": "highest offered arrival rate (req/s) at which every class's "
            "attainment stays at or above its objective (DistServe)",
            "max_goodput_rps": self.rate_rps,
            "bounded": self.bounded,
            "points": [p.to_json() for p in self.points],
        }


_RUN_SEQ = re.compile(r"^(?P<run>.+)-(?P<seq>\d+)$")


def run_of(request_id: Any) -> str:
    """The load run of a request id ``<run-id>-<seq>`` (``-`` when it has no such shape)."""
    m = _RUN_SEQ.match(str(request_id or ""))
    return m.group("run") if m else "-"


def sweep_points(
    records: Sequence[Mapping[str, Any]], spec: SloSpec, *, by: str | float = "run"
) -> list[SweepPoint]:
    """Group records into sweep steps and judge each.

    ``by="run"``: one step per run id (request ids ``<run-id>-<seq>``); the offered rate is
    ``(n - 1) / (last arrival - first arrival)``, exact for constant spacing. ``by=<seconds>``:
    consecutive windows of that length from the first arrival; the offered rate is arrivals
    / window length (a trailing partial window is dropped).
    """
    groups: dict[str, list[Mapping[str, Any]]] = {}
    rates: dict[str, float] = {}
    timed = [r for r in records if arrival(r) is not None]
    if by == "run":
        for r in timed:
            run = run_of(r.get("request_id"))
            if run != "-":  # requests not from a load run are no sweep step
                groups.setdefault(run, []).append(r)
        for label, rs in list(groups.items()):
            ts = sorted(a for r in rs if (a := arrival(r)) is not None)
            if len(ts) < 2 or ts[-1] <= ts[0]:
                del groups[label]
                continue
            rates[label] = (len(ts) - 1) / (ts[-1] - ts[0])
    else:
        if isinstance(by, str):
            raise BadInput(f"sweep grouping must be 'run' or a window in seconds, got {by!r}")
        width = float(by)
        if not width > 0:
            raise BadInput(f"sweep window must be > 0 s, got {width}")
        if not timed:
            return []
        t0 = min(a for r in timed if (a := arrival(r)) is not None)
        t_end = max(a for r in timed if (a := arrival(r)) is not None)
        full = int((t_end - t0) // width)
        for r in timed:
            a = arrival(r)
            assert a is not None
            k = int((a - t0) // width)
            if k < full:
                groups.setdefault(f"{t0 + k * width:.0f}", []).append(r)
        for label, rs in groups.items():
            rates[label] = len(rs) / width
    points = []
    for label, rs in groups.items():
        judged = [(name, o) for name, o in (classify(r, spec) for r in rs) if o != INCOMPLETE]
        att: dict[str, float] = {}
        meets = True
        for cls in spec.classes:
            outs = [o for name, o in judged if name == cls.name]
            if outs:
                att[cls.name] = sum(o == "good" for o in outs) / len(outs)
                meets = meets and att[cls.name] >= cls.objective
        good = sum(o == "good" for _, o in judged)
        points.append(SweepPoint(label, rates[label], len(rs), good, att, meets and bool(att)))
    return sorted(points, key=lambda p: p.offered_rps)


def max_goodput(points: Sequence[SweepPoint]) -> MaxGoodput:
    """Walk the steps by offered rate; the last one before the first miss is the max."""
    best: float | None = None
    for p in sorted(points, key=lambda p: p.offered_rps):
        if not p.meets_objectives:
            return MaxGoodput(best, tuple(points), bounded=True)
        best = p.offered_rps
    return MaxGoodput(best, tuple(points), bounded=not points)
