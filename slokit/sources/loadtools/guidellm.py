"""GuideLLM's benchmark report (``guidellm benchmark --outputs json``) -> client fragments.

Schema checked against guidellm 0.8.1 (vllm-project/guidellm, ``src/guidellm/benchmark/
schemas/report.py`` ``GenerativeBenchmarksReport``, ``.../schemas/benchmark.py``
``GenerativeBenchmark``, ``src/guidellm/schemas/request_stats.py``
``GenerativeRequestStats``, ``src/guidellm/schemas/info.py`` ``RequestInfo``)::

    {"metadata": {"guidellm_version": ...}, "config": {...},
     "benchmarks": [{"type_": "generative_benchmark", "metrics": {...},
                     "requests": {"successful": [...], "incomplete": [...],
                                  "errored": [...]}}]}

Per request: ``response_id`` (the server's ``chatcmpl-<id>``, normalized as every response id
in slokit, :mod:`slokit.ids`) -> ``request_id``, else GuideLLM's own ``request_id`` (a request
that got no answer); ``info.timings.request_start``/``first_token_iteration``/``request_end``
(wall clock, ``time.time()``) -> ``arrival_ts``/``first_token_ts``/``finish_ts``;
``time_to_first_token_ms`` -> TTFT; ``request_latency`` (seconds) -> E2E;
``inter_token_latency_ms`` (GuideLLM's ``(last - first token) / (output_tokens - 1)``,
slokit's TPOT; GuideLLM's own ``time_per_output_token_ms`` divides by all output tokens and is
not used) -> ``tpot_s``; ``prompt_tokens``/``output_tokens``. GuideLLM keeps no per-token
gaps, so ``itl_p95_s`` stays unknown. Status: ``successful`` -> ``ok``, ``errored`` ->
``error`` (``error_type`` the first line of ``info.error``), ``incomplete`` (cut by the
benchmark's end) -> ``incomplete``. Every benchmark of a sweep report is read.

A report whose benchmarks carry no request entries (a summary) is refused by :func:`parse`.
"""

from __future__ import annotations

import time

from slokit.errors import BadInput
from slokit.records import RequestFragment, RequestStatus
from slokit.sources.loadtools import _values as v

TOOL = "GuideLLM"

#: GuideLLM's request groups and the status each maps to.
_GROUPS: tuple[tuple[str, RequestStatus], ...] = (
    ("successful", "ok"),
    ("errored", "error"),
    ("incomplete", "incomplete"),
)


def sniff(text: str) -> bool:
    """True when the text is a GuideLLM JSON report (its metadata names guidellm)."""
    head = text.lstrip()[:4096]
    return head.startswith("{") and '"guidellm_version"' in head and '"benchmarks"' in text


def aggregate_hint(text: str) -> str | None:
    """GuideLLM's summaries are refused by :func:`parse` (it must read the whole report)."""
    return None


def _ms(rec: dict[str, v.Json], key: str, where: str) -> float | None:
    x = v.number(rec, key, where)
    return x / 1000.0 if x is not None else None


def _request(rec: v.Json, status: RequestStatus, where: str, now: float) -> RequestFragment:
    r = v.obj(rec, "request", where)
    info = v.obj(r.get("info"), "info", where)
    timings = v.obj(info.get("timings"), "info.timings", where)
    raw_id = v.string(r, "response_id", where) or v.string(r, "request_id", where)
    if not raw_id:
        raise BadInput(f"{where}: has neither response_id nor request_id")
    rid = v.request_id(raw_id, where)
    error = v.string(info, "error", where)
    frag = RequestFragment(
        request_id=rid,
        source="client",
        fragment_id=f"client:{rid}",
        arrival_ts=v.number(timings, "request_start", where),
        first_token_ts=v.number(timings, "first_token_iteration", where),
        finish_ts=v.number(timings, "request_end", where),
        client_ttft_s=_ms(r, "time_to_first_token_ms", where),
        client_e2e_s=v.number(r, "request_latency", where),
        tpot_s=_ms(r, "inter_token_latency_ms", where),
        prompt_tokens=v.integer(r, "prompt_tokens", where),
        output_tokens=v.integer(r, "output_tokens", where),
        status=status,
        error_type=v.brief(error) if status == "error" and error else None,
    )
    return v.checked(frag, where, now)


def parse(text: str, name: str, now: float | None = None) -> list[RequestFragment]:
    """Every request entry of every benchmark of the report as a client fragment."""
    now_s = time.time() if now is None else now
    doc = v.obj(v.loads(text, name), "the report", name)
    out: list[RequestFragment] = []
    for b, bench in enumerate(v.items(doc.get("benchmarks"), "benchmarks", name)):
        wb = f"{name}: benchmarks[{b}]"
        groups = v.obj(v.obj(bench, "benchmark", wb).get("requests"), "requests", wb)
        for group, status in _GROUPS:
            for i, rec in enumerate(v.items(groups.get(group), group, wb)):
                out.append(_request(rec, status, f"{wb}.requests.{group}[{i}]", now_s))
    if not out:
        raise BadInput(
            f"{name}: a GuideLLM report without per-request entries (a summary): give the "
            "full JSON report (guidellm benchmark --outputs json), whose benchmarks keep "
            "their requests"
        )
    return v.unique(out, name)
