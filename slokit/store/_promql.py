"""PromQL for the Prometheus reader, and Prometheus' histogram arithmetic in Python.

The request-level facts of a :class:`~slokit.store.prometheus.PrometheusReader` are increases
of vLLM's histograms and counters per pod. This module writes those queries (one place for
the metric names) and computes quantiles, means and a standard deviation from bucket
increases the way ``histogram_quantile`` does, so the bucketed frames (quantiles asked of
Prometheus) and the summaries (quantiles computed here from one instant query per
histogram) agree.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping

from slokit.sources.dcgm import FIELDS as DCGM_FIELDS
from slokit.sources.vllm_metrics import CACHE_CONFIG_INFO, REQUEST_SUCCESS, SCALARS

#: vLLM histograms the request facts come from (family names, without ``_bucket``).
TTFT = "vllm:time_to_first_token_seconds"
QUEUE = "vllm:request_queue_time_seconds"
PREFILL = "vllm:request_prefill_time_seconds"
E2E = "vllm:e2e_request_latency_seconds"
PROMPT = "vllm:request_prompt_tokens"
GENERATION = "vllm:request_generation_tokens"
#: TPOT per request; the per-token histograms only where a pod lacks it.
TPOT = ("vllm:request_time_per_output_token_seconds", "vllm:time_per_output_token_seconds",
        "vllm:inter_token_latency_seconds")  # fmt: skip
SUCCESS = "vllm:request_success_total"
#: slokit's own SLI counter (exported by the sidecar): the only source of errors.
SLI = "slokit_requests_total"
#: A gauge every vLLM exposes: the extent of the data is read off it.
PRESENCE = "vllm:num_requests_running"


def series(metric: str) -> str:
    """A selector for ``metric`` (optionally with ``{matchers}``) that also matches vLLM's
    names stored as ``vllm_...``: a server that answers Prometheus in OpenMetrics through
    prometheus_client (0.26) escapes the colon. Other names are unchanged."""
    name, brace, rest = metric.partition("{")
    if not name.startswith("vllm:"):
        return metric
    matchers = f'__name__=~"vllm[:_]{name[5:]}"'
    if brace:
        inner = rest.rstrip()[:-1].strip()
        matchers += f", {inner}" if inner else ""
    return "{" + matchers + "}"


def engine_match() -> str:
    """The series the engine and GPU frames need (gauges and counters, no histograms):
    what the scrape normalizers read, so the fetch stays small for a large fleet."""
    names = {n for ns in SCALARS.values() for n in ns} | set(REQUEST_SUCCESS)
    names |= {CACHE_CONFIG_INFO, *DCGM_FIELDS, "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_RESERVED"}
    either = sorted(n.replace("vllm:", "vllm[:_]", 1) for n in names)
    return '{__name__=~"' + "|".join(either) + '"}'


def duration(seconds: float) -> str:
    """A PromQL range (whole milliseconds, at least 1 ms)."""
    return f"{max(1, round(seconds * 1000))}ms"


def grouping(pod_label: str) -> str:
    """The labels a per-pod aggregation keeps: the pod label and its fallbacks."""
    return ", ".join(dict.fromkeys((pod_label, "replica", "instance")))


def replica_of(labels: Mapping[str, str], pod_label: str) -> str:
    """The replica a series belongs to: its pod label, else ``replica``, else ``instance``."""
    return labels.get(pod_label) or labels.get("replica") or labels.get("instance") or "unknown"


def increase(expr: str, by: str, window_s: float) -> str:
    return f"sum by ({by}) (increase({series(expr)}[{duration(window_s)}]))"


def quantile(
    q: float, families: Iterable[str], by: str, window_s: float, matchers: str = ""
) -> str:
    """``histogram_quantile`` per pod; several families: the first a pod has (``or``).
    ``matchers`` (``pod=~"a|b"``) narrow the series read."""
    narrow = "{" + matchers + "}" if matchers else ""
    return " or ".join(
        f"histogram_quantile({q!r}, {increase(f + '_bucket' + narrow, f'{by}, le', window_s)})"
        for f in families
    )


def present(metric: str, by: str, window_s: float) -> str:
    """An instant query: one series per group of ``by`` with samples of ``metric`` in the
    ``window_s`` before the evaluation time (reads the samples once: cheap)."""
    return f"count by ({by}) (count_over_time({series(metric)}[{duration(window_s)}]))"


def one_of(label: str, values: Iterable[str]) -> str:
    """A matcher of ``label`` equal to any of ``values`` (escaped for RE2 and PromQL)."""
    alternatives = "|".join(re.escape(v) for v in sorted(set(values)))
    quoted = alternatives.replace("\\", "\\\\").replace('"', '\\"')
    return f'{label}=~"{quoted}"'


def buckets(families: Iterable[str], by: str, window_s: float) -> str:
    """Bucket increases per pod and ``le``, with ``__name__`` kept to tell families apart."""
    return " or ".join(
        f'label_replace({increase(f + "_bucket", f"{by}, le", window_s)}, "family", "{f}", "", "")'
        for f in families
    )


def labelled(exprs: Mapping[str, str]) -> str:
    """One query for several: each expression's series labelled ``family="<its key>"``."""
    return " or ".join(f'label_replace({e}, "family", "{key}", "", "")' for key, e in exprs.items())


def errors(by: str, window_s: float) -> str:
    return increase(f'{SLI}{{outcome="error"}}', by, window_s)


def counter_delta(metric: str, window: str) -> str:
    """Per series, a counter's growth over the ``window`` ending at the evaluation time
    without extrapolation: its value less its value a window ago (a series born inside it:
    its value); a series that reset inside the window: ``increase()``."""
    exact = f"(({metric} - ({metric} offset {window})) or {metric})"
    return f"({exact} unless (resets({metric}[{window}]) > 0)) or increase({metric}[{window}])"


# -- histogram arithmetic -------------------------------------------------------------------


Buckets = list[tuple[float, float]]  # (upper bound ``le``, cumulative count), any order


def _sorted(b: Buckets) -> Buckets:
    """By bound, counts made monotonic (increases of separate series can cross a little)."""
    out: Buckets = []
    top = 0.0
    for le, c in sorted(b):
        top = max(top, c if math.isfinite(c) else 0.0)
        out.append((le, top))
    return out


def hist_quantile(q: float, b: Buckets) -> float | None:
    """Prometheus' ``histogram_quantile``: linear interpolation inside the bucket holding the
    rank; a rank in the ``+Inf`` bucket is the highest finite bound. None: no observations."""
    s = _sorted(b)
    if len(s) < 2 or not math.isinf(s[-1][0]) or s[-1][1] <= 0:
        return None
    rank = q * s[-1][1]
    lo_le, lo_c = 0.0, 0.0
    for le, c in s:
        if c >= rank:
            if math.isinf(le):
                return s[-2][0]
            if le <= 0:
                return le
            if c == lo_c:
                return le
            return lo_le + (le - lo_le) * (rank - lo_c) / (c - lo_c)
        lo_le, lo_c = le, c
    return s[-2][0]


def hist_sd(b: Buckets, mean_value: float | None) -> float | None:
    """Sample standard deviation estimated from the buckets (each observation at its bucket's
    midpoint, the ``+Inf`` bucket's at the highest finite bound) around the exact mean."""
    s = _sorted(b)
    if mean_value is None or len(s) < 2 or s[-1][1] < 2:
        return None
    lo_le, lo_c, acc = 0.0, 0.0, 0.0
    for le, c in s:
        mid = lo_le if math.isinf(le) else (lo_le + le) / 2
        acc += (c - lo_c) * (mid - mean_value) ** 2
        lo_le, lo_c = (lo_le if math.isinf(le) else le), c
    return math.sqrt(acc / (s[-1][1] - 1))
