"""A running ``slokit sim`` for the real load tools (helpers in loadtool_helpers.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from slokit.lab.sim.background import BackgroundSim, running_cluster
from slokit.lab.sim.settings import SimSettings


@pytest.fixture
def sim() -> Iterator[BackgroundSim]:
    """One replica at 20x simulated speed; ``sim.spans`` holds its spans."""
    spans = InMemorySpanExporter()
    with running_cluster(
        SimSettings(speed=20.0, num_gpu_blocks=4096), exporter_factory=lambda: spans
    ) as s:
        s.spans = spans  # type: ignore[attr-defined]
        yield s
