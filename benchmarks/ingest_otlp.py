"""``slokit ingest otlp`` on vLLM ``llm_request`` span exports, spans/s on one core.

Files: ``--files`` ExportTraceServiceRequest bodies of ``--spans`` spans each (wire-exact, see
``_synth``; by default 40 x 5,000). Figures, medians of ``--repeats`` runs, all measured in the
same run and pinned to the same core:

- decode-only baseline: read each file, ``ParseFromString`` and build every span's attribute
  dict (key -> Python value): the least any ingest of these files has to do;
- whole process: ``python -m slokit ingest otlp DIR --db FILE`` in a fresh process (interpreter
  start, imports, decode, the DuckDB file, its checkpoint at exit), from spawn to exit;
- and its two halves, in a child process: slokit's decoder alone (``decode_traces``), and the
  store alone (``append_fragments`` of the decoded fragments, one commit per file as the CLI
  does, and the checkpoint at close).

``--compare DIR`` also runs all of it with the code of another checkout (e.g. a ``git worktree``
of main), interleaved with this one's runs.

Goal (issue "ingest near the decoder's speed"): >= 50,000 spans/s whole process, within 2x of
the decode-only baseline.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _synth import llm_request_export
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

REPO = Path(__file__).resolve().parents[1]


def _core() -> int:
    return sorted(os.sched_getaffinity(0))[0] if hasattr(os, "sched_getaffinity") else 0


def _pin(core: int) -> None:
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {core})


def write_files(folder: Path, files: int, spans: int) -> list[Path]:
    paths = []
    for i in range(files):
        p = folder / f"export-{i:03d}.pb"
        p.write_bytes(llm_request_export(spans, start_index=i * spans))
        paths.append(p)
    return paths


def _value(v: object) -> object:
    which = v.WhichOneof("value")  # type: ignore[attr-defined]
    return getattr(v, which) if which else None


def decode_only(paths: list[Path]) -> int:
    """The baseline: protobuf decoding and one attribute dict per span."""
    n = 0
    for p in paths:
        msg = ExportTraceServiceRequest()
        msg.ParseFromString(p.read_bytes())
        for rs in msg.resource_spans:
            for ss in rs.scope_spans:
                for span in ss.spans:
                    attrs = {kv.key: _value(kv.value) for kv in span.attributes}
                    n += len(attrs) > 0
    return n


def whole_process(folder: Path, db: Path, core: int, code: Path) -> float:
    """Seconds from spawn to exit of ``slokit ingest otlp`` on a fresh file."""
    for f in (db, db.with_name(db.name + ".wal")):
        f.unlink(missing_ok=True)
    env = dict(os.environ, PYTHONPATH=str(code))
    cmd = [sys.executable, "-m", "slokit", "ingest", "otlp", str(folder), "--db", str(db)]
    t = time.perf_counter()
    subprocess.run(
        cmd, check=True, env=env, cwd=code, stdout=subprocess.DEVNULL, preexec_fn=lambda: _pin(core)
    )
    return time.perf_counter() - t


def halves(folder: Path, db: Path, core: int, code: Path) -> tuple[float, float]:
    """Seconds in slokit's decoder and in its store, measured in a child process."""
    env = dict(os.environ, PYTHONPATH=str(code))
    cmd = [sys.executable, __file__, "--halves-of", str(folder), str(db)]
    out = subprocess.run(
        cmd, check=True, env=env, cwd=code, capture_output=True, text=True,
        preexec_fn=lambda: _pin(core),
    ).stdout.split()  # fmt: skip
    return float(out[-2]), float(out[-1])


def decoder_and_store(paths: list[Path], db: Path) -> tuple[float, float]:
    """Seconds in slokit's decoder and in the store's append path, one commit per file."""
    from slokit.sources.otlp import decode_traces
    from slokit.store.db import open_store

    t = time.perf_counter()
    decoded = [decode_traces(p.read_bytes()).fragments for p in paths]
    t_decode = time.perf_counter() - t
    for f in (db, db.with_name(db.name + ".wal")):
        f.unlink(missing_ok=True)
    store = open_store(db)
    t = time.perf_counter()
    for frags in decoded:
        store.append_fragments(frags)
    store.close()
    return t_decode, time.perf_counter() - t


def main(argv: list[str] | None = None) -> dict[str, float]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=40)
    ap.add_argument("--spans", type=int, default=5000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--compare", type=Path, help="another checkout to measure beside this one")
    ap.add_argument("--halves-of", nargs=2, type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.halves_of is not None:  # the child of halves()
        folder, db = args.halves_of
        print(*decoder_and_store(sorted(folder.glob("*.pb")), db))
        return {}
    core = _core()
    _pin(core)
    total = args.files * args.spans
    runs: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "otlp"
        folder.mkdir()
        paths = write_files(folder, args.files, args.spans)
        codes = {"": REPO}
        if args.compare is not None:
            codes[", --compare"] = args.compare.resolve()
        for _ in range(args.repeats):
            t = time.perf_counter()
            assert decode_only(paths) == total
            runs.setdefault("decode-only baseline", []).append(time.perf_counter() - t)
            for tag, code in codes.items():
                secs = whole_process(folder, Path(tmp) / "whole.duckdb", core, code)
                runs.setdefault(f"whole process{tag}", []).append(secs)
                t_decode, t_store = halves(folder, Path(tmp) / "store.duckdb", core, code)
                runs.setdefault(f"  decoder alone{tag}", []).append(t_decode)
                runs.setdefault(f"  store alone{tag}", []).append(t_store)
    rates = {k: total / statistics.median(v) for k, v in runs.items()}
    base = rates["decode-only baseline"]
    print(f"   {args.files} files x {args.spans:,} spans, one core, medians of {args.repeats}")
    for label, rate in rates.items():
        print(f"   {label:26s}: {rate:10,.0f} spans/s  ({base / rate:5.2f}x the baseline's time)")
    whole = rates["whole process"]
    print(f"   goal: whole process >= 50,000 spans/s and <= 2x the baseline's time: "
          f"{'met' if whole >= 50_000 and base / whole <= 2 else 'not met'}")  # fmt: skip
    return rates


if __name__ == "__main__":
    main()
