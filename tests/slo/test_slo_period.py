"""An SLO's ``period`` is a rolling window: positive and sane, or a clear error (exit 2)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from slo_builders import SPEC_YAML

from slokit.analysis.slo_spec import load_spec
from slokit.cli import main
from slokit.errors import BadInput


def _spec(tmp_path: Path, period: str) -> Path:
    p = tmp_path / "slo.yaml"
    p.write_text(SPEC_YAML.replace("period: 30d", f"period: {period}"))
    return p


@pytest.mark.parametrize(
    ("period", "says"),
    [
        ("0d", "between 1m and 366d"),
        ("0s", "between 1m and 366d"),
        ("0.0h", "between 1m and 366d"),
        ("30s", "between 1m and 366d"),
        ("500ms", "between 1m and 366d"),
        ("367d", "between 1m and 366d"),
        ("99999999w", "between 1m and 366d"),
        ("-1d", "not a duration"),
        ("garbage", "not a duration"),
        ("30", "not a duration"),
        ("''", "not a duration"),
        ("[30d]", "not a duration"),
        ("~", "not a duration"),
    ],
)  # fmt: skip
def test_a_period_that_is_not_a_sane_window_is_refused(
    tmp_path: Path, period: str, says: str
) -> None:
    with pytest.raises(BadInput, match=rf"slo\.yaml:\d+: period: .*{says}"):
        load_spec(_spec(tmp_path, period))


@pytest.mark.parametrize(
    ("period", "seconds"), [("30d", 2592000.0), ("28d", 2419200.0), ("4w", 2419200.0),
                            ("1h", 3600.0), ("1m", 60.0), ("366d", 31622400.0)],
)  # fmt: skip
def test_sane_periods_are_taken(tmp_path: Path, period: str, seconds: float) -> None:
    assert load_spec(_spec(tmp_path, period)).period_s == seconds


def test_slo_report_with_a_zero_period_exits_2_naming_the_field(tmp_path: Path) -> None:
    res = CliRunner().invoke(
        main, ["slo", "report", "--slo", str(_spec(tmp_path, "0d")),
               "--db", str(tmp_path / "none.duckdb")],
    )  # fmt: skip
    assert res.exit_code == 2
    assert res.stderr.startswith("slokit: ") and "period: must be between 1m and 366d" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
