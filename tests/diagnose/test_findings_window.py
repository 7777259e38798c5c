"""The sidecar's periodic diagnosis over a long incident: ticks in simulated time, each
diagnosing the window :func:`diagnosis_since` picks and storing what it found, as the
sidecar's findings tick does."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from diag_synth import T0, engine, gpu, requests

from slokit.analysis.diagnose import Diagnosis, run_diagnosis, store_findings
from slokit.records import EngineSample, GpuSample, RequestFragment
from slokit.sidecar.findings_window import FINDINGS_WINDOW_S, FUTURE_SLACK_S, diagnosis_window
from slokit.store.db import Store, open_store
from slokit.store.reader import LocalReader
from slokit.store.retention import prune_requests
from slokit.timeutil import iso, parse_time

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


def findings_tick(
    store: Store, now: float, reader: LocalReader | None = None, **window_kw: Any
) -> tuple[float | None, Diagnosis, set[str]]:
    """The sidecar's findings tick at ``now``: diagnose the window :func:`diagnosis_window`
    picks (from the reader's ``requests_from`` on: by default what the store keeps), store
    the findings; the start it picked, the diagnosis, and the rules whose findings are
    active (ended within ONGOING_S of the window's end)."""
    reader = reader or store.reader()
    mark = reader.requests_from  # read once, as the sidecar's tick does
    window = diagnosis_window(reader, now, ongoing_s=ONGOING_S, requests_from=mark, **window_kw)
    assert window is not None
    result = run_diagnosis(reader, since=window[0], until=window[1], requests_from=mark)
    store_findings(store, result.findings, window=(result.since, result.until))
    active = {f.rule for f in result.findings if f.end_ts >= window[1] - ONGOING_S}
    return window[0], result, active


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
        since, _, active = findings_tick(s, now, **({} if hold_s is None else {"hold_s": hold_s}))
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


class PrunedTicks:
    """The sidecar's store under retention: requests every second, the newest ``keep`` of
    them kept (as ``retention_requests`` does at a high rate: 150,000 are 12.5 minutes at
    200 req/s), while the engine and GPU samples go back further (a day, by age)."""

    def __init__(self, keep: int) -> None:
        self.now = T0
        self.store = open_store(":memory:", clock=lambda: self.now)
        self.keep = keep
        self.requests_from: float | None = None  # the newest whole_from pruning returned
        during = lambda before, then: lambda t: then if t >= INCIDENT else before  # noqa: E731
        # the requests of the last half hour before the incident: enough for the bounds
        self.fragments = requests(start=INCIDENT - 1800, end=END, every_s=1.0,
                                  queue_s=during(0.02, 1.5))  # fmt: skip
        self.samples = engine(start=T0, end=END, every_s=5.0, waiting=during(0, 37))
        self.gpu = gpu(start=T0, end=END)

    def tick(self, now: float, *, with_mark: bool = True) -> tuple[dict, set[str]]:
        """Store what finished by ``now`` (a minute at a time, each first seen then),
        prune past ``keep``, diagnose as the findings tick does: the diagnosis's window and
        the rules with an active finding."""
        s = self.store
        while self.now < now:
            lo, self.now = self.now, min(now, self.now + 60.0)
            s.append_fragments([f for f in self.fragments if lo < (f.finish_ts or 0) <= self.now])
            s.append_engine_samples([x for x in self.samples if lo < x.ts <= self.now])
            s.append_gpu_samples([x for x in self.gpu if lo < x.ts <= self.now])
        pruned = prune_requests(s, now=now, max_requests=self.keep)
        if pruned.whole_from is not None:
            self.requests_from = max(pruned.whole_from, self.requests_from or 0.0)
        # the store keeps the mark; without it, a reader told there is none
        reader = s.reader() if with_mark else LocalReader(s.con, requests_from=None)
        _, result, active = findings_tick(s, now, reader)
        return result.window, active


@pytest.fixture
def pruned() -> Iterator[PrunedTicks]:
    ticks = PrunedTicks(keep=600)  # ten minutes of requests, less than the 15-minute window
    yield ticks
    ticks.store.close()


def test_a_store_keeping_fewer_minutes_of_requests_than_the_window_finds_the_incident(
    pruned: PrunedTicks,
) -> None:
    """At a high rate retention keeps fewer minutes of requests than the window and its hour
    of baseline: the window and baseline start where the requests kept do, not where the
    samples do (whose baseline would hold no request, and the request rules see nothing)."""
    pruned.tick(INCIDENT - 60)
    window, active = pruned.tick(INCIDENT + 300)
    assert "queue_saturation" in active, window
    assert pruned.requests_from is not None
    assert window["requests_from"] == iso(pruned.requests_from)
    assert parse_time(window["baseline"]["since"]) >= pruned.requests_from


def test_without_the_mark_of_what_retention_deleted_the_request_rules_go_blind(
    pruned: PrunedTicks,
) -> None:
    """What the mark prevents (a guard: the store above is one that blinds them)."""
    pruned.tick(INCIDENT - 60)
    window, active = pruned.tick(INCIDENT + 300, with_mark=False)
    assert "queue_saturation" not in active
    assert "requests_from" not in window


def test_a_window_kept_requests_cover_whole_has_its_baseline_in_their_history() -> None:
    """With more than a window of requests kept, the baseline is the history before the
    window, from the oldest whole request on."""
    ticks = PrunedTicks(keep=1800)  # half an hour of requests
    try:
        ticks.tick(INCIDENT - 60)
        window, active = ticks.tick(INCIDENT + 300)
    finally:
        ticks.store.close()
    assert "queue_saturation" in active
    assert window["baseline"]["from"] == "history"
    assert ticks.requests_from is not None
    assert parse_time(window["baseline"]["since"]) >= ticks.requests_from
