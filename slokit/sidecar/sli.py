"""The derived SLI and cost series: ``slokit_requests_total`` and friends, from the store.

A request is counted once, ``grace_s`` after its first fragment arrived (so the client's
fragment, which comes after vLLM's span, is part of the verdict). Each
:meth:`SliAccountant.tick` reads, through a read cursor, the requests whose first fragment's
``ingested_at`` fell in ``(previous cut, now - grace_s]``, classifies them with the SLO spec
(:func:`slokit.analysis.slo.classify`) and increments the counters. The first arrival of a
request never changes, so no request is counted twice and nothing per request is kept in
memory; a fragment that arrives later than ``grace_s`` after the first does not change a
verdict already counted (feedback should come within the grace period), however late it
comes. A tick's cost follows the requests that arrived since the last one, not the file's
age (see :func:`~slokit.store.queries.first_seen_between`).

A request a load test cut at its end (status ``incomplete``) is neither good nor bad: it is
left out of ``slokit_requests_total`` (whose ``outcome`` values the generated alert rules
depend on), of the output tokens and of the tasks, and counted per class in
``slokit_requests_incomplete_total``.

Cost accrues per second while a replica's vLLM scrape is up; the trailing-window gauges
divide it by the good requests (per class) and successful tasks of the same window, kept in
per-minute buckets (bounded memory at any request rate).

``replica`` and ``model`` come from the traffic: they go through a
:class:`~slokit.sidecar.labels.LabelBudget` (allow-list or top-N per label, an overall series
budget), so a flood of distinct model names is counted under ``model="other"`` instead of
making a series per request.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import duckdb

from slokit.analysis.slo import INCOMPLETE, OUTCOMES, classify
from slokit.analysis.slo_spec import SloSpec
from slokit.sidecar.labels import LabelBudget, LabelLimit
from slokit.sidecar.metrics import SLI_LABELS, SidecarMetrics
from slokit.store.queries import first_seen_between

UNCLASSIFIED = "unclassified"


@dataclass
class _Minute:
    cost_usd: float = 0.0
    good: Counter[str] = field(default_factory=Counter)
    single_tasks_ok: int = 0  # requests without a task id: a task of their own


class SliAccountant:
    def __init__(
        self,
        metrics: SidecarMetrics,
        spec: SloSpec | None,
        *,
        grace_s: float = 30.0,
        window_s: float = 3600.0,
        clock: Callable[[], float] = time.time,
        max_tasks: int = 100_000,
        labels: Mapping[str, LabelLimit] | None = None,
        max_series: int = 10_000,
    ) -> None:
        """``labels``: the budget of each label that comes from the traffic (default: the top
        100 ``model`` and ``replica`` values); ``max_series``: the series budget of
        ``slokit_requests_total`` and ``slokit_output_tokens_total`` together."""
        self.metrics = metrics
        self.spec = spec
        self.grace_s = grace_s
        self.window_s = window_s
        self.clock = clock
        self.max_tasks = max_tasks
        self._watermark = clock() - grace_s  # requests first seen before start: not counted
        self._lock = threading.Lock()
        self._minutes: OrderedDict[int, _Minute] = OrderedDict()
        self._tasks: OrderedDict[str, tuple[float, bool]] = OrderedDict()  # id -> (seen, ok)
        self.counted = 0  # requests counted since start (each exactly once)
        classes = 1 + (len(spec.classes) if spec is not None else 0)  # + unclassified
        families = (metrics.requests, metrics.output_tokens)
        self.budget = LabelBudget(
            metrics.label_values_folded, SLI_LABELS,
            labels if labels is not None else {"model": LabelLimit(), "replica": LabelLimit()},
            max_series=max_series, reserve=len(families) * classes * len(OUTCOMES), clock=clock,
        )  # fmt: skip
        self.budget.track(*families)
        if spec is not None:
            for c in spec.classes:
                metrics.slo_objective.labels(c.name).set(c.objective)
                for key, ms in c.bounds_ms().items():
                    metrics.slo_bound.labels(c.name, key.removesuffix("_ms")).set(ms / 1000.0)

    def _minute(self, now: float) -> _Minute:
        key = int(now // 60)
        m = self._minutes.get(key)
        if m is None:
            m = self._minutes[key] = _Minute()
        return m

    # -- cost ----------------------------------------------------------------------------
    def accrue(self, replica: str, seconds: float) -> None:
        """Add ``seconds`` of one replica being up (called by the scrape loop)."""
        spec = self.spec
        if spec is None or spec.gpu_hour_usd is None:
            return
        usd = spec.gpu_hour_usd * spec.gpus_per_replica * seconds / 3600.0
        self.metrics.gpu_cost.labels(replica).inc(usd)
        with self._lock:
            self._minute(self.clock()).cost_usd += usd

    def label(self, label: str, value: str) -> str:
        """``value`` as the exported series show it (``other`` when folded), e.g. for the
        replica of a finding; looks up only, counts nothing."""
        return self.budget.value(label, value, weight=0.0)

    # -- requests ------------------------------------------------------------------------
    def outcome(self, record: dict[str, Any]) -> tuple[str, str]:
        if self.spec is None:
            status = record.get("status")
            if status == INCOMPLETE:
                return UNCLASSIFIED, INCOMPLETE
            return UNCLASSIFIED, "good" if status == "ok" else "error"
        cls, outcome = classify(record, self.spec)
        return cls or UNCLASSIFIED, outcome

    def tick(self, con: duckdb.DuckDBPyConnection) -> int:
        """Count the requests that became final since the last tick; returns how many."""
        cut = self.clock() - self.grace_s
        if cut <= self._watermark:
            return 0
        records = first_seen_between(con, self._watermark, cut)
        self._watermark = cut
        now = self.clock()
        for rec in records:
            cls, outcome = self.outcome(rec)
            if outcome == INCOMPLETE:
                self.metrics.requests_incomplete.labels(cls).inc()
                continue
            labels = self.budget.labelset(
                (cls, str(rec.get("replica") or ""), str(rec.get("model") or ""), outcome)
            )
            self.metrics.requests.labels(*labels).inc()
            if rec.get("output_tokens"):
                self.metrics.output_tokens.labels(*labels).inc(rec["output_tokens"])
            good = outcome == "good"
            with self._lock:
                minute = self._minute(now)
                if good:
                    minute.good[cls] += 1
                task = rec.get("task_id")
                if task is None:
                    minute.single_tasks_ok += good
                else:
                    _, ok = self._tasks.pop(task, (now, True))
                    self._tasks[task] = (now, ok and good)
                    if len(self._tasks) > self.max_tasks:
                        self._tasks.popitem(last=False)
        self.counted += len(records)
        self._update_cost_gauges(now)
        return len(records)

    def _update_cost_gauges(self, now: float) -> None:
        if self.spec is None or self.spec.gpu_hour_usd is None:
            return
        first_minute = int((now - self.window_s) // 60)
        with self._lock:
            while self._minutes and next(iter(self._minutes)) < first_minute:
                self._minutes.popitem(last=False)
            while self._tasks and next(iter(self._tasks.values()))[0] < now - self.window_s:
                self._tasks.popitem(last=False)
            cost = sum(m.cost_usd for m in self._minutes.values())
            good: Counter[str] = Counter()
            for m in self._minutes.values():
                good.update(m.good)
            ok_tasks = sum(m.single_tasks_ok for m in self._minutes.values())
            ok_tasks += sum(1 for _, ok in self._tasks.values() if ok)
        for c in self.spec.classes:
            g = good[c.name]
            self.metrics.cost_per_good_request.labels(c.name).set(cost / g if g else math.nan)
        self.metrics.cost_per_successful_task.set(cost / ok_tasks if ok_tasks else math.nan)
