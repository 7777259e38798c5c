"""kubernetes-sigs/inference-perf's per-request lifecycle file
(``per_request_lifecycle_metrics.json``, written with ``report.request_lifecycle.per_request:
true``) -> client fragments.

Schema checked against inference-perf 0.5.0 (kubernetes-sigs/inference-perf,
``inference_perf/reportgen/base.py``: the ``per_request_lifecycle_metrics`` report;
``inference_perf/apis/base.py``: ``InferenceInfo``, ``StreamedResponseMetrics``,
``ErrorResponseInfo``). A JSON array, one object per request::

    {"start_time": 1.0, "end_time": 2.0, "request": "<JSON body>", "response": "...",
     "info": {"request_metrics": {"text": {"input_tokens": 10}}, "input_tokens": 10,
              "response_metrics": {"output_tokens": 5, "output_token_times": [...],
                                   "chunk_times": [...], "server_usage": {...}}},
     "error": null | {"error_type": "...", "error_msg": "..."}}

``start_time``/``end_time`` are ``time.perf_counter()`` readings, not wall clock, so they give
no ``arrival_ts``; inference-perf sends no request id either, so ids are
``<file-stem>-<i>``. Figures as inference-perf's own ``summarize_requests``: E2E is
``end_time - start_time``; TTFT is ``output_token_times[0] - start_time`` and TPOT
``(output_token_times[-1] - output_token_times[0]) / (output_tokens - 1)``, both only for a
streamed request with more than one token time; ``itl_p95_s`` is the p95 of the gaps between
token times; ``model`` comes from the request body. A request with ``error`` is ``error``
(``error_type`` its ``error_type``).

The summaries (``summary_lifecycle_metrics.json``, ``stage_<n>_lifecycle_metrics.json``) are
no per-request files: :func:`aggregate_hint` says so.
"""

from __future__ import annotations

import json
import time
from itertools import pairwise

from slokit.errors import BadInput
from slokit.records import RequestFragment
from slokit.sources.loadtools import _values as v

TOOL = "inference-perf"

_KEYS = ('"start_time"', '"end_time"', '"info"')


def sniff(text: str) -> bool:
    """True when the text is a JSON array of inference-perf lifecycle records."""
    head = text.lstrip()[:4096]
    return head.startswith("[") and all(k in head for k in _KEYS)


def aggregate_hint(text: str) -> str | None:
    """The message for an inference-perf summary, else None."""
    head = text.lstrip()[:4096]
    if head.startswith("{") and '"load_summary"' in head and '"successes"' in text:
        return (
            "this is an inference-perf summary (summary_/stage_<n>_lifecycle_metrics.json): "
            "give per_request_lifecycle_metrics.json (set report.request_lifecycle.per_request: "
            "true)"
        )
    return None


def _model(body: str | None) -> str | None:
    if not body:
        return None
    try:
        req = json.loads(body)
    except json.JSONDecodeError:
        return None
    model = req.get("model") if isinstance(req, dict) else None
    return model if isinstance(model, str) else None


def _request(rec: v.Json, rid: str, where: str, now: float) -> RequestFragment:
    r = v.obj(rec, "request", where)
    start = v.number(r, "start_time", where)
    end = v.number(r, "end_time", where)
    if start is None or end is None:
        raise BadInput(f"{where}: start_time and end_time are required")
    info = v.obj(r.get("info"), "info", where)
    resp = v.obj(info.get("response_metrics"), "info.response_metrics", where)
    text_metrics = v.obj(
        v.obj(info.get("request_metrics"), "info.request_metrics", where).get("text"),
        "info.request_metrics.text",
        where,
    )
    prompt = v.integer(text_metrics, "input_tokens", where)
    if prompt is None:
        prompt = v.integer(info, "input_tokens", where)
    out_tokens = v.integer(resp, "output_tokens", where)
    times = v.floats(resp.get("output_token_times"), "output_token_times", where)
    error = v.obj(r.get("error"), "error", where)
    ok = not error
    streamed = ok and len(times) > 1
    ttft = times[0] - start if streamed else None
    tpot = (
        (times[-1] - times[0]) / (out_tokens - 1)
        if streamed and out_tokens is not None and out_tokens > 1
        else None
    )
    gaps = [b - a for a, b in pairwise(times)] if streamed else []
    err_type = v.string(error, "error_type", where) or v.string(error, "error_msg", where)
    body = r.get("request")
    frag = RequestFragment(
        request_id=rid,
        source="client",
        fragment_id=f"client:{rid}",
        model=_model(body if isinstance(body, str) else None),
        client_ttft_s=ttft,
        client_e2e_s=end - start if ok else None,
        tpot_s=tpot,
        itl_p95_s=v.percentile(gaps, 0.95),
        prompt_tokens=prompt,
        output_tokens=out_tokens if ok else None,
        status="ok" if ok else "error",
        error_type=None if ok else v.brief(err_type or "error"),
    )
    return v.checked(frag, where, now)


def parse(text: str, name: str, now: float | None = None) -> list[RequestFragment]:
    """Every lifecycle record as a client fragment, ids ``<file-stem>-<i>``."""
    now_s = time.time() if now is None else now
    prefix = v.stem(name)
    records = v.items(v.loads(text, name), "the file", name)
    return [
        _request(rec, f"{prefix}-{i}", f"{name}: record {i}", now_s)
        for i, rec in enumerate(records)
    ]
