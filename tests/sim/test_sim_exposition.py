"""The simulator's text exposition is prometheus_client's ``generate_latest``, byte for byte:
for a simulated replica after load and spec decode, on every scrape of a changing state, and
for every metric type and awkward value or label prometheus_client can hold."""

from __future__ import annotations

import math
from typing import Any

import pytest
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Enum,
    Gauge,
    Histogram,
    Info,
    Summary,
    generate_latest,
)
from prometheus_client.registry import Collector

from slokit.lab.sim.engine import EngineConfig, EngineCore, make_request, simulate
from slokit.lab.sim.exposition import TextExposition
from slokit.lab.sim.metrics import VllmMetrics
from slokit.lab.sim.roofline import GPUS, MODELS, Roofline


class _Frozen(Collector):
    """A registry's families as collected once: the process and GC collectors a replica's
    registry holds change between two collections, not between two renderers."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.metrics = list(registry.collect())

    def collect(self) -> Any:
        return self.metrics


def _stable(body: bytes) -> list[bytes]:
    """The lines of a replica's exposition but the live process_*/python_gc_* values."""
    return [ln for ln in body.splitlines() if not ln.startswith((b"process_", b"python_gc_"))]


def _replica(spec: bool) -> tuple[EngineCore, VllmMetrics]:
    cfg = EngineConfig(num_gpu_blocks=64, max_num_batched_tokens=512)
    core = EngineCore(cfg, Roofline(MODELS["7b"], GPUS["h100"]))
    metrics = VllmMetrics("tiny", cfg, 1 << 30)
    core.listeners.append(metrics)
    if spec:
        core.set_spec_decode(2, 0.6)
    return core, metrics


@pytest.mark.parametrize("spec", [False, True], ids=["plain", "spec-decode"])
def test_a_replica_after_load_renders_what_generate_latest_does(spec: bool) -> None:
    core, metrics = _replica(spec)
    reqs = [make_request(f"r{i}", [7] * 64 + list(range(i, i + 100)), 50) for i in range(8)]
    simulate(core, [(0.01 * i, r) for i, r in enumerate(reqs)])
    frozen = _Frozen(metrics.registry)
    body = TextExposition(frozen).render()
    assert body == generate_latest(frozen)
    assert b"vllm:e2e_request_latency_seconds_bucket{" in body  # not an empty registry


def test_every_scrape_of_a_changing_replica_is_generate_latests() -> None:
    core, metrics = _replica(False)
    text = TextExposition(metrics.registry)  # one renderer, its caches kept between scrapes
    bodies = set()
    for i in range(6):  # the caches filled by the first scrape, then values and series change
        simulate(core, [(0.0, make_request(f"r{i}", list(range(i, i + 80)), 20 + i))])
        text.registry = frozen = _Frozen(metrics.registry)
        body = text.render()
        assert body == generate_latest(frozen), i
        bodies.add(body)
    assert len(bodies) == 6


def test_the_text_scrape_is_the_fast_exposition_and_openmetrics_is_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, metrics = _replica(False)
    text, _ = metrics.render_for(None)
    assert _stable(text) == _stable(generate_latest(metrics.registry))
    monkeypatch.setattr(metrics._text, "render", lambda: b"fast\n")
    assert metrics.render_for(None)[0] == b"fast\n"
    assert metrics.render_for("text/plain;version=0.0.4")[0] == b"fast\n"
    om, _ = metrics.render_for("application/openmetrics-text; version=1.0.0")
    assert om.endswith(b"# EOF\n")


def _odd_registry() -> CollectorRegistry:
    reg = CollectorRegistry()
    c = Counter("jobs", "Jobs done.\nSecond line with a \\ backslash.", ["kind", "a_label"],
                registry=reg)  # fmt: skip
    c.labels('quote " and \\ and\nnewline', "x").inc(3)
    c.labels("plain", "é ünïcode").inc(1e21)
    Counter("already_total", "A counter named with _total.", registry=reg).inc(0.1)
    g = Gauge("temps", "Values Go formats its own way.", ["v"], registry=reg)
    for label, value in [("inf", math.inf), ("-inf", -math.inf), ("nan", math.nan),
                         ("tiny", 1e-300), ("big", 123456789.0), ("neg", -2.5),
                         ("zero", 0.0), ("negzero", -0.0), ("int", 7)]:  # fmt: skip
        g.labels(label).set(value)
    h = Histogram("lat_seconds", "A histogram.", ["route"], buckets=(0.1, 1.0, 10.0),
                  registry=reg)  # fmt: skip
    h.labels("/a").observe(0.5)
    h.labels("/b").observe(100.0)
    Summary("sizes", "A summary.", registry=reg).observe(3.0)
    Info("build", "An info metric.", registry=reg).info({"version": "1.2", "commit": "abc"})
    Enum("state", "An enum.", states=["up", "down"], registry=reg).state("down")
    Gauge("no_labels", "", registry=reg).set(1)
    return reg


def test_every_metric_type_escape_and_value_renders_as_generate_latest_does() -> None:
    reg = _odd_registry()
    text = TextExposition(reg)
    first = text.render()
    assert first == generate_latest(reg)
    assert b"_created" in first  # the families generate_latest moves out, in its order
    assert text.render() == generate_latest(reg)  # from the caches
