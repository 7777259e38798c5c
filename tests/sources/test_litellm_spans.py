"""LiteLLM's proxy in front of vLLM: its OpenTelemetry spans join slokit's records.

The fixtures are a trimmed real capture (``tests/fixtures/gateway/README.md``): LiteLLM 1.108.7's
proxy (``callbacks: ["otel"]``, OTLP/HTTP) in front of ``slokit sim``, four chat completions
(streaming or not, with an ``x-request-id`` or not) and one the upstream failed (HTTP 500), and
the simulator's vLLM-shaped ``llm_request`` spans of the same requests. LiteLLM does not pass
``traceparent`` upstream by default, so the two sides share no trace: they join by id, the
``gen_ai.response.id`` of LiteLLM's ``litellm_request`` span being the upstream's response id.

Expected values are read from the fixture's JSON independently of slokit's decoder.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from slokit.analysis.explain import explain_request
from slokit.records import RequestFragment
from slokit.sources.otlp import decode_traces
from slokit.store.db import open_store
from slokit.store.reader import LocalReader

GATEWAY = Path(__file__).resolve().parents[1] / "fixtures" / "gateway"
PROXY = GATEWAY / "litellm-1.108.7-proxy.json"
UPSTREAM = GATEWAY / "litellm-1.108.7-upstream-sim.json"
#: The simulator's pod (its resource's ``k8s.pod.name``): the replica of every served request.
ENGINE = "sim-vllm-0"
#: LiteLLM's call id of the request the upstream failed (``x-litellm-call-id``).
FAILED = "695a7251-317b-4dda-ac22-5d96d1a26ef1"


def _spans(path: Path) -> list[dict[str, Any]]:
    doc = json.loads(path.read_text())
    return [span for rs in doc["resourceSpans"] for ss in rs["scopeSpans"] for span in ss["spans"]]


def _attrs(span: dict[str, Any]) -> dict[str, Any]:
    return {a["key"]: next(iter(a["value"].values())) for a in span.get("attributes", [])}


def _strip(response_id: str) -> str:
    return response_id.removeprefix("chatcmpl-")


def _calls() -> dict[str, dict[str, Any]]:
    """LiteLLM's ``litellm_request`` spans by the request id they name."""
    return {
        _strip(_attrs(s)["gen_ai.response.id"]): s
        for s in _spans(PROXY)
        if s["name"] == "litellm_request"
    }


def _now(path: Path) -> float:
    """A clock just after the capture, so its start times are plausible."""
    return max(int(s["endTimeUnixNano"]) for s in _spans(path)) / 1e9 + 60


def _decode(path: Path) -> list[RequestFragment]:
    decoded = decode_traces(path.read_bytes(), "application/json", now=_now(path))
    assert decoded.rejected == 0, decoded.rejection_reasons
    return decoded.fragments


def test_the_fixture_holds_the_shape_the_mapping_reads() -> None:
    calls = _calls()
    assert len(calls) == 5 and FAILED in calls
    for span in calls.values():
        assert span["kind"] == "SPAN_KIND_INTERNAL" and "litellm.call_id" in _attrs(span)
    upstream = {_strip(_attrs(s)["gen_ai.request.id"]) for s in _spans(UPSTREAM)}
    assert upstream == set(calls) - {FAILED}
    # No traceparent upstream: the two sides share no trace id.
    assert not {s["traceId"] for s in _spans(PROXY)} & {s["traceId"] for s in _spans(UPSTREAM)}


def test_litellm_call_spans_become_gateway_fragments() -> None:
    spans = _spans(PROXY)
    decoded = decode_traces(PROXY.read_bytes(), "application/json", now=_now(PROXY))
    calls = _calls()
    frags = {f.request_id: f for f in decoded.fragments}
    assert set(frags) == set(calls)
    # Every other span (LiteLLM's "Received Proxy Server Request", its FastAPI spans, the
    # "Failed Proxy Server Request" marker) names no request: skipped, never rejected.
    assert decoded.rejected == 0 and decoded.skipped == len(spans) - len(calls)
    for rid, frag in frags.items():
        span, attrs = calls[rid], _attrs(calls[rid])
        start, end = int(span["startTimeUnixNano"]), int(span["endTimeUnixNano"])
        assert frag.source == "gateway"
        assert frag.fragment_id == f"gateway:{span['spanId']}"
        assert frag.trace_id == span["traceId"]
        # The proxy is never a replica: the span names no upstream engine.
        assert frag.replica is None
        assert frag.arrival_ts == pytest.approx(start / 1e9)
        assert frag.gateway_e2e_s == pytest.approx((end - start) / 1e9)
        assert frag.model == attrs["gen_ai.request.model"] == "sim-7b"
        assert frag.max_tokens == int(attrs["gen_ai.request.max_tokens"])
        if rid == FAILED:
            assert (frag.status, frag.http_status, frag.error_type) == (
                "error",
                int(attrs["http.response.status_code"]),
                attrs["error.type"],
            )
            assert frag.http_status == 500 and frag.output_tokens is None
        else:
            assert (frag.status, frag.http_status, frag.error_type) == ("ok", None, None)
            assert frag.prompt_tokens == int(attrs["gen_ai.usage.input_tokens"])
            assert frag.output_tokens == int(attrs["gen_ai.usage.output_tokens"])
            # LiteLLM sends the list as a JSON string: its first reason.
            assert attrs["gen_ai.response.finish_reasons"] == '["length"]'
            assert frag.finish_reason == "length"


def test_with_the_upstream_spans_they_merge_into_one_record_per_request() -> None:
    calls = _calls()
    upstream = {_strip(_attrs(s)["gen_ai.request.id"]): s for s in _spans(UPSTREAM)}
    with open_store(":memory:", clock=lambda: _now(PROXY)) as store:
        store.append_fragments(_decode(PROXY))
        store.append_fragments(_decode(UPSTREAM))
        rows = store.con.execute(
            "SELECT request_id, replica, status, http_status, error_type, e2e_s, "
            "gateway_e2e_s, output_tokens, finish_reason, sources FROM requests"
        ).fetchall()
        reader = LocalReader(store.con)
        docs = {rid: explain_request(reader, rid) for rid in calls}
    assert len(rows) == len(calls)
    by_id = {r[0]: r for r in rows}
    for rid in upstream:
        _, replica, status, http, error, e2e, gw_e2e, out, reason, sources = by_id[rid]
        assert (replica, status, http, error, sources) == (
            ENGINE,
            "ok",
            None,
            None,
            ["gateway", "vllm"],
        )
        assert e2e == pytest.approx(float(_attrs(upstream[rid])["gen_ai.latency.e2e"]))
        assert out == int(_attrs(upstream[rid])["gen_ai.usage.completion_tokens"])
        assert reason == "length"
        # LiteLLM's call brackets vLLM's: the gateway's own time is what it adds.
        assert gw_e2e > e2e
        gateway = docs[rid]["gateway"]
        assert gateway["gateway_e2e_s"] == pytest.approx(gw_e2e)
        assert gateway["gateway_s"] == pytest.approx(gw_e2e - e2e)
        assert docs[rid]["replica"] == ENGINE
    _, replica, status, http, error, e2e, gw_e2e, _, _, sources = by_id[FAILED]
    # Failed upstream: a gateway-only record under LiteLLM's call id, no replica.
    assert (replica, status, http, error, e2e, sources) == (
        None,
        "error",
        500,
        "InternalServerError",
        None,
        ["gateway"],
    )
    assert docs[FAILED]["gateway"]["http_status"] == 500


def test_other_internal_spans_stay_skipped() -> None:
    """Only the span LiteLLM marks with ``litellm.call_id`` is read: an INTERNAL span that
    names a response id but not LiteLLM's mark is nobody's gateway."""
    doc = json.loads(PROXY.read_text())
    for rs in doc["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for span in ss["spans"]:
                span["attributes"] = [
                    a for a in span.get("attributes", []) if a["key"] != "litellm.call_id"
                ]
    decoded = decode_traces(json.dumps(doc).encode(), "application/json", now=_now(PROXY))
    assert decoded.fragments == [] and decoded.rejected == 0


@pytest.mark.parametrize(
    "reasons",
    ["[" * 100_000, "[" * 900 + "]" * 900, '["' + "x" * 10 + '"', "[1e999]", "[]"],
    ids=["deep-unclosed", "deep-closed", "unclosed", "huge-number", "empty"],
)
def test_a_hostile_finish_reasons_string_costs_its_span_nothing(reasons: str) -> None:
    """The list in a string that LiteLLM sends, as anyone may send it: read if it can be,
    kept as sent if not, never an error for the export (it once was a RecursionError)."""
    doc = json.loads(PROXY.read_text())
    span = next(
        s
        for rs in doc["resourceSpans"]
        for ss in rs["scopeSpans"]
        for s in ss["spans"]
        if any(a["key"] == "gen_ai.response.finish_reasons" for a in s["attributes"])
    )
    for a in span["attributes"]:
        if a["key"] == "gen_ai.response.finish_reasons":
            a["value"] = {"stringValue": reasons}
    decoded = decode_traces(json.dumps(doc).encode(), "application/json", now=_now(PROXY))
    assert decoded.rejected == 0
    assert len(decoded.fragments) == len(_calls())
