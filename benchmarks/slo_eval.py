"""How fast is the SLO layer? ``slokit slo report`` and ``slokit gate`` work on N requests.

Builds N synthetic merged records (two classes, 5% errors, lognormal latencies), then
times: reading them from a DuckDB store (``Reader.requests``), ``evaluate`` (classify,
attainment, burn windows, percentiles with order-statistic CIs), ``compute_cost``, and a
gate run with a baseline (a seeded bootstrap per class and metric).

    .venv/bin/python benchmarks/slo_eval.py                 # 100k requests
    .venv/bin/python benchmarks/slo_eval.py --requests 1000000 --json
"""

from __future__ import annotations

import argparse
import json
import random
import time
from typing import Any

from slokit.analysis.cost import compute_cost
from slokit.analysis.gate import Baseline, evaluate_gate, gate_config
from slokit.analysis.slo import evaluate
from slokit.analysis.slo_spec import parse_spec
from slokit.records import RequestFragment
from slokit.store.db import open_store

SPEC = parse_spec({
    "slokit": "v1",
    "service": "bench",
    "classes": [
        {"name": "interactive", "match": {"slo_class": "interactive"}, "objective": 0.99,
         "good_when": {"ttft_ms": 500, "tpot_ms": 50}},
        {"name": "batch", "objective": 0.95, "good_when": {"e2e_ms": 30000}},
    ],
    "cost": {"gpu_hour_usd": 4.0},
})  # fmt: skip


def fragments(n: int, seed: int) -> list[RequestFragment]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        ttft = rng.lognormvariate(-2.0, 0.6)
        tokens = rng.randint(16, 256)
        tpot = rng.lognormvariate(-4.0, 0.3)
        out.append(RequestFragment(
            request_id=f"run{seed}-{i}", source="client", fragment_id=f"c:{seed}:{i}",
            slo_class="interactive" if i % 5 else "batch", task_id=f"t{i // 3}",
            replica=f"r{i % 4}", arrival_ts=1e9 + i * 0.01, client_ttft_s=ttft,
            client_e2e_s=ttft + tpot * (tokens - 1), tpot_s=tpot, output_tokens=tokens,
            prompt_tokens=rng.randint(50, 2000),
            status="error" if rng.random() < 0.05 else "ok",
        ))  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    timings: dict[str, Any] = {"requests": args.requests}
    with open_store(":memory:") as store:
        store.append_fragments(fragments(args.requests, 1))
        t = time.perf_counter()
        recs = store.reader().requests(None, None)
        timings["load_records_s"] = time.perf_counter() - t
    with open_store(":memory:") as store:
        store.append_fragments(fragments(args.requests, 2))
        base = store.reader().requests(None, None)
    t = time.perf_counter()
    rep = evaluate(recs, SPEC)
    timings["evaluate_s"] = time.perf_counter() - t
    t = time.perf_counter()
    compute_cost(recs, SPEC, duration_s=rep.window.duration_s)
    timings["cost_s"] = time.perf_counter() - t
    t = time.perf_counter()
    res = evaluate_gate(
        rep, SPEC, config=gate_config(SPEC), current_records=recs, baseline=Baseline(records=base)
    )
    timings["gate_with_baseline_s"] = time.perf_counter() - t
    timings["regressions_flagged"] = sum(bool(r.regressed) for r in res.regressions)
    if args.json:
        print(json.dumps(timings, indent=2))
    else:
        for k, v in timings.items():
            print(f"{k:<24} {v:.3f}" if isinstance(v, float) else f"{k:<24} {v}")


if __name__ == "__main__":
    main()
