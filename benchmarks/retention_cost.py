"""What a request costs a retained store over its life: appended (DuckDB's own checkpoints
included) and pruned.

A store opened as the sidecar opens it (``memory_limit`` 128MB, one thread, the default
``checkpoint_threshold``) is filled with ``--keep`` requests (a vLLM fragment each, random
request, span and trace ids, in batches of 512 as the writer commits them), then runs
``--rounds`` rounds of what 30 s at 200 req/s bring: 12 batches, then one
:func:`slokit.store.retention.prune_requests` back to ``--keep`` (the sidecar's
``retention_requests``). Each phase's CPU time is divided by the requests that passed through;
the checkpoints DuckDB runs when its WAL fills happen inside the appends' commits.

Three stores, each in its own process, interleaved in the same run:

- schema 7 (the indexed ids in DuckDB's default string compression) with DuckDB's vacuum on:
  the sidecar before this benchmark was written, the baseline;
- the latest schema with the vacuum on;
- the latest schema as the sidecar opens it with retention on
  (:func:`slokit.store.retention.skip_vacuum`).

The sum is what a request costs at steady state: times 200 req/s, the share of a core.
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
BASELINE = "schema 7, vacuum (baseline)"


VARIANTS: dict[str, tuple[int | None, bool]] = {  # label: (schema, vacuum)
    "schema 7, vacuum (baseline)": (7, True),
    "schema 8, vacuum": (None, True),
    "schema 8, no vacuum (sidecar)": (None, False),
}


def _measure(
    db: Path, schema: int | None, vacuum: bool, keep: int, rounds: int
) -> dict[str, float]:
    import slokit.store.db as store_db
    from slokit.store.migrations import MIGRATIONS
    from slokit.store.retention import prune_requests, skip_vacuum

    if schema is not None:
        store_db.MIGRATIONS = tuple(m for m in MIGRATIONS if m.version <= schema)  # type: ignore[attr-defined]
    clock = [T0]
    store = store_db.open_store(db, clock=lambda: clock[0])
    store.con.execute("SET memory_limit = '128MB'")
    store.con.execute("SET threads = 1")
    if not vacuum:
        skip_vacuum(store)

    n = 0
    while n < keep:
        store.append_fragments(new_vllm_fragments(BATCH, clock[0]))
        n += BATCH
        clock[0] += BATCH / 200
    store.con.execute("CHECKPOINT")
    cpu = {"append": 0.0, "prune": 0.0}
    for _ in range(rounds):
        for _ in range(12):
            frags = new_vllm_fragments(BATCH, clock[0])
            t = time.process_time()
            store.append_fragments(frags)
            cpu["append"] += time.process_time() - t
            clock[0] += BATCH / 200
        t = time.process_time()
        prune_requests(store, now=clock[0], max_requests=keep)
        cpu["prune"] += time.process_time() - t
    store.close()
    passed = rounds * 12 * BATCH
    out = {k: v / passed * 1e6 for k, v in cpu.items()}
    out["file_mb"] = db.stat().st_size / 1e6
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keep", type=int, default=150_000, help="retention_requests")
    ap.add_argument("--rounds", type=int, default=20, help="30-second rounds at 200 req/s")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        db, label = args.child
        schema, vacuum = VARIANTS[label]
        out = _measure(Path(db), schema, vacuum, args.keep, args.rounds)
        print(json.dumps(out))
        return 0
    runs: dict[str, list[dict[str, float]]] = {label: [] for label in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):  # interleaved, so drift on the machine hits both
            for v, label in enumerate(VARIANTS):
                db = Path(tmp) / f"{i}-{v}.db"
                cmd = [sys.executable, __file__, "--keep", str(args.keep), "--rounds",
                       str(args.rounds), "--child", str(db), label]  # fmt: skip
                text = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
                runs[label].append(json.loads(text.splitlines()[-1]))
    print(f"   {args.keep:,} requests kept, {args.rounds} x 30 s at 200 req/s, "
          f"medians of {args.repeats}; CPU µs per request")  # fmt: skip
    totals = {}
    for label, rs in runs.items():
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        totals[label] = med["append"] + med["prune"]
        print(f"   {label:30s}: append {med['append']:5.1f}, prune {med['prune']:5.1f}; "
              f"total {totals[label]:5.1f} (= {totals[label] * 200 / 1e4:.2f}% of a core at "
              f"200 req/s, {totals[label] / totals[BASELINE]:.2f}x); "
              f"file {med['file_mb']:.0f} MB")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
