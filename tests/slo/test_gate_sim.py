"""End to end on the simulator: `slokit load` records, then `slokit gate` on them.

A healthy replica passes; the same load against the ``error_burst`` scenario (30% of
requests fail) breaches, and the JUnit file says which case failed.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from click.testing import CliRunner

from slokit.cli import main
from slokit.lab.sim.background import running_cluster
from slokit.lab.sim.faults import scenario_faults
from slokit.lab.sim.server import SimSettings

SPEC = """\
slokit: v1
service: sim
classes:
  - name: default
    good_when: {ttft_ms: 2000, e2e_ms: 30000}
    objective: 0.95
gate:
  min_requests: 20
"""


def _run_and_gate(tmp_path: Path, scenario: str) -> tuple[int, Path, str]:
    spec = tmp_path / "slo.yaml"
    spec.write_text(SPEC)
    records, junit = tmp_path / f"{scenario}.jsonl", tmp_path / f"{scenario}.xml"
    faults, _ = scenario_faults(scenario)
    settings = SimSettings(speed=20.0, faults=faults, scenario=scenario)
    with running_cluster(settings, dcgm_port=None) as sim:
        load = CliRunner().invoke(
            main,
            [
                "load",
                "--url",
                sim.url,
                "--rate",
                "20",
                "--duration",
                "2",
                "--seed",
                "1",
                "--out",
                str(records),
                "--no-progress",
            ],
        )
        assert load.exit_code == 0, load.output
    res = CliRunner().invoke(
        main, ["gate", "--slo", str(spec), "--records", str(records), "--junit", str(junit)]
    )
    return res.exit_code, junit, res.output


@pytest.mark.slow
def test_a_healthy_simulator_run_passes_the_gate(tmp_path: Path) -> None:
    code, junit, output = _run_and_gate(tmp_path, "healthy")
    assert code == 0, output
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None and suite.get("failures") == "0"
    assert int(suite.get("tests") or 0) == 2


@pytest.mark.slow
def test_an_error_burst_run_fails_the_gate(tmp_path: Path) -> None:
    code, junit, output = _run_and_gate(tmp_path, "error_burst")
    assert code == 1, output
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None
    failed = [c.get("name") for c in suite.iter("testcase") if c.find("failure") is not None]
    assert failed == ["attainment >= 0.95"]
