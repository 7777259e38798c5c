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
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue

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


_DURATION, _INT, _TEXT = 0, 1, 2
_POS = {name: i for i, name in enumerate(FRAGMENT_FIELDS)}
#: What is read of an ``llm_request`` span: (attribute, RequestFragment field, how its value
#: is read, the field's position in the fragment). When two attributes name one field (an old
#: and a current semantic-convention name), the first one present wins.
_SPECS: tuple[tuple[str, str, int, int], ...] = tuple(
    (
        key,
        f,
        _DURATION if f in _DURATION_FIELDS else _INT if f in INT_FIELDS else _TEXT,
        _POS[f],
    )
    for key, f in _VLLM_ATTRS.items()
)
_DURATION_SPECS = tuple((key, f, i) for key, f, kind, i in _SPECS if kind == _DURATION)
_OTHER_SPECS = tuple(spec for spec in _SPECS if spec[2] != _DURATION)
_REQUEST_ID = "gen_ai.request.id"
#: A vLLM fragment's fields before its span is read: ``source`` set, every fact missing.
_TEMPLATE: list[Any] = [None] * len(FRAGMENT_FIELDS)
_TEMPLATE[_POS["source"]] = "vllm"
_ID, _FRAGMENT_ID, _TRACE_ID = _POS["request_id"], _POS["fragment_id"], _POS["trace_id"]
_REPLICA, _ARRIVAL, _STATUS = _POS["replica"], _POS["arrival_ts"], _POS["status"]


def vllm_fragment(span: MapSpan, replica: str | None, now: float) -> RequestFragment:
    """The fragment of an ``llm_request`` span (its attributes a map:
    :mod:`slokit.sources._otlp_map`); :class:`SpanRejected` when it cannot be one."""
    # The hot path of ingest: one map lookup per known attribute, each value read as the type
    # its field expects (a double for a latency, an int for a token count) without asking the
    # oneof which it holds; only a zero, empty or out-of-range read (the type's default: the
    # value may be of another type) takes the general path, _read. The fragment is filled in
    # as a list of its fields and made a tuple once (keyword arguments cost twice as much).
    trace_id = span.trace_id
    if len(trace_id) != 16 or trace_id == ZERO_TRACE:
        raise SpanRejected("empty or malformed trace id")
    get = span.attributes.get
    raw = get(_REQUEST_ID)
    raw_id = raw.string_value if raw is not None else None
    if not raw_id:
        raise SpanRejected("llm_request span without gen_ai.request.id")
    row = _TEMPLATE.copy()
    for key, fname, i in _DURATION_SPECS:  # no aliases: each its own field
        v = get(key)
        if v is not None:
            d = v.double_value
            if d and 0.0 < d <= MAX_DURATION_S:
                row[i] = d
            elif (x := _read(key, fname, _DURATION, v)) is not None:
                row[i] = x
    for key, fname, kind, i in _OTHER_SPECS:
        if row[i] is not None:
            continue
        v = get(key)
        if v is None:
            continue
        if kind == _INT:
            n = v.int_value
            if 0 < n <= INT_LIMITS[fname]:
                row[i] = n
                continue
        else:
            text = v.string_value
            if text:
                row[i] = text
                continue
        if (x := _read(key, fname, kind, v)) is not None:
            row[i] = x
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
    return RequestFragment._make(row)


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
