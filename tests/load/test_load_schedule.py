"""Open-loop schedules: precomputed from a seed, at the target rate."""

from __future__ import annotations

import itertools
import random
import statistics

import pytest

from slokit.errors import BadInput
from slokit.lab.load import constant_schedule, make_schedule, poisson_schedule


def test_poisson_schedule_offers_the_target_rate_over_the_duration() -> None:
    offsets = poisson_schedule(50.0, 20.0, random.Random(7))
    assert len(offsets) == 1000
    assert all(0.0 <= t < 20.0 for t in offsets)
    assert offsets == sorted(offsets)


def test_poisson_schedule_gaps_are_exponential_with_mean_one_over_rate() -> None:
    offsets = poisson_schedule(200.0, 20.0, random.Random(3))
    gaps = [b - a for a, b in itertools.pairwise(offsets)]
    mean = statistics.fmean(gaps)
    assert mean == pytest.approx(1 / 200.0, rel=0.05)
    # An exponential distribution has a coefficient of variation of 1; constant spacing 0.
    assert statistics.pstdev(gaps) / mean == pytest.approx(1.0, abs=0.1)


def test_poisson_schedule_is_reproducible_from_its_seed() -> None:
    assert poisson_schedule(10, 5, random.Random(1)) == poisson_schedule(10, 5, random.Random(1))
    assert poisson_schedule(10, 5, random.Random(1)) != poisson_schedule(10, 5, random.Random(2))


def test_constant_schedule_is_evenly_spaced() -> None:
    offsets = constant_schedule(4.0, 2.0)
    assert offsets == pytest.approx([0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75])


@pytest.mark.parametrize("rate", [0.0, -1.0, float("inf"), float("nan")])
def test_a_rate_that_is_not_positive_and_finite_is_bad_input(rate: float) -> None:
    with pytest.raises(BadInput, match="rate"):
        poisson_schedule(rate, 10.0, random.Random(0))


def test_an_unknown_arrival_process_is_bad_input() -> None:
    with pytest.raises(BadInput, match="arrival"):
        make_schedule("bursty", 1.0, 1.0, random.Random(0))  # type: ignore[arg-type]


def test_a_schedule_with_no_request_at_all_is_bad_input() -> None:
    with pytest.raises(BadInput, match="no request"):
        constant_schedule(0.1, 2.0)
