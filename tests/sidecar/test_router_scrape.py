"""The sidecar scrapes a gateway router (llm-d router / Inference Extension EPP) into
``router_samples``, recorded in ``scrapes`` like the engines and GPUs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from sidecar_harness import (
    LoopThread,
    StartSidecar,
    TargetServer,
    closed_port_url,
    store_rows,
    wait_for,
)

from slokit.sidecar.config import Target, load_config
from slokit.store.db import open_store

ROUTER_FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "router"


@pytest.fixture(params=sorted(p.name for p in ROUTER_FIXTURES.glob("*.prom")))
def router(request: pytest.FixtureRequest, vllm_fixtures: Path) -> Iterator[TargetServer]:
    """A fake router target serving one of tests/fixtures/router/*.prom."""
    lt = LoopThread()
    t = TargetServer(lt, vllm_fixtures)
    t.body = (ROUTER_FIXTURES / request.param).read_bytes()
    yield t
    t.close()
    lt.close()


def test_router_target_is_scraped_into_router_samples(
    start_sidecar: StartSidecar, router: TargetServer
) -> None:
    sc = start_sidecar(router_urls=(f"epp={router.url}",), scrape_interval_s=0.3)
    count = "SELECT count(DISTINCT ts) FROM router_samples"
    wait_for(lambda: store_rows(sc, count)[0][0] >= 2, what="router samples")
    assert sc.value("slokit_scrape_up", target=router.url, kind="router", replica="epp") == 1
    rows = store_rows(
        sc, "SELECT DISTINCT router, pool, model FROM router_samples ORDER BY ALL NULLS FIRST"
    )
    assert {r[0] for r in rows} == {"epp"}
    assert any(r[1] for r in rows), rows  # the pool the scrape names
    assert any(r[2] for r in rows), rows  # a model's request series
    scrapes = store_rows(sc, "SELECT DISTINCT kind, replica, up, error FROM scrapes")
    assert scrapes == [("router", "epp", True, None)]
    # the engines' tables are not written from a router's exposition
    assert store_rows(sc, "SELECT count(*) FROM engine_samples") == [(0,)]


@pytest.mark.parametrize("router", ["llm_d_epp.prom"], indirect=True)
def test_router_queue_and_saturation_are_stored(
    start_sidecar: StartSidecar, router: TargetServer
) -> None:
    sc = start_sidecar(router_urls=(router.url,), scrape_interval_s=0.3)
    sql = "SELECT sum(flow_queue_size), max(pool_saturation) FROM router_samples GROUP BY ts"
    wait_for(lambda: bool(store_rows(sc, sql)), what="router samples")
    queue, saturation = store_rows(sc, sql)[0]
    assert (queue, saturation) == (37.0, 1.05)
    name = router.url.split("://")[1].split("/")[0]  # no NAME=: the router is its host:port
    assert store_rows(sc, "SELECT DISTINCT router FROM router_samples") == [(name,)]


def test_a_down_router_is_a_failed_scrape_of_kind_router(start_sidecar: StartSidecar) -> None:
    down = closed_port_url()
    sc = start_sidecar(router_urls=(f"epp={down}",), scrape_interval_s=0.2)
    fails = "SELECT count(*) FROM scrapes WHERE kind = 'router' AND NOT up"
    wait_for(lambda: store_rows(sc, fails)[0][0] >= 2, what="failed router scrapes")
    assert sc.value("slokit_scrape_failures_total", target=down, kind="router", reason="down") >= 2
    assert store_rows(sc, "SELECT count(*) FROM router_samples") == [(0,)]


def test_router_urls_repeat_or_come_as_a_comma_list() -> None:
    flags = {"router_urls": ("a=http://r1:9090/metrics,http://r2:9090/metrics", "http://r3:1/m")}
    targets = [t for t in load_config(flags=flags).targets() if t.kind == "router"]
    assert targets == [
        Target("http://r1:9090/metrics", "router", "a"),
        Target("http://r2:9090/metrics", "router", "r2:9090"),
        Target("http://r3:1/m", "router", "r3:1"),
    ]
    env = {"SLOKIT_ROUTER_URLS": "http://r1:9090/metrics, b=http://r2:9090/metrics"}
    assert [t.replica for t in load_config(env=env).targets()] == ["r1:9090", "b"]


def test_a_router_url_must_be_http() -> None:
    from slokit.errors import BadInput

    with pytest.raises(BadInput, match="http"):
        load_config(flags={"router_urls": ("epp=ftp://r1/metrics",)}).validate()


def test_the_cli_takes_router_url() -> None:
    from slokit.cli.sidecar import command

    result = CliRunner().invoke(command, ["--help"])
    assert result.exit_code == 0 and "--router-url" in result.output


def test_no_router_configured_is_no_telemetry_gap(vllm_fixtures: Path) -> None:
    """Without a router target nothing is said about the router: it is an optional source."""
    from slokit.analysis.diagnose import diagnose
    from slokit.records import ScrapeResult
    from slokit.sources.vllm_metrics import parse_vllm_metrics

    body = (vllm_fixtures / "metrics_after_load.prom").read_bytes()
    t0 = 1_700_000_000.0
    with open_store(":memory:") as store:
        for i in range(60):
            store.append_engine_samples(parse_vllm_metrics(body, ts=t0 + i, replica="pod"))
            store.append_scrapes([ScrapeResult(t0 + i, "http://pod/metrics", "vllm", "pod", True)])
        doc = diagnose(store.reader())
    gaps = [f for f in doc["findings"] if f["rule"] == "telemetry_gap"]
    assert not [f for f in gaps if f["evidence"].get("source") == "router"], gaps
    assert "router" not in str([f["summary"] for f in gaps])
