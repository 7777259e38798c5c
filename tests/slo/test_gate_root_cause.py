"""The gate says why: a failing gate whose source holds the run's engine telemetry names
the root cause of the breach (the diagnosis over the run's window) in its Markdown summary
and its JUnit failure messages."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from click.testing import CliRunner

from slokit.analysis.gate import junit_xml, markdown_summary
from slokit.cli import main
from slokit.store.db import open_store

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "diagnose"))  # the scenario harness lives there
from scenario_harness import SCENARIO_DIR, load_scenario, run_scenario_virtual  # noqa: E402

import slokit  # noqa: E402

SPEC = REPO / "examples" / "slo" / "chat.yaml"


@pytest.fixture(scope="module")
def queue_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A simulated queue-saturation run (capped batch, a burst) in a store."""
    path = tmp_path_factory.mktemp("gate") / "run.duckdb"
    collected = run_scenario_virtual(load_scenario(SCENARIO_DIR / "queue_saturation.yaml"))
    with open_store(path) as store:
        collected.store_into(store)
    return path


def test_a_failing_gate_names_the_root_cause_in_markdown_and_junit(
    queue_run: Path, tmp_path: Path
) -> None:
    md, xml = tmp_path / "summary.md", tmp_path / "junit.xml"
    res = CliRunner().invoke(
        main,
        ["gate", "--slo", str(SPEC), "--db", str(queue_run), "--markdown", str(md),
         "--junit", str(xml)],
    )  # fmt: skip
    assert res.exit_code == 1, res.output
    summary = md.read_text()
    assert "### Root cause" in summary
    assert "- root cause queue_saturation on sim-vllm-0: TTFT p95" in summary
    failures = ET.parse(xml).getroot().findall(".//failure")
    breaches = [f for f in failures if f.get("type") != "volume_breach"]
    assert breaches, [f.attrib for f in failures]
    for f in breaches:
        assert (f.get("message") or "").endswith("; root cause queue_saturation on sim-vllm-0")
        assert "root cause queue_saturation on sim-vllm-0: " in (f.text or "")


def test_the_result_carries_the_root_causes_only_when_it_failed(queue_run: Path) -> None:
    result = slokit.gate(SPEC, source=queue_run)
    assert not result.passed
    assert [r.to_json()["id"] for r in result.root_causes] == ["queue_saturation@sim-vllm-0"]
    assert result.to_json()["root_causes"][0]["rule"] == "queue_saturation"
    passing = slokit.gate(_lenient(tmp_spec=queue_run.parent / "lenient.yaml"), source=queue_run)
    assert passing.passed and passing.root_causes == []
    assert "Root cause" not in markdown_summary(passing)
    assert "root cause" not in junit_xml(passing)


def _lenient(tmp_spec: Path) -> Path:
    tmp_spec.write_text(
        "slokit: v1\nservice: chat\nclasses:\n  - name: default\n"
        "    good_when: {ttft_ms: 600000}\n    objective: 0.5\n"
    )
    return tmp_spec


def test_a_records_file_has_no_telemetry_to_diagnose(tmp_path: Path) -> None:
    records = tmp_path / "run.jsonl"
    t0 = 1_700_000_000
    records.write_text(
        "".join(
            f'{{"request_id": "r{i}", "arrival_ts": {t0 + i}, "first_token_ts": {t0 + i + 9.5},'
            f' "finish_ts": {t0 + i + 10}, "status": "ok", "ttft_s": 9.5, "e2e_s": 10}}\n'
            for i in range(30)
        )
    )
    result = slokit.gate(SPEC, records=records)
    assert not result.passed and result.root_causes == []
