"""Connection hygiene for the sidecar's HTTP listeners (the API on 9464, OTLP/HTTP on 4318).

aiohttp alone keeps a connection that never finishes its headers for an hour, and accepts
connections until the process runs out of file descriptors, after which nothing (``/healthz``
included) can connect. Each listener therefore serves through a :class:`GuardedSite`, which
wraps aiohttp's per-connection protocol so that a :class:`ConnectionGuard` knows the phase
of every connection and enforces:

- **header timeout**: a request's headers must be complete within ``header_timeout_s`` of
  the connection opening (or of the first byte after an idle keep-alive); else 408 and close;
- **body timeout**: a request whose body stops arriving for ``body_timeout_s`` is closed;
- **idle timeout**: a keep-alive connection without a request for ``idle_timeout_s`` is closed;
- **a cap**: at ``max_connections`` a new connection evicts the one that has waited longest
  for its headers (else the longest idle one, else the upload silent longest); only when
  every connection has a request being answered is the new one closed at once. A flood of
  incomplete requests therefore cannot lock out a probe: the probe's connection displaces
  the oldest incomplete one and is answered as soon as its headers arrive.

Deadlines are checked by one sweep per listener (``sweep(now)``, clock injectable). Malformed
requests and clients that vanish are logged on one line without a traceback
(:class:`QuietServerLog`); real handler bugs keep theirs.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import resource
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.typedefs import Handler, Middleware
from aiohttp.web_protocol import RequestPayloadError
from prometheus_client import CollectorRegistry, Counter, Gauge

log = logging.getLogger("slokit.sidecar.connections")

Clock = Callable[[], float]

#: A listener at its cap says so at most this often.
WARN_EVERY_S = 60.0

_408_BODY = b'{"error": "request headers did not arrive in time"}'
#: Sent to a connection whose headers did not arrive in time (then it is closed).
REQUEST_TIMEOUT_408 = (
    b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Type: application/json\r\n"
    b"Content-Length: %d\r\n\r\n%s" % (len(_408_BODY), _408_BODY)
)


@dataclass(frozen=True)
class Limits:
    """One listener's timeouts (seconds) and connection cap."""

    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    idle_timeout_s: float = 75.0
    max_connections: int = 256

    def sweep_every_s(self) -> float:
        """How often deadlines are checked: a quarter of the shortest, within [0.05, 1] s."""
        shortest = min(self.header_timeout_s, self.body_timeout_s, self.idle_timeout_s)
        return min(1.0, max(0.05, shortest / 4))


class ConnectionMetrics:
    """``slokit_http_connections{listener}`` and ``slokit_http_connections_closed_total``."""

    def __init__(self, registry: CollectorRegistry | None) -> None:
        self.open = Gauge(
            "slokit_http_connections", "Open connections per HTTP listener.", ["listener"],
            registry=registry,
        )  # fmt: skip
        self.closed = Counter(
            "slokit_http_connections_closed_total",
            "Connections the sidecar closed itself, by reason (header_timeout, body_timeout, "
            "idle_timeout, evicted, refused).",
            ["listener", "reason"], registry=registry,
        )  # fmt: skip


class Phase(enum.Enum):
    HEADERS = "headers"  # waiting for a request's headers to complete
    REQUEST = "request"  # a handler is running
    IDLE = "idle"  # keep-alive, no byte of the next request yet


class _Guarded(asyncio.Protocol):
    """aiohttp's protocol for one connection, with the phase and times the guard needs."""

    def __init__(self, guard: ConnectionGuard, inner: asyncio.Protocol) -> None:
        self.guard = guard
        self.inner = inner
        self.transport: asyncio.Transport | None = None
        self.admitted = False
        self.phase = Phase.HEADERS
        self.since = self.last_rx = guard.clock()
        self.request: web.BaseRequest | None = None

    # -- asyncio.Protocol ----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.since = self.last_rx = self.guard.clock()
        if not self.guard.admit(self):
            self.transport.abort()  # every slot holds a running request: refuse at once
            return
        self.admitted = True
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        now = self.last_rx = self.guard.clock()
        if self.phase is Phase.IDLE:
            self.phase, self.since = Phase.HEADERS, now
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self.guard.forget(self)
        if self.admitted:
            self.admitted = False
            self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    # -- phases (driven by the guard's middleware) ----------------------------------------
    def begin(self, request: web.BaseRequest) -> None:
        self.phase, self.request = Phase.REQUEST, request
        self.since = self.guard.clock()

    def end(self) -> None:
        if self.phase is Phase.REQUEST:
            self.phase, self.request = Phase.IDLE, None
            self.since = self.guard.clock()

    def uploading(self) -> bool:
        """A handler runs while the request's body is still arriving."""
        return (
            self.phase is Phase.REQUEST
            and self.request is not None
            and not self.request.content.is_eof()
        )

    def expired(self, now: float, limits: Limits) -> str | None:
        """The reason this connection must go now, or None."""
        if self.phase is Phase.HEADERS and now - self.since > limits.header_timeout_s:
            return "header_timeout"
        if self.phase is Phase.IDLE and now - self.since > limits.idle_timeout_s:
            return "idle_timeout"
        if self.uploading() and now - self.last_rx > limits.body_timeout_s:
            return "body_timeout"
        return None


class ConnectionGuard:
    """The connections of one listener: their deadlines and the cap."""

    def __init__(
        self,
        name: str,
        limits: Limits,
        *,
        metrics: ConnectionMetrics | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.name = name
        self.limits = limits
        self.metrics = metrics
        self.clock: Clock = clock or (lambda: asyncio.get_running_loop().time())
        self._conns: dict[asyncio.BaseTransport, _Guarded] = {}
        self._sweeper: asyncio.TimerHandle | None = None
        self._warned_at: float | None = None
        #: Connections closed by the guard, by reason (the metric's counts, for tests).
        self.closed: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._conns)

    def phases(self) -> dict[str, int]:
        """How many connections are in each phase (for tests and debugging)."""
        out = {p.value: 0 for p in Phase}
        for c in list(self._conns.values()):
            out[c.phase.value] += 1
        return out

    # -- wiring --------------------------------------------------------------------------
    def install(self, app: web.Application) -> None:
        """Add the guard's middleware (outermost) and stop its sweep when ``app`` is cleaned up."""
        app.middlewares.insert(0, self.middleware())

        async def stop_sweeping(_app: web.Application) -> None:
            self.stop()

        app.on_cleanup.append(stop_sweeping)

    def protocol_factory(self, inner: Callable[[], asyncio.Protocol]) -> Callable[[], _Guarded]:
        return lambda: _Guarded(self, inner())

    def start(self) -> None:
        if self._sweeper is None:
            loop = asyncio.get_running_loop()
            self._sweeper = loop.call_later(self.limits.sweep_every_s(), self._tick)

    def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None

    def _tick(self) -> None:
        self._sweeper = None
        try:
            self.sweep(self.clock())
        finally:
            loop = asyncio.get_running_loop()
            self._sweeper = loop.call_later(self.limits.sweep_every_s(), self._tick)

    def middleware(self) -> Middleware:
        @web.middleware
        async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
            conn = self._conns.get(request.transport) if request.transport else None
            if conn is not None:
                conn.begin(request)
            try:
                return await handler(request)
            except Exception as exc:
                # The client went away, or the guard closed it (a stalled body, an eviction):
                # reading the body failed (ConnectionResetError, or aiohttp's RuntimeError
                # "Connection closed."). Nobody is left to answer; one line, no traceback.
                t = request.transport
                if not isinstance(exc, ConnectionError) and t is not None and not t.is_closing():
                    raise
                log.debug("%s: connection lost during %s %s: %r", self.name, request.method,
                          request.path, exc)  # fmt: skip
                return web.Response(status=408)
            finally:
                if conn is not None:
                    conn.end()

        return cast(Middleware, guard)

    # -- the cap and the deadlines --------------------------------------------------------
    def admit(self, conn: _Guarded) -> bool:
        """Track ``conn``; at the cap, evict the longest-waiting incomplete or idle one."""
        assert conn.transport is not None
        if len(self._conns) >= self.limits.max_connections:
            victim = self._victim()
            self._warn_at_cap("refusing new ones" if victim is None else
                              "closing the oldest incomplete or idle ones")  # fmt: skip
            if victim is None:
                self._count("refused")
                return False
            self._close(victim, "evicted")
        self._conns[conn.transport] = conn
        self._gauge()
        return True

    def _warn_at_cap(self, doing: str) -> None:
        now = self.clock()
        if self._warned_at is None or now - self._warned_at >= WARN_EVERY_S:
            self._warned_at = now
            log.warning("%s: at its cap of %d connections, %s (slowloris? see "
                        "slokit_http_connections_closed_total)", self.name,
                        self.limits.max_connections, doing)  # fmt: skip

    def _victim(self) -> _Guarded | None:
        """Who makes room: the longest wait for headers, else the longest idle, else the
        upload that has been silent longest; never a request being answered."""
        for phase in (Phase.HEADERS, Phase.IDLE):
            waiting = [c for c in self._conns.values() if c.phase is phase]
            if waiting:
                return min(waiting, key=lambda c: c.since)
        uploading = [c for c in self._conns.values() if c.uploading()]
        return min(uploading, key=lambda c: c.last_rx) if uploading else None

    def forget(self, conn: _Guarded) -> None:
        if conn.transport is not None and self._conns.pop(conn.transport, None) is not None:
            self._gauge()

    def sweep(self, now: float) -> int:
        """Close every connection past its deadline; returns how many."""
        dropped = 0
        for conn in list(self._conns.values()):
            reason = conn.expired(now, self.limits)
            if reason is not None:
                self._close(conn, reason)
                dropped += 1
        return dropped

    def _close(self, conn: _Guarded, reason: str) -> None:
        self.forget(conn)
        self._count(reason)
        t = conn.transport
        if t is None or t.is_closing():
            return
        if reason == "header_timeout":
            t.write(REQUEST_TIMEOUT_408)
        if reason in ("header_timeout", "idle_timeout") and not t.get_write_buffer_size():
            t.close()
        else:  # a running handler, or a peer that does not read: free the descriptor now
            t.abort()

    def _count(self, reason: str) -> None:
        self.closed[reason] = self.closed.get(reason, 0) + 1
        if self.metrics is not None:
            self.metrics.closed.labels(self.name, reason).inc()

    def _gauge(self) -> None:
        if self.metrics is not None:
            self.metrics.open.labels(self.name).set(len(self._conns))


class GuardedSite(web.TCPSite):
    """A TCP site whose connections go through ``guard`` (see the module docstring)."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, guard: ConnectionGuard,
                 **kw: Any) -> None:  # fmt: skip
        super().__init__(runner, host, port, **kw)
        self.guard = guard

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers the site with its runner
        server = self._runner.server
        assert server is not None
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self.guard.protocol_factory(server), self._host, self._port,
            backlog=self._backlog, reuse_address=self._reuse_address,
            reuse_port=self._reuse_port,
        )  # fmt: skip
        sockets = self._server.sockets
        self._bound_port = sockets[0].getsockname()[1] if sockets else self._port
        self.guard.start()

    async def stop(self) -> None:
        self.guard.stop()
        await super().stop()


class QuietServerLog(logging.LoggerAdapter[logging.Logger]):
    """aiohttp's server logger, minus tracebacks for what clients do wrong.

    aiohttp logs every malformed request (a line too long, bad framing, a body that does not
    decompress) and every client that disconnects mid-body with a traceback: a hostile client
    could fill the disk. Those become one line at INFO (malformed) or DEBUG (gone); anything
    else, a bug in a handler, keeps its traceback.
    """

    def __init__(self, logger: logging.Logger | None = None) -> None:
        super().__init__(logger or logging.getLogger("aiohttp.server"), {})

    def log(self, level: int, msg: object, *args: object, exc_info: Any = None,
            **kw: Any) -> None:  # fmt: skip
        exc = exc_info if isinstance(exc_info, BaseException) else None
        if exc_info is True:
            exc = sys.exc_info()[1]
        if isinstance(exc, HttpProcessingError | RequestPayloadError):  # malformed
            text = str(msg) % args if args else str(msg)
            detail = " ".join(str(exc).split())[:300]
            super().log(min(level, logging.INFO), "%s: %s", text, detail, **kw)
        elif isinstance(exc, ConnectionError | asyncio.CancelledError):  # the client left
            text = str(msg) % args if args else str(msg)
            super().log(logging.DEBUG, "%s: %s", text, type(exc).__name__, **kw)
        else:
            super().log(level, msg, *args, exc_info=exc_info, **kw)


def handler_kwargs(max_line_size: int = 8190) -> dict[str, Any]:
    """aiohttp RequestHandler settings for a guarded listener."""
    return {
        # The guard closes idle connections; aiohttp's own timer is a backstop behind it.
        "keepalive_timeout": 3600.0,
        "max_line_size": max_line_size,
        "max_field_size": 8190,
        "max_headers": 128,
        "lingering_time": 2.0,  # after an early answer, drain an unread body this long at most
        "logger": QuietServerLog(),
    }


def fd_headroom(wanted: int, reserve: int = 128) -> int:
    """File descriptors the listeners may hold: raise the soft RLIMIT_NOFILE toward
    ``wanted + reserve`` (up to the hard limit) and return what is left after ``reserve``
    (DuckDB, scrapes, logs, the listening sockets, descriptors closing)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = wanted + reserve
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(0, soft - reserve)


def fit_caps(caps: dict[str, int], *, reserve: int = 128) -> dict[str, int]:
    """Scale the listeners' caps down to what the descriptor limit allows (with a warning),
    so that accept() never fails for want of descriptors."""
    wanted = sum(caps.values())
    room = fd_headroom(wanted, reserve)
    if room >= wanted:
        return dict(caps)
    scaled = {k: max(8, v * room // wanted) for k, v in caps.items()}
    log.warning(
        "open-file limit (RLIMIT_NOFILE) leaves room for %d connections, not %d: caps "
        "lowered to %s; raise `ulimit -n` to keep the configured ones",
        room, wanted, scaled,
    )  # fmt: skip
    return scaled
