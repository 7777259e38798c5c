"""docs/metrics.md is the public contract of the sidecar's /metrics: every series the sidecar
can export has a row there, and every row names a series it exports."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client import CollectorRegistry

from slokit.sidecar.connections import ConnectionMetrics
from slokit.sidecar.metrics import SidecarMetrics

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def _exported() -> set[str]:
    registry = CollectorRegistry()
    SidecarMetrics(registry)
    ConnectionMetrics(registry)  # the listeners' series, in the same registry at run time
    return {m.name + ("_total" if m.type == "counter" else "") for m in registry.collect()}


def _documented() -> set[str]:
    return set(re.findall(r"^\| `(slokit_[a-z0-9_]+)`", DOC.read_text(), re.M))


def test_every_series_the_sidecar_exports_is_documented() -> None:
    assert _exported() - _documented() == set()


def test_every_documented_series_is_one_the_sidecar_exports() -> None:
    assert _documented() - _exported() == set()
