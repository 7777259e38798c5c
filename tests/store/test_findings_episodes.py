"""Stored findings: a diagnosis replaces what earlier runs said about the same episode."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from slokit.records import Finding
from slokit.store.db import Store, open_store

T0 = 1_795_958_000.0
WINDOW = 900.0


@pytest.fixture
def store() -> Iterator[Store]:
    with open_store(":memory:", clock=lambda: T0) as s:
        yield s


def finding(
    start: float,
    end: float,
    *,
    rule: str = "queue_saturation",
    replica: str | None = "pod-a",
    summary: str = "s",
) -> Finding:
    return Finding(rule, "critical", 1.0, replica, start, end, summary, {}, "rb")


def tick(store: Store, now: float, *found: Finding) -> None:
    """What the sidecar does every 30 s: diagnose the newest 15 minutes, store the result."""
    store.replace_findings(list(found), (now - WINDOW, now))


def stored(store: Store) -> list[tuple[str, str | None, float, float, str]]:
    return [
        (r[0], r[1], float(r[2]), float(r[3]), r[4])
        for r in store.con.execute(
            "SELECT rule, replica, epoch(start_ts), epoch(end_ts), summary FROM findings "
            "ORDER BY rule, replica NULLS FIRST, start_ts"
        ).fetchall()
    ]


def test_an_incident_longer_than_the_window_is_one_finding_from_its_start(store: Store) -> None:
    incident = T0 + 100
    for k in range(60):  # 30 minutes of ticks, the incident going on throughout
        now = T0 + 200 + 30 * k
        tick(store, now, finding(max(incident, now - WINDOW), now, summary=f"tick {k}"))
    assert stored(store) == [("queue_saturation", "pod-a", incident, T0 + 200 + 30 * 59, "tick 59")]


def test_another_replica_or_rule_is_another_finding(store: Store) -> None:
    tick(store, T0 + 1000, finding(T0 + 100, T0 + 1000))
    tick(
        store,
        T0 + 1030,
        finding(T0 + 130, T0 + 1030, replica="pod-b"),
        finding(T0 + 130, T0 + 1030, rule="kv_pressure"),
    )
    assert [(r[0], r[1], r[2]) for r in stored(store)] == [
        ("kv_pressure", "pod-a", T0 + 130),
        ("queue_saturation", "pod-a", T0 + 100),
        ("queue_saturation", "pod-b", T0 + 130),
    ]


def test_a_fleet_finding_is_not_merged_with_a_replicas(store: Store) -> None:
    tick(store, T0 + 1000, finding(T0 + 100, T0 + 1000, replica=None))
    tick(store, T0 + 1030, finding(T0 + 130, T0 + 1030, replica=None))
    tick(store, T0 + 1060, finding(T0 + 160, T0 + 1060))
    assert [(r[1], r[2], r[3]) for r in stored(store)] == [
        (None, T0 + 100, T0 + 1030),
        ("pod-a", T0 + 160, T0 + 1060),
    ]


def test_an_episode_that_ended_before_the_new_one_began_is_kept(store: Store) -> None:
    tick(store, T0 + 1000, finding(T0 + 50, T0 + 90))  # over, before the next window starts
    tick(store, T0 + 1060, finding(T0 + 400, T0 + 1060))
    assert [(r[2], r[3]) for r in stored(store)] == [(T0 + 50, T0 + 90), (T0 + 400, T0 + 1060)]


def test_appending_without_a_window_replaces_nothing(store: Store) -> None:
    store.replace_findings([finding(T0, T0 + 60)])
    store.replace_findings([finding(T0 + 30, T0 + 90)])
    assert len(stored(store)) == 2
