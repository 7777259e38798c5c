"""Burn-rate windows as data: factors follow the period, durations follow the scale."""

from __future__ import annotations

import pytest

from slokit.errors import BadInput
from slokit.generate.burnrate import DEFAULT_WINDOWS, BurnRatePlan, WindowPair, prom_duration

DAY = 86400.0


def test_thirty_day_period_gives_the_sre_workbook_factors() -> None:
    assert [w.factor(30 * DAY) for w in DEFAULT_WINDOWS] == [14.4, 6.0, 3.0, 1.0]


def test_default_windows_are_page_1h_5m_6h_30m_and_ticket_1d_2h_3d_6h() -> None:
    plan = BurnRatePlan(period_s=30 * DAY)
    pairs = [
        (w.severity, plan.duration(w.long_s), plan.duration(w.short_s)) for w in DEFAULT_WINDOWS
    ]
    assert pairs == [
        ("page", "1h", "5m"),
        ("page", "6h", "30m"),
        ("ticket", "1d", "2h"),
        ("ticket", "3d", "6h"),
    ]


def test_a_28_day_period_scales_the_factors_as_sloth_does() -> None:
    assert [w.factor(28 * DAY) for w in DEFAULT_WINDOWS] == [13.44, 5.6, 2.8, 0.933333]


def test_window_scale_shrinks_durations_but_keeps_factors() -> None:
    plan = BurnRatePlan(period_s=30 * DAY, scale=720)
    assert plan.duration(3600) == "5s"
    assert plan.duration(300) == "417ms"
    assert [w.factor(plan.period_s) for w in plan.windows] == [14.4, 6.0, 3.0, 1.0]


def test_rate_windows_lists_each_window_once_shortest_first() -> None:
    assert BurnRatePlan(period_s=30 * DAY).rate_windows() == [
        "5m",
        "30m",
        "1h",
        "2h",
        "6h",
        "1d",
        "3d",
    ]


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (300, "5m"),
        (3600, "1h"),
        (86400, "1d"),
        (90, "90s"),
        (5400, "90m"),
        (0.25, "250ms"),
        (259200, "3d"),
    ],
)
def test_prom_duration_uses_the_largest_exact_unit(seconds: float, text: str) -> None:
    assert prom_duration(seconds) == text


def test_prom_duration_refuses_windows_below_a_millisecond() -> None:
    with pytest.raises(BadInput):
        prom_duration(0.0001)


def test_plan_refuses_a_non_positive_scale() -> None:
    with pytest.raises(BadInput, match="scale"):
        BurnRatePlan(period_s=30 * DAY, scale=0)


def test_plan_refuses_a_short_window_not_shorter_than_the_long_one() -> None:
    with pytest.raises(BadInput, match="short window"):
        BurnRatePlan(period_s=30 * DAY, windows=(WindowPair("page", 0.02, 300, 3600),))
