"""Any OTLP attribute value, of any type, reaches the store or a rejection, never a crash.

Spans shaped like vLLM's ``llm_request`` and like gateway/client spans carry attribute
values drawn from every AnyValue type: any float (NaN, infinities, subnormals, 1e308), any
int64, strings with control characters, bytes, arrays and key-value lists nested deep,
under the keys slokit reads and others. The properties:

- ``decode_traces`` raises nothing but BadInput, accounts for every span (fragment,
  skipped or rejected), and what it yields the store appends: every fragment is kept.
- the sidecar's HTTP receiver answers 200 or 400 (never 5xx), and every span it
  acknowledged (not rejected) is in the store.
"""

from __future__ import annotations

import base64
import itertools
import json
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from google.protobuf import json_format
from google.protobuf.json_format import MessageToDict
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from sidecar_harness import StartSidecar

from slokit.errors import BadInput
from slokit.sources.otlp import DecodedTraces, decode_traces
from slokit.store.db import Store, open_store

KEYS = [
    "gen_ai.request.id", "slokit.request_id", "http.request.header.x-request-id",
    "gen_ai.response.id", "gen_ai.latency.time_in_queue", "gen_ai.latency.time_to_first_token",
    "gen_ai.latency.e2e", "gen_ai.latency.time_in_model_prefill",
    "gen_ai.latency.time_in_model_decode", "gen_ai.latency.time_in_model_inference",
    "gen_ai.usage.prompt_tokens", "gen_ai.usage.completion_tokens", "gen_ai.usage.input_tokens",
    "gen_ai.usage.output_tokens", "gen_ai.usage.cached_tokens", "gen_ai.request.max_tokens",
    "gen_ai.response.model", "gen_ai.request.model", "gen_ai.response.finish_reasons",
    "http.response.status_code", "http.status_code", "error.type", "slokit.slo_class",
    "slokit.task_id", "slokit.tenant", "slokit.client.ttft_s",
    "gen_ai.server.time_to_first_token", "k8s.pod.name", "unrelated",
]  # fmt: skip

NOW_S = time.time()
#: Start times that are far from every bound, or far past one (never near it: the receiver and
#: the test's own decoding read the clock at different instants).
STARTS_NS = [0, int((NOW_S - 60) * 1e9), 2**64 - 1, 5 * 10**9, int((NOW_S - 40 * 86400) * 1e9)]

_floats = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True),
    st.sampled_from([math.nan, math.inf, -math.inf, 1e308, -1e308, 5e-324, 0.0, -0.0, 1.5]),
)
_ints = st.one_of(
    st.integers(-(2**63), 2**63 - 1), st.sampled_from([0, 1, 200, 429, -1, 2**63 - 1, 10**9 + 1])
)
_strings = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["", " ", "\t", "cmpl--0", "chatcmpl-", "cmpl-a-0", "nan", "inf", "-1e999",
                     "1e30", "400", "99999999999999999999999", "x" * 600, "a\x00b"]),
)  # fmt: skip
_leaf = st.one_of(
    _strings.map(lambda v: ("string_value", v)),
    _ints.map(lambda v: ("int_value", v)),
    _floats.map(lambda v: ("double_value", v)),
    st.booleans().map(lambda v: ("bool_value", v)),
    st.binary(max_size=8).map(lambda v: ("bytes_value", v)),
)
_value = st.recursive(
    _leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3).map(lambda v: ("array", v)),
        st.lists(st.tuples(st.sampled_from(KEYS), inner), max_size=3).map(lambda v: ("kv", v)),
    ),
    max_leaves=8,
)
#: Nesting past protobuf's recursion limit of 100 (the decoder refuses it: BadInput).
_deep = st.integers(1, 130).map(lambda n: ("deep", n))


def _fill(av: AnyValue, v: tuple[str, Any]) -> None:
    kind, x = v
    if kind == "array":
        av.array_value.SetInParent()
        for item in x:
            _fill(av.array_value.values.add(), item)
    elif kind == "kv":
        av.kvlist_value.SetInParent()
        for key, item in x:
            kv = av.kvlist_value.values.add()
            kv.key = key
            _fill(kv.value, item)
    elif kind == "deep":
        for _ in range(x):
            av = av.array_value.values.add()
        av.string_value = "deep"
    else:
        setattr(av, kind, x)


_TRACE = bytes(range(1, 17))
_span = st.fixed_dictionaries(
    {
        "name": st.sampled_from(["llm_request", "POST /v1/completions", ""]),
        "kind": st.integers(0, 5),
        "trace": st.one_of(st.just(_TRACE), st.just(_TRACE), st.binary(max_size=20)),
        "start": st.sampled_from(STARTS_NS),
        "duration_ns": st.sampled_from([0, 1_500_000_000, -1_000, 8 * 86400 * 10**9]),
        # the request id most spans carry (a plain one, a hostile one, or another type)
        "id": st.one_of(
            st.integers(0, 10**6).map(lambda n: ("string_value", f"cmpl-q{n}-0")),
            st.integers(0, 10**6).map(lambda n: ("string_value", f"q{n}")),
            _value,
        ),
        "attrs": st.lists(st.tuples(st.sampled_from(KEYS), _value), max_size=8),
        "deep": st.one_of(st.none(), st.none(), st.none(), _deep),
        "status": st.integers(0, 2),
    }
)
_export = st.tuples(
    st.lists(st.tuples(st.sampled_from(KEYS), _value), max_size=2),  # resource attributes
    st.lists(_span, min_size=1, max_size=4),
)
_span_ids = itertools.count(1)


def build(resource: list[Any], spans: list[dict[str, Any]]) -> ExportTraceServiceRequest:
    """The export, with span ids unique across the whole run."""
    msg = ExportTraceServiceRequest()
    rs = msg.resource_spans.add()
    for key, v in resource:
        kv = rs.resource.attributes.add()
        kv.key = key
        _fill(kv.value, v)
    out = rs.scope_spans.add().spans
    for d in spans:
        span = out.add()
        span.name, span.kind, span.trace_id = d["name"], d["kind"], d["trace"]
        span.span_id = next(_span_ids).to_bytes(8, "big")
        span.start_time_unix_nano = d["start"]
        end = d["start"] + d["duration_ns"]
        span.end_time_unix_nano = end if 0 <= end < 2**64 else 0
        span.status.code = d["status"]
        id_key = "gen_ai.request.id" if d["name"] == "llm_request" else "slokit.request_id"
        extra = [(id_key, d["id"])] + ([("deep", d["deep"])] if d["deep"] else [])
        for key, v in [*extra, *d["attrs"]]:
            kv = span.attributes.add()
            kv.key = key
            _fill(kv.value, v)
    return msg


def otlp_json(msg: ExportTraceServiceRequest) -> bytes:
    """OTLP/JSON as the spec writes it (hex ids)."""
    doc = MessageToDict(msg)
    for rs in doc.get("resourceSpans", []):
        for ss in rs.get("scopeSpans", []):
            for span in ss.get("spans", []):
                for k in ("traceId", "spanId"):
                    if k in span:
                        span[k] = base64.b64decode(span[k]).hex()
    return json.dumps(doc).encode()


def serialize(msg: ExportTraceServiceRequest, as_json: bool) -> tuple[bytes, str]:
    if as_json:
        return otlp_json(msg), "application/json"
    return msg.SerializeToString(), "application/x-protobuf"


def decode_or_none(body: bytes, ct: str) -> DecodedTraces | None:
    """decode_traces, with BadInput (and only BadInput) as None."""
    try:
        return decode_traces(body, ct)
    except BadInput:
        return None


def stored(cur: Any, fragment_ids: list[str]) -> set[str]:
    if not fragment_ids:
        return set()
    marks = ", ".join("?" * len(fragment_ids))
    sql = f"SELECT fragment_id FROM request_fragments WHERE fragment_id IN ({marks})"
    return {r[0] for r in cur.execute(sql, fragment_ids).fetchall()}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    with open_store(tmp_path_factory.mktemp("fuzz") / "fuzz.duckdb") as s:
        yield s


@settings(max_examples=150, deadline=None)
@given(export=_export, as_json=st.booleans())
def test_decoded_attributes_of_any_type_reach_the_store_or_a_rejection(
    store: Store, export: tuple[list[Any], list[dict[str, Any]]], as_json: bool
) -> None:
    body, ct = serialize(build(*export), as_json)
    decoded = decode_or_none(body, ct)
    event("bad input" if decoded is None else f"fragments {min(len(decoded.fragments), 2)}+")
    if decoded is None:
        return
    event(f"rejected {min(decoded.rejected, 2)}+")
    assert decoded.spans == decoded.skipped + decoded.rejected + len(decoded.fragments)
    assert sum(decoded.rejection_reasons.values()) == decoded.rejected
    store.append_fragments(decoded.fragments)  # raises nothing
    ids = [f.fragment_id for f in decoded.fragments]
    assert stored(store.con, ids) == set(ids)


def test_the_http_receiver_keeps_every_span_it_acknowledges(
    start_sidecar: StartSidecar, tmp_path: Path
) -> None:
    sc = start_sidecar()
    client = httpx.Client(timeout=30)

    @settings(max_examples=100, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
    @given(export=_export, as_json=st.booleans())
    def check(export: tuple[list[Any], list[dict[str, Any]]], as_json: bool) -> None:
        body, ct = serialize(build(*export), as_json)
        resp = client.post(sc.otlp, content=body, headers={"Content-Type": ct})
        assert resp.status_code in (200, 400), (resp.status_code, resp.text[:300])
        expected = decode_or_none(body, ct)  # what the receiver was given to keep
        if resp.status_code == 400:
            assert expected is None
            return
        assert expected is not None
        out = ExportTraceServiceResponse()
        if as_json:
            json_format.Parse(resp.content, out)
        else:
            out.ParseFromString(resp.content)
        event(f"rejected {min(out.partial_success.rejected_spans, 2)}+")
        event(f"fragments {min(len(expected.fragments), 2)}+")
        assert out.partial_success.rejected_spans == expected.rejected
        ids = [f.fragment_id for f in expected.fragments]
        cur = sc.committed().cursor()
        try:
            assert stored(cur, ids) == set(ids)  # acknowledged is kept
        finally:
            cur.close()

    try:
        check()
    finally:
        client.close()
    assert httpx.get(f"{sc.api}/readyz").status_code == 200
