"""Backfill from a Prometheus HTTP API: vLLM and DCGM series of a window into the store.

Users who already run Prometheus need no sidecar history: ``query_range`` with the step
they ask for returns each series' value at every step (raw counters stay cumulative; rates
are computed at query time, as for scraped samples). The window is cut into chunks so
that no answer exceeds Prometheus' 11,000 points per series. The points of one timestamp
and one replica form one "scrape", which the same normalizers as live scrapes turn into
engine and GPU samples (old and new vLLM names, ``Hostname`` and ``hostname``).

The replica of a vLLM series is its ``replica_label`` (default ``pod``), else its
``instance``; DCGM series name their pod themselves.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx

from slokit.errors import BadInput
from slokit.records import EngineSample, GpuSample
from slokit.sources.dcgm import gpu_samples_from_families
from slokit.sources.exposition import MetricFamily, Sample
from slokit.sources.vllm_metrics import engine_samples_from_families

#: The series slokit reads: vLLM's and dcgm-exporter's. vLLM's names may be stored with
#: ``vllm_`` for ``vllm:``: a server that answers Prometheus in OpenMetrics through
#: prometheus_client (0.26) escapes the colon to an underscore.
DEFAULT_MATCH = '{__name__=~"vllm[:_].+|DCGM_FI_.+"}'
#: Prometheus refuses a range query with more points than this per series.
MAX_POINTS = 11_000


@dataclass(frozen=True)
class Series:
    labels: dict[str, str]
    points: list[tuple[float, float]]


class PrometheusClient:
    """The API calls backfill and the Prometheus reader need; the HTTP client is injected
    (tests, auth, TLS)."""

    def __init__(
        self, base_url: str, client: httpx.Client | None = None, timeout_s: float = 60.0
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise BadInput(f"--prometheus must be an http(s) URL, got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.client = client or httpx.Client(timeout=timeout_s)

    def _get(self, path: str, params: dict[str, str]) -> Any:
        url = f"{self.base_url}{path}"
        try:
            resp = self.client.get(url, params=params)
        except httpx.HTTPError as exc:
            raise BadInput(f"cannot reach Prometheus at {self.base_url}: {exc}") from None
        try:
            body = resp.json()
        except ValueError:
            raise BadInput(f"{url}: HTTP {resp.status_code}, not a Prometheus API answer") from None
        if body.get("status") != "success":
            raise BadInput(
                f"{url}: {body.get('errorType', 'error')}: {body.get('error', resp.status_code)}"
            )
        return body["data"]

    def server_time(self) -> float:
        """Prometheus' own clock (``time()``), the reference for relative times such as ``1h``."""
        data = self._get("/api/v1/query", {"query": "time()"})
        return float(data["result"][0])

    def query_range(self, query: str, start: float, end: float, step_s: float) -> list[Series]:
        data = self._get(
            "/api/v1/query_range",
            {"query": query, "start": _num(start), "end": _num(end), "step": _num(step_s)},
        )
        return _matrix(data, "query_range")

    def query(self, query: str, at: float) -> list[tuple[dict[str, str], float]]:
        """An instant query at ``at``: ``(labels, value)`` per series of the vector."""
        data = self._get("/api/v1/query", {"query": query, "time": _num(at)})
        if data.get("resultType") != "vector":
            raise BadInput(f"query returned {data.get('resultType')!r}, expected a vector")
        return [(dict(r["metric"]), float(r["value"][1])) for r in data["result"]]

    def raw_samples(self, selector: str, window_s: float, at: float) -> list[Series]:
        """The samples as stored (no lookback, no step) of ``selector`` in the ``window_s``
        seconds before ``at``: an instant query of a range vector."""
        data = self._get(
            "/api/v1/query", {"query": f"{selector}[{max(1, round(window_s * 1000))}ms]",
                              "time": _num(at)}
        )  # fmt: skip
        return _matrix(data, "query")


def _matrix(data: Any, call: str) -> list[Series]:
    """The series of an answer that must be a matrix."""
    if data.get("resultType") != "matrix":
        raise BadInput(f"{call} returned {data.get('resultType')!r}, expected a matrix")
    return [
        Series(dict(r["metric"]), [(float(t), float(v)) for t, v in r.get("values", [])])
        for r in data["result"]
    ]


def _num(x: float) -> str:
    return f"{x:.3f}".rstrip("0").rstrip(".")


def chunks(
    start: float, end: float, step_s: float, max_points: int = MAX_POINTS
) -> Iterator[tuple[float, float]]:
    """``[start, end]`` cut into ranges of at most ``max_points`` steps, no step twice."""
    if step_s <= 0:
        raise BadInput(f"step must be > 0, got {step_s}")
    if end < start:
        raise BadInput("the window ends before it starts")
    span = step_s * (max_points - 1)
    a = start
    while a <= end:
        b = min(end, a + span)
        yield a, b
        a = b + step_s


def vllm_name(name: str) -> str:
    """A stored series name with vLLM's own spelling (``vllm_x`` -> ``vllm:x``)."""
    return "vllm:" + name[5:] if name.startswith("vllm_") else name


def samples_from_series(
    series: list[Series], replica_label: str = "pod"
) -> tuple[list[EngineSample], list[GpuSample]]:
    """Group points by (timestamp, replica) and normalize each group like one scrape."""
    groups: dict[tuple[float, str], dict[str, MetricFamily]] = {}
    for s in series:
        labels = dict(s.labels)
        name = labels.pop("__name__", None)
        if not name:
            continue
        name = vllm_name(name)
        replica = labels.get(replica_label) or labels.get("instance") or "unknown"
        for ts, value in s.points:
            if math.isnan(value):
                continue
            fams = groups.setdefault((ts, replica), {})
            fam = fams.get(name)
            if fam is None:
                fam = fams[name] = MetricFamily(name=name, type="untyped")
            fam.samples.append(Sample(name=name, labels=labels, value=value, timestamp=ts))
    engine: list[EngineSample] = []
    gpu: list[GpuSample] = []
    for (ts, replica), fams in sorted(groups.items()):
        engine.extend(engine_samples_from_families(fams.values(), ts=ts, replica=replica))
        gpu.extend(gpu_samples_from_families(fams.values(), ts=ts))
    return engine, gpu


def backfill_samples(
    client: PrometheusClient,
    start: float,
    end: float,
    step_s: float,
    *,
    match: str = DEFAULT_MATCH,
    replica_label: str = "pod",
    max_points: int = MAX_POINTS,
) -> Iterator[tuple[list[EngineSample], list[GpuSample], int, int]]:
    """Per chunk: (engine samples, GPU samples, series, points), oldest chunk first."""
    for a, b in chunks(start, end, step_s, max_points):
        series = client.query_range(match, a, b, step_s)
        engine, gpu = samples_from_series(series, replica_label)
        yield engine, gpu, len(series), sum(len(s.points) for s in series)
