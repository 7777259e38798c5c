"""OTLP/gRPC trace receiver (``opentelemetry.proto.collector.trace.v1.TraceService/Export``).

vLLM's default export protocol. The method takes raw bytes and decodes them itself, so
undecodable data is INVALID_ARGUMENT (not a gRPC internal error) and the bytes can be
forwarded unchanged. Overload is UNAVAILABLE (retryable per the OTLP spec). gRPC's own gzip
compression is handled by grpcio. Needs ``grpcio`` (``pip install 'slokit[otlp-grpc]'``).
"""

from __future__ import annotations

import hmac
from typing import Any

from slokit.errors import BadInput
from slokit.sidecar.otlp_ingest import THREAD_DECODE_BYTES, OtlpIngest, Overloaded
from slokit.sources.otlp import decode_message, parse_request

METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


def _grpc() -> Any:
    try:
        import grpc
        import grpc.aio
    except ImportError:
        raise BadInput(
            "OTLP/gRPC needs grpcio: pip install 'slokit[otlp-grpc]' "
            "(or pass --otlp-grpc '' to serve OTLP/HTTP only)"
        ) from None
    return grpc


class OtlpGrpcReceiver:
    def __init__(self, ingest: OtlpIngest, token: str | None = None) -> None:
        self.ingest = ingest
        self.token = token
        self._server: Any = None
        self.port: int | None = None

    async def _export(self, request: bytes, context: Any) -> bytes:
        import asyncio

        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceResponse,
        )

        grpc = _grpc()
        code = "OK"
        try:
            if self.token is not None:
                md = dict(context.invocation_metadata() or ())
                got = str(md.get("authorization", "")).encode()
                if not hmac.compare_digest(got, f"Bearer {self.token}".encode()):
                    code = "UNAUTHENTICATED"
                    await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong token")
            if len(request) > self.ingest.max_bytes:
                code = "RESOURCE_EXHAUSTED"
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "message over the limit")
            try:
                if len(request) >= THREAD_DECODE_BYTES:
                    msg = await asyncio.to_thread(parse_request, request)
                else:
                    msg = parse_request(request)
                decoded = decode_message(msg, default_replica=self.ingest.default_replica)
            except BadInput as exc:
                code = "INVALID_ARGUMENT"
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc)[:1000])
            try:
                accepted = await self.ingest.accept(
                    decoded, "grpc", (request, "application/x-protobuf", None)
                )
            except Overloaded as exc:
                code = "UNAVAILABLE"
                await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
            out = ExportTraceServiceResponse()
            if accepted.rejected:
                out.partial_success.rejected_spans = accepted.rejected
                out.partial_success.error_message = accepted.error_message
            return bytes(out.SerializeToString())
        finally:
            self.ingest.metrics.otlp_requests.labels(protocol="grpc", code=code).inc()

    async def start(self, address: str) -> int:
        """Bind ``address`` (HOST:PORT, port 0 picks one) and serve; returns the port."""
        grpc = _grpc()
        limit = self.ingest.max_bytes
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", limit),
                ("grpc.max_send_message_length", 4 * 1024 * 1024),
            ]
        )
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
