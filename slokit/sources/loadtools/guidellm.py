"""GuideLLM's benchmark report (``guidellm run --output kind=json``) -> client fragments.

Schema checked against guidellm 0.8.1's source and real runs against ``slokit sim``
(tests/loadtools/test_guidellm_real.py; vllm-project/guidellm,
``src/guidellm/benchmark/schemas/report.py`` ``GenerativeBenchmarksReport``,
``.../benchmark/schemas/benchmark.py`` ``GenerativeBenchmark``,
``src/guidellm/schemas/base/request_stats.py`` ``GenerativeRequestStats``,
``src/guidellm/schemas/base/info.py`` ``RequestInfo``)::

    {"metadata": {"guidellm_version": ...}, "config": {...},
     "benchmarks": [{"type_": "generative_benchmark",
                     "scheduler_metrics": {"measure_start_time": ..., "measure_end_time": ...},
                     "metrics": {"request_totals": {"successful": N, ...}, ...},
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
``error``, ``incomplete`` (in flight when the benchmark ended: cancelled) -> ``incomplete``.
An error's ``info.error`` is the ``repr()`` of the exception GuideLLM caught
(``HTTPStatusError("Server error '500 Internal Server Error' for url ...")``): its type ->
``error_type``, the status httpx names -> ``http_status``; any other text -> its first line.
Every benchmark of a sweep report is read.

Only the requests GuideLLM measured are imported, so that slokit counts what GuideLLM's own
metrics count: those overlapping its measurement window
(``scheduler_metrics.measure_start_time``/``measure_end_time``: the benchmark less warmup and
cooldown) by ``request_start_time``/``request_end_time``, GuideLLM's rule
(``GenerativeRequestsAccumulator.get_within_range``); left out are warmup and cooldown
requests and those dispatched as the benchmark ended (cancelled at once). A report whose
benchmarks carry no request entries (``--metrics sample_size=0``, a summary) or only a sample
of them (``sample_size=N``: fewer measured entries than ``metrics.request_totals``) is
refused by :func:`parse`: attainment over a sample would not count the run's requests.
"""

from __future__ import annotations

import re
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

#: ``repr()`` of an exception: ``TypeName(args...)``.
_REPR = re.compile(r"(?P<type>[A-Za-z_][\w.]*)\((?P<args>.*)\)", re.DOTALL)
#: httpx's HTTPStatusError message: ``Server error '500 Internal Server Error' for url ...``.
_HTTPX_STATUS = re.compile(
    r"(?:Informational response|Redirect response|Client error|Server error) '(\d{3}) "
)

_SUMMARY = (
    "{name}: a GuideLLM report without per-request entries (a summary): give the full JSON "
    "report (guidellm run --output kind=json, without --metrics sample_size), whose "
    "benchmarks keep their requests"
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


def _error(error: str) -> tuple[str, int | None]:
    """``info.error`` -> (error type, HTTP status when httpx named one)."""
    m = _HTTPX_STATUS.search(error)
    status = int(m.group(1)) if m else None
    r = _REPR.fullmatch(error.strip())
    return (r["type"] if r else v.brief(error)), status


def _request(rec: v.Json, status: RequestStatus, where: str, now: float) -> RequestFragment:
    r = v.obj(rec, "request", where)
    info = v.obj(r.get("info"), "info", where)
    timings = v.obj(info.get("timings"), "info.timings", where)
    raw_id = v.string(r, "response_id", where) or v.string(r, "request_id", where)
    if not raw_id:
        raise BadInput(f"{where}: has neither response_id nor request_id")
    rid = v.request_id(raw_id, where)
    error = v.string(info, "error", where)
    error_type, http_status = _error(error) if status == "error" and error else (None, None)
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
        http_status=http_status,
        error_type=error_type,
    )
    return v.checked(frag, where, now)


def _window(b: dict[str, v.Json], where: str) -> tuple[float, float] | None:
    """GuideLLM's measurement window (None in a report without one: every request counts)."""
    sm = v.obj(b.get("scheduler_metrics"), "scheduler_metrics", where)
    start = v.number(sm, "measure_start_time", where)
    end = v.number(sm, "measure_end_time", where)
    return (start, end) if start is not None and end is not None else None


def _measured(rec: v.Json, window: tuple[float, float] | None, where: str) -> bool:
    """Whether GuideLLM counted the request: it overlaps the window (one without an end time
    never does; one without a start is an instant at its end)."""
    if window is None:
        return True
    r = v.obj(rec, "request", where)
    end = v.number(r, "request_end_time", where)
    if end is None:
        return False
    start = v.number(r, "request_start_time", where)
    return end >= window[0] and (end if start is None else start) <= window[1]


#: One request group of a benchmark: its name, slokit's status and its measured entries, each
#: with its index in the group.
_Group = tuple[str, RequestStatus, list[tuple[int, v.Json]]]


def _groups(bench: v.Json, where: str) -> list[_Group]:
    """The measured requests of each group of one benchmark, refused when GuideLLM kept only a
    sample of them."""
    b = v.obj(bench, "benchmark", where)
    groups = v.obj(b.get("requests"), "requests", where)
    totals = v.obj(
        v.obj(b.get("metrics"), "metrics", where).get("request_totals"), "request_totals", where
    )
    window = _window(b, where)
    out: list[_Group] = []
    for group, status in _GROUPS:
        entries = [
            (i, rec)
            for i, rec in enumerate(v.items(groups.get(group), group, where))
            if _measured(rec, window, f"{where}.requests.{group}[{i}]")
        ]
        counted = v.integer(totals, group, f"{where}.metrics.request_totals")
        if entries and counted is not None and len(entries) < counted:
            raise BadInput(
                f"{where}: GuideLLM kept {len(entries)} of its {counted} {group} requests "
                "(--metrics sample_size): run it without sample_size so that the report "
                "keeps every request"
            )
        out.append((group, status, entries))
    return out


def parse(text: str, name: str, now: float | None = None) -> list[RequestFragment]:
    """Every measured request of every benchmark of the report as a client fragment."""
    now_s = time.time() if now is None else now
    doc = v.obj(v.loads(text, name), "the report", name)
    out: list[RequestFragment] = []
    for b, bench in enumerate(v.items(doc.get("benchmarks"), "benchmarks", name)):
        wb = f"{name}: benchmarks[{b}]"
        for group, status, entries in _groups(bench, wb):
            for i, rec in entries:
                out.append(_request(rec, status, f"{wb}.requests.{group}[{i}]", now_s))
    if not out:
        raise BadInput(_SUMMARY.format(name=name))
    return v.unique(out, name)
