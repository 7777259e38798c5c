"""A real inference-perf 0.5.0 run's output (tests/fixtures/loadtools/README.md: 26 streamed
completions against ``slokit sim``, 3 of them failed with vLLM's 500) imports request by
request, and the figures slokit gets from the imported records equal inference-perf's own
summary of the same run. No tool is needed: both files are committed.

inference-perf's figures (``summarize_requests`` in ``inference_perf/reportgen/base.py``) are
``summarize``: ``np.mean``, ``np.min``, ``np.max`` and ``np.percentile`` (linear
interpolation, numpy's default) over one value per request, in the file's order;
:func:`_summarize` applies it to the imported records.

Tolerances:

- counts and token figures: exact (whole numbers; token means are sums of integers over a
  count, ``rel=1e-12`` for the division).
- latencies: the importer computes each request's value with inference-perf's own expression
  over the same doubles (JSON round-trips them exactly), so the values are bit-identical;
  their means and percentiles are then numpy's over the same list, the same up to the order of
  numpy's pairwise summation in another numpy build: ``rel=1e-12``.
- ``slokit gate``'s percentiles (:func:`slokit.analysis.slo.quantile`) interpolate linearly too,
  so its p50/p95/p99 equal inference-perf's ``median``/``p95``/``p99`` at ``rel=1e-12``.
"""

from __future__ import annotations

import json
import string
from collections import Counter
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from slokit.cli import main as cli_main
from slokit.records import RequestFragment
from slokit.sources.files import parse_requests_file, read_text

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "loadtools"
RUN = FIXTURES / "inference-perf-0.5.0-run.json"
SUMMARY = FIXTURES / "inference-perf-0.5.0-run-summary.json"
SLO = REPO / "examples" / "slo" / "chat.yaml"

#: The run's ``report.request_lifecycle.percentiles``.
PERCENTILES = (50, 90, 95, 99)
#: inference-perf's latency figures (``successes.latency``) -> the fragment's field.
LATENCIES = (
    ("request_latency", "client_e2e_s"),
    ("time_to_first_token", "client_ttft_s"),
    ("time_per_output_token", "tpot_s"),
)
#: inference-perf's label for an HTTP status (``make_concise_label``), the run's only one.
HTTP_LABELS = {500: "500 - Internal Server Error"}
REL = 1e-12


def _summarize(values: list[float]) -> dict[str, float]:
    """inference-perf's ``summarize`` (``inference_perf/reportgen/base.py``)."""
    out = {
        "mean": float(np.mean(values)),
        "min": float(np.min(values)),
        "max": float(np.max(values)),
    }
    for p in PERCENTILES:
        out["median" if p == 50 else f"p{p:g}"] = float(np.percentile(values, p))
    return out


@pytest.fixture(scope="module")
def frags() -> list[RequestFragment]:
    return parse_requests_file(read_text(RUN), name=str(RUN))


@pytest.fixture(scope="module")
def summary() -> dict:
    return json.loads(SUMMARY.read_text())


def _ok(frags: list[RequestFragment]) -> list[RequestFragment]:
    return [f for f in frags if f.status == "ok"]


def test_counts_equal_inference_perfs(frags, summary):
    assert len(frags) == summary["load_summary"]["count"] == 26
    assert Counter(f.status for f in frags) == {
        "ok": summary["successes"]["count"],
        "error": summary["failures"]["count"],
    }
    by_label = Counter(HTTP_LABELS[f.http_status] for f in frags if f.status == "error")
    assert by_label == {k: v["count"] for k, v in summary["failures"]["by_label"].items()}
    assert {f.error_type for f in frags if f.status == "error"} == {"HTTP Error 500"}


def test_requests_are_keyed_by_the_servers_response_id(frags):
    ok = [f.request_id for f in _ok(frags)]
    # cmpl-<32 hex> -> <32 hex>; a 500 carries no id: <file-stem>-<i>
    assert len(set(ok)) == len(ok)
    assert all(len(r) == 32 and set(r) <= set(string.hexdigits) for r in ok)
    errors = [f.request_id for f in frags if f.status == "error"]
    assert all(r.startswith("inference-perf-0.5.0-run-") for r in errors)
    assert {f.model for f in frags} == {"Qwen/Qwen2.5-7B-Instruct"}


@pytest.mark.parametrize(("key", "field"), LATENCIES)
def test_latencies_equal_inference_perfs_summary(frags, summary, key, field):
    values = [getattr(f, field) for f in _ok(frags)]
    assert None not in values  # every success was streamed with more than one token time
    want = summary["successes"]["latency"][key]
    assert _summarize(values) == pytest.approx(want, rel=REL, abs=0)


def test_token_counts_are_the_servers_as_inference_perfs(frags, summary):
    ok = _ok(frags)
    prompt = summary["successes"]["prompt_tokens"]
    output = summary["successes"]["output_tokens"]  # the server's usage.completion_tokens
    assert sum(f.prompt_tokens for f in ok) == prompt["total"]
    assert sum(f.output_tokens for f in ok) == output["total"]
    for got, want in (
        (_summarize([f.prompt_tokens for f in ok]), prompt),
        (_summarize([f.output_tokens for f in ok]), output),
    ):
        assert got == pytest.approx({k: want[k] for k in got}, rel=REL)
    # the client's re-tokenization (a byte-level tokenizer, not the model's) is not used
    assert summary["successes"]["output_len"]["mean"] > 4 * output["mean"]
    # a failed request's input_tokens 0 is inference-perf's placeholder: unknown
    assert {f.prompt_tokens for f in frags if f.status == "error"} == {None}


def test_itl_is_per_request_from_the_token_times_inference_perf_pooled(frags, summary):
    """inference-perf pools every request's gaps (``inter_token_latency``); slokit keeps each
    request's p95 of the same gaps (``itl_p95_s``). The file's token times are the ones the
    summary used (repeated per token of a chunk: gaps of 0)."""
    records = [r for r in json.loads(RUN.read_text()) if r["error"] is None]
    gaps = [
        [b - a for a, b in pairwise(r["info"]["response_metrics"]["output_token_times"])]
        for r in records
    ]
    pooled = [g for request in gaps for g in request]
    want = summary["successes"]["latency"]["inter_token_latency"]
    assert _summarize(pooled) == pytest.approx(want, rel=REL, abs=0)
    ok = _ok(frags)
    assert [f.itl_p95_s for f in ok] == [float(np.percentile(g, 95)) for g in gaps]
    assert max(f.itl_p95_s for f in ok) <= want["max"]


def test_gate_on_the_file_counts_and_percentiles_as_inference_perf(summary):
    gate = CliRunner().invoke(cli_main, ["gate", "--slo", str(SLO), "--run", str(RUN), "--json"])
    assert gate.exit_code == 1, gate.output  # the 500s breach the default class's 95%
    overall = json.loads(gate.output)["report"]["overall"]
    ok, failed = summary["successes"]["count"], summary["failures"]["count"]
    assert overall["requests"] == summary["load_summary"]["count"]
    assert overall["outcomes"] == {"good": ok, "slow": 0, "error": failed, "quality_fail": 0}
    assert overall["output_tokens"] == summary["successes"]["output_tokens"]["total"]
    latency = summary["successes"]["latency"]
    for metric, key in (
        ("e2e", "request_latency"),
        ("ttft", "time_to_first_token"),
        ("tpot", "time_per_output_token"),
    ):
        got = overall["percentiles"][metric]
        assert got["n"] == ok
        for p, name in ((50, "median"), (95, "p95"), (99, "p99")):
            assert got[f"p{p}"]["value_s"] == pytest.approx(latency[key][name], rel=REL)
