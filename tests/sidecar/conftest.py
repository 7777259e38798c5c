"""Fixtures for the sidecar tests (the harness lives in sidecar_harness.py)."""

from __future__ import annotations

import faulthandler
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from sidecar_harness import BASE, LoopThread, Running, StartSidecar, TargetServer

from slokit._gc import restore_gc, tune_gc
from slokit.sidecar.runner import Sidecar


@pytest.fixture
def start_sidecar(tmp_path: Path) -> Iterator[StartSidecar]:
    """``start_sidecar(**config_overrides, before_commit=..., scrape_transport=...)``.

    The sidecar runs in this process under the collector schedule its own process gets
    (``slokit.sidecar.runner.run``), unfrozen: what this process built is the test's."""
    schedule = tune_gc()
    lt = LoopThread()
    started: list[Sidecar] = []

    def start(**kw: Any) -> Running:
        inject = {k: kw.pop(k) for k in ("before_commit", "scrape_transport", "forward_transport", "nvml_poller")
                  if k in kw}  # fmt: skip
        db = Path(kw.pop("db", tmp_path / f"sidecar{len(started)}.duckdb"))
        cfg = replace(BASE, db=str(db), **kw)
        reg = CollectorRegistry()
        sc = Sidecar(cfg, registry=reg, **inject)
        lt.call(sc.start())
        started.append(sc)
        return Running(sc, reg, db)

    yield start
    for sc in started:
        # stopping waits for periodic work in flight (a first findings tick imports pandas):
        # on a busy machine that has taken over 30 s; the teardown is not what is tested. A
        # stop still running after 60 s prints every thread's stack (in the test's report if
        # it then times out), so a stop that hangs can be told from a slow one.
        faulthandler.dump_traceback_later(60)
        try:
            lt.call(sc.stop(), timeout=180)
        finally:
            faulthandler.cancel_dump_traceback_later()
    lt.close()
    restore_gc(schedule)


@pytest.fixture(scope="session")
def export_body(vllm_fixtures: Path) -> bytes:
    """A real vLLM export: 64 ``llm_request`` spans (request ids r0..r63)."""
    return (vllm_fixtures / "otlp" / "export_06.pb").read_bytes()


@pytest.fixture
def target(vllm_fixtures: Path) -> Iterator[TargetServer]:
    lt = LoopThread()
    t = TargetServer(lt, vllm_fixtures)
    yield t
    t.close()
    lt.close()
