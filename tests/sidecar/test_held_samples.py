"""Scraped samples (engine, GPU, router, scrape health) are held and committed together every
``samples_interval_s``: one statement per kind instead of one per scrape tick, since DuckDB's
cost of an insert is mostly per statement. A reader that flushes the writer sees them, stopping
commits them, and they count against the queue's bound until DuckDB has them."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from sidecar_harness import FakeClock, tick, wait_for

from slokit.records import EngineSample, ScrapeResult
from slokit.sidecar.metrics import SidecarMetrics
from slokit.sidecar.write_errors import QueueFull, RecordsRefused
from slokit.sidecar.writer import Writer
from slokit.store.db import Store, open_store

NOW = 1_795_958_000.0


@dataclass
class Held:
    writer: Writer
    store: Store
    clock: FakeClock

    def count(self, table: str) -> int:
        cur = self.store.cursor()
        try:
            return int(cur.execute(f"SELECT count(*) FROM {table}").fetchall()[0][0])
        finally:
            cur.close()

    def taken(self) -> None:
        """Wait until the writer has handled everything submitted (held or committed): the
        queue is empty and no batch is in flight (one taken from the queue but not yet held
        would be held after a tick, on a later interval)."""
        w = self.writer

        def handled() -> bool:
            with w._cond:
                return not w._queue and w._inflight_since is None

        wait_for(handled, timeout=30, what="the writer to handle the queue")

    def tick(self, seconds: float) -> None:
        tick(self.writer, self.clock, seconds)


def _held(tmp_path: Path, **kw: Any) -> Held:
    store = open_store(tmp_path / "h.duckdb")
    clock = FakeClock()
    writer = Writer(store, metrics=SidecarMetrics(CollectorRegistry()), clock=clock, **kw)
    writer.start()
    return Held(writer, store, clock)


@pytest.fixture
def held(tmp_path: Path) -> Iterator[Held]:
    h = _held(tmp_path, samples_interval_s=5.0)
    yield h
    h.writer.stop()
    h.store.close()


def _engine(i: int) -> EngineSample:
    return EngineSample(NOW + i, "pod-a", "m", running=float(i))


def _scrape(i: int) -> ScrapeResult:
    return ScrapeResult(NOW + i, "http://pod-a/metrics", "vllm", "pod-a", True, samples=600)


def test_samples_wait_for_the_interval_and_go_in_one_statement_per_kind(held: Held) -> None:
    w = held.writer
    before = w.committed_batches
    futures = []
    for i in range(3):  # three scrape ticks of one replica
        futures += [w.submit("engine", [_engine(i)]), w.submit("scrapes", [_scrape(i)])]
    held.taken()
    assert not any(f.done() for f in futures)
    assert held.count("engine_samples") == 0  # the interval has not passed on the writer's clock
    held.tick(5.0)
    assert [f.result(30) for f in futures] == [1] * 6
    assert held.count("engine_samples") == 3 and held.count("scrapes") == 3
    assert w.committed_batches == before + 2  # engine and scrapes, one statement each


def test_a_flush_commits_the_held_samples(held: Held) -> None:
    held.writer.submit("engine", [_engine(0)])
    held.writer.submit("scrapes", [_scrape(0)])
    held.taken()
    assert held.writer.flush(30)  # what the sidecar's API does before it reads
    assert held.count("engine_samples") == 1 and held.count("scrapes") == 1


def test_stopping_commits_the_held_samples(tmp_path: Path) -> None:
    h = _held(tmp_path, samples_interval_s=5.0)
    futures = [h.writer.submit("engine", [_engine(i)]) for i in range(4)]
    h.taken()
    h.writer.stop()
    assert [f.result(0) for f in futures] == [1] * 4
    assert h.count("engine_samples") == 4
    h.store.close()


def test_held_samples_count_against_the_bound_until_committed(tmp_path: Path) -> None:
    h = _held(tmp_path, samples_interval_s=5.0, capacity=3)
    h.writer.submit("engine", [_engine(i) for i in range(3)])
    h.taken()
    assert h.writer.depth == 3
    with pytest.raises(QueueFull):
        h.writer.submit("engine", [_engine(3)])
    assert h.writer.flush(30)
    assert h.writer.depth == 0
    assert h.writer.submit("engine", [_engine(3)]) is not None
    h.writer.stop()
    h.store.close()


def test_a_sample_the_store_refuses_is_refused_alone_among_the_held_ones(held: Held) -> None:
    w = held.writer
    good = [w.submit("engine", [_engine(i)]) for i in range(3)]
    bad = w.submit("engine", [EngineSample(NOW, None, "m")])  # type: ignore[arg-type]
    held.taken()
    held.tick(5.0)
    assert [f.result(30) for f in good] == [1] * 3
    with pytest.raises(RecordsRefused):
        bad.result(30)
    assert held.count("engine_samples") == 3


def test_with_no_interval_each_tick_is_committed_at_once(tmp_path: Path) -> None:
    h = _held(tmp_path, samples_interval_s=0.0)
    fut: concurrent.futures.Future[int] = h.writer.submit("engine", [_engine(0)])
    assert fut.result(30) == 1  # the writer's clock never moves
    assert h.count("engine_samples") == 1
    h.writer.stop()
    h.store.close()
