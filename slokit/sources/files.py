"""Recorded files -> records: metric history, vLLM bench results, load records (slokit's own
or a load tool's, :mod:`slokit.sources.loadtools`), quality rows.

Every parser here is all-or-nothing: the whole text is parsed before anything is
returned, and a bad line raises :class:`~slokit.errors.BadInput` naming ``file:line``, so
the caller writes a file completely or not at all. Parsers take text (or bytes) and the
file's name (for messages and synthesized ids); :func:`read_text` reads a path.

Values are held to :mod:`slokit.sources.validate`'s bounds. A request record with an
implausible value (a negative or week-long latency, an absurd token count, a time before 2000
or more than a day after ``now``, an id that is empty once normalized) is bad input naming
``file:line``. A metric sample whose value is outside its field's range becomes a missing fact
and is counted in ``invalid``, as in a live scrape; a sample timestamp outside the plausible
range is bad input.
"""

from __future__ import annotations

import csv
import io
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args

from slokit import clientlog as cl
from slokit.errors import BadInput
from slokit.ids import InvalidRequestId, checked_request_id
from slokit.records import EngineSample, GpuSample, RequestFragment, RequestStatus
from slokit.sources import _json, loadtools
from slokit.sources.dcgm import gpu_samples_from_families
from slokit.sources.exposition import (
    MetricFamily,
    is_openmetrics,
    parse_exposition,
    parse_openmetrics_history,
)
from slokit.sources.loadtools._values import integer, number, string
from slokit.sources.validate import Invalid, fragment_problem, timestamp_problem
from slokit.sources.vllm_metrics import engine_samples_from_families

#: Every request status by name (``incomplete``, a load test's end, included).
_STATUSES: dict[str, RequestStatus] = {s: s for s in get_args(RequestStatus)}


def read_text(path: str | Path) -> str:
    """Read a file as UTF-8; unreadable or undecodable files are :class:`BadInput`."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise BadInput(f"{p}: cannot read: {exc.strerror or exc}") from exc
    return _as_text(data, str(p))


def _as_text(data: str | bytes, name: str) -> str:
    if isinstance(data, str):
        return data
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise BadInput(f"{name}:{line}: invalid UTF-8") from exc


def _stem(name: str) -> str:
    return Path(name).stem or name


def _now(now: float | None) -> float:
    return time.time() if now is None else now


def _request_id(raw: str, where: str) -> str:
    try:
        return checked_request_id(raw)
    except InvalidRequestId as exc:
        raise BadInput(f"{where}: {exc}") from None


def _checked(frag: RequestFragment, where: str, now: float) -> RequestFragment:
    """``frag``, or :class:`BadInput` at ``where`` when a value of it is implausible."""
    why = fragment_problem(frag, now)
    if why is not None:
        raise BadInput(f"{where}: {why}")
    return frag


# --- (a) metric history: OpenMetrics / Prometheus text with timestamps -------------------


@dataclass(slots=True)
class MetricsFileRecords:
    engine_samples: list[EngineSample] = field(default_factory=list)
    gpu_samples: list[GpuSample] = field(default_factory=list)


def parse_metrics_file(
    data: str | bytes,
    *,
    name: str,
    instance: str | None = None,
    default_ts: float | None = None,
    invalid: Invalid = None,
    now: float | None = None,
) -> MetricsFileRecords:
    """Group samples by (timestamp, instance) and build engine and GPU samples per group.

    OpenMetrics (ends with ``# EOF``) carries timestamps in seconds; classic Prometheus text
    in milliseconds. The ``instance`` label names the replica; ``instance`` is used for
    samples without one. Samples without a timestamp take ``default_ts`` (e.g. the time a
    scrape was saved); without it they are rejected, and so are timestamps before 2000 or
    more than a day after ``now`` (default the clock). Values out of their field's range
    become missing facts, counted by field in ``invalid``.
    """
    now_s = _now(now)
    text = _as_text(data, name)
    try:
        families = (
            parse_openmetrics_history(text) if is_openmetrics(text) else parse_exposition(text)
        )
    except BadInput as exc:
        raise BadInput(f"{name}: {exc}") from exc

    groups: dict[tuple[float, str], dict[str, MetricFamily]] = {}
    for fam in families:
        for s in fam.samples:
            ts = s.timestamp if s.timestamp is not None else default_ts
            if ts is None:
                raise BadInput(
                    f"{name}: sample {s.name} has no timestamp; give the time it was taken"
                )
            if why := timestamp_problem(ts, now_s):
                raise BadInput(f"{name}: sample {s.name} at {ts!r}: timestamp {why}")
            inst = s.labels.get("instance") or instance
            if inst is None:
                raise BadInput(f"{name}: sample {s.name} has no 'instance' label; name the replica")
            fams = groups.setdefault((ts, inst), {})
            g = fams.get(fam.name)
            if g is None:
                g = fams[fam.name] = MetricFamily(name=fam.name, type=fam.type, help=fam.help)
            g.samples.append(s)

    out = MetricsFileRecords()
    for (ts, inst), fams in sorted(groups.items()):
        out.engine_samples.extend(
            engine_samples_from_families(fams.values(), ts=ts, replica=inst, invalid=invalid)
        )
        out.gpu_samples.extend(gpu_samples_from_families(fams.values(), ts=ts, invalid=invalid))
    return out


# --- helpers for JSON records -------------------------------------------------------------


def _where(name: str, line: int | None) -> str:
    return f"{name}:{line}" if line is not None else name


def _percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (as numpy's default), or None for no values."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _tpot(e2e: float | None, ttft: float | None, output_tokens: int | None) -> float | None:
    if e2e is None or ttft is None or output_tokens is None or output_tokens <= 1:
        return None
    return (e2e - ttft) / (output_tokens - 1)


def _float_list(v: Any, key: str, where: str) -> list[float]:
    if v is None:
        return []
    out = [_json.finite(x) for x in v] if isinstance(v, list) else [None]
    if any(x is None for x in out):
        raise BadInput(f"{where}: {key} must be a list of finite numbers")
    return [x for x in out if x is not None]


def _json_lines(text: str, name: str) -> Iterator[tuple[int, dict[str, Any]]]:
    for lineno, line in _json.lines(text):
        if not line.strip():
            continue
        try:
            rec = _json.loads(line)
        except _json.NotJson as exc:
            raise BadInput(f"{name}:{lineno}: not JSON: {exc.msg}") from exc
        if not isinstance(rec, dict):
            raise BadInput(f"{name}:{lineno}: expected a JSON object")
        yield lineno, rec


# --- (b) vllm bench serve --save-result --save-detailed -----------------------------------

_BENCH_LISTS = ("ttfts", "latencies", "input_lens", "output_lens", "errors")


def is_vllm_bench(text: str) -> bool:
    """True when the text is a ``vllm bench serve`` result (one JSON object with ``ttfts``)."""
    head = text.lstrip()[:1]
    if head != "{":
        return False
    try:
        doc = _json.loads(text)
    except _json.NotJson:
        first = text.lstrip().split("\n", 1)[0]
        try:
            doc = _json.loads(first)
        except _json.NotJson:
            return False
    return isinstance(doc, dict) and "ttfts" in doc


def parse_vllm_bench(
    data: str | bytes, *, name: str, now: float | None = None
) -> list[RequestFragment]:
    """``vllm bench serve --save-result --save-detailed`` JSON -> client fragments.

    Per request: ``ttfts``, ``itls``, ``latencies``, ``input_lens``, ``output_lens``,
    ``errors`` ("" when it succeeded); ``generated_texts`` are never read. vLLM's
    ``start_times`` are ``time.perf_counter()`` readings, not wall-clock time, so they give
    no ``arrival_ts``. Ids are ``<file-stem>-<i>`` (``<stem>-<run>-<i>`` for a file that
    ``--append-result`` wrote several runs into) unless the JSON carries ``request_ids``.
    """
    text = _as_text(data, name)
    try:
        runs: list[tuple[int, Any]] = [(1, _json.loads(text))]
    except _json.NotJson:
        runs = [(ln, rec) for ln, rec in _json_lines(text, name)]  # --append-result: one per line
    stem = _stem(name)
    out: list[RequestFragment] = []
    for k, (lineno, doc) in enumerate(runs):
        where = _where(name, lineno if len(runs) > 1 else None)
        prefix = stem if len(runs) == 1 else f"{stem}-{k}"
        out.extend(_bench_run(doc, where, prefix, _now(now)))
    return out


def _bench_run(doc: Any, where: str, prefix: str, now: float) -> list[RequestFragment]:
    if not isinstance(doc, dict):
        raise BadInput(f"{where}: expected a JSON object")
    missing = [k for k in _BENCH_LISTS if k not in doc]
    if missing:
        raise BadInput(
            f"{where}: not a detailed vllm bench result (missing {', '.join(missing)}; "
            "run with --save-result --save-detailed)"
        )
    n = len(doc["ttfts"]) if isinstance(doc["ttfts"], list) else -1
    for k in (*_BENCH_LISTS, "itls", "request_ids"):
        if k in doc and (not isinstance(doc[k], list) or len(doc[k]) != n):
            raise BadInput(f"{where}: {k} must be a list as long as ttfts ({n})")
    model = doc.get("model_id") if isinstance(doc.get("model_id"), str) else None
    ids = doc.get("request_ids")
    out: list[RequestFragment] = []
    for i in range(n):
        rec = {k: doc[k][i] for k in (*_BENCH_LISTS, "itls") if k in doc}
        w = f"{where}: request {i}"
        error = rec.get("errors")
        if error is not None and not isinstance(error, str):
            raise BadInput(f"{w}: errors entries must be strings")
        ok = not error
        ttft = number(rec, "ttfts", w)
        e2e = number(rec, "latencies", w)
        out_tokens = integer(rec, "output_lens", w)
        itls = _float_list(rec.get("itls"), "itls", w)
        if ids is not None:
            if not isinstance(ids[i], str) or not ids[i]:
                raise BadInput(f"{w}: request_ids entries must be non-empty strings")
            rid = _request_id(ids[i], w)
        else:
            rid = f"{prefix}-{i}"
        frag = RequestFragment(
            request_id=rid,
            source="client",
            fragment_id=f"client:{rid}",
            model=model,
            client_ttft_s=ttft if ok else None,
            client_e2e_s=e2e if ok else None,
            tpot_s=_tpot(e2e, ttft, out_tokens) if ok else None,
            itl_p95_s=_percentile(itls, 0.95) if ok else None,
            prompt_tokens=integer(rec, "input_lens", w),
            output_tokens=out_tokens if ok else None,
            status="ok" if ok else "error",
            error_type=None if ok else _first_line(str(error)),
        )
        out.append(_checked(frag, w, now))
    return out


def _first_line(s: str, limit: int = 120) -> str:
    line = s.strip().split("\n", 1)[0].strip()
    return line[:limit]


# --- (c) slokit load JSONL ------------------------------------------------------------------


def parse_load_jsonl(
    data: str | bytes, *, name: str, now: float | None = None
) -> list[RequestFragment]:
    """slokit load records (:mod:`slokit.clientlog`, one JSON object per line) -> client
    fragments."""
    text = _as_text(data, name)
    now_s = _now(now)
    out: list[RequestFragment] = []
    seen: set[str] = set()
    for lineno, rec in _json_lines(text, name):
        w = f"{name}:{lineno}"
        raw_id = string(rec, cl.REQUEST_ID, w)
        if not raw_id:
            raise BadInput(f"{w}: {cl.REQUEST_ID} is required")
        rid = _request_id(raw_id, w)
        if rid in seen:
            raise BadInput(f"{w}: {cl.REQUEST_ID} {raw_id!r} appears twice")
        seen.add(rid)
        raw_status = string(rec, cl.STATUS, w)
        status = _STATUSES.get(raw_status) if raw_status is not None else None
        if raw_status is not None and status is None:
            raise BadInput(
                f"{w}: {cl.STATUS} must be one of {sorted(_STATUSES)}, got {_json.shown(raw_status)}"
            )
        ttft = number(rec, cl.TTFT_S, w)
        e2e = number(rec, cl.E2E_S, w)
        out_tokens = integer(rec, cl.OUTPUT_TOKENS, w)
        http_status = integer(rec, cl.HTTP_STATUS, w)
        frag = RequestFragment(
            request_id=rid,
            source="client",
            fragment_id=f"client:{rid}",
            trace_id=string(rec, cl.TRACE_ID, w),
            model=string(rec, cl.MODEL, w),
            tenant=string(rec, cl.TENANT, w),
            slo_class=string(rec, cl.SLO_CLASS, w),
            task_id=string(rec, cl.TASK_ID, w),
            arrival_ts=number(rec, cl.SEND_TS, w),
            first_token_ts=number(rec, cl.FIRST_TOKEN_TS, w),
            finish_ts=number(rec, cl.FINISH_TS, w),
            client_ttft_s=ttft,
            client_e2e_s=e2e,
            tpot_s=_tpot(e2e, ttft, out_tokens),
            itl_p95_s=_percentile(_float_list(rec.get(cl.ITL_S), cl.ITL_S, w), 0.95),
            prompt_tokens=integer(rec, cl.PROMPT_TOKENS, w),
            output_tokens=out_tokens,
            max_tokens=integer(rec, cl.MAX_TOKENS, w),
            finish_reason=string(rec, cl.FINISH_REASON, w),
            status=status,
            http_status=http_status,
            error_type=string(rec, cl.ERROR_TYPE, w),
        )
        out.append(_checked(frag, w, now_s))
    return out


def parse_requests_file(
    data: str | bytes, *, name: str, now: float | None = None
) -> list[RequestFragment]:
    """Per-request results, told apart by content: a load tool's (AIPerf, GuideLLM,
    inference-perf: :mod:`slokit.sources.loadtools`), a vLLM bench result or slokit load JSONL.

    A tool's aggregate (AIPerf's ``profile_export_aiperf.json``, an inference-perf summary) is
    :class:`BadInput` naming the tool and the per-request file to give instead.
    """
    text = _as_text(data, name)
    frags = loadtools.parse_requests(text, name=name, now=now)
    if frags is not None:
        return frags
    if is_vllm_bench(text):
        return parse_vllm_bench(text, name=name, now=now)
    if (hint := loadtools.aggregate_problem(text)) is not None:
        raise BadInput(f"{name}: {hint}")
    return parse_load_jsonl(text, name=name, now=now)


# --- (d) quality rows -------------------------------------------------------------------------

_TRUE = frozenset({"true", "1", "pass", "passed", "yes", "y", "t"})
_FALSE = frozenset({"false", "0", "fail", "failed", "no", "n", "f"})


def _quality_value(v: Any, where: str) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, int | float) and v in (0, 1):
        return bool(v)
    if isinstance(v, str):
        s = v.strip().lower()
        if s in _TRUE:
            return True
        if s in _FALSE:
            return False
    raise BadInput(
        f"{where}: quality_pass must be true/false (or 1/0, pass/fail), got {_json.shown(v)}"
    )


def _csv_rows(reader: Any, name: str) -> Iterator[tuple[int, list[str]]]:
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            raise BadInput(f"{name}:{reader.line_num}: malformed CSV: {exc}") from exc
        yield reader.line_num, row


def parse_quality(data: str | bytes, *, name: str) -> list[RequestFragment]:
    """``request_id,quality_pass`` rows, CSV with a header or JSONL -> quality fragments."""
    text = _as_text(data, name)
    rows: list[tuple[int, Any, Any]] = []
    if text.lstrip().startswith("{"):
        for lineno, rec in _json_lines(text, name):
            rows.append((lineno, rec.get("request_id"), rec.get("quality_pass", None)))
    else:
        reader = csv.reader(io.StringIO(text, newline=""))
        header: list[str] | None = None
        for lineno, row in _csv_rows(reader, name):
            if not row or all(not c.strip() for c in row):
                continue
            if header is None:
                header = [c.strip() for c in row]
                if "request_id" not in header or "quality_pass" not in header:
                    raise BadInput(f"{name}:{lineno}: header must name request_id and quality_pass")
                continue
            if len(row) != len(header):
                raise BadInput(f"{name}:{lineno}: {len(row)} fields, header has {len(header)}")
            d = dict(zip(header, row, strict=True))
            rows.append((lineno, d["request_id"], d["quality_pass"]))
    out: list[RequestFragment] = []
    seen: set[str] = set()
    for lineno, raw_id, value in rows:
        w = f"{name}:{lineno}"
        if not isinstance(raw_id, str) or not raw_id.strip():
            raise BadInput(f"{w}: request_id is required")
        rid = _request_id(raw_id, w)
        if rid in seen:
            raise BadInput(f"{w}: request_id {raw_id!r} appears twice")
        seen.add(rid)
        out.append(
            RequestFragment(
                request_id=rid,
                source="quality",
                fragment_id=f"quality:{rid}",
                quality_pass=_quality_value(value, w),
            )
        )
    return out
