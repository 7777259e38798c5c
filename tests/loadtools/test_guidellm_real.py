"""Real GuideLLM (0.8.1) against ``slokit sim``: its JSON report imports request by request,
each of GuideLLM's request groups with its status, and the figures GuideLLM reports equal the
ones slokit computes from the same records (the importer, ``slokit gate --records`` and
``slokit ingest requests`` + ``slokit slo report``).

One run (``guidellm run``, 0.8.1's name for ``benchmark``) is shared by the tests: a constant
8 requests/s for 4 s of 64-token answers, against a simulator at real speed that fails 15% of
its requests with vLLM's engine-dead 500 (seed 2: the 1st, 9th, 16th, 18th... it admits). The
report then holds all three groups: successful, errored (the 500s) and incomplete (in flight
when max_duration ended the benchmark: GuideLLM cancels them).

Figures and tolerances:

- request counts: GuideLLM's ``metrics.request_totals``, exactly (the importer keeps the
  requests of GuideLLM's measurement window, as GuideLLM counts them; a request dispatched as
  the benchmark ended is in the report's lists but in no figure of GuideLLM's).
- means of TTFT and E2E (one value per request) and of ITL (GuideLLM weights each request's
  ITL by its ``output_tokens - 1``): ``rel=1e-9``; the same doubles, summed by numpy in
  another order (a few ulps).
- GuideLLM's percentiles do not interpolate: each is the smallest value whose cumulative
  weight reaches p (``Percentiles.from_pdf``); the same rule applied to the imported records
  (:func:`_guidellm_percentile`) picks the same request's value: ``rel=1e-12`` (ms -> s -> ms).
- slokit's percentiles interpolate linearly (numpy's default, as vLLM reports), so its p95 is
  not GuideLLM's: ``gate``/``slo report`` equal the linear quantile of GuideLLM's own
  per-request values, and their 95% confidence bounds (order statistics picked by the same
  binomial rule as GuideLLM's ``percentile_cis``) equal GuideLLM's wherever it gives one;
  ``rel=1e-9`` (ms -> s).
"""

from __future__ import annotations

import bisect
import itertools
import json
import subprocess
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner
from loadtool_helpers import (
    SLO,
    build_tokenizer,
    offline_env,
    served_ids,
    served_model,
    tool_bin,
)
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from slokit.analysis.slo import quantile
from slokit.cli import main as cli_main
from slokit.ids import checked_request_id
from slokit.lab.sim.background import running_cluster
from slokit.lab.sim.faults import Faults
from slokit.lab.sim.settings import SimSettings
from slokit.records import RequestFragment
from slokit.sources.files import parse_requests_file, read_text

pytestmark = [pytest.mark.loadtools, pytest.mark.slow]

#: GuideLLM's groups -> slokit's status.
STATUS = {"successful": "ok", "errored": "error", "incomplete": "incomplete"}
#: GuideLLM's per-request latencies (successful group) -> slokit's metric, fragment field and
#: the factor from GuideLLM's unit to seconds.
LATENCIES = (
    ("time_to_first_token_ms", "ttft", "client_ttft_s", 1e-3),
    ("inter_token_latency_ms", "tpot", "tpot_s", 1e-3),
    ("request_latency", "e2e", "client_e2e_s", 1.0),
)


@dataclass
class GuideLLMRun:
    report: Path
    bench: dict  # the report's one benchmark
    spans: InMemorySpanExporter

    def fragments(self) -> list[RequestFragment]:
        return parse_requests_file(read_text(self.report), name=str(self.report))


@pytest.fixture(scope="module")
def guidellm_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GuideLLMRun]:
    bin_dir = tool_bin("guidellm")
    home = tmp_path_factory.mktemp("guidellm")
    tok = build_tokenizer(bin_dir, home / "tokenizer")
    report = home / "benchmarks.json"
    spans = InMemorySpanExporter()
    settings = SimSettings(speed=1.0, seed=2, num_gpu_blocks=4096, faults=Faults(error_rate=0.15))
    with running_cluster(settings, exporter_factory=lambda: spans) as sim:
        cmd = [
            str(bin_dir / "guidellm"), "run",
            f"--backend=kind=openai_http,target={sim.url},model={served_model(sim.url)}",
            f"--tokenizer=kind=huggingface_auto,model={tok}",
            "--profile=kind=constant,rate=8",
            "--constraint=kind=max_duration,seconds=4",
            "--data=kind=synthetic_text,prompt_tokens=24,output_tokens=64",
            f"--output=kind=json,path={report}",
            "--disable-console-interactive",
        ]  # fmt: skip
        env = {
            **offline_env(home),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "GUIDELLM__MAX_WORKER_PROCESSES": "2",  # default 10 processes; the host has 2 cores
        }
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env, cwd=home)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        (bench,) = json.loads(report.read_text())["benchmarks"]
        yield GuideLLMRun(report, bench, spans)


def _guidellm_percentile(values: list[float], weights: list[float], p: float) -> float:
    """GuideLLM's percentile (``DistributionSummary.from_values`` + ``Percentiles.from_pdf``):
    equal values merged, weights normalized and cumulated in value order (numpy's cumsum adds
    in sequence, as here), then the first value whose cumulative probability reaches ``p``."""
    merged: dict[float, float] = {}
    for x, w in sorted(zip(values, weights, strict=True)):
        merged[x] = merged.get(x, 0.0) + w
    xs = [x for x, w in merged.items() if w > 0]
    total = sum(merged[x] for x in xs)  # whole numbers: exact in any order
    cdf = list(itertools.accumulate(merged[x] / total for x in xs))
    return xs[bisect.bisect_left(cdf, p)]


def test_every_guidellm_request_is_imported_with_its_groups_status(guidellm_run):
    totals = guidellm_run.bench["metrics"]["request_totals"]
    # the run is built to fill every group (see the module docstring)
    assert totals["successful"] >= 10 and totals["errored"] >= 1 and totals["incomplete"] >= 1
    frags = guidellm_run.fragments()
    assert len(frags) == totals["total"]
    assert Counter(f.status for f in frags) == {s: totals[g] for g, s in STATUS.items()}
    errors = {(f.error_type, f.http_status) for f in frags if f.status == "error"}
    assert errors == {("HTTPStatusError", 500)}
    # a request the server answered is keyed by the server's id (chatcmpl-<id> -> <id>)
    ok = {f.request_id for f in frags if f.status == "ok"}
    successful = guidellm_run.bench["requests"]["successful"]
    assert ok == {checked_request_id(r["response_id"]) for r in successful}
    assert ok <= served_ids(guidellm_run.spans, ok)


def test_guidellm_means_and_percentiles_equal_its_rule_on_the_imported_records(guidellm_run):
    ok = [f for f in guidellm_run.fragments() if f.status == "ok"]
    metrics = guidellm_run.bench["metrics"]
    for key, _, field, to_s in LATENCIES:
        values = [getattr(f, field) / to_s for f in ok]
        if key == "inter_token_latency_ms":  # one value per gap between output tokens
            weights = [float(f.output_tokens - 1) for f in ok]
        else:
            weights = [1.0] * len(ok)
        theirs = metrics[key]["successful"]
        assert theirs["count"] == round(sum(weights)), key
        mean = sum(x * w for x, w in zip(values, weights, strict=True)) / sum(weights)
        assert theirs["mean"] == pytest.approx(mean, rel=1e-9), key
        for p in ("p10", "p25", "p50", "p75", "p90", "p95", "p99"):
            ours = _guidellm_percentile(values, weights, int(p[1:]) / 100)
            assert theirs["percentiles"][p] == pytest.approx(ours, rel=1e-12), (key, p)


def test_gate_and_slo_report_on_guidellms_file_report_guidellms_figures(guidellm_run, tmp_path):
    report = str(guidellm_run.report)
    gate = CliRunner().invoke(cli_main, ["gate", "--slo", str(SLO), "--run", report, "--json"])
    assert gate.exit_code in (0, 1), gate.output  # 1: the 500s breach the SLO
    db = str(tmp_path / "slokit.duckdb")
    ingest = CliRunner().invoke(cli_main, ["ingest", "requests", "--db", db, report])
    assert ingest.exit_code == 0, ingest.output
    slo = CliRunner().invoke(cli_main, ["slo", "report", "--slo", str(SLO), "--db", db, "--json"])
    assert slo.exit_code == 0, slo.output

    bench = guidellm_run.bench
    totals = bench["metrics"]["request_totals"]
    cis_compared = 0
    for overall in (
        json.loads(gate.output)["report"]["overall"],
        json.loads(slo.output)["overall"],
    ):
        # incomplete requests are counted apart, neither good nor errors
        assert overall["requests"] == totals["successful"] + totals["errored"]
        assert overall["outcomes"]["error"] == totals["errored"]
        assert overall["incomplete"] == totals["incomplete"]
        for key, metric, _, to_s in LATENCIES:
            xs = sorted(r[key] * to_s for r in bench["requests"]["successful"])
            ours = overall["percentiles"][metric]
            assert ours["n"] == len(xs) == totals["successful"], metric
            cis = bench["metrics"][key]["successful"]["percentile_cis"]
            for p in ("p50", "p95", "p99"):
                assert ours[p]["value_s"] == pytest.approx(
                    quantile(xs, int(p[1:]) / 100), rel=1e-9
                ), (metric, p)
                # GuideLLM gives intervals for per-request metrics only (not token-weighted
                # ITL), and none where the sample cannot bound both sides
                if metric != "tpot" and cis is not None and cis[p] is not None:
                    bounds = [cis[p]["lower"] * to_s, cis[p]["upper"] * to_s]
                    assert ours[p]["ci95_s"] == pytest.approx(bounds, rel=1e-9), (metric, p)
                    cis_compared += 1
    assert cis_compared >= 4  # at least the medians of TTFT and E2E, in both reports
