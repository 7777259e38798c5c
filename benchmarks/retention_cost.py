"""What a request costs a retained store over its life: appended, checkpointed, pruned.

A store opened as the sidecar opens it (``memory_limit`` 128MB, one thread) is filled with
``--keep`` requests (a vLLM fragment each, random request, span and trace ids, in batches of
512 as the writer commits them), then runs ``--rounds`` rounds of what 30 s at 200 req/s bring:
12 batches, one :func:`slokit.store.retention.prune_requests` back to ``--keep`` (the sidecar's
``retention_requests``), and every third round a checkpoint. Each phase's CPU time is divided by
the requests that passed through.

Two stores, each in its own process, side by side in the same run: the schema before
migration 8 (the indexed ids in DuckDB's default string compression) as the baseline, and the
latest. The sum is what a request costs at steady state: times 200 req/s, the share of a core.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _synth import new_vllm_fragments

T0 = 1_795_958_000.0
BATCH = 512


def _measure(db: Path, schema: int | None, keep: int, rounds: int) -> dict[str, float]:
    import slokit.store.db as store_db
    from slokit.store.migrations import MIGRATIONS
    from slokit.store.retention import prune_requests

    if schema is not None:
        store_db.MIGRATIONS = tuple(m for m in MIGRATIONS if m.version <= schema)  # type: ignore[attr-defined]
    clock = [T0]
    store = store_db.open_store(db, clock=lambda: clock[0])
    store.con.execute("SET memory_limit = '128MB'")
    store.con.execute("SET threads = 1")

    n = 0
    while n < keep:
        store.append_fragments(new_vllm_fragments(BATCH, clock[0]))
        n += BATCH
        clock[0] += BATCH / 200
    store.con.execute("CHECKPOINT")
    cpu = {"append": 0.0, "prune": 0.0, "checkpoint": 0.0}
    for r in range(rounds):
        for _ in range(12):
            frags = new_vllm_fragments(BATCH, clock[0])
            t = time.process_time()
            store.append_fragments(frags)
            cpu["append"] += time.process_time() - t
            clock[0] += BATCH / 200
        t = time.process_time()
        prune_requests(store, now=clock[0], max_requests=keep)
        cpu["prune"] += time.process_time() - t
        if r % 3 == 2:
            t = time.process_time()
            store.con.execute("CHECKPOINT")
            cpu["checkpoint"] += time.process_time() - t
    store.close()
    passed = rounds * 12 * BATCH
    return {k: v / passed * 1e6 for k, v in cpu.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keep", type=int, default=150_000, help="retention_requests")
    ap.add_argument("--rounds", type=int, default=12, help="30-second rounds at 200 req/s")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        db, schema = args.child
        out = _measure(Path(db), int(schema) if schema else None, args.keep, args.rounds)
        print(json.dumps(out))
        return 0
    runs: dict[str, list[dict[str, float]]] = {"schema 7 (baseline)": [], "latest": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):  # interleaved, so drift on the machine hits both
            for label, schema in (("schema 7 (baseline)", "7"), ("latest", "")):
                db = Path(tmp) / f"{i}-{schema or 'latest'}.db"
                cmd = [sys.executable, __file__, "--keep", str(args.keep), "--rounds",
                       str(args.rounds), "--child", str(db), schema]  # fmt: skip
                text = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
                runs[label].append(json.loads(text.splitlines()[-1]))
    print(f"   {args.keep:,} requests kept, {args.rounds} x 30 s at 200 req/s, "
          f"medians of {args.repeats}; CPU µs per request")  # fmt: skip
    totals = {}
    for label, rs in runs.items():
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        totals[label] = sum(med.values())
        parts = ", ".join(f"{k} {v:5.1f}" for k, v in med.items())
        print(f"   {label:20s}: {parts}; total {totals[label]:5.1f} "
              f"(= {totals[label] * 200 / 1e4:.2f}% of a core at 200 req/s)")  # fmt: skip
    base = totals["schema 7 (baseline)"]
    print(f"   latest / baseline: {totals['latest'] / base:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
