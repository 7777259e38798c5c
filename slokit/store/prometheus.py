"""A :class:`~slokit.store.reader.Reader` over Prometheus' HTTP API (or Thanos, Mimir,
VictoriaMetrics): every pod's vLLM, DCGM and slokit series, for a fleet-wide diagnosis.

* **Engine and GPU questions**: on the first question about a window, that window's vLLM
  gauges and counters and DCGM series (plus the counters' lookback) are fetched with
  ``query_range`` (chunked under Prometheus' 11,000 points per series; the rows those
  normalizers of live scrapes would make, built column-wise from the answer by :mod:`slokit.store._prom_rows`) into an
  in-memory slokit store, and a :class:`~slokit.store.reader.LocalReader` answers. A
  diagnosis asks the request frames first: the engine series of their window (and a
  lookback of a few buckets) are then fetched in the background meanwhile. The step is
  ``step_s`` or the window's
  bucket size (10 s), coarser for long windows (at most ~2,000 points per series). Points
  are taken at the end of each step, so a counter's increase falls in the bucket it
  happened in. Prometheus repeats a series' last value for 5 minutes after it stops
  (staleness): a pod that vanished without a stale marker looks alive that long.
* **Request questions** (``basis = "histograms"``): from vLLM's histograms and counters
  per pod (:mod:`slokit.store._histograms`). Prometheus holds no per-request records:
  ``request``, ``slowest_request`` are None, ``requests`` and ``findings`` empty.
* **Extent** (:meth:`bounds`): a ``count_over_time`` range query of
  ``vllm:num_requests_running`` over ``history_s`` (default 7 days) before Prometheus' own
  clock finds the first and last steps with data; one fine range query of ``timestamp()``
  around each finds the newest sample and the fine step holding the oldest, whose raw
  samples (an instant query of a range vector) give the oldest exactly, wherever the
  grid of steps falls.

Headers (Mimir's ``X-Scope-OrgID``, a bearer token as ``Authorization``) and basic auth go
with every call; on the loopback interface answers are asked uncompressed. An unreachable server, an HTTP error or an answer that is not Prometheus'
JSON is a :class:`~slokit.errors.BadInput` naming the URL.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Literal

import httpx

from slokit.errors import BadInput
from slokit.sources.prometheus import PrometheusClient
from slokit.store import _histograms as hist
from slokit.store import _promql as pq
from slokit.store._prom_rows import scrape_tables
from slokit.store.append import append_table
from slokit.store.db import Store, open_store
from slokit.store.queries import PageKey
from slokit.store.reader import LocalReader
from slokit.store.window import MAX_TS

if TYPE_CHECKING:  # frames are built only when a diagnosis asks
    import pandas as pd

__all__ = ["PrometheusReader"]

#: Hosts of the loopback interface (and any 127.x.y.z).
LOOPBACK = frozenset({"localhost", "::1"})
#: Buckets before the request frames' origin the engine frames of a diagnosis read
#: (:func:`slokit.analysis.rules._context.build_context`: ``lookback = 3 * bucket_s``).
ENGINE_LOOKBACK_BUCKETS = 3
#: Points per series of one engine fetch (the step grows past it for long windows).
MAX_STEPS = 2000


def _headers(url: str, headers: Mapping[str, str] | None) -> dict[str, str]:
    """The headers of every call: ``headers``, and on the loopback interface answers
    uncompressed (unless asked otherwise): gzip costs Prometheus more CPU than the bytes
    it saves cost there (an engine fetch of 100 pods x 1 h: 20 MB, gzipped in ~2 s, sent
    in ~0.2 s)."""
    out = dict(headers or {})
    try:
        host = httpx.URL(url).host
    except httpx.InvalidURL:  # PrometheusClient says what is wrong with it
        host = ""
    local = host in LOOPBACK or host.startswith("127.")
    if local and not any(k.lower() == "accept-encoding" for k in out):
        out["Accept-Encoding"] = "identity"
    return out


class PrometheusReader:
    """:class:`~slokit.store.reader.Reader` over a Prometheus HTTP API. Use it as a context
    manager (it holds an HTTP client and an in-memory store)."""

    basis: Literal["records", "histograms"] = "histograms"

    def __init__(
        self,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        basic_auth: tuple[str, str] | None = None,
        pod_label: str = "pod",
        step_s: float | None = None,
        transport: httpx.BaseTransport | None = None,
        timeout_s: float = 30,
        history_s: float = 7 * 86400,
    ) -> None:
        self.url = url
        self.pod_label = pod_label
        self.step_s = step_s
        self.history_s = history_s
        try:
            http = httpx.Client(headers=_headers(url, headers), auth=basic_auth,
                                transport=transport, timeout=timeout_s)  # fmt: skip
        except UnicodeError as exc:
            raise BadInput(
                f"a Prometheus header (--prometheus-header) must be ASCII: {exc}"
            ) from None
        try:
            self.client = PrometheusClient(url, client=http, timeout_s=timeout_s)
        except BadInput:
            http.close()
            raise
        self._store: Store | None = None
        self._local: LocalReader | None = None
        self._fetched: tuple[float, float] | None = None
        self._bounds: tuple[float | None, float | None] | None = None
        self._windows: dict[tuple[str, str], dict[str, Any]] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._pending: Future[tuple[Store, tuple[float, float]]] | None = None

    def __enter__(self) -> PrometheusReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._pool is not None:  # let a fetch started ahead end, then drop its store
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
            if self._pending is not None and not self._pending.cancelled():
                if self._pending.exception() is None:
                    self._pending.result()[0].close()
                self._pending = None
        self.client.client.close()
        if self._store is not None:
            self._store.close()
            self._store = self._local = None

    # -- extent ------------------------------------------------------------------------------
    def bounds(self) -> tuple[float | None, float | None]:
        if self._bounds is None:
            self._bounds = self._find_bounds()
        return self._bounds

    def _find_bounds(self) -> tuple[float | None, float | None]:
        now = self.client.server_time()
        step = max(60.0, math.ceil(self.history_s / 1000))
        sel = pq.series(pq.PRESENCE)
        # Each point looks back two steps and the grid ends a step past ``now``: data newer
        # than the grid's last point before ``now`` (a fresh Prometheus) is never missed,
        # whatever the rounding of the grid.
        coarse = self.client.query_range(
            f"count(count_over_time({sel}[{pq.duration(2 * step)}]))",
            now - self.history_s, now + step, step,
        )  # fmt: skip
        times = sorted(t for s in coarse for t, v in s.points if v > 0)
        if not times:
            return None, None

        fine = max(1.0, min(step / 1000, 60.0))  # under the 5 min staleness

        def points(end: float, agg: str) -> list[tuple[float, float]]:
            got = self.client.query_range(f"{agg}(timestamp({sel}))", end - 2 * step, end, fine)
            # a sample's time: a value past year 9999 (or NaN) is no time, and is left out
            return sorted((t, v) for s in got for t, v in s.points if 0 <= v <= MAX_TS)

        def oldest(end: float) -> float:
            # The first fine point that sees data looks back up to 5 minutes and finds the
            # newest sample before it, not the oldest: the one before it saw none, so the
            # oldest sample is within ``fine`` of it, and its raw samples name it exactly.
            found = points(end, "min")
            if not found:
                return end
            first_point, seen = found[0]
            raw = self.client.raw_samples(sel, 2 * fine, first_point)
            return min([seen, *(t for s in raw for t, _ in s.points)])

        def newest(end: float) -> float:
            # Every point up to 5 minutes after the newest sample reports its timestamp.
            found = points(end, "max")
            return max(v for _, v in found) if found else end

        return oldest(times[0]), newest(times[-1])

    # -- engine and GPU: an in-memory store of the fetched window ---------------------------
    def _engine(self, lo: float, hi: float) -> LocalReader:
        """A reader over the engine and GPU samples of (at least) ``[lo, hi]``."""
        if self._pending is not None:  # a fetch started ahead (:meth:`request_buckets`)
            pending, self._pending = self._pending, None
            self._keep(*pending.result())
        f = self._fetched
        if self._local is not None and f is not None and f[0] <= lo and hi <= f[1]:
            return self._local
        if f is not None:
            lo, hi = min(lo, f[0]), max(hi, f[1])
        self._keep(self._fetch(lo, hi), (lo, hi))
        assert self._local is not None
        return self._local

    def _fetch(self, lo: float, hi: float) -> Store:
        """An in-memory store of the engine and GPU samples of ``[lo, hi]``."""
        store = open_store(":memory:")
        step = self.step_s or max(10.0, math.ceil((hi - lo) / MAX_STEPS))
        # Points at the end of each step: the increase up to a point belongs to its bucket.
        try:
            for got in self.client.range_chunks(pq.engine_match(), lo + step - 1e-3,
                                                hi + step - 1e-3, step):  # fmt: skip
                engine, gpu = scrape_tables(got, self.pod_label)
                append_table(store, "engine_samples", engine)
                append_table(store, "gpu_samples", gpu)
        except BaseException:
            store.close()
            raise
        return store

    def _keep(self, store: Store, fetched: tuple[float, float]) -> None:
        if self._store is not None:
            self._store.close()
        self._store, self._local, self._fetched = store, store.reader(), fetched

    def _fetch_ahead(self, lo: float, hi: float) -> None:
        """Start fetching the engine and GPU samples of ``[lo, hi]`` in the background,
        unless some are fetched (or being fetched) already."""
        if self._store is None and self._pending is None:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1)
            self._pending = self._pool.submit(lambda: (self._fetch(lo, hi), (lo, hi)))

    def _whole(self) -> LocalReader:
        """The samples fetched so far, or all of them when nothing was asked yet."""
        if self._local is not None:
            return self._local
        lo, hi = self.bounds()
        return self._engine(lo or 0.0, hi or 0.0)

    def engine_buckets(
        self, origin: float, until: float, bucket_s: float, lookback_s: float
    ) -> pd.DataFrame:
        return self._engine(origin - lookback_s, until).engine_buckets(
            origin, until, bucket_s, lookback_s
        )

    def gpu_buckets(
        self, origin: float, until: float, bucket_s: float, busy_util: float
    ) -> pd.DataFrame:
        return self._engine(origin, until).gpu_buckets(origin, until, bucket_s, busy_util)

    def engine_window(self, replica: str, since: float, until: float) -> list[dict[str, Any]]:
        return self._engine(since, until).engine_window(replica, since, until)

    def engine_series(
        self, since: float | None, until: float | None
    ) -> dict[str, list[tuple[float, float | None, float | None]]]:
        lo, hi = self.bounds()
        if lo is None or hi is None:
            return {}
        a, b = since if since is not None else lo, until if until is not None else hi
        return self._engine(a, b).engine_series(since, until)

    def has_engine_samples(self, replica: str) -> bool:
        return self._whole().has_engine_samples(replica)

    def engine_counter_increase(
        self, column: str, replica: str, since: float, until: float
    ) -> dict[str, Any]:
        return self._engine(since, until).engine_counter_increase(column, replica, since, until)

    def cache_config(self) -> dict[str, float] | None:
        return self._whole().cache_config()

    def gpu_state_at(self, replica: str, ts: float, *, max_age_s: float) -> dict[str, Any] | None:
        return self._engine(ts - max_age_s, ts).gpu_state_at(replica, ts, max_age_s=max_age_s)

    def energy_increase(self, since: float | None, until: float | None) -> float | None:
        lo, hi = self.bounds()
        if lo is None or hi is None:
            return None
        a, b = since if since is not None else lo, until if until is not None else hi
        return self._engine(a, b).energy_increase(since, until)

    def last_seen(self, source: str, before: float) -> float | None:
        return self._whole().last_seen(source, before)

    def sample_gaps(
        self, source: str, since: float, until: float, *, stale_factor: float, min_gap_s: float
    ) -> list[tuple[str, float, float, float | None]]:
        return self._engine(since, until).sample_gaps(
            source, since, until, stale_factor=stale_factor, min_gap_s=min_gap_s
        )

    def failed_scrapes(self, since: float, until: float) -> list[dict[str, Any]]:
        return []  # scrape failures are Prometheus' own ``up`` series, not slokit's

    # -- requests: from histograms -----------------------------------------------------------
    def _window(self, since: float, until: float) -> dict[str, Any]:
        # Keyed by the query it makes: ends a microsecond apart (a window's newest sample
        # included) ask the same.
        key = (pq.duration(max(until - since, 1e-3)), f"{until:.3f}")
        if key not in self._windows:
            self._windows[key] = hist.window_increases(self.client, self.pod_label, since, until)
        return self._windows[key]

    def request_summary(self, replica: str | None, since: float, until: float) -> dict[str, Any]:
        pods = self._window(since, until)
        pod = hist.fleet(pods) if replica is None else pods.get(replica)
        return hist.summarize(pod, since, until)

    def request_summaries(self, since: float, until: float) -> dict[str, dict[str, Any]]:
        pods = self._window(since, until)
        return {r: hist.summarize(p, since, until) for r, p in pods.items()}

    def peer_count(self, since: float, until: float, slo_class: str | None) -> int:
        """Requests of the fleet in the window (the histograms know no SLO class)."""
        return int(self.request_summary(None, since, until)["n"] or 0)

    def percentile_ranks(
        self,
        values: Mapping[str, float | None],
        since: float,
        until: float,
        slo_class: str | None,
        model: str | None = None,
    ) -> dict[str, Any]:
        """No ranks (they need each peer's value); the peers' p50/p95 of TTFT and TPOT."""
        s = self.request_summary(None, since, until)
        ranks = {m: {"rank": None, "p50": s.get(f"{key}_p50"), "p95": s.get(f"{key}_p95")}
                 for m, key in (("ttft_s", "ttft"), ("tpot_s", "tpot")) if m in values}  # fmt: skip
        return {"peers": int(s["n"] or 0), "ranks": ranks}

    def request_buckets(self, origin: float, until: float, bucket_s: float) -> pd.DataFrame:
        # The engine frames of a diagnosis come next, over the same window and a lookback
        # of a few buckets: their series are fetched and parsed while Prometheus computes
        # these (a different window asked later is fetched then, as without this).
        self._fetch_ahead(origin - ENGINE_LOOKBACK_BUCKETS * bucket_s, until)
        return hist.request_buckets(self.client, self.pod_label, origin, until, bucket_s)

    def finished_buckets(self, origin: float, until: float, bucket_s: float) -> pd.DataFrame:
        return hist.finished_buckets(self.client, self.pod_label, origin, until, bucket_s)

    def request(self, request_id: str) -> dict[str, Any] | None:
        return None  # Prometheus holds no per-request records

    def requests(self, since: float | None, until: float | None) -> list[dict[str, Any]]:
        return []

    def requests_page(
        self, since: float | None, until: float | None, after: PageKey | None, limit: int
    ) -> tuple[list[dict[str, Any]], PageKey | None]:
        return [], None

    def slowest_request(self, *, source: str = "vllm") -> str | None:
        return None

    def findings_overlapping(
        self, replica: str | None, since: float, until: float
    ) -> list[dict[str, Any]]:
        return []

    def findings(
        self, since: float | None, until: float | None, limit: int = 200
    ) -> list[dict[str, Any]]:
        return []

    # -- SLI counts (slo report) -------------------------------------------------------------
    def sli_counts(self, since: float, until: float) -> dict[str, dict[str, float]]:
        """``class -> outcome -> requests`` (and ``class -> "output_tokens:<outcome>"``) over
        ``[since, until]`` from ``slokit_requests_total`` and ``slokit_output_tokens_total``.

        Exact where a series did not reset: its value at ``until`` less its value at
        ``since`` (a series born inside the window counts whole, as a counter starts at 0),
        so the counts equal the sidecars' own judged requests up to the scrape interval at
        either edge. ``increase()`` would extrapolate to the window's edges and lose most
        of a new series' first sample. A series that reset (a sidecar restarted) falls back
        to ``increase()``, extrapolated."""
        w = pq.duration(max(until - since, 1e-3))
        out: dict[str, dict[str, float]] = {}
        for metric, prefix in ((pq.SLI, ""), ("slokit_output_tokens_total", "output_tokens:")):
            expr = f"sum by (class, outcome) ({pq.counter_delta(metric, w)})"
            for labels, v in self.client.query(expr, until):
                if math.isfinite(v):
                    cls = out.setdefault(labels.get("class", ""), {})
                    key = prefix + labels.get("outcome", "")
                    cls[key] = cls.get(key, 0.0) + v
        return out
