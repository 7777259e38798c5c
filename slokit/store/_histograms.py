"""Request-level frames and summaries from vLLM's histograms and counters in Prometheus.

A Prometheus backend has no per-request records, so the facts the rules read of requests
are built from increases per pod:

* ``request_buckets``: per bucket of ``bucket_s``, ``increase(...[bucket_s])`` evaluated at
  the bucket's end (so it covers the bucket). ``n`` is the increase of TTFT observations
  (requests that got a first token in the bucket: arrival is not in the histograms, so a
  request lands in the bucket of its first token), ``ttft_p95``/``tpot_p50`` are
  ``histogram_quantile`` of the bucket increases, the means are increases of ``_sum`` over
  ``_count``; ``frontend_mean`` is TTFT's mean less queue's and prefill's (a difference of
  means, not a mean of differences), ``n_timed`` the queue-time observations.
* ``finished_buckets``: ``vllm:request_success_total`` and the generated tokens of finished
  requests per bucket.
* summaries over any window: one instant query for the bucket increases (quantiles and the
  TTFT standard deviation computed in :mod:`slokit.store._promql`) and one for sums and
  counts.

Errors are only known from slokit's ``slokit_requests_total{outcome="error"}`` (vLLM counts
no failed requests): without it ``n_err`` is NaN/None, unknown, and ``top_error`` and
``top_http_status`` are always None. Counts are rounded increases (Prometheus extrapolates
an increase to the window's edges).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from slokit.sources.prometheus import PrometheusClient, Series, chunks
from slokit.store import _promql as pq

if TYPE_CHECKING:  # pandas builds the frames only when a diagnosis asks for them
    import pandas as pd

REQUEST_COLUMNS = ("replica", "bucket", "n", "n_err", "ttft_p95", "tpot_p50", "queue_mean",
                   "prefill_mean", "frontend_mean", "prompt_mean", "n_timed", "first_t",
                   "last_t")  # fmt: skip
FINISHED_COLUMNS = ("replica", "bucket", "completed", "output_tokens")


def _range(
    client: PrometheusClient, expr: str, start: float, end: float, step: float
) -> list[Series]:
    out: list[Series] = []
    for a, b in chunks(start, end, step):
        out.extend(client.query_range(expr, a, b, step))
    return out


class _Grid:
    """Bucket ``b`` of ``[origin, until)`` is evaluated at ``origin + (b + 1) * bucket_s``."""

    def __init__(self, origin: float, until: float, bucket_s: float) -> None:
        self.origin, self.until, self.bucket_s = origin, until, bucket_s
        self.count = max(1, math.ceil((until - origin) / bucket_s - 1e-9))

    def fetch(
        self, client: PrometheusClient, pod_label: str, expr: str, *, additive: bool = False
    ) -> dict[tuple[str, int], float]:
        """``(replica, bucket) -> value``; several series of one pod are summed when the
        value is ``additive`` (counts), else the first is kept."""
        start = self.origin + self.bucket_s
        end = self.origin + self.count * self.bucket_s
        out: dict[tuple[str, int], float] = {}
        for s in _range(client, expr, start, end, self.bucket_s):
            replica = pq.replica_of(s.labels, pod_label)
            for t, v in s.points:
                b = round((t - self.origin) / self.bucket_s) - 1
                key = (replica, b)
                if key not in out:
                    out[key] = v
                elif additive:
                    out[key] += v
        return out

    def span(self, b: int) -> tuple[float, float]:
        lo = self.origin + b * self.bucket_s
        return lo, min(self.until, lo + self.bucket_s)


def _frame(rows: list[dict[str, Any]], columns: tuple[str, ...]) -> pd.DataFrame:
    import pandas as pd  # deferred: heavy, and only a diagnosis needs frames

    frame = pd.DataFrame(rows, columns=list(columns))
    if frame.empty:
        return frame.astype({"replica": "object", "bucket": "int64"})
    return frame.sort_values(["replica", "bucket"], ignore_index=True)


def _nan(v: float | None) -> float:
    return math.nan if v is None or not math.isfinite(v) else v


def request_buckets(
    client: PrometheusClient, pod_label: str, origin: float, until: float, bucket_s: float
) -> pd.DataFrame:
    grid, by = _Grid(origin, until, bucket_s), pq.grouping(pod_label)

    def get(expr: str, additive: bool = False) -> dict[tuple[str, int], float]:
        return grid.fetch(client, pod_label, expr, additive=additive)

    n = get(pq.increase(pq.TTFT + "_count", by, bucket_s), True)
    cols: dict[str, dict[tuple[str, int], float]] = {
        "n_err": get(pq.errors(by, bucket_s), True),
        "ttft_p95": get(pq.quantile(0.95, [pq.TTFT], by, bucket_s)),
        "tpot_p50": get(pq.quantile(0.5, pq.TPOT, by, bucket_s)),
        "ttft_mean": get(pq.mean(pq.TTFT, by, bucket_s)),
        "queue_mean": get(pq.mean(pq.QUEUE, by, bucket_s)),
        "prefill_mean": get(pq.mean(pq.PREFILL, by, bucket_s)),
        "prompt_mean": get(pq.mean(pq.PROMPT, by, bucket_s)),
        "n_timed": get(pq.increase(pq.QUEUE + "_count", by, bucket_s), True),
    }
    errors_known = bool(cols["n_err"])
    rows: list[dict[str, Any]] = []
    for (replica, b), count in n.items():
        if not math.isfinite(count) or round(count) <= 0 or b < 0:
            continue
        key = (replica, b)
        row: dict[str, Any] = {"replica": replica, "bucket": b, "n": round(count)}
        for name in ("ttft_p95", "tpot_p50", "queue_mean", "prefill_mean", "prompt_mean"):
            row[name] = _nan(cols[name].get(key))
        row["n_err"] = round(_nan(cols["n_err"].get(key, 0.0))) if errors_known else math.nan
        row["n_timed"] = round(cols["n_timed"].get(key, 0.0) or 0.0)
        row["frontend_mean"] = _frontend(
            cols["ttft_mean"].get(key), cols["queue_mean"].get(key), cols["prefill_mean"].get(key)
        )
        row["first_t"], row["last_t"] = grid.span(b)
        rows.append(row)
    return _frame(rows, REQUEST_COLUMNS)


def _frontend(ttft: float | None, queue: float | None, prefill: float | None) -> float:
    parts = [_nan(v) for v in (ttft, queue, prefill)]
    if any(math.isnan(p) for p in parts):
        return math.nan
    return max(0.0, parts[0] - parts[1] - parts[2])


def finished_buckets(
    client: PrometheusClient, pod_label: str, origin: float, until: float, bucket_s: float
) -> pd.DataFrame:
    grid, by = _Grid(origin, until, bucket_s), pq.grouping(pod_label)
    done = grid.fetch(client, pod_label, pq.increase(pq.SUCCESS, by, bucket_s), additive=True)
    tokens = grid.fetch(
        client, pod_label, pq.increase(pq.GENERATION + "_sum", by, bucket_s), additive=True
    )
    rows = []
    for key in sorted(set(done) | set(tokens)):
        c, t = done.get(key), tokens.get(key)
        if key[1] < 0 or not ((c or 0) > 0.5 or (t or 0) > 0.5):
            continue
        rows.append({"replica": key[0], "bucket": key[1],
                     "completed": round(_nan(c)) if c is not None and math.isfinite(c) else 0,
                     "output_tokens": _nan(t)})  # fmt: skip
    return _frame(rows, FINISHED_COLUMNS)


# -- summaries ------------------------------------------------------------------------------

_SUMS = {
    "ttft": pq.TTFT,
    "queue": pq.QUEUE,
    "prefill": pq.PREFILL,
    "prompt": pq.PROMPT,
    "output": pq.GENERATION,
}


class _Pod:
    """Increases of one pod (or the fleet) over a window."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.buckets: dict[str, dict[float, float]] = {}

    def add(self, other: _Pod) -> None:
        for k, v in other.sums.items():
            self.sums[k] = self.sums.get(k, 0.0) + v
        for fam, b in other.buckets.items():
            mine = self.buckets.setdefault(fam, {})
            for le, c in b.items():
                mine[le] = mine.get(le, 0.0) + c

    def hist(self, families: tuple[str, ...]) -> pq.Buckets:
        fam = next((f for f in families if sum(self.buckets.get(f, {}).values()) > 0), None)
        return list(self.buckets[fam].items()) if fam else []


def window_increases(
    client: PrometheusClient, pod_label: str, since: float, until: float
) -> dict[str, _Pod]:
    """Per replica, the increases of sums, counts and buckets over ``[since, until)``."""
    by, w = pq.grouping(pod_label), max(until - since, 1e-3)
    union = " or ".join(
        f'label_replace({pq.increase(f"{fam}_{part}", by, w)}, "family", "{key}_{part}", "", "")'
        for key, fam in _SUMS.items()
        for part in ("sum", "count")
    )
    union += f' or label_replace({pq.errors(by, w)}, "family", "errors", "", "")'
    pods: dict[str, _Pod] = {}
    for labels, v in client.query(union, until):
        if math.isfinite(v):
            pod = pods.setdefault(pq.replica_of(labels, pod_label), _Pod())
            pod.sums[labels["family"]] = v
    for labels, v in client.query(pq.buckets([pq.TTFT, pq.E2E, *pq.TPOT], by, w), until):
        if math.isfinite(v) and "le" in labels:
            pod = pods.setdefault(pq.replica_of(labels, pod_label), _Pod())
            pod.buckets.setdefault(labels["family"], {})[float(labels["le"])] = v
    return pods


def _div(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def summarize(pod: _Pod | None, since: float, until: float) -> dict[str, Any]:
    """The :func:`slokit.store.frames.request_summary` dict of one pod (None: no data)."""
    p = pod or _Pod()
    s: Callable[[str], float | None] = p.sums.get
    n = round(s("ttft_count") or 0.0)
    ttft, tpot, e2e = p.hist((pq.TTFT,)), p.hist(pq.TPOT), p.hist((pq.E2E,))
    ttft_mean = _div(s("ttft_sum"), s("ttft_count"))
    queue, prefill = (
        _div(s("queue_sum"), s("queue_count")),
        _div(s("prefill_sum"), s("prefill_count")),
    )
    frontend = _frontend(ttft_mean, queue, prefill)
    err = s("errors")
    return {
        "n": n,
        "n_err": round(err) if err is not None else None,
        "ttft_p50": pq.hist_quantile(0.5, ttft),
        "ttft_p95": pq.hist_quantile(0.95, ttft),
        "ttft_p99": pq.hist_quantile(0.99, ttft),
        "tpot_p50": pq.hist_quantile(0.5, tpot),
        "tpot_p95": pq.hist_quantile(0.95, tpot),
        "e2e_p99": pq.hist_quantile(0.99, e2e),
        "ttft_mean": ttft_mean,
        "ttft_sd": pq.hist_sd(ttft, ttft_mean),
        "queue_mean": queue,
        "prefill_mean": prefill,
        "frontend_mean": None if math.isnan(frontend) else frontend,
        "prompt_mean": _div(s("prompt_sum"), s("prompt_count")),
        "output_mean": _div(s("output_sum"), s("output_count")),
        "n_timed": round(s("queue_count") or 0.0),
        "top_error": None,
        "top_http_status": None,
        "since": since,
        "until": until,
    }


def fleet(pods: dict[str, _Pod]) -> _Pod:
    total = _Pod()
    for p in pods.values():
        total.add(p)
    return total
