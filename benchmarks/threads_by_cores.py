"""The sidecar's threads and memory on a big node: the same soak believing it has 2 and N CPUs.

A GPU node has 64-224 cores, and numpy's OpenBLAS, Arrow's CPU pool and DuckDB's async I/O
threads size themselves by them, not by the pod's CPU limit. This runs
``soak_sidecar.py`` (200 req/s, 1 s scrapes of two replicas) with the sidecar under a library
that answers glibc's CPU counts with ``--cores`` (``tests/sidecar/fake_cpus.py``; the threads
still run on this machine's cores), with the default ``native_threads: 1`` and with ``0`` (the
libraries' defaults), one after the other, and reports each run's threads, CPU and memory.

    python benchmarks/threads_by_cores.py [--cores 2,64] [--duration 120] [--out FILE]

Needs a C compiler (``cc``) to build the library.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "sidecar"))  # the fake-CPU library the tests use

import fake_cpus  # noqa: E402


def _soak(lib: Path, cores: int, native: int, duration: float, tmp: Path) -> dict[str, object]:
    out = tmp / f"soak-{cores}-{native}.json"
    env = {**fake_cpus.environment(lib, cores), "SLOKIT_NATIVE_THREADS": str(native)}
    cmd = [sys.executable, str(REPO / "benchmarks" / "soak_sidecar.py"), "--duration",
           str(duration), "--out", str(out)]  # fmt: skip
    for key, value in env.items():
        cmd += ["--sidecar-env", f"{key}={value}"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    doc = json.loads(out.read_text())
    return {
        "cores": cores,
        "native_threads": native,
        "threads_max": doc["threads_max"],
        "cpu_core_share": doc["cpu_core_share"],
        "rss_anon_mb_last": doc["rss_anon_mb_after_warmup"]["last"],
        "rss_mb_last": doc["rss_mb_after_warmup"]["last"],
        "lost": doc["lost"],
    }


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cores", default="2,64", help="comma-separated CPU counts to claim")
    ap.add_argument("--duration", type=float, default=120.0, help="seconds of each soak")
    ap.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="slokit-threads-") as d:
        tmp = Path(d)
        lib = fake_cpus.build(tmp)
        for cores in (int(c) for c in args.cores.split(",")):
            for native in (1, 0):
                row = _soak(lib, cores, native, args.duration, tmp)
                print(json.dumps(row), flush=True)
                rows.append(row)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
