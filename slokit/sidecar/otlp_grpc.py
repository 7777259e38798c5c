"""OTLP/gRPC trace receiver (``opentelemetry.proto.collector.trace.v1.TraceService/Export``).

vLLM's default export protocol. The method takes raw bytes and decodes them itself, so
undecodable data is INVALID_ARGUMENT (not a gRPC internal error) and the bytes can be
forwarded unchanged. Overload is UNAVAILABLE (retryable per the OTLP spec). gRPC's own gzip
compression is handled by grpcio. Needs ``grpcio`` (``pip install 'slokit[otlp-grpc]'``).

Connection hygiene comes from grpc core's server options (:func:`server_options`): a cap on
connections, the HTTP/2 handshake within the header timeout, idle connections closed,
connections recycled, concurrent streams and metadata bounded, client pings policed, and no
bandwidth probing, so a message the receiver has not asked for stays in its client.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
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
        # no flow-control window grown by bandwidth probing: a message the receiver has not
        # asked for yet stays in its client past the first 64 KiB (with probing, 16 waiting
        # messages of 15 MiB took 129 MB of the sidecar's memory; without, 2 MB)
        ("grpc.http2.bdp_probe", 0),
        # the server pings a silent peer, and drops it when the ping is not answered
        ("grpc.keepalive_time_ms", ms(limits.idle_timeout_s)),
        ("grpc.keepalive_timeout_ms", ms(min(20.0, limits.body_timeout_s))),
        # clients may ping every 10 s at most (more is a ping flood: GOAWAY)
        ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
        ("grpc.http2.max_ping_strikes", 2),
    ]


class _Refused(Exception):
    """An export answered with a gRPC status other than OK (``code``: its name)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class OtlpGrpcReceiver:
    def __init__(
        self, ingest: OtlpIngest, token: str | None = None, *, limits: Limits | None = None
    ) -> None:
        self.ingest = ingest
        self.token = token
        self.limits = limits or Limits()
        self._server: Any = None
        self.port: int | None = None

    async def _export(self, requests: AsyncIterator[bytes], context: Any) -> bytes:
        """Export, served as a client stream (the same on the wire as the unary call OTLP
        clients make): gRPC reads the message only when it is asked for, so it is asked for
        once the budget holds room for the largest it may be; meanwhile it waits in the
        client, under HTTP/2 flow control. Each answer is counted before it is sent."""
        grpc = _grpc()
        try:
            answer = await self._answer(requests, context)
        except _Refused as refused:
            self.ingest.metrics.otlp_requests.labels(protocol="grpc", code=refused.code).inc()
            await context.abort(getattr(grpc.StatusCode, refused.code), refused.message)
            raise AssertionError("unreachable: context.abort raises") from None
        self.ingest.metrics.otlp_requests.labels(protocol="grpc", code="OK").inc()
        return answer

    async def _answer(self, requests: AsyncIterator[bytes], context: Any) -> bytes:
        """The response's bytes, or :class:`_Refused` with the status to answer."""
        if self.token:
            md = dict(context.invocation_metadata() or ())
            got = md.get("authorization")
            if not bearer_matches(got if isinstance(got, str) else None, self.token):
                raise _Refused("UNAUTHENTICATED", "missing or wrong token")
        try:
            async with self.ingest.hold(self.ingest.max_bytes) as held:
                request = await self._read_one(requests)  # gRPC refuses one over max_bytes
                await self._read_end(requests)
                await held.resize(len(request))
                return await self._accept(request)
        except BadInput as exc:
            raise _Refused("INVALID_ARGUMENT", str(exc)[:1000]) from None
        except Overloaded as exc:  # the write queue full, or the bodies held over budget
            raise _Refused("UNAVAILABLE", str(exc)) from None

    async def _read_one(self, requests: AsyncIterator[bytes]) -> bytes:
        """The call's one message; BadInput when there is none, Overloaded when it does not
        arrive within ``body_timeout_s`` (a stalled sender holds the budget no longer)."""
        try:
            return await asyncio.wait_for(anext(requests), self.limits.body_timeout_s)
        except StopAsyncIteration:  # none sent, or gRPC refused it (over its size limit)
            raise BadInput("the call carried no export message") from None
        except TimeoutError:
            raise Overloaded(1, f"the export message did not arrive within "
                                f"{self.limits.body_timeout_s:g} s") from None  # fmt: skip

    async def _read_end(self, requests: AsyncIterator[bytes]) -> None:
        """The end of the call after its message (a unary client's half-close, sent with the
        message); BadInput when a second message comes instead: a call whose messages were
        not all kept must not be acknowledged. (A second message is read while the first is
        held at ``max_bytes``: for a moment, one of the two is uncounted.)"""
        try:
            await asyncio.wait_for(anext(requests), self.limits.body_timeout_s)
        except StopAsyncIteration:
            return
        except TimeoutError:
            raise Overloaded(1, f"the call did not end within {self.limits.body_timeout_s:g} s "
                                "of its message") from None  # fmt: skip
        raise BadInput("an export call carries one message; this one carried more")

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
                "Export": grpc.stream_unary_rpc_method_handler(
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
