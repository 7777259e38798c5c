"""DuckDB's memory for the request tables' indexes, with and without retention, under the
sidecar's ``db_memory_limit``.

A store opened as the sidecar opens it (``memory_limit``, one thread) takes batches of
``--batch`` new requests (a vLLM fragment each, random ids as request, span and trace ids
are), as the writer commits them, with a checkpoint every 50 batches. Two runs, each in its own
process, side by side in the same run:

- keeping every request: it goes until a commit fails (DuckDB's indexes have filled the
  limit) or ``--total`` requests are in;
- with :func:`slokit.store.retention.prune_requests` keeping ``--keep`` (every 10 batches,
  the sidecar's every 30 s at 200 req/s is about 6,000 requests).

Each prints the requests stored when it ended, and DuckDB's own accounting
(``duckdb_memory()``'s ART_INDEX) every 10 batches.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from _synth import new_vllm_fragments

T0 = 1_795_958_000.0


def _fill(db: Path, limit: str, total: int, batch: int, keep: int | None) -> dict[str, object]:
    from slokit.store.db import open_store
    from slokit.store.retention import prune_requests

    clock = [T0]
    store = open_store(db, clock=lambda: clock[0])
    store.con.execute(f"SET memory_limit = '{limit}'")
    store.con.execute("SET threads = 1")
    n, index_mb, error = 0, [], None
    while n < total:
        frags = new_vllm_fragments(batch, clock[0])
        try:
            store.append_fragments(frags)
            n += batch
            clock[0] += batch / 200  # 200 req/s
            if keep is not None and (n // batch) % 10 == 0:
                prune_requests(store, now=clock[0], max_requests=keep)
            if (n // batch) % 10 == 0:
                mem = dict(store.con.execute(
                    "SELECT tag, memory_usage_bytes / 1e6 FROM duckdb_memory() "
                    "WHERE tag = 'ART_INDEX'"
                ).fetchall())  # fmt: skip
                index_mb.append([n, round(mem.get("ART_INDEX", 0.0), 1)])
            if (n // batch) % 50 == 0:
                store.con.execute("CHECKPOINT")
        except Exception as exc:  # what failed is the figure
            error = str(exc).splitlines()[0][:200]
            break
    try:
        row = store.con.execute("SELECT count(*) FROM requests").fetchone()
        stored = row[0] if row else None
    except Exception:  # an invalidated database answers nothing more
        stored = None
    return {"passed_through": n, "stored": stored, "art_index_mb_at": index_mb, "failed": error}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", default="128MB", help="DuckDB memory_limit (the sidecar's default)")
    ap.add_argument("--total", type=int, default=700_000)
    ap.add_argument("--keep", type=int, default=150_000, help="retention_requests")
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        db, keep = args.child
        out = _fill(Path(db), args.limit, args.total, args.batch, int(keep) if keep else None)
        print(json.dumps(out))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        for label, keep in (("every request kept", ""), (f"{args.keep:,} kept", str(args.keep))):
            cmd = [sys.executable, __file__, "--limit", args.limit, "--total", str(args.total),
                   "--batch", str(args.batch), "--child", str(Path(tmp) / f"{bool(keep)}.db"),
                   keep]  # fmt: skip
            res = json.loads(subprocess.run(cmd, check=True, capture_output=True,
                                            text=True).stdout.splitlines()[-1])  # fmt: skip
            index = res["art_index_mb_at"]
            print(f"   {label:22s}: {res['passed_through']:>9,} requests through, "
                  f"{res['stored'] if res['stored'] is None else format(res['stored'], ',')} stored; ART index MB at "
                  f"{', '.join(f'{n // 1000}k: {mb}' for n, mb in index[:: max(1, len(index) // 6)])}"
                  + (f"; FAILED: {res['failed']}" if res["failed"] else ""))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
