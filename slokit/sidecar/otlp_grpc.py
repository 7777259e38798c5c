"""OTLP/gRPC trace receiver (``opentelemetry.proto.collector.trace.v1.TraceService/Export``).

vLLM's default export protocol. The method takes raw bytes and decodes them itself, so
undecodable data is INVALID_ARGUMENT (not a gRPC internal error) and the bytes can be
forwarded unchanged. Overload is UNAVAILABLE (retryable per the OTLP spec). gRPC's own gzip
compression is handled by grpcio. Needs ``grpcio`` (``pip install 'slokit[otlp-grpc]'``).

Connection hygiene comes from grpc core's server options (:func:`server_options`): a cap on
connections, the HTTP/2 handshake within the header timeout, idle connections closed,
connections recycled, concurrent streams and metadata bounded, and client pings policed.
"""

from __future__ import annotations

import asyncio
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from slokit.errors import BadInput
from slokit.sidecar.connections import Limits
from slokit.sidecar.otlp_http import bearer_matches
from slokit.sidecar.otlp_ingest import THREAD_DECODE_BYTES, OtlpIngest, Overloaded
from slokit.sources.otlp import decode_message, parse_spans

METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


def _grpc() -> Any:
    # deferred: grpcio is an optional extra, imported only when OTLP/gRPC is served
    try:
        import grpc
        import grpc.aio
    except ImportError:
        raise BadInput(
            "OTLP/gRPC needs grpcio: pip install 'slokit[otlp-grpc]' "
            "(or pass --otlp-grpc '' to serve OTLP/HTTP only)"
        ) from None
    return grpc


#: Concurrent RPCs per connection (an exporter needs a handful).
MAX_CONCURRENT_STREAMS = 100
#: Connections are recycled after this long (with a grace for RPCs in flight).
MAX_CONNECTION_AGE_S = 3600.0


def server_options(max_receive_bytes: int, limits: Limits) -> list[tuple[str, int]]:
    """grpc core's server arguments for ``limits`` (names as in grpc_types.h)."""
    ms = lambda s: max(1, int(s * 1000))  # noqa: E731
    return [
        ("grpc.max_receive_message_length", max_receive_bytes),
        ("grpc.max_send_message_length", 4 * 1024 * 1024),
        ("grpc.max_allowed_incoming_connections", limits.max_connections),
        # a connection that has not finished the HTTP/2 preface and SETTINGS in time is closed
        ("grpc.server_handshake_timeout_ms", ms(limits.header_timeout_s)),
        ("grpc.max_connection_idle_ms", ms(limits.idle_timeout_s)),
        ("grpc.max_connection_age_ms", ms(MAX_CONNECTION_AGE_S)),
        ("grpc.max_connection_age_grace_ms", ms(limits.body_timeout_s)),
        ("grpc.max_concurrent_streams", MAX_CONCURRENT_STREAMS),
        ("grpc.max_metadata_size", 16 * 1024),
        # the server pings a silent peer, and drops it when the ping is not answered
        ("grpc.keepalive_time_ms", ms(limits.idle_timeout_s)),
        ("grpc.keepalive_timeout_ms", ms(min(20.0, limits.body_timeout_s))),
        # clients may ping every 10 s at most (more is a ping flood: GOAWAY)
        ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
        ("grpc.http2.max_ping_strikes", 2),
    ]


class OtlpGrpcReceiver:
    def __init__(
        self, ingest: OtlpIngest, token: str | None = None, *, limits: Limits | None = None
    ) -> None:
        self.ingest = ingest
        self.token = token
        self.limits = limits or Limits()
        self._server: Any = None
        self.port: int | None = None

    async def _export(self, request: bytes, context: Any) -> bytes:
        grpc = _grpc()
        code = "OK"
        try:
            if self.token:
                md = dict(context.invocation_metadata() or ())
                got = md.get("authorization")
                if not bearer_matches(got if isinstance(got, str) else None, self.token):
                    code = "UNAUTHENTICATED"
                    await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong token")
            if len(request) > self.ingest.max_bytes:
                code = "RESOURCE_EXHAUSTED"
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "message over the limit")
            try:
                async with self.ingest.hold(len(request)):
                    return await self._accept(request)
            except BadInput as exc:
                code = "INVALID_ARGUMENT"
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc)[:1000])
            except Overloaded as exc:  # the write queue full, or the bodies held over budget
                code = "UNAVAILABLE"
                await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
            raise AssertionError("unreachable: context.abort raises")
        finally:
            self.ingest.metrics.otlp_requests.labels(protocol="grpc", code=code).inc()

    async def _accept(self, request: bytes) -> bytes:
        """Decode and keep ``request``'s spans; BadInput when it is not an export, Overloaded
        when the writer cannot take them."""
        if len(request) >= THREAD_DECODE_BYTES:
            msg = await asyncio.to_thread(parse_spans, request)
        else:
            msg = parse_spans(request)
        decoded = decode_message(msg, default_replica=self.ingest.default_replica)
        accepted = await self.ingest.accept(
            decoded, "grpc", (request, "application/x-protobuf", None)
        )
        out = ExportTraceServiceResponse()
        if accepted.rejected:
            out.partial_success.rejected_spans = accepted.rejected
            out.partial_success.error_message = accepted.error_message
        return bytes(out.SerializeToString())

    async def start(self, address: str) -> int:
        """Bind ``address`` (HOST:PORT, port 0 picks one) and serve; returns the port."""
        grpc = _grpc()
        limit = self.ingest.max_bytes
        server = grpc.aio.server(options=server_options(limit, self.limits))
        handler = grpc.method_handlers_generic_handler(
            "opentelemetry.proto.collector.trace.v1.TraceService",
            {
                "Export": grpc.unary_unary_rpc_method_handler(
                    self._export, request_deserializer=None, response_serializer=None
                )
            },
        )
        server.add_generic_rpc_handlers((handler,))
        port = server.add_insecure_port(address)
        if port == 0:
            raise BadInput(f"cannot bind OTLP/gRPC on {address}")
        await server.start()
        self._server = server
        self.port = port
        return int(port)

    async def stop(self, grace_s: float = 5.0) -> None:
        if self._server is not None:
            await self._server.stop(grace_s)
            self._server = None
