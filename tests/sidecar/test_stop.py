"""Stopping a sidecar while periodic work runs in a thread: its queries are interrupted, the
store closes after it, and nothing acknowledged is lost."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import duckdb
from prometheus_client import CollectorRegistry
from sidecar_harness import BASE, LoopThread

from slokit.sidecar.runner import Sidecar

# A query that would run for hours: only an interrupt ends it in a test's time.
ENDLESS = "SELECT sum(i) FROM range(1000000000000) t(i)"


def _sidecar(tmp_path: Path, **kw: Any) -> Sidecar:
    cfg = replace(BASE, db=str(tmp_path / "s.duckdb"), diagnose_interval_s=0, **kw)
    return Sidecar(cfg, registry=CollectorRegistry())


def _add_periodic(lt: LoopThread, sc: Sidecar, fn: Any) -> None:
    async def add() -> None:
        sc._periodic("endless", 0.01, fn)

    lt.call(add())


def test_stop_interrupts_the_query_of_periodic_work_in_flight(tmp_path: Path) -> None:
    lt = LoopThread()
    sc = _sidecar(tmp_path)
    running = threading.Event()
    outcome: list[str] = []

    def endless(cur: Any) -> None:
        running.set()
        try:
            cur.execute(ENDLESS).fetchall()
            outcome.append("finished")
        except duckdb.InterruptException:
            outcome.append("interrupted")

    try:
        lt.call(sc.start())
        _add_periodic(lt, sc, endless)
        assert running.wait(60), "the periodic task never ran"
        lt.call(sc.stop(), timeout=120)
        assert outcome == ["interrupted"]
        assert sc.store is None  # closed after the work ended, not under it
    finally:
        lt.close()


def test_periodic_work_that_runs_several_queries_ends_at_the_next_one(tmp_path: Path) -> None:
    """A tick of many queries (a diagnosis) that swallows one interrupt meets the next."""
    lt = LoopThread()
    sc = _sidecar(tmp_path)
    running = threading.Event()
    interrupted: list[int] = []

    def stubborn(cur: Any) -> None:
        running.set()
        for attempt in range(3):
            try:
                cur.execute(ENDLESS).fetchall()
            except duckdb.InterruptException:
                interrupted.append(attempt)

    try:
        lt.call(sc.start())
        _add_periodic(lt, sc, stubborn)
        assert running.wait(60), "the periodic task never ran"
        lt.call(sc.stop(), timeout=120)
        assert interrupted == [0, 1, 2]
    finally:
        lt.close()


def _stop_beside(tmp_path: Path, caplog: Any, *components: Any) -> tuple[list[str], Sidecar]:
    """Start a sidecar, give it ``components`` to stop (in reverse, as it stops its own) and,
    stopped after all of them, one that records its stop; stop the sidecar. Returns what the
    last one recorded (``["last"]`` once it stopped) and the stopped sidecar."""
    lt = LoopThread()
    sc = _sidecar(tmp_path)
    stopped: list[str] = []

    async def last() -> None:
        stopped.append("last")

    try:
        lt.call(sc.start())
        sc._stoppables[:0] = [last]
        sc._stoppables += components
        with caplog.at_level("ERROR", logger="slokit.sidecar"):
            lt.call(sc.stop(), timeout=120)
    finally:
        lt.close()
    return stopped, sc


def test_a_component_that_never_stops_does_not_keep_the_store_open(
    tmp_path: Path, monkeypatch: Any, caplog: Any
) -> None:
    """grpc.aio's server stop can fail to return: the sidecar goes on without it after
    STOP_COMPONENT_S, and still stops the components after it and closes its store."""
    monkeypatch.setattr("slokit.sidecar.runner.STOP_COMPONENT_S", 0.2)

    async def never() -> None:
        await asyncio.Event().wait()

    async def fails() -> None:
        raise RuntimeError("boom")

    stopped, sc = _stop_beside(tmp_path, caplog, never, fails)
    assert stopped == ["last"] and sc.store is None
    assert "never did not stop" in caplog.text and "fails failed: boom" in caplog.text


def test_a_component_whose_stop_cancels_itself_does_not_skip_the_others(
    tmp_path: Path, caplog: Any
) -> None:
    """A stop that ends by raising CancelledError (a server cancelling its own tasks) is
    logged; the components after it still stop and the store closes."""

    async def cancels_itself() -> None:
        raise asyncio.CancelledError

    stopped, sc = _stop_beside(tmp_path, caplog, cancels_itself)
    assert stopped == ["last"] and sc.store is None
    assert "cancels_itself was cancelled" in caplog.text
