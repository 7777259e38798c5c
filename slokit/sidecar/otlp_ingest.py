"""What both OTLP receivers share: decode, hand to the writer, wait until it is durable.

:meth:`OtlpIngest.accept` returns only once the request's fragments are durable (synced in
the writer's journal, or committed to DuckDB when there is no journal), so the receivers can
answer 200 knowing the spans are kept. It raises :class:`Overloaded` when
the write queue is full or the commit does not come within ``ack_timeout_s`` (the receiver
answers 503/UNAVAILABLE with Retry-After; the client's retry is harmless because fragments
are deduplicated by id).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from slokit.sidecar.metrics import SidecarMetrics
from slokit.sidecar.write_errors import QueueFull, RecordsRefused, WriterStopped
from slokit.sidecar.writer import Writer
from slokit.sources.otlp import DecodedTraces

if TYPE_CHECKING:
    from slokit.sidecar.body_budget import ByteBudget

#: Bodies at least this big are decoded in a worker thread, not on the event loop.
THREAD_DECODE_BYTES = 256 * 1024


class BodyHold(Protocol):
    """A body's hold on the receivers' byte budget (:class:`slokit.sidecar.body_budget.Held`)."""

    async def grow(self, nbytes: int) -> None: ...

    async def resize(self, nbytes: int) -> None: ...


class _Unbounded:
    """The hold when there is no budget: it grows without waiting."""

    async def grow(self, nbytes: int) -> None:
        return None

    async def resize(self, nbytes: int) -> None:
        return None


class Overloaded(Exception):
    def __init__(self, retry_after_s: int, why: str) -> None:
        super().__init__(why)
        self.retry_after_s = retry_after_s


@dataclass(frozen=True)
class Accepted:
    rejected: int
    error_message: str


class OtlpIngest:
    def __init__(
        self,
        writer: Writer,
        metrics: SidecarMetrics,
        *,
        max_bytes: int,
        default_replica: str | None,
        ack_timeout_s: float = 30.0,
        forward: Callable[[bytes, str, str | None], None] | None = None,
        budget: ByteBudget | None = None,
    ) -> None:
        """``budget``: the bytes of bodies both receivers may hold at once (None: no bound
        beyond each body's ``max_bytes``)."""
        self.writer = writer
        self.metrics = metrics
        self.max_bytes = max_bytes
        self.default_replica = default_replica
        self.ack_timeout_s = ack_timeout_s
        self.forward = forward
        self.budget = budget

    def hold(self, nbytes: int) -> contextlib.AbstractAsyncContextManager[BodyHold]:
        """The budget's hold on ``nbytes``, to grow as the body inflates (raises
        :class:`Overloaded` when they do not fit in time); nothing to wait for without a
        budget."""
        if self.budget is None:
            return contextlib.nullcontext(_Unbounded())
        return self.budget.hold(nbytes)

    async def accept(
        self, decoded: DecodedTraces, protocol: str, raw: tuple[bytes, str, str | None]
    ) -> Accepted:
        """Count ``decoded``, make its fragments durable, and say what partial_success to send.

        ``raw`` is the body as received (bytes, content type, encoding): forwarded upstream
        unchanged once the spans are durable.
        """
        m = self.metrics
        m.spans_received.labels(protocol=protocol).inc(decoded.spans)
        for reason, n in decoded.rejection_reasons.items():
            m.spans_rejected.labels(reason=reason).inc(n)
        if decoded.fragments:
            try:
                fut = self.writer.submit("fragments", decoded.fragments)
            except QueueFull as exc:
                raise Overloaded(exc.retry_after_s, "write queue full") from None
            except WriterStopped:
                raise Overloaded(self.writer.retry_after_s, "sidecar is shutting down") from None
            try:
                await asyncio.wait_for(asyncio.wrap_future(fut), self.ack_timeout_s)
            except TimeoutError:
                m.dropped.labels(reason="ack_timeout").inc()
                raise Overloaded(self.writer.retry_after_s, "writer is behind") from None
            except RecordsRefused:  # the store cannot hold them: rejected, a retry cannot help
                n, reason = len(decoded.fragments), "refused by the store"
                decoded.rejected += n
                decoded.rejection_reasons[reason] = decoded.rejection_reasons.get(reason, 0) + n
                m.spans_rejected.labels(reason=reason).inc(n)
            except Exception as exc:  # a failed commit: retryable, the writer logged it
                m.dropped.labels(reason="write_failed").inc()
                raise Overloaded(self.writer.retry_after_s, f"write failed: {exc}") from None
        if self.forward is not None:
            self.forward(*raw)
        message = ""
        if decoded.rejected:
            message = "; ".join(f"{n} {r}" for r, n in sorted(decoded.rejection_reasons.items()))
        return Accepted(decoded.rejected, message)
