"""OTLP's trace messages with each span's attributes read as a map: the decoder's view.

On the wire, a span's ``repeated KeyValue attributes = 9`` is exactly what protobuf writes for
``map<string, AnyValue> attributes = 9`` (a map is a repeated entry message whose fields 1 and
2 are the key and the value). So the same bytes parse into either message, and this module
builds the second one at import time: OpenTelemetry's own ``trace.proto`` descriptor with one
field changed, plus an ``ExportTraceServiceRequest`` that holds it, in their own package
(``slokit.otlp_map.trace.v1``). Everything else (resources, scopes, events, links, status and
every ``AnyValue``) keeps OpenTelemetry's types.

Why: the span mappers want a dozen known attributes out of each span. As a map, each is one
lookup (``attributes.get(key)``) done in upb's C; as a list, every attribute of every span is
wrapped in a Python object and its key copied into a Python string before it can be
compared. On vLLM's ``llm_request`` spans that is about 3 µs a span against 7
(``benchmarks/ingest_otlp.py``).

What the map changes: a key sent twice keeps its last value (as a dict built from the list
does), and the attributes come out in no particular order. Re-serializing a map view is not
byte-identical to what was sent; code that forwards or rewrites an export
(:mod:`slokit.sidecar.forward`) uses OpenTelemetry's messages instead.
"""

from __future__ import annotations

from typing import Any, TypeAlias

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from opentelemetry.proto.trace.v1 import trace_pb2

__all__ = ["ExportTraceServiceRequest", "MapSpan"]

_OTEL_PACKAGE = "." + trace_pb2.DESCRIPTOR.package  # .opentelemetry.proto.trace.v1
PACKAGE = "slokit.otlp_map.trace.v1"
_FILE = "slokit/otlp_map/trace/v1/trace.proto"

#: A span of the map view (its class is built at run time, so typed loosely): the fields of
#: OpenTelemetry's ``Span``, with ``attributes`` a ``Mapping[str, AnyValue]``.
MapSpan: TypeAlias = Any


def _file() -> descriptor_pb2.FileDescriptorProto:
    f = descriptor_pb2.FileDescriptorProto()
    trace_pb2.DESCRIPTOR.CopyToProto(f)
    f.name, f.package = _FILE, PACKAGE
    f.ClearField("options")
    for message in f.message_type:
        _repackage(message)
    span = next(m for m in f.message_type if m.name == "Span")
    entry = span.nested_type.add(name="AttributesEntry")
    entry.options.map_entry = True
    entry.field.add(
        name="key", number=1, label=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING
    )
    value = entry.field.add(name="value", number=2, label=1)
    value.type = descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE
    value.type_name = ".opentelemetry.proto.common.v1.AnyValue"
    attributes = next(fd for fd in span.field if fd.name == "attributes")
    attributes.type_name = f".{PACKAGE}.Span.AttributesEntry"
    request = f.message_type.add(name="ExportTraceServiceRequest")
    spans = request.field.add(name="resource_spans", number=1, label=3)
    spans.type = descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE
    spans.type_name = f".{PACKAGE}.ResourceSpans"
    return f


def _repackage(message: descriptor_pb2.DescriptorProto) -> None:
    """Point the message's references to trace.proto's own types at this package's copies."""
    for fd in message.field:
        if fd.type_name.startswith(_OTEL_PACKAGE + "."):
            fd.type_name = "." + PACKAGE + fd.type_name[len(_OTEL_PACKAGE) :]
    for nested in message.nested_type:
        _repackage(nested)


def _request_class() -> Any:
    pool = descriptor_pool.Default()
    try:
        pool.FindFileByName(_FILE)
    except KeyError:
        pool.Add(_file())
    return message_factory.GetMessageClass(
        pool.FindMessageTypeByName(f"{PACKAGE}.ExportTraceServiceRequest")
    )


#: ``ExportTraceServiceRequest`` whose spans' attributes are maps (see the module doc).
ExportTraceServiceRequest: Any = _request_class()
