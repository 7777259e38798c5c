"""Run files -> records for ``slokit gate``: a load JSONL, a vLLM bench result or a load tool's
per-request file (:mod:`slokit.sources.loadtools`), and a baseline (an earlier run's records
or its ``slokit slo report --json``).

Records are merged through an in-memory store, the same path as ``ingest``, so a gate
judges exactly what ``slo report`` would after loading the same file.
"""

from __future__ import annotations

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
        if not isinstance(doc["classes"], list):
            raise BadInput(f"{path}: classes must be a list (a slokit slo report --json)")
        return Baseline(report=doc)
    return Baseline(records=load_run_file(path, "records").records)
