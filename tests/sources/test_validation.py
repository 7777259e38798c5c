"""Implausible values are caught before the store, by one rule per kind of input.

Spans (OTLP) and request records (files) with such a value are rejected whole, with a reason;
the other spans of the export are kept. Scraped samples (vLLM, DCGM, metric files) keep the
rest of the scrape: the odd value becomes a missing fact and is counted by field.
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from slokit.errors import BadInput
from slokit.sources.dcgm import parse_dcgm_metrics
from slokit.sources.files import parse_load_jsonl, parse_metrics_file
from slokit.sources.otlp import DecodedTraces, decode_traces
from slokit.sources.vllm_metrics import parse_vllm_metrics
from slokit.store.db import open_store

NOW = 1_795_958_400.0  # the receiving clock, injected
START_NS = int((NOW - 60) * 1e9)
TRACE = bytes(range(1, 17))

INF, NAN = math.inf, math.nan


def _set(span: Any, key: str, value: Any) -> None:
    kv = span.attributes.add()
    kv.key = key
    if isinstance(value, bool):
        kv.value.bool_value = value
    elif isinstance(value, int):
        kv.value.int_value = value
    elif isinstance(value, float):
        kv.value.double_value = value
    else:
        kv.value.string_value = value


GOOD_VLLM = {
    "gen_ai.latency.time_in_queue": 0.01,
    "gen_ai.latency.time_to_first_token": 0.2,
    "gen_ai.latency.e2e": 1.5,
    "gen_ai.latency.time_in_model_prefill": 0.05,
    "gen_ai.latency.time_in_model_decode": 1.2,
    "gen_ai.usage.prompt_tokens": 100,
    "gen_ai.usage.completion_tokens": 50,
    "gen_ai.request.max_tokens": 64,
}


def vllm_export(*overrides: dict[str, Any], start_ns: int = START_NS) -> bytes:
    """One llm_request span per override dict (request ids cmpl-v<i>-0); an override value of
    None drops the attribute; ``_start_ns`` in an override sets that span's start."""
    msg = ExportTraceServiceRequest()
    spans = msg.resource_spans.add().scope_spans.add().spans
    for i, ov in enumerate(overrides):
        span = spans.add()
        span.name, span.kind, span.trace_id = "llm_request", 2, TRACE
        span.span_id = (i + 1).to_bytes(8, "big")
        span.start_time_unix_nano = ov.get("_start_ns", start_ns)
        attrs = {"gen_ai.request.id": f"cmpl-v{i}-0", **GOOD_VLLM, **ov}
        for k, v in attrs.items():
            if v is not None and not k.startswith("_"):
                _set(span, k, v)
    return msg.SerializeToString()


def http_export(kind: int, *overrides: dict[str, Any]) -> bytes:
    """One gateway (kind 2) or client (kind 3) span per override dict (ids h<i>)."""
    msg = ExportTraceServiceRequest()
    spans = msg.resource_spans.add().scope_spans.add().spans
    for i, ov in enumerate(overrides):
        span = spans.add()
        span.name, span.kind, span.trace_id = "POST /v1/completions", kind, TRACE
        span.span_id = (i + 1).to_bytes(8, "big")
        span.start_time_unix_nano = ov.get("_start_ns", START_NS)
        span.end_time_unix_nano = ov.get("_end_ns", START_NS + 1_500_000_000)
        attrs = {
            "http.request.header.x-request-id": f"h{i}",
            "http.response.status_code": 200,
            "gen_ai.usage.output_tokens": 50,
            **ov,
        }
        for k, v in attrs.items():
            if v is not None and not k.startswith("_"):
                _set(span, k, v)
    return msg.SerializeToString()


def decode(body: bytes) -> DecodedTraces:
    return decode_traces(body, now=NOW)


# -- vLLM llm_request spans: each hostile value rejects its span alone ----------------------

HOSTILE_VLLM = [
    ("gen_ai.latency.e2e", NAN, "gen_ai.latency.e2e is not finite"),
    ("gen_ai.latency.time_to_first_token", INF, "gen_ai.latency.time_to_first_token is not finite"),
    ("gen_ai.latency.time_in_queue", -INF, "gen_ai.latency.time_in_queue is not finite"),
    ("gen_ai.latency.time_in_model_prefill", 1e308,
     "gen_ai.latency.time_in_model_prefill is out of range"),
    ("gen_ai.latency.e2e", 8 * 86400.0, "gen_ai.latency.e2e is out of range"),
    ("gen_ai.latency.time_in_model_decode", -0.5,
     "gen_ai.latency.time_in_model_decode is negative"),
    ("gen_ai.latency.e2e", "nan", "gen_ai.latency.e2e is not finite"),
    ("gen_ai.usage.completion_tokens", 1e30, "gen_ai.usage.completion_tokens is out of range"),
    ("gen_ai.usage.completion_tokens", INF, "gen_ai.usage.completion_tokens is not finite"),
    ("gen_ai.usage.prompt_tokens", NAN, "gen_ai.usage.prompt_tokens is not finite"),
    ("gen_ai.usage.prompt_tokens", -1, "gen_ai.usage.prompt_tokens is negative"),
    ("gen_ai.usage.prompt_tokens", 12.5, "gen_ai.usage.prompt_tokens is not a whole number"),
    ("gen_ai.usage.prompt_tokens", 10**9 + 1, "gen_ai.usage.prompt_tokens is out of range"),
    ("gen_ai.usage.prompt_tokens", "99999999999999999999999",
     "gen_ai.usage.prompt_tokens is out of range"),
    ("gen_ai.request.max_tokens", 1e19, "gen_ai.request.max_tokens is out of range"),
    ("_start_ns", 2**64 - 1, "span start time more than a day ahead"),
    ("_start_ns", int((NOW + 86400 + 60) * 1e9), "span start time more than a day ahead"),
    ("_start_ns", 5 * 10**9, "span start time before 2000"),
    ("gen_ai.request.id", " ", "request id empty once normalized"),
    ("gen_ai.request.id", "\t", "request id empty once normalized"),
    ("gen_ai.request.id", "cmpl--0", "request id empty once normalized"),
    ("gen_ai.request.id", "chatcmpl-", "request id empty once normalized"),
    ("gen_ai.request.id", "cmpl- -0", "request id empty once normalized"),
    ("gen_ai.request.id", "a\nb", "request id has control characters"),
    ("gen_ai.request.id", "x" * 513, "request id longer than 512 characters"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("key", "value", "reason"), HOSTILE_VLLM, ids=[f"{k}={v!r}"[:60] for k, v, _ in HOSTILE_VLLM]
)
def test_a_hostile_vllm_value_rejects_its_span_alone(key: str, value: Any, reason: str) -> None:
    decoded = decode(vllm_export({}, {key: value}, {}))
    assert decoded.rejection_reasons == {reason: 1}
    assert [f.request_id for f in decoded.fragments] == ["v0", "v2"]


PLAUSIBLE_VLLM = [
    ("gen_ai.latency.e2e", 0.0, "e2e_s", 0.0),
    ("gen_ai.latency.e2e", 5e-324, "e2e_s", 5e-324),  # a subnormal is a (tiny) number
    ("gen_ai.latency.e2e", 7 * 86400.0, "e2e_s", 7 * 86400.0),
    ("gen_ai.usage.completion_tokens", 400.0, "output_tokens", 400),
    ("gen_ai.usage.completion_tokens", "400", "output_tokens", 400),
    ("gen_ai.request.max_tokens", 2**63 - 1, "max_tokens", 2**63 - 1),
    ("_start_ns", int((NOW + 86400 - 60) * 1e9), "arrival_ts", NOW + 86400 - 60),
    ("_start_ns", 0, "arrival_ts", None),  # unset: a missing fact
    ("gen_ai.latency.e2e", 2, "e2e_s", 2.0),  # a latency sent as an int, or as text
    ("gen_ai.latency.e2e", "0.5", "e2e_s", 0.5),
    ("gen_ai.usage.completion_tokens", 0, "output_tokens", 0),
    ("gen_ai.response.model", "m-1", "model", "m-1"),
    ("gen_ai.response.model", 7, "model", "7"),
    ("gen_ai.latency.e2e", "fast", "e2e_s", None),  # wrong type: a missing fact
    ("gen_ai.latency.e2e", True, "e2e_s", None),
    ("gen_ai.usage.prompt_tokens", "many", "prompt_tokens", None),
    ("gen_ai.usage.prompt_tokens", True, "prompt_tokens", None),
]  # fmt: skip


@pytest.mark.parametrize(
    ("key", "value", "field", "expected"),
    PLAUSIBLE_VLLM,
    ids=[f"{k}={v!r}"[:60] for k, v, _, _ in PLAUSIBLE_VLLM],
)
def test_a_plausible_or_untyped_vllm_value_keeps_its_span(
    key: str, value: Any, field: str, expected: Any
) -> None:
    decoded = decode(vllm_export({key: value}))
    assert decoded.rejected == 0
    (frag,) = decoded.fragments
    got = getattr(frag, field)
    assert got == pytest.approx(expected) if isinstance(expected, float) else got == expected


def test_the_future_bound_follows_the_injected_clock() -> None:
    body = vllm_export({"_start_ns": int((NOW + 3 * 86400) * 1e9)})
    assert decode_traces(body, now=NOW).rejected == 1
    assert decode_traces(body, now=NOW + 3 * 86400).rejected == 0


# -- gateway and client spans ----------------------------------------------------------------

HOSTILE_HTTP = [
    ({"http.response.status_code": 99999}, "http.response.status_code is out of range"),
    ({"http.response.status_code": 42}, "http.response.status_code is out of range"),
    ({"http.response.status_code": 1e30}, "http.response.status_code is out of range"),
    ({"http.response.status_code": INF}, "http.response.status_code is not finite"),
    ({"gen_ai.usage.output_tokens": -5}, "gen_ai.usage.output_tokens is negative"),
    ({"gen_ai.usage.output_tokens": 2**62}, "gen_ai.usage.output_tokens is out of range"),
    ({"slokit.client.ttft_s": "nan"}, "slokit.client.ttft_s is not finite"),
    ({"slokit.client.ttft_s": "-1e999"}, "slokit.client.ttft_s is not finite"),
    ({"slokit.client.ttft_s": -0.1}, "slokit.client.ttft_s is negative"),
    ({"_end_ns": START_NS - 1}, "span end before its start"),
    ({"_end_ns": START_NS + 8 * 86400 * 10**9}, "span duration is out of range"),
    ({"_start_ns": 2**64 - 2, "_end_ns": 2**64 - 1}, "span start time more than a day ahead"),
    ({"http.request.header.x-request-id": "chatcmpl-"}, "request id empty once normalized"),
    ({"http.request.header.x-request-id": "\x00"}, "request id has control characters"),
]  # fmt: skip


@pytest.mark.parametrize("kind", [2, 3], ids=["gateway", "client"])
@pytest.mark.parametrize(
    ("override", "reason"), HOSTILE_HTTP, ids=[str(o)[:60] for o, _ in HOSTILE_HTTP]
)
def test_a_hostile_http_span_value_rejects_its_span_alone(
    kind: int, override: dict[str, Any], reason: str
) -> None:
    decoded = decode(http_export(kind, {}, override, {}))
    assert decoded.rejection_reasons == {reason: 1}
    assert [f.request_id for f in decoded.fragments] == ["h0", "h2"]


def test_an_http_status_of_the_wrong_type_is_a_missing_fact() -> None:
    (frag,) = decode(http_export(2, {"http.response.status_code": True})).fragments
    assert frag.http_status is None and frag.status == "ok"  # it has a duration


# -- JSON nesting ------------------------------------------------------------------------------


def _nested_attribute(depth: int) -> bytes:
    value: dict[str, Any] = {"stringValue": "x"}
    for _ in range(depth):
        value = {"arrayValue": {"values": [value]}}
    span = {"traceId": TRACE.hex(), "spanId": "0102030405060708", "name": "llm_request",
            "attributes": [{"key": "gen_ai.request.id", "value": {"stringValue": "cmpl-a-0"}},
                           {"key": "deep", "value": value}]}  # fmt: skip
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}).encode()


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 2000 + b"]" * 2000,
        b'{"resourceSpans":' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        b'{"a":' * 400 + b"1" + b"}" * 400,
        _nested_attribute(300),
    ],
    ids=["list-2000", "list-100000", "object-400", "attribute-300"],
)
def test_deeply_nested_json_is_bad_input(body: bytes) -> None:
    with pytest.raises(BadInput, match="nested"):
        decode_traces(body, "application/json")


def test_moderately_nested_attribute_values_still_decode() -> None:
    decoded = decode_traces(_nested_attribute(20), "application/json", now=NOW)
    assert [f.request_id for f in decoded.fragments] == ["a"]


# -- scraped samples: a bad value is a missing fact, counted; the scrape is kept ---------------

VLLM_SCRAPE = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{model_name="m"}} 3
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{model_name="m"}} {kv}
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{{model_name="m"}} {pre}
# TYPE vllm:request_success_total counter
vllm:request_success_total{{finished_reason="stop",model_name="m"}} 10
vllm:request_success_total{{finished_reason="length",model_name="m"}} {succ}
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{{le="1.0",model_name="m"}} {bucket}
vllm:e2e_request_latency_seconds_bucket{{le="+Inf",model_name="m"}} 4
vllm:e2e_request_latency_seconds_sum{{model_name="m"}} 2.5
vllm:e2e_request_latency_seconds_count{{model_name="m"}} 4
"""
ODD = ["NaN", "+Inf", "-Inf", "1e308", "-3"]


def _vllm(**values: str) -> tuple[Any, Counter[str]]:
    text = VLLM_SCRAPE.format(**{"kv": "0.5", "pre": "7", "succ": "2", "bucket": "3", **values})
    invalid: Counter[str] = Counter()
    (es,) = parse_vllm_metrics(text, ts=NOW, replica="r", invalid=invalid)
    return es, invalid


@pytest.mark.parametrize("value", ODD)
def test_an_odd_counter_value_is_missing_and_counted(value: str) -> None:
    es, invalid = _vllm(pre=value)
    assert es.preemptions_total is None
    assert invalid == {"preemptions_total": 1}
    assert (es.running, es.kv_usage_ratio, es.request_success_total) == (3, 0.5, 12)


@pytest.mark.parametrize("value", [*ODD, "1.5"])
def test_an_odd_kv_usage_is_missing_and_counted(value: str) -> None:
    es, invalid = _vllm(kv=value)
    assert es.kv_usage_ratio is None
    assert invalid == {"kv_usage_ratio": 1}
    assert es.preemptions_total == 7


@pytest.mark.parametrize("value", ODD)
def test_one_odd_success_reason_leaves_the_total_unknown(value: str) -> None:
    es, invalid = _vllm(succ=value)
    assert es.request_success_total is None
    assert es.request_success_by_reason == {"stop": 10}
    assert invalid == {"request_success_total": 1}


@pytest.mark.parametrize("value", ODD)
def test_a_histogram_with_an_odd_bucket_is_left_out_and_counted(value: str) -> None:
    es, invalid = _vllm(bucket=value)
    assert "e2e_s" not in es.histograms
    assert invalid == {"histogram:e2e_s": 1}


def test_plausible_values_count_nothing() -> None:
    es, invalid = _vllm(kv="1.0")
    assert (es.kv_usage_ratio, es.preemptions_total, "e2e_s" in es.histograms) == (1.0, 7, True)
    assert invalid == {}


DCGM = """\
# TYPE DCGM_FI_DEV_POWER_USAGE gauge
DCGM_FI_DEV_POWER_USAGE{{gpu="0",UUID="GPU-a"}} {power}
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="GPU-a"}} {util}
# TYPE DCGM_FI_DEV_GPU_TEMP gauge
DCGM_FI_DEV_GPU_TEMP{{gpu="0",UUID="GPU-a"}} 61
"""


@pytest.mark.parametrize("value", ODD)
def test_an_odd_dcgm_value_is_missing_and_counted(value: str) -> None:
    invalid: Counter[str] = Counter()
    (g,) = parse_dcgm_metrics(DCGM.format(power=value, util="50"), ts=NOW, invalid=invalid)
    assert g.power_w is None and g.util_ratio == 0.5 and g.temperature_c == 61
    assert invalid == {"power_w": 1}


def test_a_utilization_over_100_percent_is_missing_and_counted() -> None:
    invalid: Counter[str] = Counter()
    (g,) = parse_dcgm_metrics(DCGM.format(power="300", util="250"), ts=NOW, invalid=invalid)
    assert (g.util_ratio, g.power_w, invalid) == (None, 300.0, {"util_ratio": 1})


def test_a_dcgm_blank_is_missing_but_not_counted() -> None:
    invalid: Counter[str] = Counter()
    (g,) = parse_dcgm_metrics(DCGM.format(power="140737488355328", util="50"), ts=NOW,
                              invalid=invalid)  # fmt: skip
    assert g.power_w is None and invalid == {}


# -- files ------------------------------------------------------------------------------------


def test_a_history_sample_with_an_odd_value_keeps_the_file() -> None:
    text = (
        "# TYPE vllm:num_preemptions counter\n"
        f'vllm:num_preemptions_total{{model_name="m"}} 1 {NOW - 20}\n'
        f'vllm:num_preemptions_total{{model_name="m"}} +Inf {NOW - 10}\n'
        "# EOF\n"
    )
    invalid: Counter[str] = Counter()
    recs = parse_metrics_file(text, name="h.om", instance="r", invalid=invalid, now=NOW)
    assert [e.preemptions_total for e in recs.engine_samples] == [1.0, None]
    assert invalid == {"preemptions_total": 1}


@pytest.mark.parametrize(("ts", "why"), [(18_000_000_000, "more than a day ahead"),
                                         (100, "before 2000")])  # fmt: skip
def test_a_history_sample_at_an_implausible_time_is_bad_input(ts: float, why: str) -> None:
    text = f'vllm:num_requests_waiting{{model_name="m"}} 5 {ts}\n# EOF\n'
    with pytest.raises(BadInput, match=rf"^h\.om: .*timestamp {why}"):
        parse_metrics_file(text, name="h.om", instance="r", now=NOW)


LOAD = {"request_id": "a1", "send_ts": NOW - 5, "ttft_s": 0.2, "e2e_s": 1.0, "output_tokens": 5}


@pytest.mark.parametrize(
    ("override", "why"),
    [
        ({"e2e_s": 1e308}, "e2e_s is out of range"),
        ({"ttft_s": -0.2}, "client_ttft_s is negative"),
        ({"send_ts": 18_000_000_000}, "arrival_ts more than a day ahead"),
        ({"output_tokens": 10**12}, "output_tokens is out of range"),
        ({"http_status": 1000}, "http_status is out of range"),
        ({"request_id": " "}, "request id empty once normalized"),
        ({"request_id": "chatcmpl-"}, "request id empty once normalized"),
    ],
    ids=["e2e-1e308", "negative-ttft", "year-2540", "tokens", "http-1000", "blank", "chatcmpl-"],
)
def test_an_implausible_load_record_is_bad_input_naming_its_line(
    override: dict[str, Any], why: str
) -> None:
    text = json.dumps(LOAD) + "\n" + json.dumps({**LOAD, "request_id": "a2", **override}) + "\n"
    with pytest.raises(BadInput, match=rf"^f\.jsonl:2: .*{why}"):
        parse_load_jsonl(text, name="f.jsonl", now=NOW)


# -- slokit ingest otlp on a file with a poison span --------------------------------------------


def test_ingest_otlp_keeps_a_files_valid_spans_and_reports_the_poison(tmp_path: Path) -> None:
    from slokit.cli import main

    now_ns = time.time_ns()  # the CLI judges start times by the wall clock
    path = tmp_path / "export.pb"
    path.write_bytes(
        vllm_export(
            {},
            {"gen_ai.latency.e2e": NAN},
            {},
            {"gen_ai.request.id": "cmpl--0"},
            start_ns=now_ns - 60 * 10**9,
        )
    )
    db = tmp_path / "s.duckdb"
    res = CliRunner().invoke(main, ["ingest", "otlp", str(path), "--db", str(db)])
    assert res.exit_code == 0, res.output
    assert "Traceback" not in res.output
    assert "2 spans rejected" in res.output
    assert "1 gen_ai.latency.e2e is not finite" in res.output
    assert "1 request id empty once normalized" in res.output
    with open_store(db, read_only=True) as store:
        ids = {r[0] for r in store.con.execute("SELECT request_id FROM requests").fetchall()}
        rejections = store.con.execute("SELECT sum(count) FROM ingest_rejections").fetchone()
    assert ids == {"v0", "v2"}
    assert rejections == (2,)
