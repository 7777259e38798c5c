"""Ingest files into the store: OTLP exports, metric files, client records, quality results.

Each file is all-or-nothing: it is parsed whole before anything is written, so a bad file
writes nothing and is reported (and counted in ``ingest_rejections``); the good files of the
same call are kept.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from slokit.errors import BadInput
from slokit.records import EngineSample, GpuSample, RequestFragment
from slokit.store.db import Store


@dataclass
class IngestReport:
    files: int = 0
    fragments: int = 0
    new_fragments: int = 0
    requests: int = 0
    engine_samples: int = 0
    gpu_samples: int = 0
    skipped_spans: int = 0
    rejected_spans: int = 0
    bad_files: list[tuple[str, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.bad_files


def expand_paths(paths: Iterable[str | Path], patterns: Sequence[str]) -> list[Path]:
    """Files as given, and for directories the files matching ``patterns``, sorted."""
    out: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            found = sorted({f for pat in patterns for f in p.rglob(pat) if f.is_file()})
            if not found:
                raise BadInput(f"{p}: no files matching {', '.join(patterns)}")
            out.extend(found)
        elif p.is_file():
            out.append(p)
        else:
            raise BadInput(f"{p}: no such file or directory")
    return out


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise BadInput(f"{path}: cannot read: {exc.strerror}") from None


def _each_file(
    store: Store,
    report: IngestReport,
    paths: list[Path],
    source: str,
    handle: Callable[[Path], None],
) -> IngestReport:
    for path in paths:
        try:
            handle(path)
        except BadInput as exc:
            msg = str(exc) if str(path) in str(exc) else f"{path}: {exc}"
            report.bad_files.append((str(path), msg))
            store.record_rejection(source, "bad file", 1, msg[:500])
            continue
        report.files += 1
    return report


def _store_fragments(store: Store, report: IngestReport, frags: list[RequestFragment]) -> None:
    res = store.append_fragments(frags)
    report.fragments += res.received
    report.new_fragments += res.new
    report.requests += res.requests_touched


def ingest_otlp(
    store: Store,
    paths: Iterable[str | Path],
    *,
    replica: str | None = None,
    max_bytes: int = 64 * 1024 * 1024,
) -> IngestReport:
    """OTLP ``ExportTraceServiceRequest`` files (.pb, .json, gzip or not)."""
    from slokit.sources.otlp import decode_traces, sniff_file

    report = IngestReport()
    files = expand_paths(paths, ["*.pb", "*.json", "*.pb.gz", "*.json.gz", "*.otlp"])

    def handle(path: Path) -> None:
        body, ct, enc = sniff_file(_read(path))
        decoded = decode_traces(body, ct, enc, max_bytes=max_bytes, default_replica=replica)
        if decoded.rejected:
            store.record_rejection(
                "otlp", "rejected spans", decoded.rejected, f"{path}: {decoded.rejection_reasons}"
            )
        report.skipped_spans += decoded.skipped
        report.rejected_spans += decoded.rejected
        _store_fragments(store, report, decoded.fragments)

    return _each_file(store, report, files, "otlp", handle)


def store_samples(
    store: Store, report: IngestReport, engine: Sequence[EngineSample], gpu: Sequence[GpuSample]
) -> None:
    report.engine_samples += store.append_engine_samples(engine)
    report.gpu_samples += store.append_gpu_samples(gpu)


def ingest_metrics(
    store: Store,
    paths: Iterable[str | Path],
    *,
    instance: str | None = None,
    default_ts: float | None = None,
) -> IngestReport:
    """Prometheus text / OpenMetrics files, with sample timestamps (recorded history) or without
    (a saved scrape: its samples take ``default_ts``, else the file's modification time)."""
    from slokit.sources.files import parse_metrics_file

    report = IngestReport()
    files = expand_paths(paths, ["*.prom", "*.om", "*.txt", "*.openmetrics"])

    def handle(path: Path) -> None:
        ts = default_ts if default_ts is not None else path.stat().st_mtime
        recs = parse_metrics_file(_read(path), name=str(path), instance=instance, default_ts=ts)
        if not recs.engine_samples and not recs.gpu_samples:
            raise BadInput(f"{path}: no vLLM or DCGM series found")
        store_samples(store, report, recs.engine_samples, recs.gpu_samples)

    return _each_file(store, report, files, "metrics", handle)


def ingest_requests(store: Store, paths: Iterable[str | Path]) -> IngestReport:
    """Client-side records: ``slokit load`` JSONL or ``vllm bench serve --save-detailed`` JSON."""
    from slokit.sources.files import parse_requests_file

    report = IngestReport()
    files = expand_paths(paths, ["*.jsonl", "*.json"])

    def handle(path: Path) -> None:
        _store_fragments(store, report, parse_requests_file(_read(path), name=str(path)))

    return _each_file(store, report, files, "requests", handle)


def ingest_quality(store: Store, paths: Iterable[str | Path]) -> IngestReport:
    """Quality results: ``request_id,quality_pass`` rows (CSV with header, or JSONL)."""
    from slokit.sources.files import parse_quality

    report = IngestReport()
    files = expand_paths(paths, ["*.csv", "*.jsonl"])

    def handle(path: Path) -> None:
        _store_fragments(store, report, parse_quality(_read(path), name=str(path)))

    return _each_file(store, report, files, "quality", handle)
