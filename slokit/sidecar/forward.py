"""Forward received OTLP bodies to an upstream OTLP/HTTP endpoint, without prompt and
completion content unless ``forward_content`` opts in.

Ingest never waits for the upstream: bodies go into a bounded queue (by count and bytes) and
one task posts them; when the queue is full or the upstream fails, the body is dropped and
counted in ``slokit_dropped_total{reason="forward_queue_full"|"forward_failed"}``.

Content (:func:`is_content_attribute`, :func:`is_content_event`: the prompt, the completion,
input/output messages and system instructions, as attributes or as events) is what slokit
never stores; it does not leave the pod through the forwarder either. A body that names none
of it is forwarded byte for byte; one that does is decoded, stripped (the span's
``dropped_attributes_count``/``dropped_events_count`` say how much) and re-encoded as
protobuf, compressed as it came. A body that cannot be checked is not forwarded
(``forward_failed``).
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import logging
import zlib
from collections import deque
from typing import Any

import httpx

from slokit.errors import BadInput
from slokit.sidecar.metrics import SidecarMetrics

log = logging.getLogger("slokit.sidecar.forward")


#: Attributes that carry prompt or completion content (GenAI semantic conventions, current and
#: older): exact names, and prefixes of indexed forms such as ``gen_ai.prompt.0.content``.
CONTENT_ATTRIBUTES = frozenset(
    {
        "gen_ai.prompt",
        "gen_ai.completion",
        "gen_ai.input.messages",
        "gen_ai.output.messages",
        "gen_ai.system_instructions",
    }
)
_CONTENT_PREFIXES = ("gen_ai.prompt.", "gen_ai.completion.")
#: Events whose body or attributes are content (older GenAI conventions).
CONTENT_EVENTS = frozenset(
    {
        "gen_ai.user.message",
        "gen_ai.system.message",
        "gen_ai.assistant.message",
        "gen_ai.tool.message",
        "gen_ai.choice",
    }
)
_CONTENT_EVENT_PREFIX = "gen_ai.content."
#: A body with none of these byte strings holds no content (checked before decoding).
_MARKERS = (
    *(k.encode() for k in sorted(CONTENT_ATTRIBUTES)),
    *(e.encode() for e in sorted(CONTENT_EVENTS)),
    _CONTENT_EVENT_PREFIX.encode(),
)


def is_content_attribute(key: str) -> bool:
    return key in CONTENT_ATTRIBUTES or key.startswith(_CONTENT_PREFIXES)


def is_content_event(name: str) -> bool:
    return name in CONTENT_EVENTS or name.startswith(_CONTENT_EVENT_PREFIX)


def _strip_attributes(holder: Any) -> int:
    kept = [kv for kv in holder.attributes if not is_content_attribute(kv.key)]
    removed = len(holder.attributes) - len(kept)
    if removed:
        del holder.attributes[:]
        holder.attributes.extend(kept)
        holder.dropped_attributes_count += removed
    return removed


def strip_content(msg: Any) -> int:
    """Remove content attributes and events from an ExportTraceServiceRequest in place;
    returns how many attributes and events went."""
    n = 0
    for rs in msg.resource_spans:
        n += _strip_attributes(rs.resource)
        for ss in rs.scope_spans:
            for span in ss.spans:
                n += _strip_attributes(span)
                events = [e for e in span.events if not is_content_event(e.name)]
                gone = len(span.events) - len(events)
                if gone:
                    del span.events[:]
                    span.events.extend(events)
                    span.dropped_events_count += gone
                    n += gone
                for event in span.events:
                    n += _strip_attributes(event)
                for link in span.links:
                    n += _strip_attributes(link)
    return n


def without_content(
    body: bytes, content_type: str, encoding: str | None, *, max_bytes: int
) -> tuple[bytes, str, str | None]:
    """``body`` with its content removed (see the module doc); BadInput if undecodable."""
    # deferred: the OTLP decoder (protobuf, pyarrow) loads only when content is stripped
    from slokit.sources.otlp import decompress, parse_request

    raw = decompress(body, encoding, max_bytes)
    if not any(m in raw for m in _MARKERS):
        return body, content_type, encoding
    msg = parse_request(raw, content_type)
    if not strip_content(msg):  # the words appeared, but not as content
        return body, content_type, encoding
    out = msg.SerializeToString()
    enc = (encoding or "").strip().lower()
    if enc in ("gzip", "x-gzip"):
        return gzip.compress(out, compresslevel=1), "application/x-protobuf", "gzip"
    if enc == "deflate":
        return zlib.compress(out, 1), "application/x-protobuf", "deflate"
    return out, "application/x-protobuf", None


def traces_url(url: str) -> str:
    """``http://collector:4318`` -> ``http://collector:4318/v1/traces``; a path is kept."""
    rest = url.split("://", 1)[-1]
    return url if "/" in rest.rstrip("/") else url.rstrip("/") + "/v1/traces"


class Forwarder:
    def __init__(
        self,
        url: str,
        metrics: SidecarMetrics,
        *,
        max_items: int = 1000,
        max_bytes: int = 64 * 1024 * 1024,
        timeout_s: float = 10.0,
        token: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        forward_content: bool = False,
        max_body_bytes: int = 64 * 1024 * 1024,
    ) -> None:
        self.url = traces_url(url)
        self.metrics = metrics
        self.max_items = max_items
        self.max_bytes = max_bytes
        self.forward_content = forward_content
        self.max_body_bytes = max_body_bytes
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._client = httpx.AsyncClient(transport=transport, timeout=timeout_s, headers=headers)
        self._queue: deque[tuple[bytes, str, str | None]] = deque()
        self._bytes = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.sent = 0

    def submit(self, body: bytes, content_type: str, encoding: str | None) -> None:
        """Queue one body; never blocks."""
        if len(self._queue) >= self.max_items or self._bytes + len(body) > self.max_bytes:
            self.metrics.dropped.labels(reason="forward_queue_full").inc()
            return
        self._queue.append((body, content_type, encoding))
        self._bytes += len(body)
        self._wake.set()

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._queue:
                body, ct, enc = self._queue.popleft()
                self._bytes -= len(body)
                try:
                    ok = await self._send(body, ct, enc)
                except Exception:  # one export must never stop the forwarding of the rest
                    log.exception("forwarding an export to %s failed", self.url)
                    ok = False
                if ok:
                    self.sent += 1
                else:
                    self.metrics.dropped.labels(reason="forward_failed").inc()

    async def _send(self, body: bytes, ct: str, enc: str | None) -> bool:
        """Post one export upstream (its content removed unless ``forward_content``); whether
        the upstream took it."""
        if not self.forward_content:
            try:
                body, ct, enc = await asyncio.to_thread(
                    without_content, body, ct, enc, max_bytes=self.max_body_bytes
                )
            except BadInput as exc:  # never forward what could not be checked
                log.warning("not forwarding a body that cannot be decoded: %s", exc)
                return False
        headers = {"Content-Type": ct}
        if enc:
            headers["Content-Encoding"] = enc
        try:
            resp = await self._client.post(self.url, content=body, headers=headers)
        except httpx.HTTPError as exc:
            log.warning("forwarding to %s failed: %s", self.url, exc)
            return False
        return resp.status_code < 300

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="otlp forwarder")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._client.aclose()
