"""The sidecar's API on 9464: metrics, probes, explain, diagnose, quality feedback, and the
read-only data endpoints :class:`slokit.store.remote.SidecarReader` asks (``/api/bounds``,
``/api/requests``, ``/api/energy``, ``/api/engine_series``, ``/api/findings``,
``/api/cache_config``, ``/api/request``, ``/api/slowest_request``), each answered by one
:class:`~slokit.store.reader.LocalReader` method.

Reads run in worker threads on their own DuckDB cursor (the writer keeps the connection), so
a slow query never stalls ingest. ``/healthz`` and ``/readyz`` are open; everything else
needs the bearer token when one is configured.

Bad input is a JSON ``{"error": ...}`` with 400 (malformed), 404 (not found, unknown path),
405, 413 (body too large), 414 (request id too long) or 415, never a 500. A request id is
looked up as ``/api/explain/<id>`` (percent-encoded; any character, ``/`` included) or
``/api/explain?id=<id>``.

``/api/requests`` answers a window's records a page at a time (``limit``, at most
:data:`MAX_PAGE_RECORDS`, and the page before's ``next`` cursor as ``after``); each page reads
one slice of the window, cut by time (:func:`_records_page`), so a long window is never held
in memory at once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler
from aiohttp.web_protocol import RequestPayloadError
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

import slokit
from slokit.analysis.slo_spec import SloSpec
from slokit.errors import BadInput, NotFound
from slokit.ids import MAX_REQUEST_ID_CHARS, candidate_ids, checked_request_id
from slokit.sidecar.metrics import SidecarMetrics
from slokit.sidecar.otlp_http import bearer_auth
from slokit.sidecar.write_errors import QueueFull, RecordsRefused, WriterStopped
from slokit.sidecar.writer import Writer
from slokit.store.db import Store
from slokit.store.reader import LocalReader
from slokit.store.remote import decode_page_key, encode_page_key
from slokit.store.retention import requests_whole_from
from slokit.store.window import resolve_window
from slokit.timeutil import iso

log = logging.getLogger("slokit.sidecar.api")

MAX_FEEDBACK_BYTES = 4 * 1024 * 1024
#: The Content-Encodings a feedback body may come in: what aiohttp's reader inflates (``br``
#: and ``zstd`` only where their decoders are installed: elsewhere its parser answers 400).
#: Any other would be read as if uncompressed.
FEEDBACK_ENCODINGS = ("identity", "gzip", "deflate", "br", "zstd")
#: The API's request line may be this long: a request id of MAX_REQUEST_ID_CHARS characters
#: fits percent-encoded, and a longer one (up to about 10,000 bytes) still reaches the handler,
#: which answers 414 with the limit instead of aiohttp's bare "line too long".
MAX_LINE_BYTES = 32 * 1024
#: Records per ``/api/requests`` page unless ``limit`` says fewer, and the most it may say.
PAGE_RECORDS = 1000
MAX_PAGE_RECORDS = 10_000
#: Most findings ``/api/findings`` lists (``limit``; the reader's default is 200).
MAX_FINDINGS = 1000
#: Count queries a page may spend finding where its slice of the window ends.
_MAX_PROBES = 64


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=headers)


def _json(doc: object) -> web.Response:
    return web.json_response(doc, dumps=lambda o: json.dumps(o, default=str))


def _id_error(rid: str) -> web.Response | None:
    """414 for an id longer than any kept, 400 for one that cannot be an id, else None."""
    if min(len(c) for c in candidate_ids(rid) or [rid]) > MAX_REQUEST_ID_CHARS:
        return _error(414, f"request id of {len(rid)} characters: request ids are at most "
                           f"{MAX_REQUEST_ID_CHARS} characters")  # fmt: skip
    try:
        checked_request_id(rid)
    except BadInput as exc:
        return _error(400, str(exc))
    return None


def _count(query: Mapping[str, str], name: str, default: int, most: int) -> int:
    """A positive integer query parameter of at most ``most`` (BadInput otherwise)."""
    raw = query.get(name)
    if raw is None:
        return default
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 9) or not 1 <= int(raw) <= most:
        raise BadInput(f"{name}={raw[:20]!r}: expected a whole number from 1 to {most}")
    return int(raw)


def _bounds(reader: LocalReader, query: Mapping[str, str]) -> tuple[float | None, float | None]:
    """``since``/``until`` as the reader's methods take them (ISO 8601, Unix seconds or a
    duration back from the newest data; absent: open). Each bound is parsed on its own: a
    window that ends before it starts is no error here, it holds nothing."""
    since = resolve_window(reader, query.get("since"), None).since
    until = resolve_window(reader, None, query.get("until")).until
    return since, until


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """aiohttp's own answers (unknown path, wrong method, body too large) as JSON errors."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        headers = {k: v for k, v in exc.headers.items() if k.lower() in ("allow", "retry-after")}
        text = exc.text or ""
        default = not text or text.startswith(f"{exc.status}:")  # "404: Not Found"
        return _error(exc.status, exc.reason if default else text, headers)


class Api:
    def __init__(
        self,
        store: Store,
        writer: Writer,
        metrics: SidecarMetrics,
        *,
        spec: SloSpec | None = None,
        ready: Callable[[], bool] | None = None,
        ack_timeout_s: float = 30.0,
        not_found_hint: str | None = None,
        threads: int = 0,
    ) -> None:
        """``threads``: the API's own threads for its reads (0: the event loop's default
        executor, shared with the receivers' decoding and the scrapes' parsing)."""
        #: Appended to explain's 404: where a request this store no longer holds went.
        self.not_found_hint = not_found_hint
        self.store = store
        self.writer = writer
        self.metrics = metrics
        self.spec = spec
        self.ready = ready or (lambda: True)
        self.ack_timeout_s = ack_timeout_s
        self._pool = (
            concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="slokit-api")
            if threads
            else None
        )

    def app(self, token: str | None = None) -> web.Application:
        app = web.Application(client_max_size=MAX_FEEDBACK_BYTES,
                              middlewares=[json_errors, bearer_auth(token)])  # fmt: skip
        r = app.router
        r.add_get("/metrics", self.metrics_handler)
        r.add_get("/healthz", self.healthz)
        r.add_get("/readyz", self.readyz)
        r.add_get("/api/explain/{request_id:.+}", self.explain)
        r.add_get("/api/explain", self.explain)
        r.add_get("/api/diagnose", self.diagnose)
        r.add_get("/api/bounds", self.data_bounds)
        r.add_get("/api/requests", self.records)
        r.add_get("/api/request", self.record)
        r.add_get("/api/slowest_request", self.slowest)
        r.add_get("/api/energy", self.energy)
        r.add_get("/api/engine_series", self.engine_series)
        r.add_get("/api/findings", self.findings)
        r.add_get("/api/cache_config", self.cache_config)
        r.add_post("/v1/feedback", self.feedback)
        return app

    async def _read(self, fn: Callable[[Any], Any]) -> Any:
        def run() -> Any:
            self.writer.flush()  # what was acknowledged is in the store before it is read
            cur = self.store.cursor()
            try:
                return fn(cur)
            finally:
                cur.close()

        if self._pool is None:
            return await asyncio.to_thread(run)
        return await asyncio.get_running_loop().run_in_executor(self._pool, run)

    async def close(self) -> None:
        """Reads not yet started are dropped (their clients are gone with the listener)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def _gone(self, exc: NotFound, mark: float | None) -> dict[str, Any]:
        """Explain's 404 where retention deletes requests: what the store keeps, and whether
        it has deleted any (``mark``: the file's ``requests_whole_from``; None: it has not,
        and the request never reached it)."""
        hint = self.not_found_hint
        if mark is None:
            gone = "it has recorded no deletion: the request never reached it"
            return {"error": f"{exc}; {hint}; {gone}", "retention": hint}
        gone = f"it deleted those that arrived up to {iso(mark)}: a later one never reached it"
        return {"error": f"{exc}; {hint}; {gone}", "retention": hint, "requests_from": iso(mark)}

    # -- handlers ------------------------------------------------------------------------
    async def metrics_handler(self, request: web.Request) -> web.Response:
        self.metrics.ingest_lag.set(self.writer.lag_s())
        self.metrics.queue_depth.set(self.writer.depth)
        body = generate_latest(self.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(self, request: web.Request) -> web.Response:
        """200 when the sidecar takes data; else 503 and ``reason``, e.g. the storage fault
        (disk full, I/O error) that fails its writes to the store or the journal, until a
        write succeeds again."""
        fault = self.store.storage_error or self.writer.journal_fault
        checks = {"writer": self.writer.alive, "store": self._store_open(), "storage": not fault}
        checks["started"] = self.ready()
        ok = all(checks.values())
        doc: dict[str, Any] = {"ready": ok, **checks}
        if not ok:
            doc["reason"] = (
                f"writes are failing: {fault}" if fault
                else "; ".join(f"{k} not ready" for k, v in checks.items() if not v)
            )  # fmt: skip
        return web.json_response(doc, status=200 if ok else 503)

    def _store_open(self) -> bool:
        return self.store.answers()

    async def explain(self, request: web.Request) -> web.Response:
        # deferred: the explain stack is loaded on the first request for it (the sidecar's
        # steady state stays off slokit.analysis beyond the SLO classes)
        from slokit.analysis.explain import explain_request

        rid = request.match_info.get("request_id", request.query.get("id"))
        if rid is None:
            return _error(400, "which request? /api/explain/<id> or /api/explain?id=<id>")
        bad = _id_error(rid)
        if bad is not None:
            return bad
        try:
            doc = await self._read(
                lambda con: explain_request(LocalReader(con), rid, spec=self.spec)
            )
        except NotFound as exc:
            if not self.not_found_hint:
                return _error(404, str(exc))
            mark = await self._read(requests_whole_from)
            return web.json_response(self._gone(exc, mark), status=404)
        except BadInput as exc:
            return _error(400, str(exc))
        return _json(doc)

    async def diagnose(self, request: web.Request) -> web.Response:
        since_raw, until_raw = request.query.get("since"), request.query.get("until")

        def run(con: Any) -> Any:
            reader = LocalReader(con)  # from where the file's requests are whole
            return slokit.diagnose(reader, since_raw, until_raw).to_dict()

        try:
            doc = await self._read(run)
        except NotFound as exc:
            return _error(404, str(exc))
        except BadInput as exc:
            return _error(400, str(exc))
        return _json(doc)

    # -- the data a remote reader asks (slokit.store.remote.SidecarReader) ----------------
    async def _answer(self, fn: Callable[[LocalReader], object]) -> web.Response:
        """``fn(LocalReader(cursor))`` in a worker thread, as JSON; BadInput is a 400."""
        try:
            doc = await self._read(lambda con: fn(LocalReader(con)))
        except BadInput as exc:
            return _error(400, str(exc))
        return _json(doc)

    async def data_bounds(self, request: web.Request) -> web.Response:
        """``{"oldest", "newest"}``: epoch seconds over requests, engine and GPU samples."""

        def run(reader: LocalReader) -> dict[str, float | None]:
            oldest, newest = reader.bounds()
            return {"oldest": oldest, "newest": newest}

        return await self._answer(run)

    async def records(self, request: web.Request) -> web.Response:
        """``{"records": [...], "next": cursor | null}``: records arriving in
        ``[since, until)``, oldest first, at most ``limit`` of them, from the ``after``
        cursor on (docs/schema/requests-page.schema.json)."""
        query = request.query

        def run(reader: LocalReader) -> dict[str, Any]:
            since, until = _bounds(reader, query)
            limit = _count(query, "limit", PAGE_RECORDS, MAX_PAGE_RECORDS)
            after = decode_page_key(query["after"]) if "after" in query else None
            records, nxt = reader.requests_page(since, until, after, limit)
            return {"records": records, "next": encode_page_key(nxt) if nxt else None}

        return await self._answer(run)

    async def record(self, request: web.Request) -> web.Response:
        """``{"record": {...} | null}``: the merged record of ``?id=`` (any accepted form)."""
        rid = request.query.get("id")
        if rid is None:
            return _error(400, "which request? /api/request?id=<id>")
        bad = _id_error(rid)
        if bad is not None:
            return bad
        return await self._answer(lambda reader: {"record": reader.request(rid)})

    async def slowest(self, request: web.Request) -> web.Response:
        """``{"request_id": ... | null}``: the successful request with ``source``'s fragment
        (default vllm) that waited longest for its first token."""
        source = request.query.get("source", "vllm")
        if not source or len(source) > 64:
            return _error(400, "source: expected a fragment source such as vllm or client")
        return await self._answer(
            lambda reader: {"request_id": reader.slowest_request(source=source)}
        )

    async def energy(self, request: web.Request) -> web.Response:
        """``{"joules": ... | null}``: energy used by all GPUs over ``[since, until]``."""
        query = request.query
        return await self._answer(
            lambda reader: {"joules": reader.energy_increase(*_bounds(reader, query))}
        )

    async def engine_series(self, request: web.Request) -> web.Response:
        """``{"replicas": {replica: [[ts, running, waiting], ...]}}`` over the window."""
        query = request.query
        return await self._answer(
            lambda reader: {"replicas": reader.engine_series(*_bounds(reader, query))}
        )

    async def findings(self, request: web.Request) -> web.Response:
        """``{"findings": [...]}``: stored findings overlapping the window, most severe
        first, then newest (at most ``limit``, default 200)."""
        query = request.query

        def run(reader: LocalReader) -> dict[str, Any]:
            since, until = _bounds(reader, query)
            limit = _count(query, "limit", 200, MAX_FINDINGS)
            return {"findings": reader.findings(since, until, limit)}

        return await self._answer(run)

    async def cache_config(self, request: web.Request) -> web.Response:
        """``{"cache_config": {"num_gpu_blocks", "block_size"} | null}``."""
        return await self._answer(lambda reader: {"cache_config": reader.cache_config()})

    async def feedback(self, request: web.Request) -> web.Response:
        """``[{"request_id", "quality_pass"}]`` or one such object -> quality fragments."""
        # deferred: the file parsers (and the load-tool readers they pull in) load on the
        # first feedback POST, not in every running sidecar
        from slokit.sources.files import parse_quality

        enc = (request.headers.get("Content-Encoding") or "identity").strip().lower()
        if enc not in FEEDBACK_ENCODINGS:  # aiohttp would read it raw, or answer in plain text
            return _error(415, f"unsupported Content-Encoding {enc[:64]!r}: send the body "
                               "uncompressed, gzip or deflate")  # fmt: skip
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return _error(413, f"body over {MAX_FEEDBACK_BYTES} bytes")
        except RequestPayloadError as exc:  # broken framing, undecodable Content-Encoding
            return _error(400, f"malformed request body: {exc}")
        except web.HTTPException as exc:  # any other refusal of aiohttp's reader, as JSON
            return _error(exc.status if exc.status >= 400 else 400,
                          f"malformed request body: {exc.reason}")  # fmt: skip
        try:
            doc = json.loads(body)
        except (ValueError, RecursionError):  # not JSON, not UTF-8, a 5,000-digit number, ...
            return _error(400, "body must be JSON: [{request_id, quality_pass}] or one object")
        rows = doc if isinstance(doc, list) else [doc]
        if not rows or not all(isinstance(r, dict) for r in rows):
            return _error(400, "expected objects with request_id and quality_pass")
        try:
            for r in rows:
                if isinstance(r.get("request_id"), str):
                    checked_request_id(r["request_id"]).encode("utf-8")
            lines = "\n".join(json.dumps(r) for r in rows)
            frags = parse_quality(lines, name="feedback")
        except BadInput as exc:
            return _error(400, str(exc))
        except (ValueError, RecursionError):  # a lone surrogate; nesting json cannot re-encode
            return _error(400, "request_id must be text without lone surrogates")
        try:
            fut = self.writer.submit("fragments", frags)
            await asyncio.wait_for(asyncio.wrap_future(fut), self.ack_timeout_s)
        except (QueueFull, WriterStopped, TimeoutError):
            return _error(503, "sidecar overloaded; retry", {"Retry-After": "1"})
        except RecordsRefused as exc:  # the store cannot hold them: retrying cannot help
            return _error(422, str(exc))
        except Exception as exc:  # a failed commit of the database itself: retryable
            return _error(503, f"write failed: {exc}; retry", {"Retry-After": "1"})
        return web.json_response({"accepted": len(frags)})
