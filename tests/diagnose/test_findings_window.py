"""The sidecar's periodic diagnosis over a long incident: ticks in simulated time, each
diagnosing the window :func:`diagnosis_since` picks and storing what it found, as the
sidecar's findings tick does."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from diag_synth import T0, engine, gpu, requests

from slokit.analysis.diagnose import run_diagnosis, store_findings
from slokit.records import EngineSample, GpuSample, RequestFragment
from slokit.sidecar.findings_window import FINDINGS_WINDOW_S, FUTURE_SLACK_S, diagnosis_window
from slokit.store.db import Store, open_store

TICK_S = 300.0  # the sidecar's default is 30 s: five-minute ticks keep the test short
ONGOING_S = 2 * TICK_S  # the sidecar's: a finding that ended this recently is still going on
QUIET_S = 7200.0  # two hours of normal service before the incident
INCIDENT = T0 + QUIET_S
LONG_S = 3600.0  # the incident lasts an hour
END = INCIDENT + LONG_S + 1800.0  # then half an hour of normal service again


@pytest.fixture(scope="module")
def telemetry() -> tuple[list[RequestFragment], list[EngineSample], list[GpuSample]]:
    """A queue that builds up at INCIDENT and drains an hour later (requests every 2 s)."""

    def during(before: float, then: float) -> object:
        return lambda t: then if INCIDENT <= t < INCIDENT + LONG_S else before

    return (
        requests(start=T0, end=END, every_s=2.0, queue_s=during(0.02, 1.5)),
        engine(start=T0, end=END, every_s=5.0, waiting=during(0, 37)),
        gpu(start=T0, end=END),
    )


class Ticks:
    """The sidecar's store as time passes: what had arrived by ``now``, then a findings tick."""

    def __init__(self, store: Store, telemetry: tuple[list, list, list]) -> None:
        self.store = store
        self.fragments, self.samples, self.gpu = telemetry
        self.upto = T0

    def tick(self, now: float, hold_s: float | None = None) -> tuple[float | None, set[str]]:
        """Store what finished in (upto, now], diagnose: the window's start and the rules
        whose findings are active (ended within ONGOING_S of the newest data)."""
        s, lo = self.store, self.upto
        s.append_fragments(
            [f for f in self.fragments if lo < (f.finish_ts or f.arrival_ts or 0) <= now]
        )
        s.append_engine_samples([x for x in self.samples if lo < x.ts <= now])
        s.append_gpu_samples([x for x in self.gpu if lo < x.ts <= now])
        self.upto = now
        reader = s.reader()
        kw = {} if hold_s is None else {"hold_s": hold_s}
        window = diagnosis_window(reader, now, ongoing_s=ONGOING_S, **kw)
        assert window is not None
        since, until = window
        result = run_diagnosis(reader, since=since, until=until)
        store_findings(s, result.findings, window=(result.since, result.until))
        active = {f.rule for f in result.findings if f.end_ts >= until - ONGOING_S}
        return since, active


@pytest.fixture
def ticks(telemetry: tuple[list, list, list]) -> Iterator[Ticks]:
    with open_store(":memory:") as s:
        yield Ticks(s, telemetry)


def test_an_hour_long_incident_stays_found_at_every_tick(ticks: Ticks) -> None:
    ticks.tick(INCIDENT - 60)
    for minute in range(5, 60, 5):
        _, active = ticks.tick(INCIDENT + 60 * minute)
        assert "queue_saturation" in active, f"{minute} min into the incident"


def test_the_window_holds_the_incidents_start_and_slides_again_after_it(ticks: Ticks) -> None:
    ticks.tick(INCIDENT - 60)
    for minute in range(5, 40, 5):
        since, _ = ticks.tick(INCIDENT + 60 * minute)
    assert since is not None and since <= INCIDENT + 10  # judged against the hour before
    for minute in range(5, 30, 5):  # after it: one old finding no longer holds the window
        now = INCIDENT + LONG_S + 60 * minute
        since, active = ticks.tick(now)
    assert "queue_saturation" not in active
    newest = ticks.store.reader().bounds()[1]
    assert newest is not None and since == pytest.approx(newest - FINDINGS_WINDOW_S)


def test_the_window_is_held_no_longer_than_the_hold(ticks: Ticks) -> None:
    ticks.tick(INCIDENT - 60, hold_s=1800)
    for minute in range(5, 50, 5):
        since, _ = ticks.tick(INCIDENT + 60 * minute, hold_s=1800)
        newest = ticks.store.reader().bounds()[1]
        assert newest is not None and since is not None and since >= newest - 1800 - 1e-6
    assert since > INCIDENT  # 45 minutes in, half an hour's hold: the start is let go


def test_one_finding_is_stored_for_the_whole_incident(ticks: Ticks) -> None:
    ticks.tick(INCIDENT - 60)
    for minute in range(5, 60, 5):
        ticks.tick(INCIDENT + 60 * minute)
    rows = ticks.store.con.execute(
        "SELECT epoch(start_ts) FROM findings WHERE rule = 'queue_saturation'"
    ).fetchall()
    assert len(rows) == 1 and rows[0][0] == pytest.approx(INCIDENT, abs=10)


@pytest.mark.parametrize("ahead_h", [2, 23])
def test_a_request_stamped_hours_ahead_does_not_blind_the_findings(
    ticks: Ticks, ahead_h: float
) -> None:
    """One client whose clock runs hours ahead (or that stamps local time as UTC): its span
    is accepted (up to a day ahead), and the window stays at the sidecar's own time."""
    ticks.tick(INCIDENT - 60)
    skewed = requests(start=INCIDENT + 3600 * ahead_h, end=INCIDENT + 3600 * ahead_h + 1,
                      every_s=2.0, prefix="skewed")  # fmt: skip
    ticks.store.append_fragments(skewed)
    for minute in range(5, 30, 5):
        since, active = ticks.tick(INCIDENT + 60 * minute)
        assert "queue_saturation" in active, f"{minute} min into the incident"
        assert since is not None and since <= INCIDENT + 10


def test_data_a_little_ahead_of_the_clock_is_in_the_window(ticks: Ticks) -> None:
    """Other hosts' clocks drift by seconds: data up to FUTURE_SLACK_S ahead counts as now."""
    now = INCIDENT + 600
    ticks.tick(now)
    ahead = requests(start=now + FUTURE_SLACK_S / 2, end=now + FUTURE_SLACK_S / 2 + 1,
                     every_s=2.0, prefix="ahead")  # fmt: skip
    ticks.store.append_fragments(ahead)
    window = diagnosis_window(ticks.store.reader(), now, ongoing_s=ONGOING_S)
    assert window is not None and window[1] >= now + FUTURE_SLACK_S / 2
