"""The committed dashboards/ and alerts/ are exactly what the generators produce now."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from slokit.cli import main

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_SPEC = "examples/slo/chat.yaml"


def _build(tmp_path: Path) -> tuple[Path, Path]:
    runner = CliRunner()
    dash, alerts = tmp_path / "dashboards", tmp_path / "alerts"
    r1 = runner.invoke(main, ["dashboards", "build", "--slo", EXAMPLE_SPEC, "--out", str(dash)])
    r2 = runner.invoke(main, ["alerts", "build", "--slo", EXAMPLE_SPEC, "--out", str(alerts)])
    assert r1.exit_code == 0, r1.output
    assert r2.exit_code == 0, r2.output
    return dash, alerts


def test_regenerating_gives_the_committed_files_byte_for_byte(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    dash, alerts = _build(tmp_path)
    for built_dir, committed_dir in ((dash, REPO / "dashboards"), (alerts, REPO / "alerts")):
        built = sorted(p.name for p in built_dir.iterdir())
        assert built, built_dir
        for name in built:
            committed = committed_dir / name
            assert committed.exists(), f"{committed} missing: run the build commands in README"
            assert committed.read_bytes() == (built_dir / name).read_bytes(), (
                f"{committed} differs from the generator's output; regenerate with "
                f"`slokit {'dashboards' if built_dir == dash else 'alerts'} build --slo {EXAMPLE_SPEC}`"
            )


def test_alerts_build_needs_a_readable_spec(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main, ["alerts", "build", "--slo", str(tmp_path / "none.yaml"), "--out", str(tmp_path)]
    )
    assert result.exit_code == 2
    assert "cannot read SLO spec" in result.output


def test_alerts_build_refuses_a_bad_label_name(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main,
        [
            "alerts",
            "build",
            "--slo",
            str(REPO / EXAMPLE_SPEC),
            "--out",
            str(tmp_path),
            "--replica-label",
            "a-b",
        ],
    )
    assert result.exit_code == 2
    assert "not a Prometheus label name" in result.output


def test_dashboards_build_without_a_spec_writes_all_four(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["dashboards", "build", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "slokit-capacity.json",
        "slokit-gpu.json",
        "slokit-latency.json",
        "slokit-overview.json",
    ]
