"""gateway_queueing on synthetic stores: the router's side against the engines'."""

from __future__ import annotations

from typing import Any

from slokit.analysis.diagnose import diagnose
from slokit.records import EngineSample, RouterSample
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
