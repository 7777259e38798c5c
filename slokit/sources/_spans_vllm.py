"""vLLM's ``llm_request`` span (scope ``vllm.tracing.otel``) -> a ``vllm`` fragment.

Every ``gen_ai.latency.*`` and ``gen_ai.usage.*`` attribute becomes a field; the span's start
time is the arrival. A span without ``gen_ai.request.id``, with an empty or malformed trace
id, or with an implausible value is rejected (:class:`SpanRejected`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from slokit.ids import checked_request_id
from slokit.records import RequestFragment
from slokit.sources._span_values import (
    INT_FIELDS,
    INT_LIMITS,
    STATUS_ERROR,
    ZERO_TRACE,
    SpanRejected,
)
from slokit.sources.validate import (
    FUTURE_SLACK_S,
    MAX_DURATION_S,
    MIN_TS,
    duration_problem,
    int_problem,
    timestamp_problem,
)

if TYPE_CHECKING:
    from opentelemetry.proto.trace.v1.trace_pb2 import Span

#: vLLM llm_request attribute -> RequestFragment field.
_VLLM_ATTRS: dict[str, str] = {
    "gen_ai.latency.time_in_queue": "queue_s",
    "gen_ai.latency.time_to_first_token": "ttft_s",
    "gen_ai.latency.e2e": "e2e_s",
    "gen_ai.latency.time_in_model_prefill": "prefill_s",
    "gen_ai.latency.time_in_model_decode": "decode_s",
    "gen_ai.latency.time_in_model_inference": "inference_s",
    "gen_ai.usage.prompt_tokens": "prompt_tokens",
    "gen_ai.usage.completion_tokens": "output_tokens",
    "gen_ai.usage.input_tokens": "prompt_tokens",
    "gen_ai.usage.output_tokens": "output_tokens",
    "gen_ai.usage.cached_tokens": "cached_tokens",
    "gen_ai.request.max_tokens": "max_tokens",
    "gen_ai.response.model": "model",
    "gen_ai.request.model": "model",
}

_DURATION_FIELDS = frozenset(f for f in _VLLM_ATTRS.values() if f.endswith("_s"))


def vllm_fragment(span: Span, replica: str | None, now: float) -> RequestFragment:
    """The fragment of an ``llm_request`` span; :class:`SpanRejected` when it cannot be one."""
    # The hot path of ingest: one pass over the attributes, no per-attribute function calls
    # for durations (the common case).
    trace_id = span.trace_id
    if len(trace_id) != 16 or trace_id == ZERO_TRACE:
        raise SpanRejected("empty or malformed trace id")
    values: dict[str, Any] = {}
    raw_id = None
    for kv in span.attributes:
        key = kv.key
        if key == "gen_ai.request.id":
            raw_id = kv.value.string_value
            continue
        fname = _VLLM_ATTRS.get(key)
        if fname is None:
            continue
        v = kv.value
        which = v.WhichOneof("value")
        x: Any
        if which == "double_value":
            x = v.double_value
        elif which == "int_value":
            x = v.int_value
        elif which == "string_value":
            x = v.string_value
        else:
            continue
        if fname in _DURATION_FIELDS:
            try:
                d = float(x)
            except ValueError:
                continue  # a malformed value is a missing fact, not a guess
            if not 0.0 <= d <= MAX_DURATION_S:  # also NaN
                raise SpanRejected(f"{key} {duration_problem(d)}")
            values[fname] = d
        elif fname in INT_FIELDS:
            if which == "int_value" and 0 <= x <= INT_LIMITS[fname]:
                values[fname] = x  # the common case
                continue
            if which == "string_value":
                try:
                    x = int(x)
                except ValueError:
                    continue
            if why := int_problem(x, INT_LIMITS[fname]):
                raise SpanRejected(f"{key} {why}")
            values[fname] = int(x)
        else:
            values[fname] = str(x)
    if not raw_id:
        raise SpanRejected("llm_request span without gen_ai.request.id")
    request_id = checked_request_id(raw_id, from_span=True)
    start_ns = span.start_time_unix_nano
    arrival = start_ns / 1e9 if start_ns else None
    if arrival is not None and not MIN_TS <= arrival <= now + FUTURE_SLACK_S:
        raise SpanRejected(f"span start time {timestamp_problem(arrival, now)}")
    return RequestFragment(
        request_id=request_id,
        source="vllm",
        fragment_id="vllm:" + span.span_id.hex(),
        trace_id=trace_id.hex(),
        replica=replica,
        arrival_ts=arrival,
        status="error" if span.status.code == STATUS_ERROR else None,
        **values,
    )
