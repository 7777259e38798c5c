"""Ingest files into the store: OTLP exports, metric files, client records, quality results.

Each file is all-or-nothing: it is parsed whole before anything is written, so a bad file
writes nothing and is reported (and counted in ``ingest_rejections``); the good files of the
same call are kept.

Memory stays bounded by the limit, not by the file: an OTLP file is decompressed in a stream
that stops at ``max_bytes`` (a gzip bomb costs at most that), and a file bigger than the limit
is refused before it is read. A metric file over :data:`METRICS_BUCKET_BYTES` is split on disk
by sample timestamp into buckets that each hold whole scrapes (every sample of one timestamp),
and the buckets are parsed one at a time, so the parser's per-sample objects exist for one
bucket at a time instead of the whole file. OTLP fragments wait in memory, as Arrow, until
:data:`OTLP_BATCH_ROWS` of them are stored in one transaction (about 40 MB at most).
"""

from __future__ import annotations

import contextlib
import math
import re
import tempfile
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from slokit.errors import BadInput
from slokit.records import EngineSample, GpuSample, RequestFragment, RouterSample
from slokit.sources.exposition import MetricFamily, parse_exposition
from slokit.sources.files import parse_metrics_file, parse_quality, parse_requests_file
from slokit.sources.otlp import PayloadTooLarge, decode_traces, decompress
from slokit.sources.router_metrics import is_router_exposition, router_samples_from_families
from slokit.store.append import AppendResult, fragments_table
from slokit.store.db import Store

#: Default limit on an OTLP file's (decompressed) size: the sidecar's body limit.
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
#: Environment variable that sets ``slokit ingest otlp --max-bytes``.
MAX_BYTES_ENV = "SLOKIT_INGEST_MAX_BYTES"
#: Metric files are parsed in buckets of about this much text.
METRICS_BUCKET_BYTES = 4 * 1024 * 1024

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


def parse_size(text: str) -> int:
    """``'200M'`` -> 209715200. Units K, M, G, T are powers of 1024 (``MiB`` and ``MB`` alike);
    a bare number is bytes. BadInput for anything else or for zero."""
    m = _SIZE.match(str(text))
    if not m:
        raise BadInput(f"not a size: {text!r} (expected bytes, or e.g. 64M, 1.5G)")
    size = float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()]
    if not size < 2**63:  # an infinity too (400 digits read as a float)
        shown = text if len(text) <= 40 else text[:40] + "..."
        raise BadInput(f"a size must be under 8 EiB, got {shown!r}")
    n = int(size)
    if n <= 0:
        raise BadInput(f"a size must be > 0, got {text!r}")
    return n


@dataclass
class IngestReport:
    files: int = 0
    fragments: int = 0
    new_fragments: int = 0
    requests: int = 0
    engine_samples: int = 0
    gpu_samples: int = 0
    router_samples: int = 0
    skipped_spans: int = 0
    rejected_spans: int = 0
    rejection_reasons: dict[str, int] = field(default_factory=dict)  # reason -> spans
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
        elif p.exists():  # a FIFO, a socket, a device: read whole files only, sized first
            raise BadInput(f"{p}: not a regular file or a directory (a pipe, socket or "
                           "device); save the data to a file and give that")  # fmt: skip
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
            _bad_file(store, report, source, path, exc)
            continue
        report.files += 1
    return report


def _bad_file(store: Store, report: IngestReport, source: str, path: Path, exc: BadInput) -> None:
    """Report ``path`` as a bad file (and count it in ``ingest_rejections``)."""
    msg = str(exc) if str(path) in str(exc) else f"{path}: {exc}"
    report.bad_files.append((str(path), msg))
    store.record_rejection(source, "bad file", 1, msg[:500])


def _count_stored(report: IngestReport, res: AppendResult) -> None:
    report.fragments += res.received
    report.new_fragments += res.new
    report.requests += res.requests_touched


def _store_fragments(store: Store, report: IngestReport, frags: list[RequestFragment]) -> None:
    _count_stored(report, store.append_fragments(frags))


def _too_big(path: Path, what: str, max_bytes: int) -> BadInput:
    return PayloadTooLarge(
        f"{path}: {what} exceeds the {max_bytes}-byte limit; raise it with --max-bytes "
        f"(or {MAX_BYTES_ENV}) if the file is genuine"
    )


def read_otlp_file(path: Path, max_bytes: int = DEFAULT_MAX_BYTES) -> tuple[bytes, str]:
    """(body, content type) of an OTLP file: gzip undone in bounded memory, JSON told from
    protobuf by its first byte. Over ``max_bytes`` (on disk or decompressed) is refused."""
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise _too_big(path, f"its size ({size} bytes)", max_bytes)
        data = path.read_bytes()
    except OSError as exc:
        raise BadInput(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:  # a gzip bomb stops at the limit: memory holds at most max_bytes
        body = decompress(data, "gzip", max_bytes) if data[:2] == b"\x1f\x8b" else data
    except PayloadTooLarge:
        raise _too_big(path, "the decompressed content", max_bytes) from None
    except BadInput as exc:
        raise BadInput(f"{path}: {exc}") from None
    del data
    start = re.compile(rb"\s*").match(body)
    first = body[start.end() : start.end() + 1] if start else b""
    ct = "application/json" if first in (b"{", b"[") else "application/x-protobuf"
    return body, ct


def ingest_otlp(
    store: Store,
    paths: Iterable[str | Path],
    *,
    replica: str | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> IngestReport:
    """OTLP ``ExportTraceServiceRequest`` files (.pb, .json, gzip or not), each at most
    ``max_bytes`` decompressed."""
    report = IngestReport()
    files = expand_paths(paths, ["*.pb", "*.json", "*.pb.gz", "*.json.gz", "*.otlp"])
    pending = _PendingFragments(store, report)

    def handle(path: Path) -> None:
        body, ct = read_otlp_file(path, max_bytes)
        decoded = decode_traces(body, ct, None, max_bytes=max_bytes, default_replica=replica)
        del body
        if decoded.rejected:
            store.record_rejection(
                "otlp", "rejected spans", decoded.rejected, f"{path}: {decoded.rejection_reasons}"
            )
        report.skipped_spans += decoded.skipped
        report.rejected_spans += decoded.rejected
        for reason, n in decoded.rejection_reasons.items():
            report.rejection_reasons[reason] = report.rejection_reasons.get(reason, 0) + n
        pending.add(path, fragments_table(decoded.fragments))

    try:
        _each_file(store, report, files, "otlp", handle)
    except BaseException:  # a bug, an interrupt: the files read before it are kept all the same
        with contextlib.suppress(Exception):
            pending.flush()
        raise
    pending.flush()
    return report


#: OTLP fragments are stored in transactions of at least this many rows (the files' fragments
#: gathered in memory, as Arrow): DuckDB writes an append of a whole row group (122,880 rows)
#: straight to the database file instead of into the WAL, which halves what a commit costs.
OTLP_BATCH_ROWS = 131_072


class _PendingFragments:
    """Fragment tables of whole files, stored together once they fill a batch."""

    def __init__(self, store: Store, report: IngestReport) -> None:
        self.store = store
        self.report = report
        self.files: list[tuple[Path, pa.Table]] = []
        self.rows = 0

    def add(self, path: Path, table: pa.Table) -> None:
        if table.num_rows:
            self.files.append((path, table))
            self.rows += table.num_rows
        if self.rows >= OTLP_BATCH_ROWS:
            self.flush()

    def flush(self) -> None:
        files, self.files, self.rows = self.files, [], 0
        if not files:
            return
        store, report = self.store, self.report
        try:
            _count_stored(
                report, store.append_fragment_table(pa.concat_tables([t for _, t in files]))
            )
        except BadInput:  # a value the store refuses: find its file, keep the others
            for path, table in files:
                try:
                    _count_stored(report, store.append_fragment_table(table))
                except BadInput as exc:
                    report.files -= 1  # counted as read when it was decoded
                    _bad_file(store, report, "otlp", path, exc)


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
    bucket_bytes: int = METRICS_BUCKET_BYTES,
) -> IngestReport:
    """Prometheus text / OpenMetrics files, with sample timestamps (recorded history) or without
    (a saved scrape: its samples take ``default_ts``, else the file's modification time).
    Files over ``bucket_bytes`` are parsed in buckets of whole timestamps (module doc)."""
    report = IngestReport()
    files = expand_paths(paths, ["*.prom", "*.om", "*.txt", "*.openmetrics"])

    def handle(path: Path) -> None:
        ts = default_ts if default_ts is not None else path.stat().st_mtime
        if path.stat().st_size <= bucket_bytes and (router := _router_samples(path, instance, ts)):
            report.router_samples += store.append_router_samples(router)
            return
        if path.stat().st_size <= bucket_bytes:
            recs = parse_metrics_file(_read(path), name=str(path), instance=instance, default_ts=ts)
            engine, gpu = recs.engine_samples, recs.gpu_samples
        else:
            engine, gpu = _metrics_in_buckets(path, instance, ts, bucket_bytes)
        if not engine and not gpu:
            raise BadInput(f"{path}: no vLLM or DCGM series found")
        store_samples(store, report, engine, gpu)

    return _each_file(store, report, files, "metrics", handle)


#: Name prefixes of the router's families (slokit.sources.router_metrics).
_ROUTER_PREFIXES = (b"llm_d_epp_", b"inference_pool_", b"inference_objective_",
                    b"inference_extension_", b"inference_model_")  # fmt: skip


def _router_samples(path: Path, instance: str | None, default_ts: float) -> list[RouterSample]:
    """A saved scrape of the gateway router (llm-d router / Inference Extension EPP),
    recognised by its families; samples with timestamps are grouped by them."""
    data = _read(path)
    if not any(p in data for p in _ROUTER_PREFIXES):  # most files: vLLM or DCGM, not parsed twice
        return []
    families = parse_exposition(data)
    if not is_router_exposition(families):
        return []
    by_ts: dict[float, list[MetricFamily]] = {}
    for fam in families:
        for sample in fam.samples:
            at = sample.timestamp if sample.timestamp is not None else default_ts
            group = by_ts.setdefault(at, [])
            if not group or group[-1].name != fam.name:
                group.append(MetricFamily(fam.name, fam.type, fam.help))
            group[-1].samples.append(sample)
    router = instance or path.stem
    return [
        s
        for at, fams in sorted(by_ts.items())
        for s in router_samples_from_families(fams, ts=at, router=router)
    ]


class _Misbucketed(Exception):
    """A sample's timestamp, as the parser read it, is not the one it was bucketed by."""


def _ts_key(line: str, om: bool, default: int | None) -> int | None:
    """floor(seconds) of a sample line's timestamp (``default`` when it has none); None
    when unreadable (the parser will say why)."""
    body = line
    if om:
        cut = body.find(" # {")  # an exemplar
        if cut != -1:
            body = body[:cut]
    end = body.rfind("}")
    rest = body[end + 1 :].split() if end != -1 else body.split()[1:]
    if len(rest) < 2:
        return default
    try:
        ts = float(rest[1])
        return math.floor(ts if om else ts / 1000.0)  # classic text: milliseconds
    except (ValueError, OverflowError):
        return None


def _bucket(key: int, k: int) -> int:
    """Bucket of a whole second: hashed, since scrape times are evenly spaced (every 15 s
    would put every sample of a file in one bucket of three)."""
    return (((key * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF) >> 32) % k


def _metrics_in_buckets(
    path: Path, instance: str | None, default_ts: float, bucket_bytes: int
) -> tuple[list[EngineSample], list[GpuSample]]:
    """Parse a big metric file one bucket of whole timestamps at a time (module doc).

    Every line that is not a sample (metadata, ``# EOF``, blank) goes to every bucket in its
    place, so each bucket is a valid file of its own; errors name the file's own line."""
    size = path.stat().st_size
    k = max(1, min(256, math.ceil(size / bucket_bytes)))
    try:
        with path.open("rb") as f:
            f.seek(max(0, size - 4096))
            tail = f.read()
    except OSError as exc:
        raise BadInput(f"{path}: cannot read: {exc.strerror or exc}") from None
    om = tail.rstrip(b"\n").rsplit(b"\n", 1)[-1].strip() == b"# EOF"
    default = math.floor(default_ts)
    with tempfile.TemporaryDirectory(prefix="slokit-ingest-") as tmp:
        outs = [open(Path(tmp) / f"{i}.txt", "w", encoding="utf-8") for i in range(k)]  # noqa: SIM115
        lines = [array("I") for _ in range(k)]  # bucket line -> the file's line
        used = [False] * k
        try:
            with path.open("rb") as f:
                for lineno, raw in enumerate(f, start=1):
                    try:
                        line = raw.decode("utf-8")
                    except UnicodeDecodeError:
                        raise BadInput(f"{path}:{lineno}: invalid UTF-8") from None
                    stripped = line.strip()
                    if stripped and not stripped.startswith("#"):
                        key = _ts_key(stripped, om, default)
                        b = 0 if key is None else _bucket(key, k)
                        outs[b].write(line)
                        lines[b].append(lineno)
                        used[b] = True
                    else:
                        for b in range(k):
                            outs[b].write(line)
                            lines[b].append(lineno)
        except OSError as exc:
            raise BadInput(f"{path}: cannot read: {exc.strerror or exc}") from None
        finally:
            for o in outs:
                o.close()
        engine: list[EngineSample] = []
        gpu: list[GpuSample] = []
        try:
            for b in range(k):
                if not used[b]:
                    continue
                data = (Path(tmp) / f"{b}.txt").read_bytes()
                try:
                    recs = parse_metrics_file(
                        data, name=str(path), instance=instance, default_ts=default_ts
                    )
                except BadInput as exc:
                    raise _relined(exc, lines[b]) from None
                del data
                stamps = [r.ts for r in recs.engine_samples] + [r.ts for r in recs.gpu_samples]
                if any(_bucket(math.floor(ts), k) != b for ts in stamps):
                    raise _Misbucketed
                engine.extend(recs.engine_samples)
                gpu.extend(recs.gpu_samples)
        except _Misbucketed:  # this file's lines defeat the split: parse it whole
            recs = parse_metrics_file(
                _read(path), name=str(path), instance=instance, default_ts=default_ts
            )
            return recs.engine_samples, recs.gpu_samples
    return engine, gpu


def _relined(exc: BadInput, lines: array[int]) -> BadInput:
    """``exc`` with its ``line N`` (of a bucket) as the file's own line number."""

    def fix(m: re.Match[str]) -> str:
        n = int(m.group(1))
        return f"line {lines[n - 1]}" if 0 < n <= len(lines) else m.group(0)

    return BadInput(re.sub(r"\bline (\d+)", fix, str(exc), count=1))


def ingest_requests(store: Store, paths: Iterable[str | Path]) -> IngestReport:
    """Client-side records: ``slokit load`` JSONL or ``vllm bench serve --save-detailed`` JSON."""
    report = IngestReport()
    files = expand_paths(paths, ["*.jsonl", "*.json"])

    def handle(path: Path) -> None:
        _store_fragments(store, report, parse_requests_file(_read(path), name=str(path)))

    return _each_file(store, report, files, "requests", handle)


def ingest_quality(store: Store, paths: Iterable[str | Path]) -> IngestReport:
    """Quality results: ``request_id,quality_pass`` rows (CSV with header, or JSONL)."""
    report = IngestReport()
    files = expand_paths(paths, ["*.csv", "*.jsonl"])

    def handle(path: Path) -> None:
        _store_fragments(store, report, parse_quality(_read(path), name=str(path)))

    return _each_file(store, report, files, "quality", handle)
