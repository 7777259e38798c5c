"""What the OTLP span mappers share: span constants, attribute values, and their checks.

An attribute value is read as a Python value (:func:`any_value`) and then coerced to its
fragment field's type (:func:`coerce`): a value of the wrong type (a string that is not a
number) is a missing fact; a number that cannot be true (:mod:`slokit.sources.validate`)
rejects the whole span with :class:`SpanRejected`, whose message is the reason.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeAlias

from slokit.sources.validate import (
    HTTP_STATUS_RANGE,
    MAX_INT64,
    MAX_TOKENS,
    duration_problem,
    int_problem,
    timestamp_problem,
)

if TYPE_CHECKING:
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue
    from opentelemetry.proto.trace.v1.trace_pb2 import Span

#: A span attribute's value as read (:func:`any_value`); None for kinds never read.
AttrValue: TypeAlias = "str | int | float | bool | list[AttrValue] | None"

SPAN_KIND_SERVER = 2
SPAN_KIND_CLIENT = 3
STATUS_ERROR = 2
ZERO_TRACE = b"\0" * 16

#: Integer fields and their largest plausible value (see slokit.sources.validate).
INT_LIMITS: dict[str, int] = {
    "prompt_tokens": MAX_TOKENS,
    "output_tokens": MAX_TOKENS,
    "cached_tokens": MAX_TOKENS,
    "max_tokens": MAX_INT64,
    "http_status": HTTP_STATUS_RANGE[1],
}
INT_FIELDS = frozenset(INT_LIMITS)
_FLOAT_FIELDS = frozenset({"client_ttft_s"})


class SpanRejected(Exception):
    """A span with an implausible value; the message is the reason (a metric label)."""


def any_value(v: AnyValue) -> AttrValue:
    kind = v.WhichOneof("value")
    if kind == "string_value":
        return v.string_value
    if kind == "int_value":
        return v.int_value
    if kind == "double_value":
        return v.double_value
    if kind == "bool_value":
        return v.bool_value
    if kind == "array_value":
        return [any_value(x) for x in v.array_value.values]
    return None


def coerce(key: str, field_name: str, value: AttrValue) -> str | int | float | None:
    """An attribute value as its field's type: None when it is of the wrong type (a missing
    fact); :class:`SpanRejected` when it is a number that cannot be true."""
    if isinstance(value, list):
        value = value[0] if value else None
    if value is None:
        return None
    if field_name in INT_FIELDS:
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            return None
        if isinstance(value, str):
            try:
                value = int(value)
            except ValueError:
                return None
        why = int_problem(value, INT_LIMITS[field_name])
        if why is None and field_name == "http_status" and value < HTTP_STATUS_RANGE[0]:
            why = "is out of range"
        if why is not None:
            raise SpanRejected(f"{key} {why}")
        return int(value)
    if field_name in _FLOAT_FIELDS or field_name.endswith("_s"):
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            return None
        try:
            x = float(value)
        except (ValueError, OverflowError):
            return None
        if why := duration_problem(x):
            raise SpanRejected(f"{key} {why}")
        return x
    return str(value)


def start_s(span: Span, now: float) -> float | None:
    """The span's start in epoch seconds (None when unset); :class:`SpanRejected` if
    implausible."""
    start_ns = span.start_time_unix_nano
    if not start_ns:
        return None
    start = start_ns / 1e9
    if why := timestamp_problem(start, now):
        raise SpanRejected(f"span start time {why}")
    return start
