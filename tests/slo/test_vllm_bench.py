"""A vLLM bench result judged by slokit agrees with vLLM's own goodput definition:
a request is good if every given metric is <= its target, TPOT = (latency - ttft) /
(output_len - 1), taken as 0 for a single output token; goodput = good / duration."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import pytest

from slokit.analysis.slo import evaluate
from slokit.analysis.slo_spec import parse_spec
from slokit.sources.runs import load_run_file

# vllm bench serve --goodput ttft:125 tpot:62.5 e2el:1000
GOODPUT = {"ttft": 125.0, "tpot": 62.5, "e2el": 1000.0}
BENCH = {
    "duration": 4.0,
    "completed": 5,
    "ttfts": [0.0625, 0.1, 0.0, 0.25, 0.0625, 0.0625],
    "latencies": [0.25, 0.5, 0.0, 0.5, 0.5, 1.5],
    "input_lens": [10, 10, 10, 10, 10, 10],
    "output_lens": [4, 1, 0, 8, 4, 100],
    "itls": [[0.0625] * 3, [], [], [0.03] * 7, [0.1458] * 3, [0.0145] * 99],
    "errors": ["", "", "boom", "", "", ""],
}
# By hand: r0 is good at equality (TPOT 0.1875/3 = 62.5 ms), r1 has one token (TPOT 0),
# r2 failed, r3 TTFT 250 ms, r4 TPOT 145.8 ms, r5 E2E 1.5 s -> 2 good, 0.5 good req/s.
SPEC = parse_spec(
    {
        "slokit": "v1",
        "service": "bench",
        "classes": [
            {
                "name": "all",
                "objective": 0.3,
                "good_when": {"ttft_ms": 125, "tpot_ms": 62.5, "e2e_ms": 1000},
            }
        ],
    }
)


@pytest.fixture
def bench_file(tmp_path: Path) -> Path:
    p = tmp_path / "bench.json"
    p.write_text(json.dumps(BENCH))
    return p


def test_good_requests_match_the_hand_computed_vllm_definition(bench_file: Path) -> None:
    run = load_run_file(str(bench_file), "vllm-bench")
    rep = evaluate(run.records, SPEC, duration_s=run.duration_s)
    g = rep.class_report("all")
    assert g.good == 2
    assert g.outcomes == {"good": 2, "slow": 3, "error": 1, "quality_fail": 0}


def test_observed_goodput_is_vllms_request_goodput(bench_file: Path) -> None:
    run = load_run_file(str(bench_file), "vllm-bench")
    assert run.duration_s == 4.0
    rep = evaluate(run.records, SPEC, duration_s=run.duration_s)
    assert rep.class_report("all").good_rps == pytest.approx(2 / 4.0)


@pytest.mark.vllm
def test_vllms_calculate_metrics_gives_the_same_goodput(bench_file: Path) -> None:
    from slokit.lab.vllm_server import vllm_available, vllm_python

    if not vllm_available():
        pytest.skip("real vLLM not installed (scripts/vllm-env.sh)")
    script = textwrap.dedent(f"""
        import json
        from vllm.benchmarks.serve import calculate_metrics
        from vllm.benchmarks.lib.endpoint_request_func import RequestFuncOutput
        d = json.load(open({str(bench_file)!r}))
        outs = [RequestFuncOutput(success=not e, latency=lat, ttft=t, output_tokens=o,
                                  prompt_len=i, itl=itl, error=e)
                for t, lat, o, i, itl, e in zip(d["ttfts"], d["latencies"], d["output_lens"],
                                                d["input_lens"], d["itls"], d["errors"])]
        m, _ = calculate_metrics([], outs, d["duration"], None, [99.0], {GOODPUT!r})
        print(json.dumps({{"request_goodput": m.request_goodput}}))
    """)
    proc = subprocess.run(
        [str(vllm_python()), "-c", script], capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    vllm_goodput = json.loads(proc.stdout.strip().splitlines()[-1])["request_goodput"]
    run = load_run_file(str(bench_file), "vllm-bench")
    ours = evaluate(run.records, SPEC, duration_s=run.duration_s).class_report("all").good_rps
    assert ours == pytest.approx(vllm_goodput)
