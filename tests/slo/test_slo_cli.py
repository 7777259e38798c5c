"""`slokit gate` and `slokit slo report` through click's CliRunner."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from slo_builders import known_fragments

from slokit.cli import main
from slokit.store.db import open_store


def load_line(
    i: int,
    *,
    ttft: float,
    slo_class: str = "interactive",
    status: str = "ok",
    t0: float = 1_700_000_000.0,
) -> dict[str, Any]:
    """One `slokit load` record: 21 output tokens, 20 ms per token after the first."""
    return {
        "request_id": f"run-{i}", "slo_class": slo_class, "send_ts": t0 + i,
        "ttft_s": ttft, "e2e_s": ttft + 0.4, "output_tokens": 21, "prompt_tokens": 50,
        "status": status, "itl_s": [0.02] * 20,
    }  # fmt: skip


def write_jsonl(path: Path, recs: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


@pytest.fixture
def healthy(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "healthy.jsonl", [load_line(i, ttft=0.1) for i in range(50)])


@pytest.fixture
def degraded(tmp_path: Path) -> Path:
    return write_jsonl(
        tmp_path / "degraded.jsonl", [load_line(i, ttft=0.1 if i % 4 else 0.9) for i in range(50)]
    )


def gate(*args: str) -> Any:
    return CliRunner().invoke(main, ["gate", *args])


def test_gate_passes_a_healthy_run(spec_path: Path, healthy: Path) -> None:
    res = gate("--slo", str(spec_path), "--records", str(healthy))
    assert res.exit_code == 0, res.output
    assert res.output.startswith("## slokit gate: PASS")


def test_gate_fails_a_degraded_run_with_exit_1(spec_path: Path, degraded: Path) -> None:
    res = gate("--slo", str(spec_path), "--records", str(degraded))
    assert res.exit_code == 1, res.output
    assert "## slokit gate: FAIL" in res.output


def test_gate_writes_junit_and_markdown(tmp_path: Path, spec_path: Path, degraded: Path) -> None:
    junit, md = tmp_path / "gate.xml", tmp_path / "summary.md"
    res = gate(
        "--slo",
        str(spec_path),
        "--records",
        str(degraded),
        "--junit",
        str(junit),
        "--markdown",
        str(md),
    )
    assert res.exit_code == 1
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None
    results = {
        c.get("name"): (
            "failure"
            if c.find("failure") is not None
            else "skipped"
            if c.find("skipped") is not None
            else "pass"
        )
        for c in suite.iter("testcase")
    }
    assert results == {"attainment >= 0.9": "failure", "attainment": "skipped"}
    assert md.read_text().startswith("## slokit gate: FAIL")


def test_gate_reads_the_store(tmp_path: Path, spec_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    with open_store(db) as store:
        store.append_fragments(known_fragments())
    res = gate("--slo", str(spec_path), "--db", str(db), "--json")
    assert res.exit_code == 1
    doc = json.loads(res.output)
    assert doc["passed"] is False
    assert doc["report"]["classes"][0]["attainment"] == pytest.approx(0.6)


def _bench(tmp_path: Path) -> Path:
    bench = tmp_path / "bench.json"
    bench.write_text(
        json.dumps(
            {
                "duration": 10.0,
                "ttfts": [0.1, 0.2],
                "latencies": [1.0, 1.0],
                "input_lens": [5, 5],
                "output_lens": [10, 10],
                "errors": ["", ""],
            }
        )
    )
    return bench


def test_gate_reads_a_vllm_bench_file(tmp_path: Path) -> None:
    spec = tmp_path / "any.yaml"
    spec.write_text(
        "slokit: v1\nservice: s\nclasses:\n  - name: any\n    objective: 0.9\n"
        "    good_when: {ttft_ms: 150}\n"
    )
    res = gate("--slo", str(spec), "--vllm-bench", str(_bench(tmp_path)), "--json")
    assert res.exit_code == 1  # one of two requests has TTFT 200 ms
    doc = json.loads(res.output)
    assert doc["report"]["classes"][0]["observed_goodput"]["good_requests_per_s"] == 0.1


def test_gate_refuses_to_pass_when_no_request_matched_a_class(
    tmp_path: Path, spec_path: Path
) -> None:
    # bench records carry no slo_class and this spec has no catch-all class
    res = gate("--slo", str(spec_path), "--vllm-bench", str(_bench(tmp_path)))
    assert res.exit_code == 2
    assert "none of the 2 requests matched an SLO class" in res.output


def test_gate_flags_a_regression_against_a_baseline(
    tmp_path: Path, spec_path: Path, healthy: Path
) -> None:
    slower = write_jsonl(tmp_path / "slower.jsonl", [load_line(i, ttft=0.3) for i in range(50)])
    res = gate("--slo", str(spec_path), "--records", str(slower), "--baseline", str(healthy))
    assert res.exit_code == 1
    assert "| interactive | ttft_p95 |" in res.output and "**yes**" in res.output
    same = gate("--slo", str(spec_path), "--records", str(healthy), "--baseline", str(healthy))
    assert same.exit_code == 0, same.output


def _report_of(spec_path: Path, records: Path) -> dict[str, Any]:
    """The ``slo report --json`` document of a run (as ``gate --json`` carries it)."""
    res = gate("--slo", str(spec_path), "--records", str(records), "--json")
    report: dict[str, Any] = json.loads(res.output)["report"]
    return report


def _spoil(report: dict[str, Any], where: str, value: Any) -> dict[str, Any]:
    """``report`` with the value at a dotted path (list indexes as numbers) replaced."""
    out = json.loads(json.dumps(report))
    *path, last = [int(p) if p.isdigit() else p for p in where.split(".")]
    node = out
    for p in path:
        node = node[p]
    node[last] = value
    return out


@pytest.mark.parametrize(
    ("where", "value", "message"),
    [
        ("classes.0", "interactive", "classes[0] must be an object"),
        ("classes.0.requests", "50", "classes[0].requests must be a whole number"),
        ("classes.0.requests", 1e300, "classes[0].requests must be a whole number"),
        ("classes.0.outcomes", [1], "classes[0].outcomes must be an object"),
        ("classes.0.outcomes.good", 10**6, "classes[0].outcomes.good must be a whole number"),
        ("classes.0.percentiles", [], "classes[0].percentiles must be an object"),
        ("classes.0.percentiles.ttft.p95", "1", "percentiles.ttft.p95 must be an object"),
        ("classes.0.percentiles.ttft.p95.value_s", "0.1", "p95 must be an object with a finite"),
        ("classes.0.percentiles.ttft.p95.ci95_s", [1], "p95.ci95_s must be [low, high]"),
    ],
)
def test_a_baseline_report_of_the_wrong_shape_is_bad_input_naming_the_field(
    tmp_path: Path, spec_path: Path, healthy: Path, where: str, value: Any, message: str
) -> None:
    """It once was a traceback with exit 1: the gate's exit code for a regression."""
    bad = tmp_path / "baseline.json"
    bad.write_text(json.dumps(_spoil(_report_of(spec_path, healthy), where, value)))
    res = gate("--slo", str(spec_path), "--records", str(healthy), "--baseline", str(bad))
    assert res.exit_code == 2, res.output
    assert message in res.output


def test_a_baseline_report_claiming_billions_of_requests_is_compared_in_bounded_memory(
    tmp_path: Path, spec_path: Path, healthy: Path
) -> None:
    """The count a report claims sized a list of that many floats (3e9: 24 GB)."""
    report = _spoil(_report_of(spec_path, healthy), "classes.0.requests", 3 * 10**9)
    report = _spoil(report, "classes.0.outcomes.good", 3 * 10**9)
    base = tmp_path / "baseline.json"
    base.write_text(json.dumps(report))
    res = gate("--slo", str(spec_path), "--records", str(healthy), "--baseline", str(base))
    assert res.exit_code == 0, res.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--records", "missing.jsonl"], "cannot read"),
        (["--records", "bad"], "not JSON"),
        (["--records", "x", "--db", "y"], "give one input"),
    ],
)
def test_gate_bad_input_exits_2(
    tmp_path: Path, spec_path: Path, args: list[str], message: str
) -> None:
    (tmp_path / "bad").write_text("{nope\n")
    args = [str(tmp_path / a) if a in ("missing.jsonl", "bad") else a for a in args]
    res = gate("--slo", str(spec_path), *args)
    assert res.exit_code == 2, res.output
    assert message in res.output


def test_gate_with_a_bad_spec_exits_2_naming_field_and_line(tmp_path: Path, healthy: Path) -> None:
    spec = tmp_path / "bad.yaml"
    spec.write_text("slokit: v1\nservice: s\nclasses:\n  - name: a\n    objective: 1.5\n")
    res = gate("--slo", str(spec), "--records", str(healthy))
    assert res.exit_code == 2
    assert "bad.yaml:4: classes[0].objective: must be in (0, 1)" in res.output


@pytest.mark.parametrize(
    ("gate_yaml", "message"),
    [
        ("  max_burn: 2\n", "gate: unknown keys ['max_burn']"),
        ("  min_requests: -1\n", "gate.min_requests: must be a number >= 0, got -1"),
    ],
    ids=["unknown key", "negative threshold"],
)
def test_a_bad_gate_section_fails_slo_report_as_it_fails_gate(
    tmp_path: Path, spec_path: Path, healthy: Path, gate_yaml: str, message: str
) -> None:
    spec = tmp_path / "gated.yaml"
    spec.write_text(spec_path.read_text() + "gate:\n" + gate_yaml)
    line = spec.read_text().splitlines().index(gate_yaml.rstrip("\n")) + 1
    gated = gate("--slo", str(spec), "--records", str(healthy))
    report = CliRunner().invoke(
        main, ["slo", "report", "--slo", str(spec), "--db", str(tmp_path / "none.duckdb")]
    )
    assert (gated.exit_code, report.exit_code) == (2, 2), (gated.output, report.output)
    assert f"gated.yaml:{line}: {message}" in gated.output
    assert report.output == gated.output


def _db(tmp_path: Path) -> Path:
    db = tmp_path / "s.duckdb"
    with open_store(db) as store:
        store.append_fragments(known_fragments())
    return db


def test_slo_report_json(tmp_path: Path, spec_path: Path) -> None:
    res = CliRunner().invoke(
        main, ["slo", "report", "--slo", str(spec_path), "--db", str(_db(tmp_path)), "--json"]
    )
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["window"]["duration_s"] == 100.0
    inter = doc["classes"][0]
    assert (inter["attainment"], inter["burn_rate"]) == (pytest.approx(0.6), pytest.approx(4.0))
    assert doc["overall"]["observed_goodput"]["good_requests_per_s"] == pytest.approx(0.09)
    assert doc["cost"]["usd_per_successful_task"] == pytest.approx(0.04)


def test_slo_report_text_with_a_relative_window(tmp_path: Path, spec_path: Path) -> None:
    res = CliRunner().invoke(
        main,
        ["slo", "report", "--slo", str(spec_path), "--db", str(_db(tmp_path)), "--since", "50s"],
    )
    assert res.exit_code == 0, res.output
    # 50 s back from the newest data (1100) keeps arrivals from 1050 on.
    assert "1970-01-01T00:17:30.000Z .. 1970-01-01T00:18:20.000Z" in res.output
    assert "interactive (objective 90.00%)" in res.output
    assert "per successful task" in res.output
