"""kubernetes-sigs/inference-perf's per-request lifecycle file
(``per_request_lifecycle_metrics.json``, written with ``report.request_lifecycle.per_request:
true``) -> client fragments.

Schema checked against inference-perf 0.5.0's source and a real run against ``slokit sim``
(tests/fixtures/loadtools/README.md; kubernetes-sigs/inference-perf,
``inference_perf/reportgen/base.py``: the ``per_request_lifecycle_metrics`` report and
``summarize_requests``; ``inference_perf/apis/base.py``: ``InferenceInfo``,
``StreamedResponseMetrics``, ``ErrorResponseInfo``; ``inference_perf/client/modelserver/
openai_client.py``: what a request records). A JSON array, one object per request, its keys
in this order::

    {"start_time": 1.0, "end_time": 2.0, "request": "<JSON body>",
     "response": "<raw body: the SSE stream when streamed>",
     "info": {"request_metrics": {"text": {"input_tokens": 10}}, "input_tokens": 10,
              "response_metrics": null | {"output_tokens": 5, "output_token_times": [...],
                                          "chunk_times": [...], "response_chunks": [...],
                                          "server_usage": {"completion_tokens": 5, ...}}},
     "error": null | {"error_type": "HTTP Error 500", "error_msg": "<response body>"}}

``request`` and ``response`` come before ``info`` and can be long (a prompt of thousands of
tokens, a whole SSE stream), so the file is recognised by its first two keys.

``start_time``/``end_time`` are ``time.perf_counter()`` readings, not wall clock, so they give
no ``arrival_ts``. inference-perf sends no request id; the server's response id (the ``id`` of
the first event of a streamed ``response``, or of its JSON body) is the request id, normalized
as every response id in slokit (:mod:`slokit.ids`), so the records join the server's spans; a
request the server answered with no id (an HTTP error) is ``<file-stem>-<i>``, and so is every
request of a file where two share a response id.

Figures as inference-perf's own ``summarize_requests`` (defaults: ``use_server_output_tokens:
false``): E2E is ``end_time - start_time``; TTFT is ``output_token_times[0] - start_time`` and
TPOT ``(output_token_times[-1] - output_token_times[0]) / (response_metrics.output_tokens -
1)``, both only for a streamed request with more than one token time; ``itl_p95_s`` is the p95
of the gaps between token times (inference-perf pools every request's gaps instead).
``output_token_times`` is one time per chunk, unless a lifecycle summary ran first
(``summary`` or ``per_stage``) with a tokenizer: it then left each chunk's time repeated once
per token of its text (gaps of 0 inside a chunk), the times its figures used.
``response_metrics.output_tokens`` is the client's re-tokenization of the text, several times
the server's count when the tokenizer is not the model's; ``output_tokens`` is the server's
``server_usage.completion_tokens`` when it reported one (as ``prompt_tokens``, which
inference-perf itself resolves to the server's), else the client's count. ``model`` comes from
the request body. A request with ``error`` is ``error`` (``error_type`` its ``error_type``;
``HTTP Error <code>`` also gives ``http_status``); its ``input_tokens`` of 0 is
inference-perf's placeholder for a request whose answer it could not read
(``InferenceInfo(... Text(input_tokens=0))``): unknown.

The summaries (``summary_lifecycle_metrics.json``, ``stage_<n>_lifecycle_metrics.json``) are
no per-request files: :func:`aggregate_hint` says so.
"""

from __future__ import annotations

import re
import time
from itertools import pairwise

from slokit.errors import BadInput
from slokit.records import RequestFragment
from slokit.sources import _json
from slokit.sources.loadtools import _values as v

TOOL = "inference-perf"

#: The head of the file: an array whose first object starts with start_time, end_time.
_HEAD = re.compile(r'\[\s*\{\s*"start_time"\s*:\s*[^,{}\[\]]+,\s*"end_time"\s*:')
#: inference-perf's error_type for an answer other than 200.
_HTTP_ERROR = re.compile(r"HTTP Error (\d{3})")


def sniff(text: str) -> bool:
    """True when the text is a JSON array of inference-perf lifecycle records."""
    return _HEAD.match(text.lstrip()[:4096]) is not None


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


def _json_object(text: str) -> dict[str, v.Json] | None:
    try:
        doc = _json.loads(text)
    except _json.NotJson:
        return None
    return doc if isinstance(doc, dict) else None


def _model(body: str | None) -> str | None:
    req = _json_object(body) if body else None
    model = req.get("model") if req is not None else None
    return model if isinstance(model, str) else None


def _response_id(response: str | None) -> str | None:
    """The server's response id: of the first SSE event (``data: {...}``; an Anthropic
    ``message_start`` carries it in ``message``), else of the JSON body; None when none."""
    if not response:
        return None
    doc: dict[str, v.Json] | None = None
    if response.lstrip().startswith(("data:", "event:")):
        for line in response.splitlines():
            if line.startswith("data:"):
                doc = _json_object(line.removeprefix("data:").strip())
                break
    else:
        doc = _json_object(response)
    if doc is None:
        return None
    rid = doc.get("id")
    if not isinstance(rid, str):
        message = doc.get("message")
        rid = message.get("id") if isinstance(message, dict) else None
    return rid if isinstance(rid, str) and rid.strip() else None


def _error(error: dict[str, v.Json], where: str) -> tuple[str, int | None]:
    """A failed request's error -> (error type, HTTP status when inference-perf named one)."""
    err_type = v.string(error, "error_type", where) or v.string(error, "error_msg", where)
    http = _HTTP_ERROR.fullmatch(err_type.strip()) if err_type else None
    return v.brief(err_type or "error"), int(http.group(1)) if http else None


def _request(rec: v.Json, fallback_id: str, where: str, now: float) -> RequestFragment:
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
    client_tokens = v.integer(resp, "output_tokens", where)
    usage = v.obj(resp.get("server_usage"), "info.response_metrics.server_usage", where)
    server_tokens = v.integer(usage, "completion_tokens", where)
    times = v.floats(resp.get("output_token_times"), "output_token_times", where)
    error = v.obj(r.get("error"), "error", where)
    ok = not error
    streamed = ok and len(times) > 1
    ttft = times[0] - start if streamed else None
    tpot = (
        (times[-1] - times[0]) / (client_tokens - 1)
        if streamed and client_tokens is not None and client_tokens > 1
        else None
    )
    gaps = [b - a for a, b in pairwise(times)] if streamed else []
    error_type, http_status = (None, None) if ok else _error(error, where)
    body = r.get("request")
    response = r.get("response")
    raw_id = _response_id(response if isinstance(response, str) else None)
    rid = v.request_id(raw_id, where) if raw_id else fallback_id
    frag = RequestFragment(
        request_id=rid,
        source="client",
        fragment_id=f"client:{rid}",
        model=_model(body if isinstance(body, str) else None),
        client_ttft_s=ttft,
        client_e2e_s=end - start if ok else None,
        tpot_s=tpot,
        itl_p95_s=v.percentile(gaps, 0.95),
        prompt_tokens=prompt if ok or prompt else None,
        output_tokens=(server_tokens if server_tokens is not None else client_tokens)
        if ok
        else None,
        status="ok" if ok else "error",
        http_status=http_status,
        error_type=error_type,
    )
    return v.checked(frag, where, now)


def parse(text: str, name: str, now: float | None = None) -> list[RequestFragment]:
    """Every lifecycle record as a client fragment, keyed by the server's response id
    (``<file-stem>-<i>`` when it gave none; every request so, when the server gave one id to
    two requests, as a mock server may)."""
    now_s = time.time() if now is None else now
    prefix = v.stem(name)
    records = v.items(v.loads(text, name), "the file", name)
    frags = [
        _request(rec, f"{prefix}-{i}", f"{name}: record {i}", now_s)
        for i, rec in enumerate(records)
    ]
    if len({f.request_id for f in frags}) < len(frags):
        frags = [
            f._replace(request_id=f"{prefix}-{i}", fragment_id=f"client:{prefix}-{i}")
            for i, f in enumerate(frags)
        ]
    return v.unique(frags, name)
