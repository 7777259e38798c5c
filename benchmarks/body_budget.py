"""Many big export bodies at once: the sidecar's peak RSS with the body budget and without.

``--clients`` connections each POST a ``--mb`` MB OTLP/HTTP body at the same moment (random
bytes: each is read whole, then answered 400), against a sidecar with the default
``otlp_body_budget_bytes`` (64 MiB) and then one whose budget is too large to bind (what the
sidecar did before it had one). Reports, for each, the peak RSS of the sidecar (sampled every
50 ms from /proc), the answers by status, how long the burst took, and whether /healthz
answered after it.

    python benchmarks/body_budget.py [--clients 16] [--mb 60]
"""

from __future__ import annotations

import argparse
import collections
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

REPO = Path(__file__).resolve().parents[1]
UNBOUND = str(1 << 50)


def burst(clients: int, mb: int, budget: str | None) -> dict[str, object]:
    api, otlp = free_port(), free_port()
    tmp = Path(tempfile.mkdtemp(prefix="slokit-budget-"))
    env = dict(os.environ, SLOKIT_DIAGNOSE_INTERVAL_S="0")
    if budget is not None:
        env["SLOKIT_OTLP_BODY_BUDGET_BYTES"] = budget
    cmd = [sys.executable, "-m", "slokit.sidecar", "--db", str(tmp / "b.duckdb"), "--listen",
           f"127.0.0.1:{api}", "--otlp-http", f"127.0.0.1:{otlp}", "--otlp-grpc", "",
           "--log-level", "WARNING"]  # fmt: skip
    log = (tmp / "sidecar.log").open("wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env)
    body = os.urandom(1 << 20) * mb
    try:
        wait_ready(f"http://127.0.0.1:{api}", proc, tmp / "sidecar.log")
        rss0 = proc_rss_mb(proc.pid)
        peak, stop, codes = [rss0], threading.Event(), collections.Counter[str]()

        def watch() -> None:
            while not stop.is_set():
                peak[0] = max(peak[0], proc_rss_mb(proc.pid))
                time.sleep(0.05)

        def send() -> None:
            try:
                r = httpx.post(f"http://127.0.0.1:{otlp}/v1/traces", content=body, timeout=300,
                               headers={"Content-Type": "application/x-protobuf"})  # fmt: skip
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
        return {"budget": "default" if budget is None else "unbound",
                "rss_mb_before": round(rss0, 1), "rss_mb_peak": round(peak[0], 1),
                "answers": dict(codes), "burst_s": round(took, 2), "healthz_after": healthz}  # fmt: skip
    finally:
        proc.terminate()
        proc.wait(30)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--mb", type=int, default=60, help="MB per body (under max_body_bytes)")
    args = ap.parse_args(argv)
    for budget in (None, UNBOUND):
        print(json.dumps({"clients": args.clients, "mb": args.mb,
                          **burst(args.clients, args.mb, budget)}), flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
