"""Real AIPerf against ``slokit sim``: its ``profile_export.jsonl`` imports request by request,
and slokit's percentiles of the imported records equal AIPerf's own.

Tolerance: the same records give the same percentiles up to AIPerf's method (numpy's linear
interpolation, as slokit's ``quantile``) and its export rounding; ``rel=1e-6``.
"""

from __future__ import annotations

import json
import subprocess
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner
from loadtool_helpers import SLO, build_tokenizer, offline_env, served_ids, tool_bin

from slokit.analysis.slo import quantile
from slokit.cli import main as cli_main
from slokit.sources.files import parse_requests_file, read_text

pytestmark = [pytest.mark.loadtools, pytest.mark.slow]


def _model(url: str) -> str:
    with urllib.request.urlopen(url + "/v1/models", timeout=10) as r:
        return str(json.load(r)["data"][0]["id"])


@pytest.fixture
def aiperf_run(sim, tmp_path: Path) -> tuple[Path, Path, object]:
    bin_dir = tool_bin("aiperf")
    tok = build_tokenizer(bin_dir, tmp_path / "tokenizer")
    out = tmp_path / "artifacts"
    cmd = [
        str(bin_dir / "aiperf"), "profile",
        "--model", _model(sim.url), "--url", sim.url,
        "--endpoint-type", "chat", "--streaming",
        "--tokenizer", str(tok),
        "--request-rate", "4", "--request-count", "12",
        "--synthetic-input-tokens-mean", "24", "--output-tokens-mean", "8",
        "--artifact-dir", str(out), "--ui-type", "none",
    ]  # fmt: skip
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=240, env=offline_env(tmp_path)
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (records,) = out.rglob("profile_export.jsonl")
    (aggregate,) = out.rglob("profile_export_aiperf.json")
    return records, aggregate, sim.spans


def test_every_aiperf_request_is_imported_and_joins_the_sims(aiperf_run):
    records, _, spans = aiperf_run
    frags = parse_requests_file(read_text(records), name=str(records))
    assert len(frags) == 12
    assert {f.status for f in frags} == {"ok"}
    ids = {f.request_id for f in frags}
    assert ids <= served_ids(spans, ids)  # X-Request-ID is the key on both sides


def test_aiperf_percentiles_equal_slokits_of_the_imported_records(aiperf_run):
    records, aggregate, _ = aiperf_run
    agg = json.loads(aggregate.read_text())
    frags = parse_requests_file(read_text(records), name=str(records))
    for tag, field in (
        ("time_to_first_token", "client_ttft_s"),
        ("request_latency", "client_e2e_s"),
    ):
        assert agg[tag]["unit"] == "ms"
        xs = sorted(getattr(f, field) for f in frags)
        for p in ("p50", "p90", "p99"):
            assert quantile(xs, int(p[1:]) / 100) * 1000 == pytest.approx(agg[tag][p], rel=1e-6)


def test_gate_on_aiperfs_file_reports_aiperfs_figures(aiperf_run):
    records, aggregate, _ = aiperf_run
    agg = json.loads(aggregate.read_text())
    res = CliRunner().invoke(cli_main, ["gate", "--slo", str(SLO), "--run", str(records), "--json"])
    assert res.exit_code in (0, 1), res.output
    pct = json.loads(res.output)["report"]["overall"]["percentiles"]
    for tag, metric in (("time_to_first_token", "ttft"), ("request_latency", "e2e")):
        for p in ("p50", "p95", "p99"):
            got = pct[metric][p]["value_s"] * 1000
            assert got == pytest.approx(agg[tag][p], rel=1e-6)
