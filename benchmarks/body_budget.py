"""Many big export bodies at once: the sidecar's peak RSS with the body budget and without.

``--clients`` connections each POST a ``--mb`` MB OTLP/HTTP body at the same moment, against a
sidecar with the default ``otlp_body_budget_bytes`` (32 MiB) and then one whose budget is too
large to bind (what the sidecar did before it had one). Two kinds of body:

- ``plain``: random bytes (each is read whole, then answered 400);
- ``gzip``: a real export of 20 vLLM spans repeated to ``--mb`` MB and gzipped (about 130:1,
  so each client sends a few hundred KiB that inflate to ``--mb`` MB of spans: answered 200,
  or 503 when the writer's queue is full). The budget counts what each inflates to;
- ``grpc``: random bytes as OTLP/gRPC messages (INVALID_ARGUMENT), each on a channel of its
  own: gRPC reads a message only once the budget has room for it.

Reports, for each, the peak RSS of the sidecar (sampled every 50 ms from /proc), the answers by
status, how long the burst took, and whether /healthz answered after it.

    python benchmarks/body_budget.py [--clients 8] [--mb 15] [--kind plain|gzip|grpc|all]
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
from _sidecar import free_port, proc_rss_mb, wait_ready
from _synth import llm_request_export

REPO = Path(__file__).resolve().parents[1]
UNBOUND = str(1 << 50)


def _send_grpc(target: str, body: bytes) -> str:
    """One OTLP/gRPC Export of ``body`` on a channel of its own; the status's name."""
    import grpc

    from slokit.sidecar.otlp_grpc import METHOD

    with grpc.insecure_channel(target, options=[("grpc.max_send_message_length", -1)]) as ch:
        call = ch.unary_unary(METHOD, request_serializer=None, response_deserializer=None)
        try:
            call(body, timeout=300)
        except grpc.RpcError as exc:
            return str(exc.code().name)
    return "OK"


def make_body(kind: str, mb: int) -> tuple[bytes, dict[str, str]]:
    """The body every client sends, and its headers."""
    headers = {"Content-Type": "application/x-protobuf"}
    if kind in ("plain", "grpc"):
        return os.urandom(1 << 20) * mb, headers
    one = llm_request_export(20, t0=time.time() - 60)  # ~12 KB: repeats within gzip's window
    raw = one * ((mb << 20) // len(one))
    return gzip.compress(raw, 6), {**headers, "Content-Encoding": "gzip"}


def burst(clients: int, kind: str, mb: int, budget: str | None) -> dict[str, object]:
    api, otlp = free_port(), free_port()
    tmp = Path(tempfile.mkdtemp(prefix="slokit-budget-"))
    env = dict(os.environ, SLOKIT_DIAGNOSE_INTERVAL_S="0")
    if budget is not None:
        env["SLOKIT_OTLP_BODY_BUDGET_BYTES"] = budget
    http, grpc_addr = (f"127.0.0.1:{otlp}", "") if kind != "grpc" else ("", f"127.0.0.1:{otlp}")
    cmd = [sys.executable, "-m", "slokit.sidecar", "--db", str(tmp / "b.duckdb"), "--listen",
           f"127.0.0.1:{api}", "--otlp-http", http, "--otlp-grpc", grpc_addr,
           "--log-level", "WARNING"]  # fmt: skip
    log = (tmp / "sidecar.log").open("wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env)
    body, headers = make_body(kind, mb)
    try:
        wait_ready(f"http://127.0.0.1:{api}", proc, tmp / "sidecar.log")
        rss0 = proc_rss_mb(proc.pid)
        peak, stop, codes = [rss0], threading.Event(), collections.Counter[str]()

        def watch() -> None:
            while not stop.is_set():
                peak[0] = max(peak[0], proc_rss_mb(proc.pid))
                time.sleep(0.05)

        def send() -> None:
            if kind == "grpc":
                codes[_send_grpc(f"127.0.0.1:{otlp}", body)] += 1
                return
            try:
                r = httpx.post(f"http://127.0.0.1:{otlp}/v1/traces", content=body, timeout=300,
                               headers=headers)  # fmt: skip
                codes[str(r.status_code)] += 1
            except httpx.HTTPError as exc:
                codes[type(exc).__name__] += 1

        watcher = threading.Thread(target=watch)
        watcher.start()
        senders = [threading.Thread(target=send) for _ in range(clients)]
        t0 = time.perf_counter()
        for s in senders:
            s.start()
        for s in senders:
            s.join()
        took = time.perf_counter() - t0
        stop.set()
        watcher.join()
        healthz = httpx.get(f"http://127.0.0.1:{api}/healthz", timeout=30).status_code
        return {"kind": kind, "body_kib": len(body) >> 10,
                "budget": "default" if budget is None else "unbound",
                "rss_mb_before": round(rss0, 1), "rss_mb_peak": round(peak[0], 1),
                "answers": dict(codes), "burst_s": round(took, 2), "healthz_after": healthz}  # fmt: skip
    finally:
        proc.terminate()
        proc.wait(30)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument(
        "--mb", type=int, default=15, help="MB per body, inflated (under max_body_bytes)"
    )
    ap.add_argument("--kind", choices=("plain", "gzip", "grpc", "all"), default="all")
    args = ap.parse_args(argv)
    for kind in ("plain", "gzip", "grpc") if args.kind == "all" else (args.kind,):
        for budget in (None, UNBOUND):
            print(json.dumps({"clients": args.clients, "mb": args.mb,
                              **burst(args.clients, kind, args.mb, budget)}), flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
