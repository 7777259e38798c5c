"""An API flood beside ingest: what many readers of the sidecar's API do to export acks.

A sidecar (a subprocess, as deployed) is filled with ``--fill`` requests, then takes two
streams of exports for ``--duration`` seconds: 10 exports/s of 20 spans (a gateway and clients
exporting per request: small bodies, decoded on the event loop) and one export/s of 512 spans
(vLLM's batch span processor: bodies of ~300 KB, decoded in a worker thread). It does so twice:
alone, then while ``--readers`` clients loop ``GET /api/diagnose`` (each of which reads the
store and runs the rules). Reported for each phase: the acks' p50 and p99 for both streams, the
diagnoses answered, and the sidecar's CPU. ``--compare KEY=VALUE`` runs the same against a
second sidecar started with that environment (e.g. ``SLOKIT_API_THREADS=0``: API reads on the
event loop's default executor, shared with ingest, as before 2026-12-07), in the same run.

    python benchmarks/api_flood.py [--fill 20000] [--duration 30] [--readers 12]
        [--compare SLOKIT_API_THREADS=0]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
from _sidecar import free_port, proc_cpu_s, wait_drained, wait_ready
from _synth import llm_request_export

REPO = Path(__file__).resolve().parents[1]
PROTOBUF = {"Content-Type": "application/x-protobuf"}


def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    return (
        round(statistics.quantiles(xs, n=100, method="inclusive")[q - 1] * 1000, 1)
        if len(xs) > 1
        else round(xs[0] * 1000, 1)
    )


class Stream:
    """Exports of ``spans`` spans every ``every_s`` seconds; the ack latency of each."""

    def __init__(self, url: str, spans: int, every_s: float, seed: int) -> None:
        self.url, self.spans, self.every_s, self.seed = url, spans, every_s, seed
        self.latencies: list[float] = []
        self.failures = 0
        self.index = seed * 1_000_000_000

    def run(self, stop: threading.Event) -> None:
        next_at = time.monotonic()
        with httpx.Client(timeout=60) as client:
            while not stop.wait(max(0.0, next_at - time.monotonic())):
                next_at += self.every_s
                body = llm_request_export(self.spans, start_index=self.index, seed=self.seed,
                                          replica=f"stream-{self.seed}", t0=time.time() - 1,
                                          random_ids=True)  # fmt: skip
                self.index += self.spans
                t = time.perf_counter()
                try:
                    ok = client.post(self.url, content=body, headers=PROTOBUF).status_code == 200
                except httpx.HTTPError:
                    ok = False
                if ok:
                    self.latencies.append(time.perf_counter() - t)
                else:
                    self.failures += 1


def _reader(api: str, stop: threading.Event, done: list[int], failed: list[int]) -> None:
    with httpx.Client(timeout=120) as client:
        while not stop.is_set():
            try:
                ok = client.get(f"{api}/api/diagnose").status_code == 200
            except httpx.HTTPError:
                ok = False
            (done if ok else failed).append(1)


def phase(
    otlp: str, api: str, pid: int, seconds: float, readers: int, seed: int
) -> dict[str, object]:
    stop = threading.Event()
    small, big = Stream(otlp, 20, 0.1, seed), Stream(otlp, 512, 1.0, seed + 1)
    done: list[int] = []
    failed: list[int] = []
    threads = [threading.Thread(target=s.run, args=(stop,)) for s in (small, big)]
    threads += [threading.Thread(target=_reader, args=(api, stop, done, failed))
                for _ in range(readers)]  # fmt: skip
    cpu0, t0 = proc_cpu_s(pid), time.perf_counter()
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    cpu = (proc_cpu_s(pid) - cpu0) / (time.perf_counter() - t0)
    return {
        "readers": readers,
        "ack_ms_exports_of_20": {"p50": _pct(small.latencies, 50), "p99": _pct(small.latencies, 99),
                                 "n": len(small.latencies), "failed": small.failures},
        "ack_ms_exports_of_512": {"p50": _pct(big.latencies, 50), "p99": _pct(big.latencies, 99),
                                  "n": len(big.latencies), "failed": big.failures},
        "diagnoses": len(done), "diagnose_failures": len(failed),
        "cpu_core_share": round(cpu, 3),
    }  # fmt: skip


def run(env_extra: dict[str, str], fill: int, seconds: float, readers: int) -> dict[str, object]:
    api_port, otlp_port = free_port(), free_port()
    tmp = Path(tempfile.mkdtemp(prefix="slokit-apiflood-"))
    env = dict(os.environ, **env_extra)
    cmd = [sys.executable, "-m", "slokit.sidecar", "--db", str(tmp / "f.duckdb"), "--listen",
           f"127.0.0.1:{api_port}", "--otlp-http", f"127.0.0.1:{otlp_port}", "--otlp-grpc", "",
           "--log-level", "WARNING"]  # fmt: skip
    log = (tmp / "sidecar.log").open("wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env)
    api, otlp = f"http://127.0.0.1:{api_port}", f"http://127.0.0.1:{otlp_port}/v1/traces"
    try:
        wait_ready(api, proc, tmp / "sidecar.log")
        now = time.time()
        with httpx.Client(timeout=120) as client:
            for start in range(0, fill, 500):  # arrived over the last 10 minutes
                body = llm_request_export(500, start_index=start, seed=7, replica="fill",
                                          t0=now - 600 + 600 * start / fill, random_ids=True)  # fmt: skip
                client.post(otlp, content=body, headers=PROTOBUF).raise_for_status()
        wait_drained(api)
        quiet = phase(otlp, api, proc.pid, seconds, 0, 11)
        flood = phase(otlp, api, proc.pid, seconds, readers, 21)
        return {"env": env_extra, "fill": fill, "alone": quiet, "flood": flood}
    finally:
        proc.terminate()
        proc.wait(30)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fill", type=int, default=20_000)
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--readers", type=int, default=12)
    ap.add_argument("--compare", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args(argv)
    envs: list[dict[str, str]] = [{}]
    if args.compare:
        envs.append(dict(kv.split("=", 1) for kv in args.compare))
    for env in envs:
        print(json.dumps(run(env, args.fill, args.duration, args.readers)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
