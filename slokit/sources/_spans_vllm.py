"""vLLM's ``llm_request`` span (scope ``vllm.tracing.otel``) -> a ``vllm`` fragment.

Every ``gen_ai.latency.*`` and ``gen_ai.usage.*`` attribute becomes a field; the span's start
time is the arrival. A span without ``gen_ai.request.id``, with an empty or malformed trace
id, or with an implausible value is rejected (:class:`SpanRejected`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from slokit.ids import checked_request_id
from slokit.records import FRAGMENT_FIELDS, RequestFragment
from slokit.sources._otlp_map import MapSpan
from slokit.sources._span_values import (
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
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue

#: vLLM llm_request attribute -> RequestFragment field, in the order vllm_fragment reads them
#: (of two names for one field, the first that gives a value wins; tests/sources/test_spans_vllm.py
#: holds the function to this table).
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

_DURATION, _INT, _TEXT = 0, 1, 2
_REQUEST_ID = "gen_ai.request.id"
_POS = {name: i for i, name in enumerate(FRAGMENT_FIELDS)}
#: A vLLM fragment's fields before its span is read: ``source`` set, every fact missing.
_TEMPLATE: list[Any] = [None] * len(FRAGMENT_FIELDS)
_TEMPLATE[_POS["source"]] = "vllm"
_ID, _FRAGMENT_ID, _TRACE_ID = _POS["request_id"], _POS["fragment_id"], _POS["trace_id"]
_REPLICA, _ARRIVAL, _STATUS = _POS["replica"], _POS["arrival_ts"], _POS["status"]
_QUEUE, _TTFT, _E2E = _POS["queue_s"], _POS["ttft_s"], _POS["e2e_s"]
_PREFILL, _DECODE, _INFERENCE = _POS["prefill_s"], _POS["decode_s"], _POS["inference_s"]
_PROMPT, _OUTPUT, _CACHED = _POS["prompt_tokens"], _POS["output_tokens"], _POS["cached_tokens"]
_MAX_TOKENS, _MODEL = _POS["max_tokens"], _POS["model"]
_TOKENS_MAX, _MAX_TOKENS_MAX = INT_LIMITS["prompt_tokens"], INT_LIMITS["max_tokens"]
_new = tuple.__new__


def vllm_fragment(span: MapSpan, replica: str | None, now: float) -> RequestFragment:
    """The fragment of an ``llm_request`` span (its attributes a map:
    :mod:`slokit.sources._otlp_map`), reading :data:`_VLLM_ATTRS`; :class:`SpanRejected`
    when it cannot be one."""
    # The hot path of ingest, written out attribute by attribute (a loop over the table cost
    # 0.8 µs of 7 a span): one map lookup per attribute, its value read as the type its field
    # expects (a double for a latency, an int for a token count) without asking the oneof
    # which it holds; only a zero, empty or out-of-range read (the type's default: the value
    # may be of another type) takes the general path, _read, whose None leaves the field
    # missing. Of two names for one field, the first that gives a value wins. The fragment is
    # filled in as a list of its fields and made a tuple once.
    trace_id = span.trace_id
    if len(trace_id) != 16 or trace_id == ZERO_TRACE:
        raise SpanRejected("empty or malformed trace id")
    get = span.attributes.get
    raw = get(_REQUEST_ID)
    raw_id = raw.string_value if raw is not None else None
    if not raw_id:
        raise SpanRejected("llm_request span without gen_ai.request.id")
    row = _TEMPLATE.copy()
    k = "gen_ai.latency.time_in_queue"
    if (v := get(k)) is not None:
        d = v.double_value
        row[_QUEUE] = d if 0.0 < d <= MAX_DURATION_S else _read(k, "queue_s", _DURATION, v)
    k = "gen_ai.latency.time_to_first_token"
    if (v := get(k)) is not None:
        d = v.double_value
        row[_TTFT] = d if 0.0 < d <= MAX_DURATION_S else _read(k, "ttft_s", _DURATION, v)
    k = "gen_ai.latency.e2e"
    if (v := get(k)) is not None:
        d = v.double_value
        row[_E2E] = d if 0.0 < d <= MAX_DURATION_S else _read(k, "e2e_s", _DURATION, v)
    k = "gen_ai.latency.time_in_model_prefill"
    if (v := get(k)) is not None:
        d = v.double_value
        row[_PREFILL] = d if 0.0 < d <= MAX_DURATION_S else _read(k, "prefill_s", _DURATION, v)
    k = "gen_ai.latency.time_in_model_decode"
    if (v := get(k)) is not None:
        d = v.double_value
        row[_DECODE] = d if 0.0 < d <= MAX_DURATION_S else _read(k, "decode_s", _DURATION, v)
    k = "gen_ai.latency.time_in_model_inference"
    if (v := get(k)) is not None:
        d = v.double_value
        row[_INFERENCE] = d if 0.0 < d <= MAX_DURATION_S else _read(k, "inference_s", _DURATION, v)
    k = "gen_ai.usage.prompt_tokens"
    if (v := get(k)) is not None:
        n = v.int_value
        row[_PROMPT] = n if 0 < n <= _TOKENS_MAX else _read(k, "prompt_tokens", _INT, v)
    k = "gen_ai.usage.completion_tokens"
    if (v := get(k)) is not None:
        n = v.int_value
        row[_OUTPUT] = n if 0 < n <= _TOKENS_MAX else _read(k, "output_tokens", _INT, v)
    k = "gen_ai.usage.input_tokens"
    if row[_PROMPT] is None and (v := get(k)) is not None:
        n = v.int_value
        row[_PROMPT] = n if 0 < n <= _TOKENS_MAX else _read(k, "prompt_tokens", _INT, v)
    k = "gen_ai.usage.output_tokens"
    if row[_OUTPUT] is None and (v := get(k)) is not None:
        n = v.int_value
        row[_OUTPUT] = n if 0 < n <= _TOKENS_MAX else _read(k, "output_tokens", _INT, v)
    k = "gen_ai.usage.cached_tokens"
    if (v := get(k)) is not None:
        n = v.int_value
        row[_CACHED] = n if 0 < n <= _TOKENS_MAX else _read(k, "cached_tokens", _INT, v)
    k = "gen_ai.request.max_tokens"
    if (v := get(k)) is not None:
        n = v.int_value
        row[_MAX_TOKENS] = n if 0 < n <= _MAX_TOKENS_MAX else _read(k, "max_tokens", _INT, v)
    k = "gen_ai.response.model"
    if (v := get(k)) is not None:
        row[_MODEL] = v.string_value or _read(k, "model", _TEXT, v)
    k = "gen_ai.request.model"
    if row[_MODEL] is None and (v := get(k)) is not None:
        row[_MODEL] = v.string_value or _read(k, "model", _TEXT, v)
    row[_ID] = checked_request_id(raw_id, from_span=True)
    start_ns = span.start_time_unix_nano
    arrival = start_ns / 1e9 if start_ns else None
    if arrival is not None and not MIN_TS <= arrival <= now + FUTURE_SLACK_S:
        raise SpanRejected(f"span start time {timestamp_problem(arrival, now)}")
    row[_ARRIVAL] = arrival
    row[_FRAGMENT_ID] = "vllm:" + span.span_id.hex()
    row[_TRACE_ID] = trace_id.hex()
    row[_REPLICA] = replica
    if span.status.code == STATUS_ERROR:
        row[_STATUS] = "error"
    return _new(RequestFragment, row)


def _read(key: str, fname: str, kind: int, v: AnyValue) -> str | int | float | None:
    """An attribute's value as its field's type, whatever type it was sent as: None for a
    value of the wrong kind (a missing fact), :class:`SpanRejected` for one that cannot be
    true."""
    which = v.WhichOneof("value")
    x: Any
    if which == "double_value":
        x = v.double_value
    elif which == "int_value":
        x = v.int_value
    elif which == "string_value":
        x = v.string_value
    else:
        return None
    if kind == _DURATION:
        try:
            d = float(x)
        except ValueError:
            return None  # a malformed value is a missing fact, not a guess
        if not 0.0 <= d <= MAX_DURATION_S:  # also NaN
            raise SpanRejected(f"{key} {duration_problem(d)}")
        return d
    if kind == _INT:
        if which == "string_value":
            try:
                x = int(x)
            except ValueError:
                return None
        if why := int_problem(x, INT_LIMITS[fname]):
            raise SpanRejected(f"{key} {why}")
        return int(x)
    return str(x)
