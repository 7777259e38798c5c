"""AIPerf's per-request export (``profile_export.jsonl``) -> client fragments.

Schema checked against aiperf 0.13.0 (ai-dynamo/aiperf, ``src/aiperf/common/models/
record_models.py``: ``MetricRecordInfo`` and ``MetricRecordMetadata``; metric tags and units in
``src/aiperf/metrics/types/*.py``). One JSON object per line::

    {"metadata": {"x_request_id": ..., "session_num": 0, "request_start_ns": ...,
                  "request_end_ns": ..., "benchmark_phase": "profiling",
                  "was_cancelled": false, ...},
     "metrics": {"time_to_first_token": {"value": 12.3, "unit": "ms"}, ...},
     "error": null | {"code": 500, "type": "...", "message": "..."}}

Fields: ``x_request_id`` (the ``X-Request-ID`` AIPerf sent, so the key that joins the
server's records) -> ``request_id``; ``request_start_ns``/``request_end_ns`` (wall clock,
``time.time_ns()``) -> ``arrival_ts``/``finish_ts``; ``time_to_first_token`` -> TTFT;
``request_latency`` -> E2E; ``inter_token_latency`` (AIPerf's ``(latency - ttft) / (osl - 1)``,
slokit's TPOT) -> ``tpot_s``; the p95 of ``inter_chunk_latency`` -> ``itl_p95_s``;
``input_sequence_length``/``output_sequence_length`` -> token counts. A record with ``error``
is ``error`` (``error_type`` its type, ``http_status`` its code); one with ``was_cancelled``
is ``incomplete`` (cut by the benchmark's end: not judged). Warmup records are left out, as
AIPerf's own statistics leave them out.

The run's aggregate (``profile_export_aiperf.json``) is no per-request file:
:func:`aggregate_hint` says so.
"""

from __future__ import annotations

import time

from slokit.errors import BadInput
from slokit.records import RequestFragment, RequestStatus
from slokit.sources import _json
from slokit.sources.loadtools import _values as v

TOOL = "AIPerf"

#: Seconds per unit of AIPerf's ``MetricTimeUnit`` tags.
_SECONDS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "sec": 1.0, "s": 1.0}


def _record_keys(line: str) -> bool:
    try:
        rec = _json.loads(line)
    except _json.NotJson:
        return False
    return (
        isinstance(rec, dict)
        and isinstance(rec.get("metadata"), dict)
        and "request_start_ns" in rec["metadata"]
        and isinstance(rec.get("metrics"), dict)
    )


def sniff(text: str) -> bool:
    """True when the first line is an AIPerf per-request record."""
    return _record_keys(v.first_line(text))


def aggregate_hint(text: str) -> str | None:
    """The message for AIPerf's aggregate (``profile_export_aiperf.json``), else None."""
    head = text.lstrip()[:4096]
    if head.startswith("{") and '"aiperf_version"' in head:
        return (
            "this is AIPerf's aggregate (profile_export_aiperf.json): give its per-request "
            "profile_export.jsonl from the same artifacts directory"
        )
    return None


def _metric_s(metrics: dict[str, v.Json], tag: str, where: str) -> float | None:
    """A time metric in seconds (AIPerf exports it in its display unit)."""
    m = v.obj(metrics.get(tag), tag, where)
    if not m:
        return None
    value = v.number(m, "value", f"{where}: {tag}")
    if value is None:
        return None
    unit = v.string(m, "unit", f"{where}: {tag}")
    if unit not in _SECONDS:
        raise BadInput(
            f"{where}: {tag} has unit {_json.shown(unit)}, expected one of {sorted(_SECONDS)}"
        )
    return value * _SECONDS[unit]


def _metric_list_s(metrics: dict[str, v.Json], tag: str, where: str) -> list[float]:
    m = v.obj(metrics.get(tag), tag, where)
    if not m:
        return []
    unit = v.string(m, "unit", f"{where}: {tag}")
    if unit not in _SECONDS:
        raise BadInput(
            f"{where}: {tag} has unit {_json.shown(unit)}, expected one of {sorted(_SECONDS)}"
        )
    return [x * _SECONDS[unit] for x in v.floats(m.get("value"), tag, where)]


def _metric_int(metrics: dict[str, v.Json], tag: str, where: str) -> int | None:
    m = v.obj(metrics.get(tag), tag, where)
    return v.integer(m, "value", f"{where}: {tag}") if m else None


def _status(meta: dict[str, v.Json], error: dict[str, v.Json]) -> RequestStatus:
    if meta.get("was_cancelled") is True:
        return "incomplete"
    return "error" if error else "ok"


def parse(text: str, name: str, now: float | None = None) -> list[RequestFragment]:
    """Every profiling record of ``profile_export.jsonl`` as a client fragment."""
    now_s = time.time() if now is None else now
    prefix = v.stem(name)
    out: list[RequestFragment] = []
    for lineno, line in _json.lines(text):
        if not line.strip():
            continue
        w = f"{name}:{lineno}"
        try:
            rec = _json.loads(line)
        except _json.NotJson as exc:
            raise BadInput(f"{w}: not JSON: {exc.msg}") from exc
        if not isinstance(rec, dict):
            raise BadInput(f"{w}: expected a JSON object")
        meta = v.obj(rec.get("metadata"), "metadata", w)
        if meta.get("benchmark_phase") == "warmup":
            continue
        metrics = v.obj(rec.get("metrics"), "metrics", w)
        error = v.obj(rec.get("error"), "error", w)
        start_ns = v.number(meta, "request_start_ns", w)
        end_ns = v.number(meta, "request_end_ns", w)
        if start_ns is None:
            raise BadInput(f"{w}: metadata.request_start_ns is required (an AIPerf record)")
        raw_id = v.string(meta, "x_request_id", w)
        rid = v.request_id(raw_id, w) if raw_id else f"{prefix}-{lineno}"
        status = _status(meta, error)
        ttft = _metric_s(metrics, "time_to_first_token", w)
        arrival = start_ns / 1e9
        itls = _metric_list_s(metrics, "inter_chunk_latency", w)
        err_type = v.string(error, "type", w) or v.string(error, "message", w)
        frag = RequestFragment(
            request_id=rid,
            source="client",
            fragment_id=f"client:{rid}",
            arrival_ts=arrival,
            first_token_ts=arrival + ttft if ttft is not None else None,
            finish_ts=end_ns / 1e9 if end_ns is not None else None,
            client_ttft_s=ttft,
            client_e2e_s=_metric_s(metrics, "request_latency", w),
            tpot_s=_metric_s(metrics, "inter_token_latency", w),
            itl_p95_s=v.percentile(itls, 0.95),
            prompt_tokens=_metric_int(metrics, "input_sequence_length", w),
            output_tokens=_metric_int(metrics, "output_sequence_length", w),
            status=status,
            http_status=v.integer(error, "code", w),
            error_type=v.brief(err_type) if status != "ok" and err_type else None,
        )
        out.append(v.checked(frag, w, now_s))
    return v.unique(out, name)
