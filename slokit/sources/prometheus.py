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

import json
import math
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx

from slokit.errors import BadInput
from slokit.records import EngineSample, GpuSample
from slokit.sources.dcgm import gpu_samples_from_families
from slokit.sources.exposition import MetricFamily, Sample
from slokit.sources.vllm_metrics import engine_samples_from_families
from slokit.store.window import MAX_TS

#: The series slokit reads: vLLM's and dcgm-exporter's. vLLM's names may be stored with
#: ``vllm_`` for ``vllm:``: a server that answers Prometheus in OpenMetrics through
#: prometheus_client (0.26) escapes the colon to an underscore.
DEFAULT_MATCH = '{__name__=~"vllm[:_].+|DCGM_FI_.+"}'
#: Prometheus refuses a range query with more points than this per series.
MAX_POINTS = 11_000
#: The largest answer read (bytes, decompressed): past it the answer is dropped, unread. A
#: range query past it is asked again in shorter chunks (:meth:`PrometheusClient.range_chunks`).
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
#: Environment variable that sets the limit (bytes, or e.g. ``256M``, ``1G``).
MAX_BYTES_ENV = "SLOKIT_PROMETHEUS_MAX_BYTES"
#: The longest one answer may take to arrive, however steadily its bytes trickle in (each
#: read still has the client's own timeout).
ANSWER_DEADLINE_S = 300.0
#: The smallest step a query may ask (Prometheus' times are milliseconds).
MIN_STEP_S = 0.001

_NUMBER = (int, float)


@dataclass(frozen=True)
class Series:
    labels: dict[str, str]
    points: list[tuple[float, float]]


class AnswerTooLarge(BadInput):
    """An answer past the client's ``max_bytes``."""


def max_bytes_from_env() -> int:
    """The answer size limit: :data:`MAX_BYTES_ENV` if set, else :data:`DEFAULT_MAX_BYTES`."""
    text = os.environ.get(MAX_BYTES_ENV, "").strip()
    if not text:
        return DEFAULT_MAX_BYTES
    m = re.fullmatch(r"(\d{1,15}(?:\.\d{1,6})?)\s*([kmgt]?)(?:i?b)?", text, re.IGNORECASE)
    n = int(float(m.group(1)) * 1024 ** "_kmgt".index(m.group(2).lower() or "_")) if m else 0
    if not 0 < n <= 1 << 50:
        raise BadInput(f"{MAX_BYTES_ENV}={_short(text)}: expected a size such as 64M or 1G")
    return n


class PrometheusClient:
    """The API calls backfill and the Prometheus reader need; the HTTP client is injected
    (tests, auth, TLS).

    Every answer is read up to ``max_bytes`` (default :func:`max_bytes_from_env`) and
    checked whole before it is used: anything but the Prometheus API's JSON (an object with
    ``status``, ``data``, the ``resultType`` asked, series of string labels and
    ``[time, "value"]`` points) is a :class:`~slokit.errors.BadInput` naming the URL."""

    def __init__(
        self,
        base_url: str,
        client: httpx.Client | None = None,
        timeout_s: float = 60.0,
        *,
        max_bytes: int | None = None,
        deadline_s: float = ANSWER_DEADLINE_S,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise BadInput(f"--prometheus must be an http(s) URL, got {_short(base_url)}")
        try:
            url = httpx.URL(base_url)
        except (httpx.InvalidURL, ValueError, TypeError) as exc:
            raise BadInput(f"--prometheus {_short(base_url)} is not a valid URL: {exc}") from None
        if not url.host:
            raise BadInput(f"--prometheus {_short(base_url)} names no host")
        self.base_url = base_url.rstrip("/")
        self.max_bytes = max_bytes if max_bytes is not None else max_bytes_from_env()
        self.deadline_s = deadline_s
        self.client = client or httpx.Client(timeout=timeout_s)

    # -- reading and checking an answer ------------------------------------------------------
    def _read(self, url: str, params: dict[str, str]) -> tuple[int, bytearray]:
        """The status and body of a GET, the body read up to :attr:`max_bytes`."""
        limit = self.max_bytes
        try:
            with self.client.stream("GET", url, params=params) as resp:
                declared = resp.headers.get("content-length", "")
                plain = not resp.headers.get("content-encoding")
                if plain and declared.isascii() and declared.isdigit() and int(declared) > limit:
                    raise self._too_large(url)
                body = bytearray()
                deadline = time.monotonic() + self.deadline_s
                for part in resp.iter_bytes():
                    body += part
                    if len(body) > limit:
                        raise self._too_large(url)
                    if time.monotonic() > deadline:
                        raise BadInput(
                            f"{url}: the answer took over {self.deadline_s:g} s to arrive"
                        )
                return resp.status_code, body
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            raise BadInput(f"cannot reach Prometheus at {self.base_url}: {exc}") from None

    def _too_large(self, url: str) -> AnswerTooLarge:
        return AnswerTooLarge(
            f"{url}: the answer exceeds the {_size(self.max_bytes)} limit ({MAX_BYTES_ENV}): "
            "narrow the window, the series or the step, or raise the limit"
        )

    def _get(self, path: str, params: dict[str, str]) -> dict[str, Any]:
        """The ``data`` object of a successful answer."""
        url = f"{self.base_url}{path}"
        code, raw = self._read(url, params)
        try:
            body = json.loads(raw)
        except RecursionError:
            raise BadInput(f"{url}: HTTP {code}, JSON nested too deeply: not a Prometheus API "
                           "answer") from None  # fmt: skip
        except ValueError as exc:
            raise BadInput(
                f"{url}: HTTP {code}, not a Prometheus API answer ({_short(str(exc), 100)})"
            ) from None
        finally:
            del raw
        if not isinstance(body, dict):
            raise BadInput(
                f"{url}: HTTP {code}, not a Prometheus API answer (the JSON is {_kind(body)}, "
                "not an object)"
            )
        status = body.get("status")
        if status != "success":
            if status == "error" or "error" in body:
                kind, error = body.get("errorType", "error"), body.get("error", code)
                raise BadInput(f"{url}: {_short(kind, 60)}: {_short(error)}")
            raise BadInput(f"{url}: HTTP {code}, not a Prometheus API answer "
                           f"(status {_short(status, 60)})")  # fmt: skip
        data = body.get("data")
        if not isinstance(data, dict):
            raise _malformed(url, f"data is {_kind(data)}, expected an object")
        return data

    def _result(self, url: str, data: dict[str, Any], kind: str, call: str) -> Any:
        """``data.result`` of an answer that must be of ``resultType`` ``kind``."""
        got = data.get("resultType")
        if got != kind:
            raise BadInput(f"{url}: {call} returned {_short(got, 60)}, expected a {kind}")
        result = data.get("result")
        if kind != "scalar" and not isinstance(result, list):
            raise _malformed(url, f"result is {_kind(result)}, expected a list")
        return result

    # -- the calls ---------------------------------------------------------------------------
    def server_time(self) -> float:
        """Prometheus' own clock (``time()``), the reference for relative times such as ``1h``."""
        url = f"{self.base_url}/api/v1/query"
        data = self._get("/api/v1/query", {"query": "time()"})
        now, _ = _pair(self._result(url, data, "scalar", "time()"), url)
        if not 0 <= now <= MAX_TS:
            raise _malformed(url, f"Prometheus' clock reads {now!r}")
        return now

    def query_range(self, query: str, start: float, end: float, step_s: float) -> list[Series]:
        path = "/api/v1/query_range"
        data = self._get(
            path, {"query": query, "start": _num(start), "end": _num(end), "step": _num(step_s)}
        )
        url = self.base_url + path
        return _matrix(self._result(url, data, "matrix", "query_range"), url)

    def range_chunks(
        self, query: str, start: float, end: float, step_s: float, max_points: int = MAX_POINTS
    ) -> Iterator[list[Series]]:
        """:meth:`query_range` of each of :func:`chunks`, oldest first. A chunk whose answer
        is over :attr:`max_bytes` is asked again in halves (and the chunks after it are no
        longer): only one step's answer past the limit is a :class:`BadInput`."""
        _check_range(start, end, step_s)
        points = max(1, max_points)
        a = start
        while a <= end:
            b = min(end, a + step_s * (points - 1))
            try:
                got = self.query_range(query, a, b, step_s)
            except AnswerTooLarge:
                steps = min(points, int((b - a) / step_s + 1e-6) + 1)
                if steps <= 1:
                    raise
                points = steps // 2
                continue
            yield got
            a = b + step_s

    def query(self, query: str, at: float) -> list[tuple[dict[str, str], float]]:
        """An instant query at ``at``: ``(labels, value)`` per series of the vector."""
        path = "/api/v1/query"
        data = self._get(path, {"query": query, "time": _num(at)})
        url = self.base_url + path
        out: list[tuple[dict[str, str], float]] = []
        for r in self._result(url, data, "vector", "query"):
            if not isinstance(r, dict):
                raise _malformed(url, f"a series is {_kind(r)}, expected an object")
            if "value" not in r and "histogram" in r:
                continue  # a native histogram: slokit reads the classic ones
            out.append((_labels(r.get("metric"), url), _pair(r.get("value"), url)[1]))
        return out

    def raw_samples(self, selector: str, window_s: float, at: float) -> list[Series]:
        """The samples as stored (no lookback, no step) of ``selector`` in the ``window_s``
        seconds before ``at``: an instant query of a range vector."""
        path = "/api/v1/query"
        data = self._get(
            path, {"query": f"{selector}[{max(1, round(window_s * 1000))}ms]",
                   "time": _num(at)}
        )  # fmt: skip
        url = self.base_url + path
        return _matrix(self._result(url, data, "matrix", "query"), url)


def _malformed(url: str, what: str) -> BadInput:
    return BadInput(f"{url}: malformed Prometheus answer: {what}")


def _kind(x: object) -> str:
    """What a JSON value is, in words."""
    if x is None:
        return "null"
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}
    return names.get(type(x), "a number")


def _short(x: object, n: int = 200) -> str:
    """``x`` on one line, at most about ``n`` characters."""
    if isinstance(x, str):
        text = x
    elif isinstance(x, _NUMBER):
        text = repr(x)
    elif isinstance(x, list | dict):
        text = f"{_kind(x)} of length {len(x)}"
    else:
        text = _kind(x)
    text = " ".join(text[: n + 1000].split())
    text = text if len(text) <= n else text[:n] + "..."
    return "".join(c if c.isprintable() else "?" for c in text)  # no terminal escapes


def _size(n: int) -> str:
    return f"{n / 1024**2:g} MiB" if n % 1024**2 == 0 else f"{n} bytes"


def _labels(metric: Any, url: str) -> dict[str, str]:
    """A series' labels: an object of strings (Unicode: no lone surrogate, which no store
    or terminal takes)."""
    if type(metric) is not dict:
        raise _malformed(url, f"a series' metric is {_kind(metric)}, expected an object")
    for k, v in metric.items():
        if type(v) is not str:
            raise _malformed(url, f"label {_short(k, 60)} is {_kind(v)}, expected a string")
        if not (k.isascii() and v.isascii()):
            try:
                k.encode(), v.encode()
            except UnicodeEncodeError:
                raise _malformed(url, f"label {_short(k, 60)} is not valid Unicode") from None
    return metric


def _pair(p: Any, url: str) -> tuple[float, float]:
    """A ``[time, "value"]`` point: a Unix time (1970 to 9999), a number as a string
    (``NaN`` and ``+Inf`` included)."""
    if type(p) is not list or len(p) != 2:
        raise _malformed(url, f'a point is {_short(p, 60)}, expected [time, "value"]')
    t, v = p
    if type(t) not in _NUMBER or not 0 <= t <= MAX_TS:
        raise _malformed(url, f"a point's time is {_short(t, 60)}, expected a Unix time")
    if type(v) is not str:
        raise _malformed(url, f"a point's value is {_kind(v)}, expected a string")
    try:
        return float(t), float(v)
    except ValueError:
        raise _malformed(url, f"a point's value is {_short(v, 60)}, not a number") from None


def _points(values: Any, url: str) -> list[tuple[float, float]]:
    """A series' ``[time, "value"]`` points (:func:`_pair`'s checks, inlined: a matrix
    can hold millions)."""
    if type(values) is not list:
        raise _malformed(url, f"a series' values are {_kind(values)}, expected a list")
    out: list[tuple[float, float]] = []
    append = out.append
    try:
        for p in values:
            if type(p) is not list or len(p) != 2:
                break
            t, v = p
            if type(v) is not str or not 0 <= t <= MAX_TS:
                break
            append((float(t), float(v)))
        else:
            return out
    except (TypeError, ValueError):
        pass
    for p in values:  # the first bad point, named
        _pair(p, url)
    raise _malformed(url, 'a point is not [time, "value"]')


def _matrix(result: list[Any], url: str) -> list[Series]:
    """The series of a matrix answer's ``result``."""
    out: list[Series] = []
    for r in result:
        if type(r) is not dict:
            raise _malformed(url, f"a series is {_kind(r)}, expected an object")
        out.append(Series(_labels(r.get("metric"), url), _points(r.get("values", []), url)))
    return out


def _num(x: float) -> str:
    return f"{x:.3f}".rstrip("0").rstrip(".")


def _check_range(start: float, end: float, step_s: float) -> None:
    if not math.isfinite(step_s) or step_s < MIN_STEP_S:
        raise BadInput(f"step must be at least 1ms, got {step_s!r}")
    if not (math.isfinite(start) and math.isfinite(end)):
        raise BadInput(f"the window must be finite, got {start!r} .. {end!r}")
    if end < start:
        raise BadInput("the window ends before it starts")


def chunks(
    start: float, end: float, step_s: float, max_points: int = MAX_POINTS
) -> Iterator[tuple[float, float]]:
    """``[start, end]`` cut into ranges of at most ``max_points`` steps, no step twice."""
    _check_range(start, end, step_s)
    span = step_s * (max(1, max_points) - 1)
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
    for series in client.range_chunks(match, start, end, step_s, max_points):
        engine, gpu = samples_from_series(series, replica_label)
        yield engine, gpu, len(series), sum(len(s.points) for s in series)
