"""The generated Prometheus rules: names, labels, annotations, and what the spec puts in them."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from slokit.analysis.slo_spec import SloSpec, parse_spec
from slokit.generate.alerts import (
    AlertOptions,
    SymptomThresholds,
    alertmanager_example,
    build_alert_files,
    slo_rule_file,
    symptom_rule_file,
)
from slokit.generate.promql import Labels


def _alerts(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for g in doc["groups"] for r in g["rules"] if "alert" in r]


def _records(doc: dict[str, Any]) -> list[str]:
    return [r["record"] for g in doc["groups"] for r in g["rules"] if "record" in r]


def test_recording_rules_use_sloth_style_names_for_every_window(spec: SloSpec) -> None:
    assert _records(slo_rule_file(spec, AlertOptions())) == [
        f"slokit:sli_error:ratio_rate{w}" for w in ("5m", "30m", "1h", "2h", "6h", "1d", "3d")
    ]


def test_error_ratio_counts_every_outcome_but_good_as_bad(spec: SloSpec) -> None:
    rule = slo_rule_file(spec, AlertOptions())["groups"][0]["rules"][0]
    assert 'slokit_requests_total{outcome!="good"}[5m]' in rule["expr"]
    assert "sum by (class)" in rule["expr"]


def test_each_class_gets_one_burn_alert_per_window_pair(spec: SloSpec) -> None:
    alerts = _alerts(slo_rule_file(spec, AlertOptions()))
    pairs = {
        (a["labels"]["class"], a["labels"]["long_window"], a["labels"]["short_window"])
        for a in alerts
    }
    assert len(alerts) == len(pairs) == 3 * 4
    assert ("batch", "3d", "6h") in pairs


def test_burn_alert_threshold_combines_factor_and_the_class_budget(spec: SloSpec) -> None:
    alerts = _alerts(slo_rule_file(spec, AlertOptions()))
    fast_batch = next(
        a for a in alerts if a["labels"]["class"] == "batch" and a["labels"]["long_window"] == "1h"
    )
    assert 'slokit:sli_error:ratio_rate1h{class="batch"} / 0.05 > 14.4' in fast_batch["expr"]
    assert 'slokit:sli_error:ratio_rate5m{class="batch"} / 0.05 > 14.4' in fast_batch["expr"]
    assert fast_batch["labels"]["severity"] == "page"


def test_a_28_day_period_lowers_the_burn_thresholds() -> None:
    spec = parse_spec(
        {
            "slokit": "v1",
            "service": "s",
            "period": "28d",
            "classes": [{"name": "c", "objective": 0.999}],
        }
    )
    exprs = [a["expr"] for a in _alerts(slo_rule_file(spec, AlertOptions()))]
    assert "/ 0.001 > 13.44" in exprs[0]
    assert "/ 0.001 > 0.933333" in exprs[3]


@pytest.mark.parametrize("kind", ["slo", "symptoms"])
def test_every_alert_has_severity_rule_summary_and_runbook_url(spec: SloSpec, kind: str) -> None:
    opts = AlertOptions(runbook_base_url="https://git.example.com/ops/slokit/blob/main/runbooks/")
    doc = slo_rule_file(spec, opts) if kind == "slo" else symptom_rule_file(opts)
    for alert in _alerts(doc):
        assert alert["labels"]["severity"] in {"page", "ticket"}
        rule = alert["labels"]["slokit_rule"]
        assert (
            alert["annotations"]["runbook_url"]
            == f"https://git.example.com/ops/slokit/blob/main/runbooks/{rule}.md"
        )
        if rule != "telemetry_gap":  # there the value is up == 0; the summary names the target
            assert "$value" in alert["annotations"]["summary"]


def test_symptom_alerts_mirror_the_diagnostic_rules() -> None:
    rules = {a["labels"]["slokit_rule"] for a in _alerts(symptom_rule_file(AlertOptions()))}
    assert rules == {"kv_pressure", "queue_saturation", "telemetry_gap", "gpu_xid", "gpu_throttle"}


def test_symptom_alerts_group_by_the_configured_replica_label() -> None:
    opts = AlertOptions(labels=Labels(replica="instance", gpu_replica="exported_pod"))
    alerts = {a["alert"]: a for a in _alerts(symptom_rule_file(opts))}
    assert "by (instance, model_name)" in alerts["VllmQueueSaturated"]["expr"]
    assert "$labels.instance" in alerts["VllmQueueSaturated"]["annotations"]["summary"]
    assert "$labels.exported_pod" in alerts["GpuXidCritical"]["annotations"]["summary"]


def test_thresholds_appear_in_expressions_and_summaries() -> None:
    opts = AlertOptions(thresholds=SymptomThresholds(kv_usage_ratio=0.85, queue_waiting=25))
    alerts = {a["alert"]: a for a in _alerts(symptom_rule_file(opts))}
    assert alerts["VllmKvCachePressure"]["expr"].endswith("> 0.85")
    assert "KV cache above 85%" in alerts["VllmKvCachePressure"]["annotations"]["summary"]
    assert alerts["VllmQueueSaturated"]["expr"].endswith(">= 25")
    assert "(threshold 25)" in alerts["VllmQueueSaturated"]["annotations"]["summary"]


def test_window_scale_shortens_windows_and_for_durations(spec: SloSpec) -> None:
    opts = AlertOptions(scale=60, evaluation_interval="1s")
    assert _records(slo_rule_file(spec, opts))[0] == "slokit:sli_error:ratio_rate5s"
    group = symptom_rule_file(opts)["groups"][0]
    queue = next(a for a in group["rules"] if a["alert"] == "VllmQueueSaturated")
    assert "[5s]" in queue["expr"] and queue["for"] == "5s"
    assert group["interval"] == "1s"


def test_critical_xids_page_and_the_rest_ticket() -> None:
    alerts = {a["alert"]: a for a in _alerts(symptom_rule_file(AlertOptions()))}
    assert alerts["GpuXidCritical"]["labels"]["severity"] == "page"
    assert "DCGM_FI_DEV_XID_ERRORS == 79" in alerts["GpuXidCritical"]["expr"]
    assert alerts["GpuXidError"]["labels"]["severity"] == "ticket"
    assert "unless" in alerts["GpuXidError"]["expr"]


def test_alertmanager_example_routes_every_severity_the_rules_use(spec: SloSpec) -> None:
    severities = {
        a["labels"]["severity"]
        for doc in (slo_rule_file(spec, AlertOptions()), symptom_rule_file(AlertOptions()))
        for a in _alerts(doc)
    }
    am = alertmanager_example()
    routed = {m.split("=")[1].strip('"') for r in am["route"]["routes"] for m in r["matchers"]}
    receivers = {r["name"] for r in am["receivers"]}
    assert severities <= routed
    assert {r["receiver"] for r in am["route"]["routes"]} <= receivers


def test_written_files_are_valid_yaml_with_a_do_not_edit_header(spec: SloSpec) -> None:
    files = build_alert_files(spec, AlertOptions())
    assert set(files) == {"chat-slo.rules.yaml", "symptoms.rules.yaml", "alertmanager.example.yaml"}
    for name, text in files.items():
        assert text.startswith("# ")
        assert yaml.safe_load(text)
        if name.endswith(".rules.yaml"):
            assert "do not edit" in text.splitlines()[1]


def test_multi_line_promql_is_written_as_a_literal_block(spec: SloSpec) -> None:
    text = build_alert_files(spec, AlertOptions())["chat-slo.rules.yaml"]
    assert "expr: |-\n      (\n        sum by (class)" in text


def test_every_runbook_url_points_at_a_committed_runbook(spec: SloSpec) -> None:
    from pathlib import Path

    runbooks = Path(__file__).resolve().parents[2] / "runbooks"
    opts = AlertOptions()
    rules = {
        a["labels"]["slokit_rule"]
        for doc in (slo_rule_file(spec, opts), symptom_rule_file(opts))
        for a in _alerts(doc)
    }
    missing = sorted(r for r in rules if not (runbooks / f"{r}.md").exists())
    assert missing == []
