"""vLLM's ``llm_request`` span -> a fragment: every attribute of the mapping table, read one by
one and with its alias."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import KeyValue

from slokit.records import FRAGMENT_FIELDS, RequestFragment
from slokit.sources._spans_vllm import _VLLM_ATTRS, vllm_fragment
from slokit.sources.otlp import parse_spans

START_S = 1_795_958_000.0


def _span(attrs: dict[str, Any]) -> Any:
    """An ``llm_request`` span carrying ``gen_ai.request.id`` and ``attrs``, as the decoder
    reads it (the map view of a protobuf body)."""
    msg = ExportTraceServiceRequest()
    span = msg.resource_spans.add().scope_spans.add().spans.add()
    span.name, span.trace_id, span.span_id = "llm_request", b"\x01" * 16, b"\x02" * 8
    span.start_time_unix_nano = int(START_S * 1e9)
    for key, value in {"gen_ai.request.id": "cmpl-r1-0", **attrs}.items():
        kv = KeyValue(key=key)
        if isinstance(value, str):
            kv.value.string_value = value
        elif isinstance(value, int):
            kv.value.int_value = value
        else:
            kv.value.double_value = value
        span.attributes.append(kv)
    return parse_spans(msg.SerializeToString()).resource_spans[0].scope_spans[0].spans[0]


def _value_for(field: str) -> Any:
    return 0.25 if field.endswith("_s") else "m-1" if field == "model" else 17


def _facts(frag: RequestFragment) -> dict[str, Any]:
    """The fields the span's attributes gave (not those every vLLM fragment has)."""
    fixed = {"request_id", "source", "fragment_id", "trace_id", "replica", "arrival_ts"}
    return {
        f: v for f, v in zip(FRAGMENT_FIELDS, frag, strict=True) if v is not None and f not in fixed
    }


@pytest.mark.parametrize("key", list(_VLLM_ATTRS))
def test_each_attribute_of_the_table_gives_its_field_and_nothing_else(key: str) -> None:
    field = _VLLM_ATTRS[key]
    frag = vllm_fragment(_span({key: _value_for(field)}), "pod-a", START_S + 60)
    assert _facts(frag) == {field: _value_for(field)}


def test_the_fields_every_vllm_fragment_has() -> None:
    frag = vllm_fragment(_span({}), "pod-a", START_S + 60)
    assert (frag.request_id, frag.source, frag.replica) == ("r1", "vllm", "pod-a")
    assert (frag.fragment_id, frag.trace_id) == ("vllm:" + "02" * 8, "01" * 16)
    assert frag.arrival_ts == START_S and frag.status is None


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (a, b)
        for a in _VLLM_ATTRS
        for b in _VLLM_ATTRS
        if a != b and _VLLM_ATTRS[a] == _VLLM_ATTRS[b]
    ],
)
def test_of_two_names_for_one_field_the_first_in_the_table_wins(first: str, second: str) -> None:
    field = _VLLM_ATTRS[first]
    winner = first if list(_VLLM_ATTRS).index(first) < list(_VLLM_ATTRS).index(second) else second
    values = {first: _value_for(field), second: _value_for(field)}
    values[winner] = {"model": "m-2"}.get(field, 0.5 if field.endswith("_s") else 23)
    frag = vllm_fragment(_span(values), None, START_S + 60)
    assert getattr(frag, field) == values[winner]


def test_a_value_of_another_type_is_read_as_the_fields_type() -> None:
    frag = vllm_fragment(
        _span(
            {
                "gen_ai.latency.e2e": 3,
                "gen_ai.usage.prompt_tokens": "12",
                "gen_ai.response.model": 7,
            }
        ),
        None,
        START_S + 60,
    )
    assert (frag.e2e_s, frag.prompt_tokens, frag.model) == (3.0, 12, "7")
