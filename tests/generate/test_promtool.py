"""Proof with the real promtool: the rules load, the unit tests pass, every panel query parses."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from slokit.analysis.slo_spec import SloSpec
from slokit.generate.alerts import AlertOptions, build_alert_files
from slokit.generate.dashboards import DashboardOptions, build_dashboards
from slokit.generate.promql import PanelQuery, check_rule_file, panel_queries

pytestmark = pytest.mark.prometheus

REPO = Path(__file__).resolve().parents[2]


def _promtool(promtool: str, *args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool, *map(str, args)], capture_output=True, text=True, timeout=120, check=False
    )


@pytest.mark.parametrize(
    "opts",
    [AlertOptions(), AlertOptions(scale=720, evaluation_interval="1s")],
    ids=["default", "scaled-for-tests"],
)
def test_generated_rule_files_pass_promtool_check(
    spec: SloSpec, promtool: str, tmp_path: Path, opts: AlertOptions
) -> None:
    paths = []
    for name, text in build_alert_files(spec, opts).items():
        if name.endswith(".rules.yaml"):
            (tmp_path / name).write_text(text)
            paths.append(tmp_path / name)
    result = _promtool(promtool, "check", "rules", *paths)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(paths)


def test_promtool_unit_tests_make_each_alert_fire_and_stay_silent(
    promtool: str, tmp_path: Path
) -> None:
    # Run on a copy so promtool's relative rule_files resolve beside the tests; the golden
    # test proves the committed rule files are the generator's output.
    shutil.copytree(REPO / "alerts", tmp_path / "alerts")
    tests = sorted((tmp_path / "alerts" / "tests").glob("*.test.yaml"))
    assert len(tests) == 3
    result = _promtool(promtool, "test", "rules", *tests)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_is_exercised_by_a_promtool_unit_test(spec: SloSpec) -> None:
    alert_names = {
        r["alert"]
        for name, text in build_alert_files(spec, AlertOptions()).items()
        if name.endswith(".rules.yaml")
        for g in yaml.safe_load(text)["groups"]
        for r in g["rules"]
        if "alert" in r
    }
    fired = set()
    for path in (REPO / "alerts" / "tests").glob("*.test.yaml"):
        for case in yaml.safe_load(path.read_text())["tests"]:
            fired |= {t["alertname"] for t in case.get("alert_rule_test", []) if t["exp_alerts"]}
    assert alert_names == fired


def _queries(spec: SloSpec) -> dict[str, list[PanelQuery]]:
    built = build_dashboards(DashboardOptions(spec=spec))
    return {name: list(panel_queries(json.loads(text))) for name, text in built.items()}


def test_every_dashboard_query_passes_the_promql_parser(
    spec: SloSpec, promtool: str, tmp_path: Path
) -> None:
    files = []
    for name, queries in _queries(spec).items():
        assert queries, name
        path = tmp_path / name.replace(".json", ".check.yaml")
        path.write_text(yaml.safe_dump(check_rule_file(queries)))
        files.append(path)
    result = _promtool(promtool, "check", "rules", *files)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(files)


def test_the_parser_check_catches_a_broken_query(promtool: str, tmp_path: Path) -> None:
    broken = [
        PanelQuery(
            "d",
            "p",
            "A",
            'sum by (pod) (rate(vllm:num_preemptions_total{pod=~"$replica"}[$__rate_interval])',
        )
    ]
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(check_rule_file(broken)))
    result = _promtool(promtool, "check", "rules", path)
    assert result.returncode != 0
