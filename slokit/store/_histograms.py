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

A frame's range queries are asked at once (Prometheus answers them in parallel), one per
count, sum and quantile (the means are divided here: each count is read once); their
answers become columns with numpy and pandas. TPOT's quantile is the first of vLLM's TPOT
histograms a pod has (``A or B``): a later histogram is read only for the pods an earlier
one leaves without a value in some bucket.

Errors are only known from slokit's ``slokit_requests_total{outcome="error"}`` (vLLM counts
no failed requests): without it ``n_err`` is NaN/None, unknown, and ``top_error`` and
``top_http_status`` are always None. Counts are rounded increases (Prometheus extrapolates
an increase to the window's edges).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import numpy.typing as npt

from slokit.sources.prometheus import PrometheusClient, Series
from slokit.store import _promql as pq

if TYPE_CHECKING:  # pandas builds the frames only when a diagnosis asks for them
    import pandas as pd

REQUEST_COLUMNS = ("replica", "bucket", "n", "n_err", "ttft_p95", "tpot_p50", "queue_mean",
                   "prefill_mean", "frontend_mean", "prompt_mean", "n_timed", "first_t",
                   "last_t")  # fmt: skip
FINISHED_COLUMNS = ("replica", "bucket", "completed", "output_tokens")

_T = TypeVar("_T")
#: Queries asked of Prometheus at once.
MAX_PARALLEL = 4


def _range(
    client: PrometheusClient, expr: str, start: float, end: float, step: float
) -> list[Series]:
    out: list[Series] = []
    for got in client.range_chunks(expr, start, end, step):
        out.extend(got)
    return out


def _together(calls: list[Callable[[], _T]]) -> list[_T]:
    """The calls' results, run at once: Prometheus answers queries in parallel, and one
    answer is read while the next is computed."""
    if len(calls) == 1:
        return [calls[0]()]
    with ThreadPoolExecutor(max_workers=min(len(calls), MAX_PARALLEL)) as pool:
        return [f.result() for f in [pool.submit(c) for c in calls]]


def _labelset(labels: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(labels.items()))


class _Grid:
    """Bucket ``b`` of ``[origin, until)`` is evaluated at ``origin + (b + 1) * bucket_s``."""

    def __init__(self, origin: float, until: float, bucket_s: float) -> None:
        self.origin, self.until, self.bucket_s = origin, until, bucket_s
        self.count = max(1, math.ceil((until - origin) / bucket_s - 1e-9))

    def query(self, client: PrometheusClient, expr: str) -> Callable[[], list[Series]]:
        """A range query of ``expr`` at the buckets' ends, to run (:func:`_together`)."""
        start = self.origin + self.bucket_s
        end = self.origin + self.count * self.bucket_s
        return lambda: _range(client, expr, start, end, self.bucket_s)

    def first_quantile(
        self, client: PrometheusClient, pod_label: str, q: float, families: tuple[str, ...]
    ) -> Callable[[], list[Series]]:
        """:meth:`query` of ``pq.quantile(q, families)`` (per pod and bucket, the first
        family it has: ``A or B``), with each later family read only for the pods an
        earlier one leaves without a value in some bucket (a fleet on one vLLM has the
        first family everywhere: the later ones, whole histograms each, cost nothing)."""
        by = pq.grouping(pod_label)

        def run() -> list[Series]:
            got = self.query(client, pq.quantile(q, families[:1], by, self.bucket_s))()
            merged: dict[tuple[tuple[str, str], ...], dict[float, float]] = {}
            for s in got:
                merged.setdefault(_labelset(s.labels), {}).update(s.points)
            # Samples the quantiles read: from a bucket before the first end to the last.
            reach = (self.count + 1) * self.bucket_s + 1.0
            end = self.origin + self.count * self.bucket_s
            for fam in families[1:]:
                has = {_labelset(lb) for lb, _ in
                       client.query(pq.present(fam + "_bucket", by, reach), end)}  # fmt: skip
                need = {lk for lk in has if len(merged.get(lk, ())) < self.count}
                if not need:
                    continue
                pods = [dict(lk).get(pod_label) for lk in need]
                narrow = "" if None in pods else pq.one_of(pod_label, map(str, pods))
                for s in self.query(client, pq.quantile(q, [fam], by, self.bucket_s, narrow))():
                    lk = _labelset(s.labels)
                    if lk in need:
                        at = merged.setdefault(lk, {})
                        for t, v in s.points:
                            at.setdefault(t, v)
            if len(merged) == len(got) and all(len(p) == len(s.points) for p, s in
                                               zip(merged.values(), got, strict=True)):  # fmt: skip
                return got  # the first family alone, as Prometheus answered
            # ``or`` answers series sorted by their labels, each point in time order
            return [Series(dict(lk), sorted(merged[lk].items())) for lk in sorted(merged)]

        return run

    def points(
        self,
        series: list[Series],
        pod_label: str,
        labelsets: dict[tuple[tuple[str, str], ...], int] | None = None,
    ) -> pd.DataFrame:
        """One row per point, in the answer's order: ``replica``, ``bucket``, ``t``, ``v``
        (and ``ls``, the code of the series' labels in ``labelsets``, when given)."""
        import pandas as pd  # deferred: heavy, and only a diagnosis needs frames

        kept = [s for s in series if s.points]
        arrays = [np.asarray(s.points, dtype=np.float64).reshape(-1, 2) for s in kept]
        both = np.concatenate(arrays) if arrays else np.empty((0, 2))
        sizes = [len(a) for a in arrays]
        replicas = np.array([pq.replica_of(s.labels, pod_label) for s in kept], dtype=object)
        t = both[:, 0]
        out = {
            "replica": np.repeat(replicas, sizes),
            "bucket": (np.rint((t - self.origin) / self.bucket_s) - 1).astype(np.int64),
            "t": t,
            "v": both[:, 1],
        }
        if labelsets is not None:
            codes = [labelsets.setdefault(_labelset(s.labels), len(labelsets)) for s in kept]
            out["ls"] = np.repeat(np.array(codes, dtype=np.int64), sizes)
        return pd.DataFrame(out)

    def values(self, series: list[Series], pod_label: str, *, additive: bool = False) -> Any:
        """A pandas Series by ``(replica, bucket)``; several series of one pod are summed
        when the value is ``additive`` (counts, in the answer's order), else the first is
        kept."""
        import pandas as pd  # deferred: heavy, and only a diagnosis needs frames

        pts = self.points(series, pod_label)
        first = pts.drop_duplicates(_KEY)
        if not additive:
            return first.set_index(_KEY)["v"]
        group = pts.groupby(_KEY, sort=False).ngroup().to_numpy()
        total = ordered_sums(group, pts["v"].to_numpy(), len(first))
        return pd.Series(total, index=pd.MultiIndex.from_frame(first[_KEY]), name="v")

    def means(self, sums: list[Series], counts: list[Series], pod_label: str) -> Any:
        """:meth:`values` of ``sums / counts`` of the series with the same labels, as PromQL
        answers it (in the sums' order: Prometheus sorts a range query's series; the first
        series of a pod kept; x/0 is NaN: missing)."""
        codes: dict[tuple[tuple[str, str], ...], int] = {}
        num = self.points(sums, pod_label, codes)
        den = self.points(counts, pod_label, codes)[["ls", "t", "v"]]
        den = den.drop_duplicates(["ls", "t"], keep="last").rename(columns={"v": "c"})
        both = num.merge(den, on=["ls", "t"], how="inner")  # keeps the sums' order
        c = both["c"].to_numpy()
        with np.errstate(divide="ignore", invalid="ignore"):
            both["v"] = np.where(c != 0, both["v"].to_numpy() / c, np.nan)
        return both.drop_duplicates(_KEY).set_index(_KEY)["v"]


_KEY = ["replica", "bucket"]


def ordered_sums(groups: npt.NDArray[np.int64], v: npt.NDArray[np.float64], n: int) -> Any:
    """Per group (``0 .. n-1``), ``v`` added up in row order, as a loop adds (float addition
    is not associative: numpy's and pandas' sums pair or compensate)."""
    import pandas as pd  # deferred: heavy, and only a diagnosis needs frames

    total = np.zeros(n)
    if len(groups):
        pos = pd.Series(groups).groupby(groups).cumcount().to_numpy()
        for p in range(int(pos.max()) + 1):
            at = pos == p  # each group at most once
            total[groups[at]] += v[at]
    return total


def _finite(values: Any, index: Any, fill: float = math.nan) -> npt.NDArray[np.float64]:
    """``values`` (a pandas Series) at ``index`` (``fill`` where absent); not finite: NaN."""
    v = values.reindex(index, fill_value=fill).to_numpy(dtype=np.float64)
    return np.where(np.isfinite(v), v, np.nan)


def _counts(v: npt.NDArray[np.float64]) -> Any:
    """Rounded counts, as integers (floats where one is unknown)."""
    r = np.rint(v)
    return r if np.isnan(r).any() else r.astype(np.int64)


def _frame(columns: tuple[str, ...], data: dict[str, Any] | None = None) -> pd.DataFrame:
    import pandas as pd  # deferred: heavy, and only a diagnosis needs frames

    if not data:
        return pd.DataFrame([], columns=list(columns)).astype({"replica": "object",
                                                               "bucket": "int64"})  # fmt: skip
    frame = pd.DataFrame(data, columns=list(columns))
    return frame.sort_values(_KEY, ignore_index=True)


#: The histograms whose mean per bucket a request row has (sum and count increases).
_MEANS = {"ttft": pq.TTFT, "queue": pq.QUEUE, "prefill": pq.PREFILL, "prompt": pq.PROMPT}


def request_buckets(
    client: PrometheusClient, pod_label: str, origin: float, until: float, bucket_s: float
) -> pd.DataFrame:
    grid, by = _Grid(origin, until, bucket_s), pq.grouping(pod_label)
    # Counts and sums apart (a mean is divided here, so each count is asked once: ``or``
    # unions cost Prometheus more than the queries alone), at once.
    exprs = {
        f"{name}_{part}": pq.increase(f"{fam}_{part}", by, bucket_s)
        for name, fam in _MEANS.items()
        for part in ("sum", "count")
    }
    exprs["errors"] = pq.errors(by, bucket_s)
    exprs["ttft_p95"] = pq.quantile(0.95, [pq.TTFT], by, bucket_s)
    calls = [grid.query(client, e) for e in exprs.values()]
    calls.append(grid.first_quantile(client, pod_label, 0.5, pq.TPOT))
    got = dict(zip([*exprs, "tpot_p50"], _together(calls), strict=True))
    n = grid.values(got["ttft_count"], pod_label, additive=True)
    buckets = n.index.get_level_values("bucket").to_numpy()
    n = n[np.isfinite(n.to_numpy()) & (np.rint(n.to_numpy()) > 0) & (buckets >= 0)]
    if n.empty:
        return _frame(REQUEST_COLUMNS)
    at = n.index
    data: dict[str, Any] = {
        "replica": np.asarray(at.get_level_values("replica"), dtype=object),
        "bucket": at.get_level_values("bucket").to_numpy(),
        "n": np.rint(n.to_numpy()).astype(np.int64),
    }
    for name in ("ttft_p95", "tpot_p50"):
        data[name] = _finite(grid.values(got[name], pod_label), at)
    means = {
        name: _finite(grid.means(got[f"{name}_sum"], got[f"{name}_count"], pod_label), at)
        for name in _MEANS
    }
    for name in ("queue", "prefill", "prompt"):
        data[f"{name}_mean"] = means[name]
    errors = grid.values(got["errors"], pod_label, additive=True)
    data["n_err"] = _counts(_finite(errors, at, 0.0)) if len(errors) else np.full(len(at), np.nan)
    queued = grid.values(got["queue_count"], pod_label, additive=True)
    data["n_timed"] = _counts(_finite(queued, at, 0.0))
    data["frontend_mean"] = _frontend(means["ttft"], means["queue"], means["prefill"])
    data["first_t"] = origin + data["bucket"] * bucket_s
    data["last_t"] = np.minimum(until, data["first_t"] + bucket_s)
    return _frame(REQUEST_COLUMNS, data)


def _frontend(ttft: Any, queue: Any, prefill: Any) -> Any:
    """TTFT not spent in the engine: the mean TTFT less the queue and prefill means (NaN
    where one is unknown)."""
    unknown = np.isnan(ttft) | np.isnan(queue) | np.isnan(prefill)
    return np.where(unknown, np.nan, np.maximum(0.0, ttft - queue - prefill))


def finished_buckets(
    client: PrometheusClient, pod_label: str, origin: float, until: float, bucket_s: float
) -> pd.DataFrame:
    grid, by = _Grid(origin, until, bucket_s), pq.grouping(pod_label)
    done, tokens = (
        grid.values(series, pod_label, additive=True)
        for series in _together([
            grid.query(client, pq.increase(pq.SUCCESS, by, bucket_s)),
            grid.query(client, pq.increase(pq.GENERATION + "_sum", by, bucket_s)),
        ])
    )  # fmt: skip
    at = done.index.union(tokens.index)
    c = done.reindex(at).to_numpy(dtype=np.float64)
    t = tokens.reindex(at).to_numpy(dtype=np.float64)
    keep = (at.get_level_values("bucket").to_numpy() >= 0) & (
        (np.nan_to_num(c, nan=0.0) > 0.5) | (np.nan_to_num(t, nan=0.0) > 0.5)
    )
    if not keep.any():
        return _frame(FINISHED_COLUMNS)
    c, t, at = c[keep], t[keep], at[keep]
    return _frame(FINISHED_COLUMNS, {
        "replica": np.asarray(at.get_level_values("replica"), dtype=object),
        "bucket": at.get_level_values("bucket").to_numpy(),
        "completed": np.where(np.isfinite(c), np.rint(c), 0).astype(np.int64),
        "output_tokens": np.where(np.isfinite(t), t, np.nan),
    })  # fmt: skip


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
    increases = {
        f"{key}_{part}": pq.increase(f"{fam}_{part}", by, w)
        for key, fam in _SUMS.items()
        for part in ("sum", "count")
    }
    increases["errors"] = pq.errors(by, w)
    sums, buckets = _together([
        lambda: client.query(pq.labelled(increases), until),
        lambda: client.query(pq.buckets([pq.TTFT, pq.E2E, *pq.TPOT], by, w), until),
    ])  # fmt: skip
    pods: dict[str, _Pod] = {}
    for labels, v in sums:
        family = labels.get("family")
        if math.isfinite(v) and family is not None:
            pod = pods.setdefault(pq.replica_of(labels, pod_label), _Pod())
            pod.sums[family] = v
    for labels, v in buckets:
        family, le = labels.get("family"), _bound(labels.get("le"))
        if math.isfinite(v) and family is not None and le is not None:
            pod = pods.setdefault(pq.replica_of(labels, pod_label), _Pod())
            pod.buckets.setdefault(family, {})[le] = v
    return pods


def _bound(le: str | None) -> float | None:
    """A bucket's upper bound (``+Inf`` included; None: missing or not a number)."""
    try:
        x = float(le) if le is not None else math.nan
    except ValueError:
        return None
    return None if math.isnan(x) else x


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
    frontend = float(_frontend(*(np.float64(math.nan if x is None else x)
                                 for x in (ttft_mean, queue, prefill))))  # fmt: skip
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
