"""Explain: decomposition, context from engine samples, causes, and what it cannot know."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from slokit.analysis.explain import (
    DOMINANT_RUNBOOK,
    Explanation,
    explain,
    explain_request,
    render_text,
)
from slokit.analysis.slo_spec import parse_spec
from slokit.errors import NotFound
from slokit.records import EngineSample, Finding, GpuSample, RequestFragment
from slokit.store.db import Store, open_store

T0 = 1_795_958_000.0
REPO = Path(__file__).resolve().parents[2]


def frag(
    rid: str,
    arrival: float,
    *,
    queue: float = 0.01,
    prefill: float = 0.05,
    decode: float = 1.0,
    frontend: float = 0.0,
    out: int = 101,
    replica: str = "pod-a",
    **kw: object,
) -> RequestFragment:
    ttft = queue + prefill
    return RequestFragment(
        request_id=rid,
        source="vllm",
        fragment_id=f"vllm:{rid}",
        replica=replica,
        arrival_ts=arrival,
        queue_s=queue,
        prefill_s=prefill,
        decode_s=decode,
        ttft_s=ttft,
        e2e_s=ttft + decode + frontend,
        prompt_tokens=200,
        output_tokens=out,
        **kw,  # type: ignore[arg-type]
    )


@pytest.fixture
def store() -> Iterator[Store]:
    with open_store(":memory:") as s:
        # 40 ordinary peers, then one request that queued 3 s behind a long queue at full KV.
        s.append_fragments([frag(f"p{i}", T0 + i) for i in range(40)])
        s.append_fragments([frag("slow", T0 + 30, queue=3.0)])
        s.append_engine_samples(
            [
                EngineSample(
                    ts=T0 + t,
                    replica="pod-a",
                    model="tiny",
                    running=8,
                    waiting=w,
                    kv_usage_ratio=kv,
                    preemptions_total=p,
                    prefix_cache_queries_total=1000 + 100 * t,
                    prefix_cache_hits_total=500 + 25 * t,
                )
                for t, w, kv, p in [
                    (0, 0, 0.3, 0),
                    (10, 1, 0.4, 0),
                    (20, 5, 0.8, 0),
                    (29, 37, 0.98, 1),
                    (31, 40, 0.99, 2),
                    (35, 20, 0.97, 3),
                ]
            ]
        )
        yield s


def test_unknown_request_raises_not_found(store: Store) -> None:
    with pytest.raises(NotFound):
        explain_request(store.reader(), "missing")


def test_components_and_shares_add_up_to_e2e(store: Store) -> None:
    doc = explain_request(store.reader(), "slow")
    c = doc["components"]
    assert c["queue_s"] == 3.0 and c["prefill_s"] == 0.05 and c["decode_s"] == 1.0
    assert c["e2e_s"] == pytest.approx(4.05)
    assert sum(c["shares"].values()) == pytest.approx(1.0, abs=1e-3)


def test_queue_dominant_request_names_queue_depth_and_kv_state(store: Store) -> None:
    doc = explain_request(store.reader(), "slow")
    assert doc["dominant"] == "queue"
    state = doc["context"]["replica_state_at_arrival"]
    assert (state["waiting"], state["running"], state["kv_usage_ratio"]) == (37, 8, 0.98)
    assert "behind 37 waiting requests on pod-a" in doc["cause"]
    assert "KV cache was 98% full" in doc["cause"]
    assert doc["runbook"] == "runbooks/queue_saturation.md"


def test_preemptions_during_life_come_from_counter_deltas(store: Store) -> None:
    doc = explain_request(store.reader(), "slow")  # arrival T0+30 (counter 1), finish T0+34.05
    assert doc["context"]["during"]["preemptions"] == 1  # 1 at T0+29 -> 2 at T0+31
    assert "1 preemption during its life" in doc["cause"]


def test_prefix_hit_ratio_is_the_windowed_counter_ratio(store: Store) -> None:
    doc = explain_request(store.reader(), "slow")
    assert doc["context"]["replica_state_at_arrival"]["prefix_hit_ratio"] == pytest.approx(0.25)


def test_slow_request_ranks_at_the_top_of_its_peers(store: Store) -> None:
    doc = explain_request(store.reader(), "slow")
    assert doc["context"]["peers"] == 41
    assert doc["context"]["percentile_rank"]["e2e_s"]["rank"] == pytest.approx(40.5 / 41)


def test_typical_request_gets_no_runbook(store: Store) -> None:
    doc = explain_request(store.reader(), "p3")
    assert doc["runbook"] is None and "typical for its peers" in doc["cause"]


def test_missing_sources_are_listed_not_guessed(store: Store) -> None:
    doc = explain_request(store.reader(), "slow")
    assert "no client record: client-side latency unknown" in doc["unknown"]
    assert any("no GPU samples for pod-a" in u for u in doc["unknown"])
    assert doc["components"]["client_s"] is None


def test_stale_engine_sample_is_a_telemetry_gap(store: Store) -> None:
    store.append_fragments([frag("late", T0 + 200)])
    doc = explain_request(store.reader(), "late")
    assert doc["context"]["replica_state_at_arrival"] is None
    assert any("telemetry gap" in u for u in doc["unknown"])


def test_client_time_is_what_the_client_waited_beyond_server_e2e(store: Store) -> None:
    store.append_fragments(
        [
            RequestFragment(
                "slow", "client", "client:slow", client_e2e_s=4.55, client_ttft_s=3.2, status="ok"
            )
        ]
    )
    doc = explain_request(store.reader(), "slow")
    assert doc["components"]["client_s"] == pytest.approx(0.5)


def test_active_findings_are_named_and_their_runbook_wins(store: Store) -> None:
    store.append_findings(
        [
            Finding(
                "kv_pressure",
                "critical",
                0.9,
                "pod-a",
                T0 + 25,
                T0 + 40,
                "KV 98% with 3 preemptions",
                {},
                "runbooks/kv_pressure.md",
            )
        ]
    )
    doc = explain_request(store.reader(), "slow")
    assert [f["rule"] for f in doc["findings"]] == ["kv_pressure"]
    assert doc["runbook"] == "runbooks/kv_pressure.md"


def test_gpu_state_at_arrival_is_reported(store: Store) -> None:
    store.append_gpu_samples(
        [
            GpuSample(
                ts=T0 + 29.5, node="n1", gpu="0", replica="pod-a", util_ratio=0.35, power_w=300.0
            )
        ]
    )
    doc = explain_request(store.reader(), "slow")
    assert doc["context"]["gpu_at_arrival"]["util_ratio"] == 0.35


def test_slo_verdict_uses_the_class_bounds(store: Store) -> None:
    spec = parse_spec(
        {
            "slokit": "v1",
            "service": "s",
            "classes": [{"name": "all", "good_when": {"ttft_ms": 1000}, "objective": 0.99}],
        }
    )
    doc = explain_request(store.reader(), "slow", spec=spec)
    assert doc["slo"]["good"] is False
    assert doc["slo"]["checks"]["ttft_ms"] == {"bound": 1000, "value": 3050.0, "ok": False}


def test_text_rendering_shows_cause_components_and_unknowns(store: Store) -> None:
    text = render_text(explain_request(store.reader(), "slow"))
    assert "cause: Queued 3.00 s" in text
    assert "queue" in text and "cannot know:" in text and "runbooks/queue_saturation.md" in text


def test_an_info_finding_is_context_not_the_runbook(store: Store) -> None:
    store.append_findings(
        [
            Finding(
                "telemetry_gap",
                "info",
                1.0,
                None,
                T0,
                T0 + 60,
                "no GPU telemetry",
                {},
                "runbooks/telemetry_gap.md",
            )
        ]
    )
    doc = explain_request(store.reader(), "slow")
    assert [f["rule"] for f in doc["findings"]] == ["telemetry_gap"]
    assert doc["runbook"] == "runbooks/queue_saturation.md"
    assert explain_request(store.reader(), "p3")["runbook"] is None


def _starved_api_server(rid: str, arrival: float) -> RequestFragment:
    """As recorded on real vLLM with its API server starved of CPU: TTFT 16 s of which
    0.5 ms queue and 2.65 s prefill; the rest went to the API server outside the engine."""
    return RequestFragment(
        request_id=rid,
        source="vllm",
        fragment_id=f"vllm:{rid}",
        replica="pod-a",
        arrival_ts=arrival,
        queue_s=0.0005,
        prefill_s=2.65,
        decode_s=0.4,
        ttft_s=16.0,
        e2e_s=17.4,
        prompt_tokens=200,
        output_tokens=20,
    )


def test_time_outside_the_engine_is_the_frontend_component(store: Store) -> None:
    store.append_fragments([_starved_api_server("starved", T0 + 32)])
    doc = explain_request(store.reader(), "starved")
    c = doc["components"]
    assert c["frontend_s"] == pytest.approx(17.4 - 0.0005 - 2.65 - 0.4)
    assert c["other_s"] == c["frontend_s"]  # the former name, kept as an alias
    assert c["shares"]["frontend"] == pytest.approx(14.3495 / 17.4, abs=1e-4)
    assert "other" not in c["shares"]
    assert sum(c["shares"].values()) == pytest.approx(1.0, abs=1e-3)


def test_a_request_mostly_outside_the_engine_is_frontend_bound(store: Store) -> None:
    store.append_fragments([_starved_api_server("starved", T0 + 32)])
    doc = explain_request(store.reader(), "starved")
    assert doc["dominant"] == "frontend"
    assert doc["runbook"] == "runbooks/frontend_bound.md"
    assert doc["cause"].startswith(
        "14.35 s (82% of E2E) was spent in vLLM's API server outside the engine (frontend: "
        "HTTP, tokenisation, detokenisation, streaming) on pod-a"
    )
    assert "components (dominant: frontend):" in render_text(doc)
    assert "  frontend    14349.5 ms   82%  ####" in render_text(doc)


def test_prefill_that_outweighs_the_frontend_stays_prefill(store: Store) -> None:
    store.append_fragments([frag("long-prompt", T0 + 33, prefill=3.0, frontend=1.0)])
    doc = explain_request(store.reader(), "long-prompt")
    assert doc["components"]["frontend_s"] == pytest.approx(1.0)
    assert doc["dominant"] == "prefill"
    assert doc["runbook"] == "runbooks/prefill_saturation.md"
    assert doc["cause"].startswith("Prefill took 3.00 s (60% of E2E) for a 200-token prompt")


def test_without_a_vllm_span_there_is_no_frontend_component(store: Store) -> None:
    store.append_fragments(
        [RequestFragment("only-client", "client", "client:only-client", client_e2e_s=9.0,
                         client_ttft_s=3.2, e2e_s=8.0, status="ok", arrival_ts=T0 + 20)]
    )  # fmt: skip
    doc = explain_request(store.reader(), "only-client")
    c = doc["components"]
    assert c["e2e_s"] == 8.0
    assert c["frontend_s"] is None and c["other_s"] is None  # never the whole E2E
    assert "frontend" not in c["shares"]
    assert doc["dominant"] == "client"
    assert "no vLLM span: queue/prefill/decode split unknown" in doc["unknown"]


def test_explain_is_typed_and_its_dict_is_the_document(store: Store) -> None:
    result = explain(store.reader(), "slow")
    assert isinstance(result, Explanation)
    assert result.dominant == "queue" and result.components.queue_s == 3.0
    assert result.context.replica_state_at_arrival is not None
    assert result.to_dict() == explain_request(store.reader(), "slow")


def test_text_of_an_older_document_shows_other_as_frontend(store: Store) -> None:
    """A sidecar from before frontend_s sends other_s only; the CLI still renders it."""
    store.append_fragments([_starved_api_server("starved", T0 + 32)])
    doc = explain_request(store.reader(), "starved")
    old = {**doc, "components": {k: v for k, v in doc["components"].items() if k != "frontend_s"}}
    old["components"]["shares"] = {
        ("other" if k == "frontend" else k): v for k, v in doc["components"]["shares"].items()
    }
    assert render_text(old) == render_text(doc)


def test_every_dominant_runbook_exists() -> None:
    assert DOMINANT_RUNBOOK["frontend"] == DOMINANT_RUNBOOK["client"] == "frontend_bound"
    for runbook in DOMINANT_RUNBOOK.values():
        assert (REPO / "runbooks" / f"{runbook}.md").is_file(), runbook


def _stored(rule: str, severity: str, replica: str | None, start: float, summary: str) -> Finding:
    return Finding(
        rule, severity, 0.9, replica, T0 + start, T0 + 60, summary, {},  # type: ignore[arg-type]
        f"runbooks/{rule}.md",
    )  # fmt: skip


def test_the_root_cause_of_a_queued_request_is_named_with_its_reason(store: Store) -> None:
    # The diagnosis stored the fleet's lost prefix hits and the queue they caused on pod-a.
    store.append_findings([
        _stored("queue_saturation", "warning", "pod-a", 20, "waiting peaked at 40"),
        _stored("prefix_affinity_loss", "warning", None, 10, "hit ratio 52% vs 83%"),
    ])  # fmt: skip
    doc = explain_request(store.reader(), "slow")
    root = doc["root_cause"]
    assert root["rule"] == "prefix_affinity_loss" and root["replica"] is None
    assert root["explains"] == "queue_saturation@pod-a"
    assert root["reason"].startswith("the fleet lost prefix-cache hits")
    assert doc["dominant"] == "queue"
    assert doc["cause"].startswith("Queued 3.00 s")
    assert " because the fleet lost prefix-cache hits" in doc["cause"]
    assert "(prefix_affinity_loss)" in doc["cause"]
    assert doc["runbook"] == "runbooks/prefix_affinity_loss.md"  # fix the cause, not the queue
    text = render_text(doc)
    assert "root cause: prefix_affinity_loss on fleet: hit ratio 52% vs 83%" in text


def test_an_unexplained_active_finding_is_its_own_root_cause(store: Store) -> None:
    store.append_findings([_stored("queue_saturation", "critical", "pod-a", 20, "waiting 40")])
    doc = explain_request(store.reader(), "slow")
    assert doc["root_cause"]["id"] == "queue_saturation@pod-a"
    assert doc["root_cause"]["explains"] is None and doc["root_cause"]["reason"] is None
    assert " because " not in doc["cause"]


def test_a_cause_on_another_replica_or_an_info_finding_is_no_root_cause(store: Store) -> None:
    store.append_findings([
        _stored("gpu_throttle", "critical", "pod-b", 0, "clock 45%"),
        _stored("telemetry_gap", "info", None, 0, "no GPU samples"),
    ])  # fmt: skip
    doc = explain_request(store.reader(), "slow")
    assert doc["root_cause"] is None
