"""gateway_queueing on synthetic stores: the router's side against the engines'."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from slokit.analysis.diagnose import diagnose
from slokit.lab.sim.faults import FaultError, Faults, apply_update
from slokit.lab.sim.server import SimCluster, SimSettings
from slokit.lab.sim.vtime import LoopClock, run_virtual
from slokit.records import EngineSample, RouterSample
from slokit.sources.exposition import parse_exposition
from slokit.sources.router_metrics import parse_router_metrics
from slokit.store.db import open_store

T0 = 1_700_000_000.0


def _run(router_queue: float, router_sat: float, waiting: float, kv: float) -> dict[str, Any]:
    """120 s of two engines and one router scraped every 2 s; the last 60 s as given."""
    engine, router = [], []
    for i in range(60):
        ts = T0 + 2 * i
        late = i >= 30
        for r in ("pod-a", "pod-b"):
            engine.append(
                EngineSample(
                    ts=ts, replica=r, model="m", running=4.0,
                    waiting=waiting if late else 0.0, kv_usage_ratio=kv if late else 0.2,
                )
            )  # fmt: skip
        router.append(RouterSample(ts=ts, router="epp", pool="p", model=None,
                                   pool_saturation=router_sat if late else 0.3))  # fmt: skip
        router.append(RouterSample(ts=ts, router="epp", pool="p", model="m",
                                   flow_queue_size=router_queue if late else 0.0))  # fmt: skip
    with open_store(":memory:") as store:
        store.append_engine_samples(engine)
        store.append_router_samples(router)
        return diagnose(store.reader())


def _found(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for f in doc["findings"] if f["rule"] == "gateway_queueing"]


def test_router_queueing_while_engines_idle_is_reported() -> None:
    doc = _run(router_queue=20.0, router_sat=1.2, waiting=0.0, kv=0.3)
    (f,) = _found(doc)
    assert f["evidence"]["kind"] == "router_holds_back"
    assert f["evidence"]["router"]["queue_peak"] == 20.0
    assert f["evidence"]["engines"]["waiting_mean"] == 0.0
    assert f["severity"] in ("warning", "critical")
    assert doc["coverage"]["sources"]["router"]["replicas"] == ["epp"]


def test_engines_saturated_while_router_admits_all_is_reported() -> None:
    (f,) = _found(_run(router_queue=0.0, router_sat=0.4, waiting=12.0, kv=0.97))
    assert f["evidence"]["kind"] == "router_admits_all"


def test_both_saturated_is_not_this_rule() -> None:
    assert _found(_run(router_queue=20.0, router_sat=1.3, waiting=12.0, kv=0.97)) == []


def test_without_a_router_the_rule_does_not_apply() -> None:
    engine = [EngineSample(ts=T0 + i, replica="a", model="m", running=1.0, waiting=0.0)
              for i in range(30)]  # fmt: skip
    with open_store(":memory:") as store:
        store.append_engine_samples(engine)
        doc = diagnose(store.reader())
    assert doc["coverage"]["rules"]["gateway_queueing"]["status"] == "not_applicable"
    assert "router" not in doc["coverage"]["sources"]


# -- the simulator's router (slokit.lab.sim.router), as the scenario pack uses it ------------

_FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "router" / "llm_d_epp.prom"


def _label_sets(text: str | bytes) -> dict[str, tuple[str, frozenset[str]]]:
    """Family -> (type, label names of its samples, ``le`` aside)."""
    return {
        fam.name: (fam.type, frozenset(k for s in fam.samples for k in s.labels if k != "le"))
        for fam in parse_exposition(text)
    }


async def _router_at_limit() -> tuple[bytes, bytes, list[float]]:
    """Three requests through a router limited to 2: one waits; then all finish."""
    settings = SimSettings(model="7b", gpu="l4", router=True)
    cluster = SimCluster(settings, 1, port=0, dcgm_port=None, clock_factory=LoopClock)
    await cluster.start()
    try:
        router = cluster.router
        assert router is not None
        router.update_faults({"router_max_inflight": 2})
        release = asyncio.Event()
        waited: list[float] = []

        async def one() -> None:
            t0 = router.clock.now()
            async with router.admit():
                waited.append(router.clock.now() - t0)
                await release.wait()
                await asyncio.sleep(1.0)

        tasks = [asyncio.create_task(one()) for _ in range(3)]
        await asyncio.sleep(0.5)
        busy = router.render()
        release.set()
        await asyncio.gather(*tasks)
        return busy, router.render(), waited
    finally:
        await cluster.stop()


def test_the_simulated_router_queues_past_its_limit_in_the_documented_names() -> None:
    busy, idle, waited = run_virtual(_router_at_limit())
    assert sorted(waited) == [0.0, 0.0, 1.5]  # the third waited for a slot
    fixture = _label_sets(_FIXTURE.read_text())
    sim = _label_sets(busy)
    assert sim and all(sim[name] == fixture[name] for name in sim), {
        name: (sim[name], fixture.get(name)) for name in sim if sim[name] != fixture.get(name)
    }
    (pool,) = [s for s in parse_router_metrics(busy, ts=T0, router="epp") if s.model is None]
    (model,) = [s for s in parse_router_metrics(busy, ts=T0, router="epp") if s.model]
    assert (pool.pool, pool.pool_saturation, pool.ready_endpoints) == ("sim-pool", 1.0, 1.0)
    assert (model.flow_queue_size, model.running, model.requests_total) == (1.0, 3.0, 3.0)
    (after,) = [s for s in parse_router_metrics(idle, ts=T0, router="epp") if s.model]
    assert after.flow_queue_size == 0.0 and after.flow_outcomes == {}
    queue_s = after.histograms["flow_queue_s"]
    assert (queue_s.count, queue_s.sum) == (3, 1.5)


def test_the_router_limit_is_a_fault_knob() -> None:
    faults = apply_update(Faults(), {"router_max_inflight": 4}).faults
    assert faults.router_max_inflight == 4
    with pytest.raises(FaultError):
        apply_update(Faults(), {"router_max_inflight": -1})
