"""A :class:`~slokit.store.reader.Reader` over Prometheus' HTTP API (or Thanos, Mimir,
VictoriaMetrics): every pod's vLLM, DCGM and slokit series, for a fleet-wide diagnosis.

* **Engine and GPU questions**: on the first question about a window, that window's vLLM
  gauges and counters and DCGM series (plus the counters' lookback) are fetched with
  ``query_range`` (chunked under Prometheus' 11,000 points per series; the rows those
  normalizers of live scrapes would make, built column-wise from the answer) into an
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
  around each gives the exact oldest and newest sample.

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
import numpy as np
import numpy.typing as npt
import pyarrow as pa

from slokit.sources.dcgm import FB_PARTS
from slokit.sources.dcgm import FIELDS as DCGM_FIELDS
from slokit.sources.prometheus import PrometheusClient, Series, chunks, vllm_name
from slokit.sources.validate import ENGINE_RANGES, GPU_RANGES, MAX_COUNT
from slokit.sources.vllm_metrics import (
    CACHE_CONFIG_INFO,
    CACHE_CONFIG_LABELS,
    REQUEST_SUCCESS,
    SCALARS,
)
from slokit.store import _histograms as hist
from slokit.store import _promql as pq
from slokit.store.append import (
    ENGINE_MAPS,
    ENGINE_SCALARS,
    HISTOGRAM_TYPE,
    append_table,
    ts_array,
)
from slokit.store.db import Store, open_store
from slokit.store.queries import PageKey
from slokit.store.reader import LocalReader

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
        http = httpx.Client(
            headers=_headers(url, headers), auth=basic_auth, transport=transport, timeout=timeout_s
        )
        self.client = PrometheusClient(url, client=http, timeout_s=timeout_s)
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
        # Each point looks back two steps and the grid ends a step past ``now``: data newer
        # than the grid's last point before ``now`` (a fresh Prometheus) is never missed,
        # whatever the rounding of the grid.
        coarse = self.client.query_range(
            f"count(count_over_time({pq.series(pq.PRESENCE)}[{pq.duration(2 * step)}]))",
            now - self.history_s, now + step, step,
        )  # fmt: skip
        times = sorted(t for s in coarse for t, v in s.points if v > 0)
        if not times:
            return None, None

        def exact(end: float, pick: Any) -> float:
            fine = max(1.0, min(step / 1000, 60.0))  # under the 5 min staleness
            got = self.client.query_range(
                f"min(timestamp({pq.series(pq.PRESENCE)}))" if pick is min
                else f"max(timestamp({pq.series(pq.PRESENCE)}))", end - 2 * step, end, fine,
            )  # fmt: skip
            vals = [v for s in got for _, v in s.points if math.isfinite(v)]
            return float(pick(vals)) if vals else end

        return exact(times[0], min), exact(times[-1], max)

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
        for a, b in chunks(lo + step - 1e-3, hi + step - 1e-3, step):
            engine, gpu = _scrape_tables(
                self.client.query_range(pq.engine_match(), a, b, step), self.pod_label
            )
            append_table(store, "engine_samples", engine)
            append_table(store, "gpu_samples", gpu)
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


# -- engine and GPU rows from the fetched series ---------------------------------------------
#
# What :func:`slokit.sources.prometheus.samples_from_series` and the scrape normalizers make
# of the series :func:`~slokit.store._promql.engine_match` fetches (vLLM gauges and counters,
# ``request_success_total``, ``cache_config_info``, DCGM fields), built column-wise: one
# ``engine_samples`` row per (timestamp, replica, model, engine), one ``gpu_samples`` row per
# (timestamp, replica, GPU), in the same order with the same values. Point by point in Python
# that took ~40 us a point (100 pods x 1 h: ~30 s); here the points are numpy arrays.

#: vLLM scalar name -> (its field's index in SCALARS, preference: 0 = the current name).
_SCALAR_NAMES: dict[str, tuple[int, int]] = {
    name: (i, pref) for i, names in enumerate(SCALARS.values()) for pref, name in enumerate(names)
}
_SCALAR_FIELDS = tuple(SCALARS)
#: An engine row is made by its first point in the parser's order: the scalar fields in
#: order, then ``request_success_total``; within one, the series in the answer's order.
_SUCCESS_ORDER = len(SCALARS)
_GPU_WANTED = frozenset(DCGM_FIELDS) | frozenset(FB_PARTS)
#: GPU columns filled from the DCGM fields, then the framebuffer parts summed into the total.
_GPU_FIELDS = tuple(dict.fromkeys(f for f, _, _ in DCGM_FIELDS.values()))
_FB_FREE, _FB_RESERVED = len(_GPU_FIELDS), len(_GPU_FIELDS) + 1
_GPU_STRINGS = ("node", "gpu", "uuid", "gpu_model", "replica", "namespace")


class _Points:
    """The points of one kind of series stacked, with integer facts per series."""

    def __init__(self, *facts: str) -> None:
        self.facts = facts
        self.ts: list[npt.NDArray[np.float64]] = []
        self.values: list[npt.NDArray[np.float64]] = []
        self.meta: list[tuple[int, ...]] = []

    def add(self, ts: npt.NDArray[np.float64], v: npt.NDArray[np.float64], *meta: int) -> None:
        self.ts.append(ts)
        self.values.append(v)
        self.meta.append(meta)

    def frame(self) -> pd.DataFrame:
        """One row per point: ``ts``, ``v`` and the facts of its series."""
        import pandas as pd  # deferred: heavy, and only a diagnosis fetches engine series

        if not self.meta:
            return pd.DataFrame({c: np.empty(0, np.int64) for c in ("ts", "v", *self.facts)})
        idx = np.repeat(np.arange(len(self.meta)), [len(t) for t in self.ts])
        meta = np.array(self.meta, dtype=np.int64)[idx]
        out: dict[str, npt.NDArray[Any]] = {
            "ts": np.concatenate(self.ts),
            "v": np.concatenate(self.values),
        }
        out.update({c: meta[:, i] for i, c in enumerate(self.facts)})
        return pd.DataFrame(out)


class _Codes:
    """Small integers for strings (or tuples), in order of first sight."""

    def __init__(self) -> None:
        self.codes: dict[Any, int] = {}

    def __call__(self, key: Any) -> int:
        return self.codes.setdefault(key, len(self.codes))

    def keys(self) -> list[Any]:
        return list(self.codes)


def _scrape_tables(series: list[Series], replica_label: str) -> tuple[pa.Table, pa.Table]:
    """``engine_samples`` and ``gpu_samples`` rows of the series of one range query."""
    scalars = _Points("rep", "eid", "field", "pref", "sid")
    success = _Points("eid", "sid", "reason")
    infos = _Points("rep", "sid", "elabel", "cfg")
    gpus = _Points("rep", "gid", "col", "sid", "name", "ident")
    reps, engines, reasons, elabels, gids, names = (_Codes() for _ in range(6))
    configs: list[tuple[float, float]] = []
    idents: list[tuple[str | None, ...]] = []
    for sid, s in enumerate(series):
        labels = {k: v for k, v in s.labels.items() if k != "__name__"}
        name = vllm_name(s.labels.get("__name__") or "")
        if not name or not s.points:
            continue
        pts = np.asarray(s.points, dtype=np.float64).reshape(-1, 2)
        ts, v = pts[:, 0], pts[:, 1]
        ts, v = ts[~np.isnan(v)], v[~np.isnan(v)]
        rep = reps(labels.get(replica_label) or labels.get("instance") or "unknown")
        model = labels.get("model_name")
        eid = -1 if model is None else engines((rep, model, labels.get("engine")))
        if name in _SCALAR_NAMES:
            f, pref = _SCALAR_NAMES[name]
            scalars.add(ts, _plausible(v, _SCALAR_FIELDS[f], ENGINE_RANGES), rep, eid, f, pref, sid)
        elif name in REQUEST_SUCCESS:
            if eid >= 0:
                reason = reasons(labels.get("finished_reason", "unknown"))
                success.add(ts, _plausible(v, "request_success_total", ENGINE_RANGES), eid, sid,
                            reason)  # fmt: skip
        elif name == CACHE_CONFIG_INFO:
            configs.append(tuple(_config_number(labels.get(CACHE_CONFIG_LABELS[f]), f)
                                 for f in ("block_size", "num_gpu_blocks")))  # type: ignore[arg-type]  # fmt: skip
            infos.add(ts, v, rep, sid, elabels(labels.get("engine")), len(configs) - 1)
        else:
            name = name[:-6] if name.endswith("_total") and name[:-6] in _GPU_WANTED else name
            gpu = labels.get("gpu")
            if name not in _GPU_WANTED or gpu is None:
                continue
            uuid, mig = _first_label(labels, "UUID", "uuid"), labels.get("GPU_I_ID", "")
            idents.append((_first_label(labels, "Hostname", "hostname"),
                           f"{gpu}/{mig}" if mig else gpu, uuid, _first_label(labels, "modelName"),
                           _first_label(labels, "pod"), _first_label(labels, "namespace")))  # fmt: skip
            col, gv = _gpu_values(name, v)
            gid = gids((rep, gpu, uuid or "", mig))
            gpus.add(ts, gv, rep, gid, col, sid, names(name), len(idents) - 1)
    # The parser's order: by timestamp, then replica name, then as each row was made.
    rep_names = reps.keys()
    rep_rank = np.empty(len(rep_names), np.int64)
    rep_rank[sorted(range(len(rep_names)), key=rep_names.__getitem__)] = np.arange(len(rep_names))
    weight = len(series) + 1
    engine = _engine_table(scalars, success, infos, engines.keys(), reasons.keys(),
                           elabels.keys(), configs, rep_names, rep_rank, weight)  # fmt: skip
    gpu = _gpu_table(gpus, idents, rep_rank, weight)
    return engine, gpu


def _first_label(labels: Mapping[str, str], *names: str) -> str | None:
    return next((labels[n] for n in names if labels.get(n)), None)


def _plausible(
    v: npt.NDArray[np.float64], fieldname: str, ranges: Mapping[str, tuple[float, float]]
) -> npt.NDArray[np.float64]:
    """``v`` where inside the field's range, else NaN (a missing fact, as ``sample_value``)."""
    lo, hi = ranges.get(fieldname, (0.0, MAX_COUNT))
    return np.where((v >= lo) & (v <= hi), v, np.nan)


def _config_number(text: str | None, fieldname: str) -> float:
    """A ``cache_config_info`` label as its field's value (NaN: missing or implausible)."""
    try:
        x = float(text) if text is not None else math.nan
    except ValueError:
        return math.nan
    lo, hi = ENGINE_RANGES.get(fieldname, (0.0, MAX_COUNT))
    return x if lo <= x <= hi else math.nan


def _gpu_values(name: str, raw: npt.NDArray[np.float64]) -> tuple[int, npt.NDArray[np.float64]]:
    """The GPU column a DCGM series fills and its values (NaN: DCGM's blank or implausible)."""
    if name in DCGM_FIELDS:
        fieldname, convert, blank = DCGM_FIELDS[name]
        col = _GPU_FIELDS.index(fieldname)
    else:  # a framebuffer part only summed into the total
        fieldname, convert, blank = "mem_total_mib", _same, DCGM_FIELDS[FB_PARTS[0]][2]
        col = _FB_FREE if name == FB_PARTS[1] else _FB_RESERVED
    v: Any = convert(np.where((raw >= blank) & (raw <= blank + 16), np.nan, raw))  # type: ignore[arg-type]
    return col, _plausible(v, fieldname, GPU_RANGES)


def _same(v: Any) -> Any:
    return v


def _masked(values: Any) -> pa.Array:
    values = np.asarray(values, dtype=np.float64)
    return pa.array(values, pa.float64(), mask=np.isnan(values))


def _engine_table(
    scalars: _Points,
    success: _Points,
    infos: _Points,
    engines: list[tuple[int, str, str | None]],
    reasons: list[str],
    elabels: list[str | None],
    configs: list[tuple[float, float]],
    rep_names: list[str],
    rep_rank: npt.NDArray[np.int64],
    weight: int,
) -> pa.Table:
    import pandas as pd  # deferred: heavy, and only a diagnosis fetches engine series

    sc = scalars.frame()
    # A field is read from the first of its names the scrape has (any engine's, as parsed).
    sc = sc[sc["pref"] == sc.groupby(["ts", "rep", "field"])["pref"].transform("min")]
    sc = sc[sc["eid"] >= 0].sort_values("sid", kind="stable")
    ok = success.frame().sort_values(["ts", "eid", "sid"], kind="stable")
    made = pd.concat([
        pd.DataFrame({"ts": sc["ts"], "eid": sc["eid"], "order": sc["field"] * weight + sc["sid"]}),
        pd.DataFrame({"ts": ok["ts"], "eid": ok["eid"], "order": _SUCCESS_ORDER * weight + ok["sid"]}),
    ])  # fmt: skip
    rows = made.groupby(["ts", "eid"], as_index=False)["order"].min()
    eng_rep = np.array([e[0] for e in engines], np.int64)
    rows["rank"] = rep_rank[eng_rep[rows["eid"].to_numpy()]] if len(rows) else 0
    rows = rows.sort_values(["ts", "rank", "order"], ignore_index=True)
    at = pd.MultiIndex.from_arrays([rows["ts"], rows["eid"]])
    n = len(rows)

    cols: dict[str, Any] = {}
    last = sc.drop_duplicates(["ts", "eid", "field"], keep="last")
    for f, fieldname in enumerate(_SCALAR_FIELDS):
        one = last[last["field"] == f]
        idx = pd.MultiIndex.from_arrays([one["ts"], one["eid"]]).get_indexer(at)
        cols[fieldname] = np.where(idx >= 0, one["v"].to_numpy()[idx], np.nan) if len(one) else None

    # request_success_total: the sum over reasons, unknown when one is implausible
    key = ok.groupby(["ts", "eid"], sort=False).ngroup().to_numpy()
    first = np.unique(key, return_index=True)[1]
    v = ok["v"].to_numpy()
    good = ~np.isnan(v)
    total = hist.ordered_sums(key[good], v[good], len(first))
    total[np.unique(key[~good])] = np.nan
    idx = pd.MultiIndex.from_arrays([ok["ts"].to_numpy()[first], ok["eid"].to_numpy()[first]])
    where = idx.get_indexer(at)
    cols["request_success_total"] = np.where(where >= 0, total[where] if len(total) else 0, np.nan)
    # ...and by reason, in the order the reasons came (the series' order)
    g = ok[good]
    rkey = g.groupby(["ts", "eid", "reason"], sort=False).ngroup().to_numpy()
    rfirst = np.unique(rkey, return_index=True)[1]
    rsum = hist.ordered_sums(rkey, g["v"].to_numpy(), len(rfirst))
    row_of = at.get_indexer(pd.MultiIndex.from_arrays([g["ts"].to_numpy()[rfirst],
                                                       g["eid"].to_numpy()[rfirst]]))  # fmt: skip
    by = np.argsort(row_of, kind="stable")
    offsets = np.concatenate([[0], np.cumsum(np.bincount(row_of, minlength=n))]).astype(np.int32)
    names = np.array(reasons, dtype=object)[g["reason"].to_numpy()[rfirst][by]] if reasons else []
    by_reason = pa.MapArray.from_arrays(
        offsets, pa.array(list(names), pa.string()), pa.array(rsum[by], pa.float64())
    )

    # the KV cache geometry: the info of the row's engine, else the scrape's only one
    cfg = infos.frame()
    cfg["n"] = cfg.groupby(["ts", "rep"])["sid"].transform("size")
    cfg = cfg.sort_values("sid", kind="stable")
    cfg_at = np.full(n, -1)
    eng_label = np.array([_label_code(elabels, e[2]) for e in engines] or [0], np.int64)
    row_eid = rows["eid"].to_numpy()
    single = cfg[cfg["n"] == 1]
    idx = pd.MultiIndex.from_arrays([single["ts"], single["rep"]]).get_indexer(
        pd.MultiIndex.from_arrays([rows["ts"], eng_rep[row_eid] if n else row_eid])
    )
    cfg_at = np.where(idx >= 0, single["cfg"].to_numpy()[idx] if len(single) else -1, cfg_at)
    multi = cfg[cfg["n"] > 1].drop_duplicates(["ts", "rep", "elabel"], keep="last")
    idx = pd.MultiIndex.from_arrays([multi["ts"], multi["rep"], multi["elabel"]]).get_indexer(
        pd.MultiIndex.from_arrays(
            [rows["ts"], eng_rep[row_eid] if n else row_eid, eng_label[row_eid] if n else row_eid]
        )
    )
    cfg_at = np.where(idx >= 0, multi["cfg"].to_numpy()[idx] if len(multi) else -1, cfg_at)
    geometry = np.array(configs or [(math.nan, math.nan)], np.float64)
    cols["block_size"] = np.where(cfg_at >= 0, geometry[cfg_at, 0], np.nan)
    cols["num_gpu_blocks"] = np.where(cfg_at >= 0, geometry[cfg_at, 1], np.nan)

    out: dict[str, pa.Array] = {
        "ts": ts_array(rows["ts"].to_numpy()),
        "replica": pa.array([rep_names[engines[e][0]] for e in row_eid], pa.string()),
        "model": pa.array([engines[e][1] for e in row_eid], pa.string()),
        "engine": pa.array([engines[e][2] for e in row_eid], pa.string()),
    }
    for name in ENGINE_SCALARS:
        col = cols.get(name)
        out[name] = _masked(np.full(n, np.nan) if col is None else col)
    empty = pa.MapArray.from_arrays(np.zeros(n + 1, np.int32), pa.array([], pa.string()),
                                    pa.array([], pa.float64()))  # fmt: skip
    for name in ENGINE_MAPS:
        out[name] = by_reason if name == "request_success_by_reason" else empty
    out["histograms"] = pa.array([[]] * n, HISTOGRAM_TYPE)
    return pa.table(out)


def _label_code(elabels: list[str | None], engine: str | None) -> int:
    """The code of an engine label among the infos' (-1: no info carries it)."""
    try:
        return elabels.index(engine)
    except ValueError:
        return -1


def _gpu_table(
    gpus: _Points, idents: list[tuple[str | None, ...]], rep_rank: npt.NDArray[np.int64],
    weight: int,
) -> pa.Table:  # fmt: skip
    import pandas as pd  # deferred: heavy, and only a diagnosis fetches engine series

    g = gpus.frame()
    # A GPU's row is made by the first of its points in the parser's order: the names as
    # they first came in the scrape, then the series' order; its labels are that series'.
    g["order"] = g.groupby(["ts", "rep", "name"])["sid"].transform("min") * weight + g["sid"]
    rows = g.sort_values("order", kind="stable").drop_duplicates(["ts", "gid"], keep="first")
    rows = rows.assign(rank=rep_rank[rows["rep"].to_numpy()] if len(rows) else 0)
    rows = rows.sort_values(["ts", "rank", "order"], ignore_index=True)
    at = pd.MultiIndex.from_arrays([rows["ts"], rows["gid"]])
    n = len(rows)
    last = g.sort_values("sid", kind="stable").drop_duplicates(["ts", "gid", "col"], keep="last")
    values = np.full((_FB_RESERVED + 1, n), np.nan)
    for col in range(_FB_RESERVED + 1):
        one = last[last["col"] == col]
        if len(one):
            idx = pd.MultiIndex.from_arrays([one["ts"], one["gid"]]).get_indexer(at)
            values[col] = np.where(idx >= 0, one["v"].to_numpy()[idx], np.nan)
    used = values[_GPU_FIELDS.index("mem_used_mib")]
    free, reserved = values[_FB_FREE], values[_FB_RESERVED]
    total = np.where(np.isnan(used) | np.isnan(free), np.nan,
                     used + free + np.nan_to_num(reserved, nan=0.0))  # fmt: skip
    who = [idents[i] for i in rows["ident"].to_numpy()]
    out: dict[str, pa.Array] = {"ts": ts_array(rows["ts"].to_numpy())}
    for i, name in enumerate(_GPU_STRINGS):
        out[name] = pa.array([w[i] for w in who], pa.string())
    out["source"] = pa.array(["dcgm"] * n, pa.string())
    for i, name in enumerate(_GPU_FIELDS):
        out[name] = _masked(values[i])
    out["mem_total_mib"] = _masked(total)
    return pa.table(out)
