"""Run files -> records for ``slokit gate``: a load JSONL, a vLLM bench result or a load tool's
per-request file (:mod:`slokit.sources.loadtools`), and a baseline (an earlier run's records
or its ``slokit slo report --json``).

Records are merged through an in-memory store, the same path as ``ingest``, so a gate
judges exactly what ``slo report`` would after loading the same file.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from slokit.analysis.gate import Baseline
from slokit.errors import BadInput
from slokit.records import RequestFragment
from slokit.sources import _json, files, loadtools


@dataclass(frozen=True)
class RunInput:
    """Records of one run, merged through the store, and the run's own duration if known."""

    records: list[dict[str, Any]]
    duration_s: float | None = None


def records_from_fragments(fragments: Sequence[RequestFragment]) -> list[dict[str, Any]]:
    """Merge fragments in an in-memory store (the same path as ``ingest``) and read them."""
    from slokit.store.db import open_store  # deferred: the store imports duckdb and pyarrow

    with open_store(":memory:") as store:
        store.append_fragments(fragments)
        return store.reader().requests(None, None)


def _bench_duration(text: str) -> float | None:
    """Sum of ``duration`` over the runs in a vLLM bench result (one or --append-result)."""
    try:
        docs = [_json.loads(text)]
    except _json.NotJson:
        try:
            docs = [_json.loads(line) for _, line in _json.lines(text) if line.strip()]
        except _json.NotJson:
            return None
    ds = [d.get("duration") for d in docs if isinstance(d, dict)]
    total = 0.0
    for d in ds:
        f = _json.finite(d)
        if f is None or f <= 0:
            return None
        total += f
    return total or None


def load_run_file(path: str, kind: str) -> RunInput:
    """``kind`` ``vllm-bench`` (``vllm bench serve --save-detailed`` JSON), ``records``
    (any per-request file :func:`~slokit.sources.files.parse_requests_file` reads, told apart
    by content: ``slokit load`` JSONL, a bench file, AIPerf's ``profile_export.jsonl``, a
    GuideLLM report, inference-perf's per-request lifecycle file) -> :class:`RunInput`."""
    text = files.read_text(path)
    if kind == "vllm-bench" or (
        kind == "records" and loadtools.detect(text) is None and files.is_vllm_bench(text)
    ):
        frags = files.parse_vllm_bench(text, name=path)
        return RunInput(records_from_fragments(frags), _bench_duration(text))
    if kind != "records":
        raise ValueError(kind)
    return RunInput(records_from_fragments(files.parse_requests_file(text, name=path)))


def load_baseline(path: str) -> Baseline:
    """A baseline: ``slokit slo report --json`` output, or an earlier run's records file."""
    text = files.read_text(path)
    try:
        doc = _json.loads(text)
    except _json.NotJson:
        doc = None
    if isinstance(doc, dict) and "classes" in doc and "overall" in doc:
        return Baseline(report=_checked_report(doc, path))
    return Baseline(records=load_run_file(path, "records").records)


#: The keys of a report's percentiles that the gate compares with (``p95``: the 0.95 quantile).
_PERCENTILE_KEY = re.compile(r"p\d+")
#: Most requests a baseline report may claim for a class (a count past it is no run's).
MAX_REPORT_REQUESTS = 10**12


def _checked_report(doc: dict[str, Any], path: str) -> dict[str, Any]:
    """``doc`` (a ``slokit slo report --json``) when every value the gate compares with has
    the shape that report gives it; BadInput naming the first that does not."""
    classes = doc["classes"]
    if not isinstance(classes, list):
        raise BadInput(f"{path}: classes must be a list (a slokit slo report --json)")
    for i, group in enumerate(classes):
        where = f"{path}: classes[{i}]"
        if not isinstance(group, dict):
            raise BadInput(f"{where} must be an object")
        if not isinstance(group.get("name"), str):
            raise BadInput(f"{where}.name must be a string")
        n = _count(group.get("requests"), f"{where}.requests", MAX_REPORT_REQUESTS)
        outcomes = group.get("outcomes")
        if outcomes is not None:
            if not isinstance(outcomes, dict):
                raise BadInput(f"{where}.outcomes must be an object")
            _count(outcomes.get("good"), f"{where}.outcomes.good", n)
        percentiles = group.get("percentiles")
        if percentiles is None:
            continue
        if not isinstance(percentiles, dict):
            raise BadInput(f"{where}.percentiles must be an object")
        for metric, by_q in percentiles.items():
            if by_q is None:
                continue
            if not isinstance(by_q, dict):
                raise BadInput(f"{where}.percentiles.{metric} must be an object")
            for q, pct in by_q.items():
                at = f"{where}.percentiles.{metric}.{q}"
                if pct is None or not _PERCENTILE_KEY.fullmatch(q):  # the gate reads p50, p95..
                    continue
                value = pct.get("value_s") if isinstance(pct, dict) else 0
                if not isinstance(pct, dict) or (value is not None and _json.finite(value) is None):
                    raise BadInput(f"{at} must be an object with a finite value_s (or null)")
                ci = pct.get("ci95_s", [None, None])
                if not (
                    isinstance(ci, list)
                    and len(ci) == 2
                    and all(x is None or _json.finite(x) is not None for x in ci)
                ):
                    raise BadInput(f"{at}.ci95_s must be [low, high] (numbers or null)")
    return doc


def _count(v: Any, where: str, most: float) -> int:
    """``v`` as a count in [0, most]; None as 0."""
    if v is None:
        return 0
    f = _json.finite(v)
    if f is None or not f.is_integer() or not 0 <= f <= most:
        raise BadInput(f"{where} must be a whole number from 0 to {most:g}")
    return int(f)
