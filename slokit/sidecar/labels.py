"""Label budgets: the exported series whose label values come from the traffic stay bounded.

``model`` and ``replica`` of ``slokit_requests_total`` come from span attributes, so a client
that sends a fresh ``gen_ai.request.model`` per request would otherwise make a series per
request. Each such label has a :class:`LabelLimit`:

* an allow-list: only those values keep their own label, every other value is ``other``;
* or a top-N by traffic: at most ``max_values`` values keep their own label. Free places go
  to the first values seen; once all are taken, a value takes the place of the least busy one
  when it has had at least twice its traffic (and at least :data:`MIN_ADMIT` requests), with
  traffic counted with a half-life (:attr:`LabelBudget.half_life_s`, 1 h) so that it means
  *recent* traffic. The displaced value's series are removed (its past counts stay in the
  samples Prometheus already has) and it is reported as ``other`` from then on. Candidates
  are tracked in a bounded table (:data:`CANDIDATES_PER_VALUE` per place), pruned to its
  busiest half when full.

On top of that, :meth:`LabelBudget.labelset` keeps the number of label sets, and so of
series, under an overall budget: past it, a new combination is counted with its foldable
labels set to ``other``. Those fully folded sets are kept within the budget by a reserve the
caller sizes (one per value of the unfoldable labels).

Every folded observation counts in ``slokit_label_values_folded_total{label,reason}``. The
folding never loses a count: a request is always counted, under its own value or ``other``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter

from slokit.errors import BadInput

OTHER = "other"
#: Values longer than this are folded (reason ``too_long``): label values are not payloads.
MAX_VALUE_CHARS = 200
#: A value must have had at least this many (decayed) requests to displace another.
MIN_ADMIT = 5.0
#: Displacing needs this many times the traffic of the least busy value (hysteresis).
DISPLACE_RATIO = 2.0
#: Candidate table size per place of the top-N.
CANDIDATES_PER_VALUE = 10
#: Renormalise the decay scale when its exponent passes this (keeps floats finite).
_MAX_EXPONENT = 60.0


@dataclass(frozen=True)
class LabelLimit:
    """``allow`` (when not empty) lists the only values kept; otherwise the top ``max_values``."""

    max_values: int = 100
    allow: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if self.max_values < 1 and not self.allow:
            raise BadInput(f"a label budget needs at least one value, got {self.max_values}")


class _TopN:
    """The admitted values of one label and the candidates for a place, with decayed counts."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.capacity = max(64, CANDIDATES_PER_VALUE * n)
        self.admitted: dict[str, float] = {}
        self.candidates: dict[str, float] = {}
        self._floor = 0.0  # a lower bound of min(admitted.values()): counts only grow

    def see(self, value: str, inc: float) -> tuple[bool, str | None]:
        """Count ``inc`` for ``value``: (does it keep its own label, the value it displaced)."""
        admitted = self.admitted
        if value in admitted:
            admitted[value] += inc
            return True, None
        if len(admitted) < self.n:
            admitted[value] = self.candidates.pop(value, 0.0) + inc
            return True, None
        count = self.candidates.get(value, 0.0) + inc
        if inc > 0 and count >= MIN_ADMIT * inc and count >= DISPLACE_RATIO * self._floor:
            weakest = min(admitted, key=admitted.__getitem__)
            least = admitted[weakest]
            if count >= DISPLACE_RATIO * least:
                del admitted[weakest]
                self.candidates.pop(value, None)
                admitted[value] = count
                self.candidates[weakest] = least
                self._floor = min(admitted.values())
                return True, weakest
            self._floor = least
        if inc > 0:
            self.candidates[value] = count
            if len(self.candidates) > self.capacity:
                keep = sorted(self.candidates.items(), key=lambda kv: kv[1], reverse=True)
                self.candidates = dict(keep[: self.capacity // 2])
        return False, None

    def rescale(self, factor: float) -> None:
        for d in (self.admitted, self.candidates):
            for k in d:
                d[k] *= factor
        self._floor *= factor


@dataclass
class _Family:
    metric: Any  # a prometheus_client metric with labels
    order: tuple[int, ...]  # its label i is the budget's label order[i]


class LabelBudget:
    """Folds label values into ``other`` per :class:`LabelLimit` and keeps a series budget.

    ``labels`` are the label names of the label sets passed to :meth:`labelset` (in order);
    ``limits`` names the foldable ones. ``max_series`` bounds the series of the ``families``
    registered with :meth:`track` together; ``reserve`` of it is kept for fully folded sets.
    Thread-safe (the SLI and findings ticks run in worker threads).
    """

    def __init__(
        self,
        folded: Counter,
        labels: Sequence[str],
        limits: Mapping[str, LabelLimit],
        *,
        max_series: int = 10_000,
        reserve: int = 0,
        half_life_s: float = 3600.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        unknown = sorted(set(limits) - set(labels))
        if unknown:
            raise BadInput(f"label budget for unknown labels {unknown}; known: {list(labels)}")
        if max_series <= reserve:
            raise BadInput(
                f"metrics_max_series {max_series} leaves no room: {reserve} series are kept "
                "for the label sets folded into 'other'; raise it"
            )
        self.folded = folded
        self.labels = tuple(labels)
        self.limits = dict(limits)
        self.max_series = max_series
        self.reserve = reserve
        self.half_life_s = half_life_s
        self.clock = clock
        self._foldable = [i for i, name in enumerate(self.labels) if name in limits]
        self._top = {k: _TopN(v.max_values) for k, v in limits.items() if not v.allow}
        self._t0 = clock()
        self._lock = threading.Lock()
        self._families: list[_Family] = []
        self._sets: set[tuple[str, ...]] = set()

    def track(self, *metrics: Any) -> None:
        """Count the series of these metrics (labelled like :attr:`labels`) in the budget."""
        for m in metrics:
            names = tuple(getattr(m, "_labelnames", ()))
            if set(names) != set(self.labels):
                raise ValueError(f"{m} has labels {names}, the budget {self.labels}")
            self._families.append(_Family(m, tuple(self.labels.index(n) for n in names)))

    # -- one label -----------------------------------------------------------------------
    def _inc(self) -> float:
        exponent = (self.clock() - self._t0) / self.half_life_s
        if exponent > _MAX_EXPONENT:
            factor = 2.0**-exponent
            for top in self._top.values():
                top.rescale(factor)
            self._t0 = self.clock()
            exponent = 0.0
        return float(2.0**exponent)

    def value(self, label: str, value: str, weight: float = 1.0) -> str:
        """``value`` or ``other`` for ``label``; ``weight`` is the traffic it stands for (0:
        look up only, e.g. for a finding, neither counted as traffic nor as folded)."""
        with self._lock:
            return self._value(label, value, weight)

    def _value(self, label: str, value: str, weight: float) -> str:
        limit = self.limits.get(label)
        if limit is None:
            return value
        if len(value) > MAX_VALUE_CHARS:
            return self._fold(label, "too_long", weight)
        if limit.allow:
            return value if value in limit.allow else self._fold(label, "not_allowed", weight)
        kept, displaced = self._top[label].see(value, weight * self._inc() if weight else 0.0)
        if displaced is not None:
            self._drop(label, displaced)
        return value if kept else self._fold(label, "top_n", weight)

    def _fold(self, label: str, reason: str, weight: float) -> str:
        if weight:
            self.folded.labels(label=label, reason=reason).inc()
        return OTHER

    def _drop(self, label: str, value: str) -> None:
        """Remove the series of a value that lost its place."""
        i = self.labels.index(label)
        gone = [s for s in self._sets if s[i] == value]
        for s in gone:
            self._sets.discard(s)
            for fam in self._families:
                fam.metric.remove(*(s[j] for j in fam.order))

    # -- a whole label set ---------------------------------------------------------------
    def labelset(self, values: Sequence[str], weight: float = 1.0) -> tuple[str, ...]:
        """Fold each foldable label of ``values`` (ordered like :attr:`labels`), then the set
        itself if it is new and the series budget is spent. The result is what to export."""
        with self._lock:
            out = list(values)
            for i in self._foldable:
                out[i] = self._value(self.labels[i], out[i], weight)
            s = tuple(out)
            if s in self._sets:
                return s
            fully_folded = all(s[i] == OTHER for i in self._foldable)  # the reserve's
            room = self.max_series - self.reserve
            if not fully_folded and (len(self._sets) + 1) * len(self._families) > room:
                for i in self._foldable:
                    if s[i] != OTHER:
                        self._fold(self.labels[i], "series_budget", weight)
                        out[i] = OTHER
                s = tuple(out)
            self._sets.add(s)
            return s


def label_limits(cfg: Any) -> dict[str, LabelLimit]:
    """The budgets of ``model`` and ``replica`` from a :class:`SidecarConfig`'s ``metrics_*``."""
    return {
        "model": LabelLimit(cfg.metrics_max_models, frozenset(cfg.metrics_allow_models)),
        "replica": LabelLimit(cfg.metrics_max_replicas, frozenset(cfg.metrics_allow_replicas)),
    }
