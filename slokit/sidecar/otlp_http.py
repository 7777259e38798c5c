"""OTLP/HTTP trace receiver: ``POST /v1/traces`` (protobuf or JSON, gzip/deflate or not).

Answers per the OTLP/HTTP spec: 200 with ``ExportTraceServiceResponse`` (``partial_success``
when spans were rejected) once the spans are durable (see OtlpIngest); 400 with a ``google.rpc.Status``
body for undecodable data; 413 past the body limit (checked after decompression, so a gzip
bomb is stopped at the limit); 415 for a missing or unknown content type; 405 for other
methods; 503 with ``Retry-After`` under overload (the write queue full, or the bodies held at
once over their budget: :mod:`slokit.sidecar.body_budget`). The response uses the request's
encoding (protobuf or JSON).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
from collections.abc import Awaitable, Callable
from typing import cast

from aiohttp import web
from aiohttp.typedefs import Middleware
from aiohttp.web_protocol import RequestPayloadError
from google.protobuf import json_format
from google.protobuf.message import Message
from google.rpc import code_pb2, status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceResponse,
)

from slokit.errors import BadInput
from slokit.sidecar.otlp_ingest import THREAD_DECODE_BYTES, BodyHold, OtlpIngest, Overloaded
from slokit.sources.otlp import (
    PayloadTooLarge,
    UnsupportedMediaType,
    decode_traces,
    encoding_name,
    inflated_size,
)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

#: Paths served without a token (probes).
OPEN_PATHS = frozenset({"/healthz", "/readyz"})


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode("utf-8", "surrogateescape")).digest()


def bearer_matches(authorization: str | None, token: str) -> bool:
    """True when ``authorization`` is ``Bearer <token>``. The scheme is case-insensitive
    (RFC 7235: ``bearer`` and ``BEARER`` too); the token is compared in constant time (as
    digests, so not even its length shows)."""
    scheme, _, credentials = (authorization or "").strip().partition(" ")
    same = hmac.compare_digest(_digest(credentials.strip()), _digest(token))
    return same and scheme.lower() == "bearer"


def bearer_auth(token: str | None) -> Middleware:
    """aiohttp middleware: 401 unless ``Authorization: Bearer <token>`` (when a token is set)."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        authorization = request.headers.get("Authorization")
        if token and request.path not in OPEN_PATHS and not bearer_matches(authorization, token):
            return web.json_response(
                {"error": "missing or wrong bearer token"}, status=401,
                headers={"WWW-Authenticate": 'Bearer realm="slokit"'},
            )  # fmt: skip
        return await handler(request)

    return cast(Middleware, middleware)


def _encode(msg: Message, as_json: bool) -> tuple[bytes, str]:
    if as_json:
        return json_format.MessageToJson(msg, indent=None).encode(), "application/json"
    return msg.SerializeToString(), "application/x-protobuf"


def _status_response(http_status: int, code: int, message: str, as_json: bool,
                     headers: dict[str, str] | None = None) -> web.Response:  # fmt: skip
    body, ct = _encode(status_pb2.Status(code=code, message=message[:1000]), as_json)
    return web.Response(status=http_status, body=body, content_type=ct, headers=headers)


#: A JSON body is held at this many times its (inflated) bytes: decoding it takes about
#: twice the memory per byte that protobuf does (a 23 MiB JSON export peaked at 11.5 times
#: its bytes, a 59 MiB protobuf one at 6).
JSON_HOLD_FACTOR = 2


async def _read_body(request: web.Request, held: BodyHold, limit: int) -> bytes:
    """The whole body. One with a ``Content-Length`` (held already) is read at once; one
    without is held chunk by chunk as it arrives, and refused past ``limit``."""
    if request.content_length is not None:
        return await request.read()
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.content.iter_any():
        size += len(chunk)
        if size > limit:
            raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=size)
        await held.grow(len(chunk))
        chunks.append(chunk)
    return b"".join(chunks)


class OtlpHttpReceiver:
    def __init__(self, ingest: OtlpIngest) -> None:
        self.ingest = ingest

    def app(self, token: str | None = None) -> web.Application:
        # aiohttp refuses bodies past client_max_size itself; the decoder checks again after
        # decompression.
        app = web.Application(client_max_size=self.ingest.max_bytes,
                              middlewares=[bearer_auth(token)])  # fmt: skip
        app.router.add_post("/v1/traces", self.handle)
        return app

    async def handle(self, request: web.Request) -> web.Response:
        resp = await self._handle(request)
        self.ingest.metrics.otlp_requests.labels(protocol="http", code=str(resp.status)).inc()
        return resp

    async def _handle(self, request: web.Request) -> web.Response:
        ct = request.headers.get("Content-Type", "")
        media = ct.split(";")[0].strip().lower()
        as_json = media == "application/json"
        if not media:  # none, or parameters alone (``;``)
            return _status_response(415, code_pb2.INVALID_ARGUMENT, "Content-Type is required: "
                                    "application/x-protobuf or application/json", as_json)  # fmt: skip
        enc = request.headers.get("Content-Encoding")
        limit = self.ingest.max_bytes
        if request.content_length is not None and request.content_length > limit:
            return _status_response(413, code_pb2.INVALID_ARGUMENT,
                                    f"body over the {limit}-byte limit", as_json)  # fmt: skip
        # the body's bytes are held from before it is read until it is answered; a body with
        # no Content-Length is held as it is read, a compressed one as it inflates
        try:
            async with self.ingest.hold(request.content_length or 0) as held:
                return await self._read_and_accept(request, ct, enc, as_json, held)
        except Overloaded as exc:
            return _status_response(503, code_pb2.UNAVAILABLE, str(exc), as_json,
                                    {"Retry-After": str(exc.retry_after_s)})  # fmt: skip

    async def _read_and_accept(
        self, request: web.Request, ct: str, enc: str | None, as_json: bool, held: BodyHold
    ) -> web.Response:
        limit = self.ingest.max_bytes
        try:
            body = await _read_body(request, held, limit)
        except web.HTTPRequestEntityTooLarge:
            return _status_response(413, code_pb2.INVALID_ARGUMENT,
                                    f"body over the {limit}-byte limit", as_json)  # fmt: skip
        except RequestPayloadError as exc:  # broken chunked framing and the like
            return _status_response(400, code_pb2.INVALID_ARGUMENT,
                                    f"malformed request body: {exc}", as_json)  # fmt: skip
        replica = self.ingest.default_replica
        try:
            compressed = encoding_name(enc) != "identity"
            # a compressed body is held at what it inflates to as well (counted first, keeping
            # nothing), and a JSON body at JSON_HOLD_FACTOR times its bytes
            size = (
                await asyncio.to_thread(inflated_size, body, enc, limit)
                if compressed
                else len(body)
            )
            more = (size if compressed else 0) + (size * (JSON_HOLD_FACTOR - 1) if as_json else 0)
            if more:
                await held.grow(more)
            if compressed or len(body) >= THREAD_DECODE_BYTES:
                decoded = await asyncio.to_thread(decode_traces, body, ct, enc, max_bytes=limit,
                                                  default_replica=replica)  # fmt: skip
            else:
                decoded = decode_traces(body, ct, enc, max_bytes=limit, default_replica=replica)
        except UnsupportedMediaType as exc:
            return _status_response(415, code_pb2.INVALID_ARGUMENT, str(exc), as_json)
        except PayloadTooLarge as exc:
            return _status_response(413, code_pb2.INVALID_ARGUMENT, str(exc), as_json)
        except BadInput as exc:
            return _status_response(400, code_pb2.INVALID_ARGUMENT, str(exc), as_json)
        # forwarded as what it was read as, not under the sender's header (its parameters
        # may be anything, in any bytes)
        canonical = "application/json" if as_json else "application/x-protobuf"
        raw = (body, canonical, enc)
        accepted = await self.ingest.accept(decoded, "http", raw)  # or Overloaded
        out = ExportTraceServiceResponse()
        if accepted.rejected:
            out.partial_success.rejected_spans = accepted.rejected
            out.partial_success.error_message = accepted.error_message
        data, rct = _encode(out, as_json)
        return web.Response(status=200, body=data, content_type=rct)
