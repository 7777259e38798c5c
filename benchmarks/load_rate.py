"""Does ``slokit load`` keep its open-loop schedule? (issue 3: within 2% at 200 req/s)

Runs the load generator open-loop (Poisson by default) against a fast vLLM-format SSE
server on 127.0.0.1 and reports the achieved rate against the target, how late sends were
(``send_ts - scheduled_ts``) and how much client-side TTFT exceeds the server's fixed delay
(the client's own overhead). The server runs in a thread of this process by default, or in
a child process with ``--server process`` so that it does not share the client's GIL.

    .venv/bin/python benchmarks/load_rate.py                    # 200 req/s for 20 s
    .venv/bin/python benchmarks/load_rate.py --rate 400 --server process --json
    .venv/bin/python benchmarks/load_rate.py --sim              # against `slokit sim`

With ``--sim`` the target is a ``slokit sim`` replica in a child process that sends its
``llm_request`` spans to an OTLP/HTTP receiver here; the report then adds how much the
client-side TTFT exceeds the server span's TTFT for the same request (joined on the
request id).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import resource
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slokit.ids import normalize_request_id
from slokit.lab.load import LoadConfig, LoadResult, percentile, run_load
from slokit.lab.otlp_capture import OtlpHttpCapture, attributes_dict
from slokit.lab.workload import parse_workload_yaml

# One vLLM 0.32 completion chunk (shape copied from the real capture) and the usage chunk.
_CHUNK = (
    'data: {{"id":"cmpl-{rid}","object":"text_completion","created":1795959447,"model":"tiny",'
    '"choices":[{{"index":0,"text":" {i}","logprobs":null,"finish_reason":{fin},'
    '"stop_reason":null,"prompt_token_ids":null,"token_ids":null}}]}}\n\n'
)
_USAGE = (
    'data: {{"id":"cmpl-{rid}","object":"text_completion","created":1795959447,"model":"tiny",'
    '"choices":[],"usage":{{"prompt_tokens":{p},"total_tokens":{t},"completion_tokens":{n}}},'
    '"system_fingerprint":"vllm-0.32.0"}}\n\ndata: [DONE]\n\n'
)


def _app(ttft_s: float, itl_s: float) -> web.Application:
    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "tiny", "object": "model"}]})

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        rid = request.headers.get("X-Request-Id", "x")
        n = int(body["max_tokens"])
        resp = web.StreamResponse(headers={"content-type": "text/event-stream; charset=utf-8"})
        await resp.prepare(request)
        await asyncio.sleep(ttft_s)
        for i in range(n):
            if i:
                await asyncio.sleep(itl_s)
            fin = '"length"' if i == n - 1 else "null"
            await resp.write(_CHUNK.format(rid=rid, i=i, fin=fin).encode())
        p = len(body["prompt"].split())
        await resp.write(_USAGE.format(rid=rid, p=p, t=p + n, n=n).encode())
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", completions)
    return app


def _serve(sock: socket.socket, ttft_s: float, itl_s: float) -> None:
    web.run_app(_app(ttft_s, itl_s), sock=sock, print=None, handle_signals=False)


def _start_server(mode: str, ttft_s: float, itl_s: float) -> tuple[str, Any]:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    if mode == "process":
        proc = multiprocessing.get_context("fork").Process(
            target=_serve, args=(sock, ttft_s, itl_s), daemon=True
        )
        proc.start()
        return url, proc

    def run() -> None:
        asyncio.set_event_loop(asyncio.new_event_loop())
        _serve(sock, ttft_s, itl_s)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return url, thread


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(1000 * seconds, 3)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start_sim(capture: OtlpHttpCapture) -> tuple[str, subprocess.Popen[bytes]]:
    port = _free_port()
    code = "from slokit.cli import main; main()"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            code,
            "sim",
            "--replicas",
            "1",
            "--port",
            str(port),
            "--otlp-endpoint",
            capture.endpoint,
            "--otlp-protocol",
            "http/protobuf",
            "--served-model-name",
            "tiny",
        ],
        stdout=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return url, proc
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("slokit sim did not start listening within 60 s")


def _ttft_vs_spans(result: LoadResult, capture: OtlpHttpCapture) -> dict[str, Any]:
    n = sum(1 for r in result.records if r["status"] == "ok")
    spans = capture.wait_for(
        lambda sp: sum(1 for _, s in sp if s.name == "llm_request") >= n, timeout_s=30
    )
    server: dict[str, float] = {}
    for _, span in spans:
        attrs = attributes_dict(span.attributes)
        if span.name == "llm_request" and "gen_ai.latency.time_to_first_token" in attrs:
            rid = normalize_request_id(str(attrs["gen_ai.request.id"]), from_span=True)
            server[rid] = float(attrs["gen_ai.latency.time_to_first_token"])
    diffs = [
        r["ttft_s"] - server[r["request_id"]]
        for r in result.records
        if r["ttft_s"] is not None and r["request_id"] in server
    ]
    return {
        "joined_spans": len(diffs),
        "client_minus_server_ttft_p50_ms": round(1000 * (percentile(diffs, 50) or 0), 3),
        "client_minus_server_ttft_p99_ms": round(1000 * (percentile(diffs, 99) or 0), 3),
        "client_minus_server_ttft_min_ms": round(1000 * min(diffs, default=0), 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=200.0)
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--arrival", choices=["poisson", "constant"], default="poisson")
    ap.add_argument("--tokens", type=int, default=16, help="output tokens per request")
    ap.add_argument("--ttft-ms", type=float, default=20.0, help="server delay to first token")
    ap.add_argument("--itl-ms", type=float, default=5.0, help="server delay between tokens")
    ap.add_argument("--server", choices=["thread", "process"], default="thread")
    ap.add_argument("--url", help="use this OpenAI-compatible server instead")
    ap.add_argument("--sim", action="store_true", help="start `slokit sim` and join its spans")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    capture: OtlpHttpCapture | None = None
    handle: Any
    if args.sim:
        capture = OtlpHttpCapture().start()
        url, handle = _start_sim(capture)
    elif args.url:
        url, handle = args.url, None
    else:
        url, handle = _start_server(args.server, args.ttft_ms / 1000, args.itl_ms / 1000)
    time.sleep(0.5)
    workload = parse_workload_yaml(
        f"classes:\n  - {{name: bench, input: 64, output: {args.tokens}}}\n"
    )
    cfg = LoadConfig(
        url=url,
        duration_s=args.duration,
        rate=args.rate,
        arrival=args.arrival,
        workload=workload,
        model=None if args.url else "tiny",
        run_id="bench",
        timeout_s=30.0,
    )
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    result = asyncio.run(run_load(cfg))
    wall = time.perf_counter() - t0
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    s = result.summary
    lags = [r["send_ts"] - r["scheduled_ts"] for r in result.records]
    # Against the built-in server, whose TTFT is exactly --ttft-ms: the client's own overhead.
    own_server = not (args.sim or args.url)
    overhead = [
        r["ttft_s"] - args.ttft_ms / 1000 for r in result.records if own_server and r["ttft_s"]
    ]
    report = {
        "target_rate": args.rate,
        "duration_s": args.duration,
        "arrival": args.arrival,
        "server": "sim" if args.sim else "external" if args.url else args.server,
        "scheduled": s.scheduled,
        "sent": s.sent,
        "ok": s.ok,
        "failed": s.errors + s.timeouts + s.cancelled,
        "achieved_rate": round(s.achieved_rate or 0.0, 3),
        "rate_error_pct": round(100 * ((s.achieved_rate or 0.0) / args.rate - 1), 3),
        "send_lag_p50_ms": round(1000 * (percentile(lags, 50) or 0), 3),
        "send_lag_p99_ms": round(1000 * (percentile(lags, 99) or 0), 3),
        "send_lag_max_ms": round(1000 * max(lags, default=0), 3),
        "client_ttft_overhead_p50_ms": _ms(percentile(overhead, 50)),
        "client_ttft_overhead_p99_ms": _ms(percentile(overhead, 99)),
        "wall_s": round(wall, 2),
        "process_cpu_s": round(cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime, 2),
        "cpus": os.cpu_count(),
    }
    if capture is not None:
        report.update(_ttft_vs_spans(result, capture))
        capture.stop()
    if isinstance(handle, multiprocessing.process.BaseProcess | subprocess.Popen):
        handle.terminate()
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for k, v in report.items():
            print(f"{k:34} {v}")
        ok = abs(report["rate_error_pct"]) <= 2.0
        print(f"{'within 2% of target':34} {'yes' if ok else 'NO'}")


if __name__ == "__main__":
    main()
