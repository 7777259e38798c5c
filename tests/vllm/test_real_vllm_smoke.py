"""Real vLLM end to end: request ids, /metrics and OTLP llm_request spans over http/protobuf.

One server (tiny model, traces to the in-test receiver) answers five requests, each with its
own X-Request-Id; every test checks one thing that the rest of slokit relies on.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from slokit.lab.otlp_capture import OtlpHttpCapture, attributes_dict
from slokit.lab.vllm_server import VllmServer

pytestmark = pytest.mark.vllm

POD = "pod-a"
SERVICE = "vllm-smoke"


@dataclass(frozen=True)
class Sent:
    request_id: str  # the X-Request-Id we sent
    kind: str  # "completion" or "chat"
    max_tokens: int
    response_ids: tuple[str, ...]  # one per body, or per SSE chunk when streaming
    usage: dict[str, int]


@dataclass(frozen=True)
class Exchange:
    server: VllmServer
    capture: OtlpHttpCapture
    sent: tuple[Sent, ...]


def _post(client: httpx.Client, path: str, request_id: str, body: dict[str, Any]) -> Any:
    response = client.post(path, json=body, headers={"X-Request-Id": request_id})
    response.raise_for_status()
    return response.json()


def _stream(
    client: httpx.Client, path: str, request_id: str, body: dict[str, Any]
) -> list[dict[str, Any]]:
    chunks: list[dict[str, Any]] = []
    with client.stream("POST", path, json=body, headers={"X-Request-Id": request_id}) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line.removeprefix("data: ")))
    return chunks


@pytest.fixture(scope="module")
def exchange(smoke_server: VllmServer, otlp_http_capture: OtlpHttpCapture) -> Exchange:
    server = smoke_server
    tag = uuid.uuid4().hex[:8]
    sent: list[Sent] = []
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        for i, max_tokens in enumerate((8, 16), start=1):
            rid = f"smoke-{tag}-c{i}"
            body = _post(
                client,
                "/v1/completions",
                rid,
                {
                    "model": "tiny",
                    "prompt": f"count {i} 2 3",
                    "max_tokens": max_tokens,
                    "ignore_eos": True,
                },
            )
            sent.append(Sent(rid, "completion", max_tokens, (body["id"],), body["usage"]))

        rid = f"smoke-{tag}-s1"
        chunks = _stream(
            client,
            "/v1/completions",
            rid,
            {
                "model": "tiny",
                "prompt": "stream 7 8 9",
                "max_tokens": 12,
                "ignore_eos": True,
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        )
        usage = chunks[-1]["usage"] if chunks and chunks[-1].get("usage") else {}
        sent.append(Sent(rid, "completion", 12, tuple(c["id"] for c in chunks), usage))

        for i, max_tokens in enumerate((6, 10), start=1):
            rid = f"smoke-{tag}-h{i}"
            body = _post(
                client,
                "/v1/chat/completions",
                rid,
                {
                    "model": "tiny",
                    "messages": [{"role": "user", "content": f"hello {i}"}],
                    "max_tokens": max_tokens,
                    "ignore_eos": True,
                },
            )
            sent.append(Sent(rid, "chat", max_tokens, (body["id"],), body["usage"]))
    return Exchange(server, otlp_http_capture, tuple(sent))


def _llm_request_spans(exchange: Exchange) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """gen_ai.request.id -> (resource attributes, span attributes) for our requests' spans."""
    ours = {s.request_id for s in exchange.sent}

    def mine(spans: list[tuple[dict[str, Any], Any]]) -> dict[str, tuple[dict[str, Any], Any]]:
        found = {}
        for resource, span in spans:
            attributes = attributes_dict(span.attributes)
            span_id = str(attributes.get("gen_ai.request.id", ""))
            if span.name == "llm_request" and any(rid in span_id for rid in ours):
                found[span_id] = (resource, attributes)
        return found

    spans = exchange.capture.wait_for(lambda spans: len(mine(spans)) >= len(ours))
    return mine(spans)


def test_completion_response_id_is_cmpl_and_the_request_id(exchange: Exchange) -> None:
    for sent in exchange.sent:
        if sent.kind == "completion":
            assert set(sent.response_ids) == {f"cmpl-{sent.request_id}"}


def test_chat_response_id_is_chatcmpl_and_the_request_id(exchange: Exchange) -> None:
    for sent in exchange.sent:
        if sent.kind == "chat":
            assert sent.response_ids == (f"chatcmpl-{sent.request_id}",)


def test_streaming_completion_ends_with_a_usage_chunk(exchange: Exchange) -> None:
    (streamed,) = [s for s in exchange.sent if len(s.response_ids) > 1]
    assert streamed.usage["completion_tokens"] == streamed.max_tokens


def test_ignore_eos_makes_every_answer_exactly_max_tokens_long(exchange: Exchange) -> None:
    assert [s.usage["completion_tokens"] for s in exchange.sent] == [
        s.max_tokens for s in exchange.sent
    ]


def test_metrics_expose_the_engine_state_slokit_reads(exchange: Exchange) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(exchange.server.base_url + "/metrics", timeout=10).text
    samples = {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:num_preemptions_total",
        "vllm:prefix_cache_queries_total",
        "vllm:cache_config_info",
        "vllm:time_to_first_token_seconds_count",
        "vllm:e2e_request_latency_seconds_count",
    ):
        assert name in samples, name
    # The server may be shared with other tests, so ours are a lower bound.
    assert samples["vllm:generation_tokens_total"] >= sum(s.max_tokens for s in exchange.sent)


def test_llm_request_spans_carry_the_request_ids(exchange: Exchange) -> None:
    span_ids = set(_llm_request_spans(exchange))
    expected = {
        f"cmpl-{s.request_id}-0" if s.kind == "completion" else f"chatcmpl-{s.request_id}"
        for s in exchange.sent
    }
    assert span_ids == expected


def test_llm_request_span_usage_matches_the_response_usage(exchange: Exchange) -> None:
    spans = _llm_request_spans(exchange)
    for sent in exchange.sent:
        (attributes,) = [a for span_id, (_, a) in spans.items() if sent.request_id in span_id]
        assert attributes["gen_ai.usage.prompt_tokens"] == sent.usage["prompt_tokens"]
        assert attributes["gen_ai.usage.completion_tokens"] == sent.usage["completion_tokens"]
        assert attributes["gen_ai.request.max_tokens"] == sent.max_tokens


def test_llm_request_spans_name_the_replica_from_otel_resource_attributes(
    exchange: Exchange,
) -> None:
    for resource, _ in _llm_request_spans(exchange).values():
        assert resource["service.name"] == SERVICE
        assert resource["k8s.pod.name"] == POD
