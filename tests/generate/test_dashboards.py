"""The generated Grafana dashboards: panels, variables, units, thresholds, marker."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from slokit.analysis.slo_spec import SloSpec
from slokit.generate.dashboards import MARKER, DashboardOptions, build_dashboards
from slokit.generate.promql import Labels, panel_queries, substitute


@pytest.fixture(scope="module")
def dashboards(spec: SloSpec) -> dict[str, dict[str, Any]]:
    return {
        name: json.loads(text)
        for name, text in build_dashboards(DashboardOptions(spec=spec)).items()
    }


def _panels(d: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in d["panels"] if p["type"] != "row"]


def test_four_dashboards_with_stable_uids(dashboards: dict[str, dict[str, Any]]) -> None:
    assert {d["uid"] for d in dashboards.values()} == {
        "slokit-overview",
        "slokit-latency",
        "slokit-capacity",
        "slokit-gpu",
    }


def test_every_dashboard_is_marked_generated(dashboards: dict[str, dict[str, Any]]) -> None:
    for d in dashboards.values():
        assert MARKER in d["description"]
        assert "generated" in d["tags"]


def test_every_dashboard_has_the_four_variables(dashboards: dict[str, dict[str, Any]]) -> None:
    for d in dashboards.values():
        names = [v["name"] for v in d["templating"]["list"]]
        assert names == ["datasource", "model", "replica", "class"]


def test_every_panel_has_a_unit_and_a_query(dashboards: dict[str, dict[str, Any]]) -> None:
    for d in dashboards.values():
        for p in _panels(d):
            assert p["fieldConfig"]["defaults"]["unit"], (d["title"], p["title"])
            assert p["targets"] and all(t["expr"] for t in p["targets"]), (d["title"], p["title"])
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}


def test_panel_ids_are_unique_and_panels_do_not_overlap(
    dashboards: dict[str, dict[str, Any]],
) -> None:
    for d in dashboards.values():
        ids = [p["id"] for p in d["panels"]]
        assert len(ids) == len(set(ids))
        cells = set()
        for p in d["panels"]:
            g = p["gridPos"]
            for x in range(g["x"], g["x"] + g["w"]):
                for y in range(g["y"], g["y"] + g["h"]):
                    assert (x, y) not in cells, (d["title"], p["title"])
                    cells.add((x, y))
            assert g["x"] + g["w"] <= 24


def test_latency_panels_draw_the_spec_bounds_as_thresholds(
    dashboards: dict[str, dict[str, Any]],
) -> None:
    ttft = next(
        p for p in _panels(dashboards["slokit-latency.json"]) if p["title"] == "Time to first token"
    )
    steps = [s["value"] for s in ttft["fieldConfig"]["defaults"]["thresholds"]["steps"]]
    assert steps == [None, 1.0, 2.0]  # interactive 1000 ms, default 2000 ms
    assert ttft["fieldConfig"]["defaults"]["custom"]["thresholdsStyle"]["mode"] == "dashed"
    assert any("slokit_slo_bound_seconds" in t["expr"] for t in ttft["targets"])


def test_overview_has_one_attainment_stat_per_class_at_its_objective(
    dashboards: dict[str, dict[str, Any]],
) -> None:
    stats = {
        p["title"]: p
        for p in _panels(dashboards["slokit-overview.json"])
        if p["title"].startswith("Attainment")
    }
    assert set(stats) == {"Attainment: interactive", "Attainment: batch", "Attainment: default"}
    steps = stats["Attainment: batch"]["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert steps == [{"color": "red", "value": None}, {"color": "green", "value": 0.95}]


def test_without_a_spec_the_overview_shows_attainment_by_class() -> None:
    d = json.loads(build_dashboards(DashboardOptions())["slokit-overview.json"])
    titles = [p["title"] for p in _panels(d)]
    assert "Attainment by class" in titles


def test_findings_table_links_each_rule_to_its_runbook() -> None:
    opts = DashboardOptions(runbook_base_url="https://runbooks.example/")
    d = json.loads(build_dashboards(opts)["slokit-overview.json"])
    table = next(p for p in _panels(d) if p["type"] == "table")
    links = table["fieldConfig"]["overrides"][0]["properties"][0]["value"]
    assert links[0]["url"] == "https://runbooks.example/${__value.text}.md"


def test_replica_label_choice_reaches_vllm_and_dcgm_selectors() -> None:
    opts = DashboardOptions(labels=Labels(replica="instance", gpu_replica="exported_pod"))
    built = {n: json.loads(t) for n, t in build_dashboards(opts).items()}
    cap = [q.expr for q in panel_queries(built["slokit-capacity.json"])]
    gpu = [q.expr for q in panel_queries(built["slokit-gpu.json"])]
    assert all('instance=~"$replica"' in e for e in cap)
    assert all('exported_pod=~"$replica"' in e for e in gpu)


def test_dashboards_cover_the_series_the_issue_lists(dashboards: dict[str, dict[str, Any]]) -> None:
    exprs = " ".join(q.expr for d in dashboards.values() for q in panel_queries(d))
    for name in (
        "slokit_requests_total",
        "slokit_output_tokens_total",
        "slokit_cost_per_good_request_usd",
        "slokit_cost_per_successful_task_usd",
        "slokit_findings_active",
        "vllm:time_to_first_token_seconds",
        "vllm:request_time_per_output_token_seconds",
        "vllm:inter_token_latency_seconds",
        "vllm:e2e_request_latency_seconds",
        "vllm:request_queue_time_seconds",
        "vllm:request_prefill_time_seconds",
        "vllm:request_decode_time_seconds",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:num_preemptions_total",
        "vllm:prefix_cache_hits_total",
        "vllm:iteration_tokens_total",
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_SM_CLOCK",
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "DCGM_FI_DEV_XID_ERRORS",
    ):
        assert name in exprs, name


def test_vllm_metric_names_exist_in_the_real_vllm_capture(
    dashboards: dict[str, dict[str, Any]], vllm_fixtures: Path
) -> None:
    exposed = {
        line.split("{")[0].split(" ")[0]
        for line in (vllm_fixtures / "metrics_after_load.prom").read_text().splitlines()
        if line.startswith("vllm:")
    }
    used = {
        m
        for d in dashboards.values()
        for q in panel_queries(d)
        for m in re.findall(r"vllm:[a-z0-9_:]+", q.expr)
    }
    used.discard("vllm:gpu_cache_usage_perc")  # the pre-0.10 name, kept as a fallback
    assert used <= exposed, used - exposed


def test_substitute_replaces_variables_and_refuses_unknown_ones() -> None:
    assert substitute('rate(x{pod=~"$replica"}[$__rate_interval])') == 'rate(x{pod=~".*"}[1m])'
    with pytest.raises(KeyError, match="nope"):
        substitute("x[$nope]")
