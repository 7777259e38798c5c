"""Causal links between findings (slokit.analysis.causality) and the root-cause headline.

Each physical chain links two findings when the evidence says the cause moved the effect;
not across replicas, not when the effect started first, not on co-occurrence alone.
"""

from __future__ import annotations

from typing import Any

import pytest

from slokit.analysis.causality import analyse, chain_text, finding_ids
from slokit.analysis.chains import CHAINS
from slokit.analysis.diagnose import Diagnosis, render_text
from slokit.records import Finding, Severity

T0 = 1_700_000_000.0


def _f(
    rule: str,
    replica: str | None = None,
    *,
    severity: Severity = "warning",
    start: float = 0.0,
    end: float = 120.0,
    confidence: float = 0.8,
    **evidence: Any,
) -> Finding:
    return Finding(
        rule, severity, confidence, replica, T0 + start, T0 + end, f"{rule} summary",
        evidence, f"runbooks/{rule}.md",
    )  # fmt: skip


_TTFT = {"baseline": {"prefill_mean": 0.1}, "episode": {"prefill_mean": 0.2}}
_PREFIX = {
    "hit_ratio_baseline": 0.83,
    "hit_ratio_after": 0.52,
    "extra_prefill_tokens": 50_000,
    "scale_out": True,
    "per_replica": {"pod-a": {"baseline": 0.83, "after": 0.4}},
}
_KV = {"kv_usage_peak": 0.99, "kv_usage_mean": 0.95, "preemptions": 40.0,
       "preemptions_per_request": 0.2}  # fmt: skip
_QUEUE = {**_TTFT, "waiting_peak": 120.0, "waiting_baseline_peak": 2.0}
_KNEE = {"arrival_rate_first": 1.0, "arrival_rate_last": 4.0, "capacity_req_s": 2.0}

#: (cause, effect) with the evidence that links them; one per chain of CHAINS.
LINKED: list[tuple[Finding, Finding]] = [
    (_f("prefix_affinity_loss", **_PREFIX), _f("beyond_knee", start=30, **_KNEE)),
    (_f("prefix_affinity_loss", **_PREFIX), _f("queue_saturation", "pod-a", start=30, **_QUEUE)),
    (_f("prefix_affinity_loss", **_PREFIX), _f("prefill_saturation", "pod-a", **_TTFT)),
    (_f("prefix_affinity_loss", **_PREFIX), _f("kv_pressure", "pod-a", start=5, **_KV)),
    (_f("kv_pressure", "pod-a", **_KV), _f("decode_saturation", "pod-a", tpot_ratio=2.0)),
    (_f("kv_pressure", "pod-a", **_KV), _f("queue_saturation", "pod-a", **_QUEUE)),
    (_f("gpu_throttle", "pod-a", clock_ratio=0.45, tpot_p50_ratio=1.4),
     _f("decode_saturation", "pod-a", tpot_ratio=1.6)),
    (_f("gpu_throttle", "pod-a", clock_ratio=0.45, tpot_p50_ratio=1.4),
     _f("queue_saturation", "pod-a", **_QUEUE)),
    (_f("gpu_throttle", "pod-a", clock_ratio=0.45, tpot_p50_ratio=1.4),
     _f("prefill_saturation", "pod-a", **_TTFT)),
    (_f("gpu_throttle", "pod-a", clock_ratio=0.45), _f("beyond_knee", start=10, **_KNEE)),
    (_f("error_burst", "pod-a", end=60, errors=300), _f("beyond_knee", start=20, **_KNEE)),
    (_f("gpu_xid", "pod-a", xids=[79], error_ratio=0.0, fleet_error_ratio=0.38),
     _f("error_burst", errors=48)),
    (_f("spec_decode_low_acceptance", "pod-a", acceptance_rate=0.2,
        acceptance_rate_baseline=0.7, tokens_per_step=1.3),
     _f("decode_saturation", "pod-a", tpot_ratio=1.5)),
    (_f("beyond_knee", **_KNEE), _f("queue_saturation", "pod-a", start=20, **_QUEUE)),
    (_f("queue_saturation", "pod-a", tpot_p50_ratio=1.8, **_QUEUE),
     _f("decode_saturation", "pod-a", start=5, arrival_ratio=11.6, batch_ratio=1.7)),
]  # fmt: skip


def _ids(pair: tuple[Finding, Finding]) -> str:
    return f"{pair[0].rule}->{pair[1].rule}"


def test_every_chain_has_a_linked_example() -> None:
    assert {(c.rule, e.rule) for c, e in LINKED} == {(c.cause, c.effect) for c in CHAINS}


@pytest.mark.parametrize("pair", LINKED, ids=_ids)
def test_each_chain_links_with_its_evidence(pair: tuple[Finding, Finding]) -> None:
    cause, effect = pair
    out = analyse([effect, cause])
    eff, cau = out.findings
    assert [c["id"] for c in eff.caused_by] == [cau.id]
    assert cau.explains == [eff.id]
    assert eff.caused_by[0]["reason"] and "\n" not in eff.caused_by[0]["reason"]
    assert out.root_causes == [cau.id]


@pytest.mark.parametrize("pair", LINKED, ids=_ids)
def test_no_link_when_the_effect_started_first(pair: tuple[Finding, Finding]) -> None:
    cause, effect = pair
    late = _f(cause.rule, cause.replica, start=effect.start_ts - T0 + 60, end=200,
              **cause.evidence)  # fmt: skip
    assert analyse([late, effect]).links == []


@pytest.mark.parametrize(
    "pair", [p for p in LINKED if p[0].replica and p[1].replica], ids=_ids
)  # fmt: skip
def test_no_link_across_replicas(pair: tuple[Finding, Finding]) -> None:
    cause, effect = pair
    other = _f(effect.rule, "pod-b", start=effect.start_ts - T0, **effect.evidence)
    assert analyse([cause, other]).links == []


@pytest.mark.parametrize("pair", LINKED, ids=_ids)
def test_co_occurrence_without_the_evidence_is_no_link(pair: tuple[Finding, Finding]) -> None:
    cause, effect = pair
    bare = _f(cause.rule, cause.replica, start=cause.start_ts - T0)
    assert analyse([bare, effect]).links == []
    # Stored findings carry no evidence: there scope and timing decide (strict=False).
    assert len(analyse([bare, effect], strict=False).links) == 1


def test_evidence_against_the_link_refuses_it() -> None:
    queue = _f("queue_saturation", "pod-a", start=30, **_QUEUE)
    # pod-a kept its hits: the fleet's loss did not slow it
    kept = {**_PREFIX, "per_replica": {"pod-a": {"baseline": 0.83, "after": 0.85}}}
    assert analyse([_f("prefix_affinity_loss", **kept), queue]).links == []
    # a handful of preemptions with a KV pool not full does not cap the batch
    light = {"kv_usage_mean": 0.6, "preemptions": 5.0, "preemptions_per_request": 0.03}
    assert analyse([_f("kv_pressure", "pod-a", **light), queue]).links == []
    # the batch grew with arrivals flat: slower requests grew it, not the backlog
    decode = _f("decode_saturation", "pod-a", arrival_ratio=1.0, batch_ratio=1.7)
    backlog = _f("queue_saturation", "pod-a", tpot_p50_ratio=1.8, **_QUEUE)
    assert analyse([backlog, decode]).links == []
    # the xid came with no failed requests
    xid = _f("gpu_xid", "pod-a", error_ratio=0.0)
    assert analyse([xid, _f("error_burst", "pod-a", errors=9)]).links == []


def test_an_info_finding_explains_nothing() -> None:
    kv = _f("kv_pressure", "pod-a", severity="info", **_KV)
    queue = _f("queue_saturation", "pod-a", severity="critical", **_QUEUE)
    out = analyse([kv, queue])
    assert out.links == [] and out.root_causes == ["queue_saturation@pod-a"]


def test_the_scale_out_case_names_the_lost_prefix_hits_and_caps_its_consequences() -> None:
    knee = _f("beyond_knee", severity="critical", start=30, confidence=0.9, **_KNEE)
    prefix = _f("prefix_affinity_loss", **_PREFIX)
    kv = _f("kv_pressure", "pod-a", start=40, kv_usage_mean=0.7, preemptions=5.0,
            preemptions_per_request=0.03)  # fmt: skip
    out = analyse([knee, prefix, kv])
    knee2, prefix2, kv2 = out.findings
    assert out.root_causes == ["prefix_affinity_loss"]
    assert sorted(prefix2.explains) == ["beyond_knee", "kv_pressure@pod-a"]
    # the consequence is never above its cause; its own severity stays in the evidence
    assert knee2.severity == "warning" and knee2.evidence["own_severity"] == "critical"
    assert "own_severity" not in kv2.evidence  # not lowered: nothing to keep
    assert knee.severity == "critical"  # the input is not changed
    reason = knee2.caused_by[0]["reason"]
    assert reason.startswith("the fleet lost prefix-cache hits (83% -> 52%) after the")


def test_severity_caps_follow_the_chain() -> None:
    xid = _f("gpu_xid", "pod-a", severity="warning", xids=[79], error_ratio=0.3)
    errors = _f("error_burst", "pod-a", severity="critical", end=60, errors=300)
    knee = _f("beyond_knee", severity="critical", start=20, **_KNEE)
    out = analyse([knee, errors, xid])
    assert [f.severity for f in out.findings] == ["warning", "warning", "warning"]
    assert out.root_causes == ["gpu_xid@pod-a"]
    text = chain_text(out.root_causes, {f.id or "": f.explains for f in out.findings},
                      {f.id or "": f.rule for f in out.findings})  # fmt: skip
    assert text == (
        "gpu_xid@pod-a -> requests fail -> error_burst@pod-a -> client retries -> "
        "arrival rate up -> beyond_knee"
    )


def test_root_causes_are_ranked_and_at_most_two() -> None:
    a = _f("queue_saturation", "pod-a", severity="critical", start=20, **_QUEUE)
    b = _f("gpu_xid", "pod-b", severity="critical", start=10, xids=[79], error_ratio=0.0)
    c = _f("decode_saturation", "pod-c", severity="critical", start=0, confidence=0.5)
    d = _f("frontend_bound", "pod-d", severity="warning", start=0)
    out = analyse([a, b, c, d])
    # severity first, then the start
    assert out.root_causes == ["decode_saturation@pod-c", "gpu_xid@pod-b"]
    # a cause that explains more comes first at the same severity
    throttle = _f("gpu_throttle", "pod-a", severity="critical", start=10, clock_ratio=0.5,
                  tpot_p50_ratio=1.3)  # fmt: skip
    out = analyse([a, b, c, throttle])
    assert out.root_causes == ["gpu_throttle@pod-a", "decode_saturation@pod-c"]
    # the second only when as severe as the first; none below warning
    assert analyse([c, d]).root_causes == ["decode_saturation@pod-c"]
    assert analyse([_f("telemetry_gap", severity="info")]).root_causes == []


def test_ids_number_repeats_of_a_rule_and_replica_by_start() -> None:
    late = _f("queue_saturation", "pod-a", start=60)
    early = _f("queue_saturation", "pod-a", start=0)
    fleet = _f("beyond_knee")
    assert finding_ids([late, fleet, early]) == [
        "queue_saturation@pod-a#2",
        "beyond_knee",
        "queue_saturation@pod-a",
    ]


def _doc(findings: list[Finding]) -> dict[str, Any]:
    out = analyse(findings)
    window = {
        "since": "2023-11-14T22:13:20.000Z",
        "until": "2023-11-14T22:15:20.000Z",
        "bucket_s": 10.0,
        "baseline": {"since": "x", "until": "y", "from": "window start"},
    }
    coverage = {"sources": {}, "rules": {}, "ran": [], "withheld": {}, "failed": {}}
    return Diagnosis(window, out.findings, coverage, T0, T0 + 120, out.root_causes).to_json()


def test_the_text_opens_with_the_root_cause_and_its_chain() -> None:
    knee = _f("beyond_knee", severity="critical", start=30, **_KNEE)
    prefix = _f("prefix_affinity_loss", **_PREFIX)
    gap = _f("telemetry_gap", severity="info")
    lines = render_text(_doc([knee, gap, prefix])).splitlines()
    assert lines[0] == "Root cause: prefix_affinity_loss on fleet: prefix_affinity_loss summary"
    assert lines[1] == "prefix_affinity_loss -> prefill tokens up -> capacity down -> beyond_knee"
    body = lines[lines.index("") + 1 :]
    first = body.index(next(ln for ln in body if ln.startswith("WARNING  prefix_affinity_loss")))
    assert body[first + 1].startswith("    WARNING  beyond_knee ")  # capped, under its cause
    assert body[first + 2].startswith("        caused by prefix_affinity_loss: the fleet lost")
    assert body[first + 3 : first + 6] == ["", "independent findings:", body[first + 5]]
    assert body[first + 5].startswith("INFO     telemetry_gap")


def test_two_root_causes_make_a_plus_headline() -> None:
    a = _f("queue_saturation", "pod-a", severity="critical", **_QUEUE)
    b = _f("gpu_xid", "pod-b", severity="critical", xids=[79], error_ratio=0.0)
    lines = render_text(_doc([a, b])).splitlines()
    assert lines[0] == "Root cause: queue_saturation on pod-a + gpu_xid on pod-b"
    assert lines[1] == ""  # no chain: neither explains anything


def test_no_root_cause_says_so_and_an_old_document_has_no_headline() -> None:
    doc = _doc([])
    assert render_text(doc).splitlines()[0] == "Root cause: none (no finding at warning or above)"
    del doc["root_causes"]
    assert render_text(doc).startswith("window ")


def test_the_html_report_lists_root_causes_first_and_consequences_under_them() -> None:
    from slokit.analysis.report_html import _findings_table

    def row(rule: str, severity: str, replica: str | None, start: float) -> dict[str, Any]:
        return {"rule": rule, "severity": severity, "confidence": 0.8, "replica": replica,
                "start": T0 + start, "end": T0 + 120, "summary": f"{rule} s",
                "runbook": f"runbooks/{rule}.md"}  # fmt: skip

    # as the store returns them: most severe first, no links, no evidence
    html = _findings_table([
        row("beyond_knee", "warning", None, 30),
        row("telemetry_gap", "info", None, 0),
        row("prefix_affinity_loss", "warning", None, 0),
    ])  # fmt: skip
    order = [html.index(r) for r in ("prefix_affinity_loss</b> (root cause)", "&#8627; beyond_knee",
                                     "telemetry_gap")]  # fmt: skip
    assert order == sorted(order)
    assert "title='caused by: the fleet lost prefix-cache hits" in html
