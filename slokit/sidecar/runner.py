"""The sidecar process: one asyncio loop wiring sources to the one writer, and the servers.

:class:`Sidecar` opens the store (quarantining a corrupt WAL instead of crash-looping), starts
the writer thread, the OTLP/HTTP and OTLP/gRPC receivers, the API, the scrape loops and the
periodic tasks (SLI accounting, findings, Parquet export). ``start``/``stop`` are separate so
tests run a real sidecar on free ports inside their own event loop; :func:`run` is the
blocking entry point the CLI uses (stops on SIGINT/SIGTERM, committing what is queued).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import httpx
from aiohttp import web
from prometheus_client import CollectorRegistry

from slokit.errors import BadInput
from slokit.sidecar.api import MAX_LINE_BYTES, Api
from slokit.sidecar.body_budget import ByteBudget
from slokit.sidecar.config import SidecarConfig, split_host_port
from slokit.sidecar.connections import (
    ConnectionGuard,
    ConnectionMetrics,
    GuardedSite,
    Limits,
    fit_caps,
    handler_kwargs,
)
from slokit.sidecar.discovery import discovery_path, remove_discovery, write_discovery
from slokit.sidecar.findings_window import diagnosis_window
from slokit.sidecar.forward import Forwarder
from slokit.sidecar.journal import Journal
from slokit.sidecar.labels import label_limits
from slokit.sidecar.metrics import SidecarMetrics
from slokit.sidecar.otlp_http import OtlpHttpReceiver
from slokit.sidecar.otlp_ingest import OtlpIngest
from slokit.sidecar.scrape import NvmlLoop, Scraper
from slokit.sidecar.sli import SliAccountant
from slokit.sidecar.writer import Writer
from slokit.store.db import Store, open_store
from slokit.store.faults import inspect_wal
from slokit.store.lake_export import TABLES as LAKE_TABLES
from slokit.store.lake_export import ParquetExporter
from slokit.store.retention import (
    prune_past_lake_hold,
    prune_requests,
    prune_samples,
    raise_whole_from,
    requests_whole_from,
    skip_vacuum,
)
from slokit.store.usage import read_usage

log = logging.getLogger("slokit.sidecar")


def _aside(wal: Path, what: str) -> Path:
    return wal.with_name(f"{wal.name}.{what}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}")


def open_store_quarantining(
    path: str, metrics: SidecarMetrics, settings: Mapping[str, Any] | None = None
) -> Store:
    """Open the store, saying what became of its WAL.

    DuckDB replays the complete commits of a WAL and drops a torn tail, and ignores a WAL it
    does not recognise, both silently: the WAL is walked first (slokit.store.faults), and
    either case is logged, counted in ``slokit_wal_damaged_total{kind}`` and a copy kept
    beside it. A WAL DuckDB refuses to replay is set aside whole and the store opened without
    it (``slokit_wal_quarantined_total``). After a replay the store is checkpointed at once,
    so a later problem with the WAL cannot cost those records. A truncated, foreign or
    newer-schema file raises BadInput (the sidecar exits with that line). ``settings`` are
    DuckDB's options at connect (:func:`store_settings`).
    """
    if path == ":memory:":
        return open_store(path, settings=settings)
    wal = Path(path + ".wal")
    check = inspect_wal(wal)
    copy: Path | None = None
    if check is not None and check.state in ("torn_tail", "unreadable"):
        copy = _aside(wal, "torn" if check.state == "torn_tail" else "unreadable")
        try:
            shutil.copyfile(wal, copy)
        except OSError as exc:  # a full volume: say so, the replay goes ahead regardless
            log.error("cannot keep a copy of the damaged WAL %s at %s: %s", wal, copy, exc)
            copy = None
    try:
        store = open_store(path, verify=True, settings=settings)
    except BadInput as exc:
        if "WAL" not in str(exc) or not wal.exists():
            raise
        aside = _aside(wal, "quarantined")
        wal.rename(aside)
        if copy is not None:
            copy.unlink(missing_ok=True)  # the whole WAL is set aside instead
        metrics.wal_quarantined.inc()
        log.error(
            "CORRUPT WAL: %s could not be replayed (%s); moved to %s and starting without it. "
            "Records written since the last checkpoint are in that file, not in the store.",
            wal,
            exc,
            aside,
        )
        return open_store(path, verify=True, settings=settings)
    if check is not None and check.state == "torn_tail":
        metrics.wal_damaged.labels(kind="torn_tail").inc()
        log.error(
            "TORN WAL: %s ends inside a transaction: its %d complete commits were replayed and "
            "the last %d bytes (an unfinished commit: a crash while writing, or a lost write) "
            "were dropped; the WAL as found is at %s.",
            wal, check.commits, check.dropped, copy,
        )  # fmt: skip
    elif check is not None and check.state == "unreadable":
        metrics.wal_damaged.labels(kind="discarded").inc()
        log.error(
            "UNREADABLE WAL: %s (%d bytes) is not a WAL DuckDB can replay, and DuckDB ignores "
            "it: records written since the last checkpoint are only in its copy at %s.",
            wal, check.size, copy,
        )  # fmt: skip
    elif check is not None and check.state == "unknown":
        log.info("the WAL %s has a header this slokit cannot walk; DuckDB replayed it", wal)
    if check is not None:
        try:  # the replayed records into the file, the WAL emptied
            store.con.execute("CHECKPOINT").fetchall()
        except Exception as exc:  # e.g. a full volume: the WAL still holds them
            log.warning("checkpoint after replaying %s failed: %s", wal, exc)
    return store


def store_settings(cfg: SidecarConfig) -> dict[str, Any]:
    """DuckDB's thread pools for the sidecar, given at connect: DuckDB starts them there, four
    async I/O threads per core of the node unless told (``native_threads``)."""
    settings: dict[str, Any] = {}
    if cfg.db_threads:
        settings["threads"] = cfg.db_threads
    if cfg.native_threads:
        settings["async_threads"] = cfg.native_threads
    return settings


def retention_hint(cfg: SidecarConfig) -> str | None:
    """What explain's 404 adds when the store deletes its oldest requests (None: it keeps all)."""
    bounds = []
    if cfg.retention_requests:
        bounds.append(f"its newest {cfg.retention_requests:,} requests")
    if cfg.retention_s:
        bounds.append(f"those first seen in the last {cfg.retention_s:g} s")
    if not bounds:
        return None
    where = "in the lake (parquet_dir)" if cfg.parquet_dir else "gone: no lake (parquet_dir) is set"
    return f"this sidecar keeps {' and '.join(bounds)} (retention); an older one is {where}"


#: How often the requests past the retention bounds are deleted (config retention_*).
RETENTION_INTERVAL_S = 30.0
#: How long retention waits for a lake's tick to end before deleting what the lake may write.
LAKE_PAUSE_WAIT_S = 10.0
#: how often the store's memory and file are read for /metrics (slokit.store.usage)
STORE_USAGE_INTERVAL_S = 10.0
#: A finding counts as active (slokit_findings_active) while it ended this recently.
FINDINGS_ACTIVE_S = 60.0
#: While stopping, how often the queries of periodic work still running are interrupted.
STOP_POLL_S = 0.1
#: While stopping, how long one component (a receiver, the scraper, the forwarder) may take to
#: stop before the sidecar goes on without it: grpc.aio's server stop can fail to return (a
#: known grpc bug), and what was acknowledged is still committed and the store closed.
STOP_COMPONENT_S = 15.0


class Sidecar:
    """A running sidecar. Injectables: ``registry`` (metrics), ``scrape_transport`` and
    ``forward_transport`` (httpx), ``before_commit`` (writer hook), ``nvml_poller``."""

    def __init__(
        self,
        config: SidecarConfig,
        *,
        registry: CollectorRegistry | None = None,
        scrape_transport: httpx.AsyncBaseTransport | None = None,
        forward_transport: httpx.AsyncBaseTransport | None = None,
        before_commit: Callable[[], None] | None = None,
        nvml_poller: Any = None,
    ) -> None:
        self.config = config.validate()
        self.metrics = SidecarMetrics(registry)
        self._scrape_transport = scrape_transport
        self._forward_transport = forward_transport
        self._before_commit = before_commit
        self._nvml_poller = nvml_poller
        self.ports: dict[str, int] = {}
        self.guards: dict[str, ConnectionGuard] = {}  # per HTTP listener: timeouts and cap
        self._runners: list[web.AppRunner] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._inflight: set[asyncio.Future[None]] = set()
        # periodic work running in threads: its cursors (stop interrupts their queries)
        self._cursors: set[Any] = set()
        self._cursors_lock = threading.Lock()
        self._stopping = threading.Event()
        self._stoppables: list[Callable[[], Awaitable[None]]] = []
        self._journal: Journal | None = None
        self._started = False
        self._discovery = False
        self.store: Store | None = None
        self.writer: Writer | None = None
        self.sli: SliAccountant | None = None

    # -- start/stop ----------------------------------------------------------------------
    async def start(self) -> None:
        try:
            await self._start()
        except BaseException:
            await self.stop()
            raise

    async def _start(self) -> None:
        cfg = self.config
        self._stopping.clear()
        spec = None
        if cfg.slo:
            from slokit.analysis.slo_spec import load_spec

            spec = load_spec(cfg.slo)
        store = self.store = await asyncio.to_thread(
            open_store_quarantining, cfg.db, self.metrics, store_settings(cfg)
        )
        if cfg.db_memory_limit:
            try:
                store.con.execute("SET memory_limit = ?", [cfg.db_memory_limit])
            except Exception as exc:  # duckdb.Error: a bad size string
                raise BadInput(f"db_memory_limit {cfg.db_memory_limit!r}: {exc}") from None
        if cfg.db_allocator_background_threads:  # process-wide: DuckDB has one allocator
            store.con.execute("SET allocator_background_threads = true")
        if cfg.retention_requests or cfg.retention_s:  # pruned oldest first: no dead rows left
            skip_vacuum(store)
        journal_path = cfg.journal_path()
        journal = None
        if journal_path is not None:
            try:
                journal = Journal(journal_path)
            except OSError as exc:
                raise BadInput(f"journal {journal_path}: {exc.strerror or exc}") from None
            self._journal = journal
        writer = self.writer = Writer(
            store, metrics=self.metrics, capacity=cfg.queue_capacity, batch_max=cfg.batch_max,
            linger_s=cfg.batch_linger_s, journal=journal, commit_interval_s=cfg.commit_interval_s,
            samples_interval_s=cfg.sample_commit_interval_s, before_commit=self._before_commit,
        )  # fmt: skip
        await asyncio.to_thread(writer.start)  # a journal left by a crash is replayed first
        self.sli = SliAccountant(self.metrics, spec, grace_s=cfg.sli_grace_s,
                                 labels=label_limits(cfg), max_series=cfg.metrics_max_series)  # fmt: skip

        forward = None
        if cfg.forward_otlp:
            fwd = Forwarder(cfg.forward_otlp, self.metrics, transport=self._forward_transport,
                            forward_content=cfg.forward_content,
                            max_body_bytes=cfg.max_body_bytes)  # fmt: skip
            fwd.start()
            self._stoppables.append(fwd.stop)
            forward = fwd.submit
        self.metrics.otlp_body_budget.set(cfg.otlp_body_budget_bytes)
        budget = ByteBudget(cfg.otlp_body_budget_bytes)
        self.metrics.otlp_body_bytes_held.set_function(lambda: budget.used)  # read at a scrape
        ingest = OtlpIngest(
            writer, self.metrics, max_bytes=cfg.max_body_bytes, default_replica=cfg.replica,
            ack_timeout_s=cfg.ack_timeout_s, forward=forward, budget=budget,
        )  # fmt: skip

        api = Api(store, writer, self.metrics, spec=spec, ready=lambda: self._started,
                  ack_timeout_s=cfg.ack_timeout_s, not_found_hint=retention_hint(cfg),
                  threads=cfg.api_threads)  # fmt: skip
        self._stoppables.append(api.close)
        # Each listener's own connection cap, within what the open-file limit allows.
        caps = fit_caps({"api": cfg.api_max_connections,
                         **{k: cfg.otlp_max_connections for k in ("otlp_http", "otlp_grpc")
                            if getattr(cfg, k)}})  # fmt: skip
        conn_metrics = ConnectionMetrics(self.metrics.registry)
        self.ports["api"] = await self._serve(api.app(cfg.token), cfg.listen, "api", caps["api"],
                                              conn_metrics, max_line_size=MAX_LINE_BYTES)  # fmt: skip
        if cfg.otlp_http:
            app = OtlpHttpReceiver(ingest).app(cfg.token)
            # the decoder undoes Content-Encoding itself, stopping at the limit (gzip bombs)
            self.ports["otlp_http"] = await self._serve(app, cfg.otlp_http, "otlp_http",
                                                        caps["otlp_http"], conn_metrics,
                                                        auto_decompress=False)  # fmt: skip
        if cfg.otlp_grpc:
            from slokit.sidecar.otlp_grpc import OtlpGrpcReceiver

            grpc_rx = OtlpGrpcReceiver(ingest, cfg.token, limits=self._limits(caps["otlp_grpc"]))
            self.ports["otlp_grpc"] = await grpc_rx.start(cfg.otlp_grpc)
            self._stoppables.append(grpc_rx.stop)

        targets = cfg.targets()
        if targets:
            sli = self.sli
            scraper = Scraper(
                targets, writer, self.metrics, interval_s=cfg.scrape_interval_s,
                timeout_s=cfg.timeout_s, transport=self._scrape_transport,
                sample_limit=cfg.scrape_sample_limit, body_limit_bytes=cfg.scrape_body_limit_bytes,
                on_up=lambda t, up, dt: sli.accrue(t.replica, dt) if up and t.kind == "vllm" else None,
            )  # fmt: skip
            scraper.start()
            self._stoppables.append(scraper.stop)
        if cfg.nvml:
            poller = self._nvml_poller
            if poller is None:
                from slokit.sources.nvml import NvmlPoller

                poller = NvmlPoller(replica=cfg.replica)
            nvml = NvmlLoop(poller, writer, self.metrics, interval_s=cfg.scrape_interval_s)
            nvml.start()
            self._stoppables.append(nvml.stop)

        # on /metrics from the start, then every STORE_USAGE_INTERVAL_S
        await asyncio.to_thread(self._on_cursor, store, self._store_usage_tick)
        self._periodic("store_usage", STORE_USAGE_INTERVAL_S, self._store_usage_tick)
        self._periodic("sli", cfg.sli_interval_s, self._sli_tick)
        if cfg.diagnose_interval_s > 0:  # 0: no periodic findings, the analysis stack unloaded
            self._periodic("findings", cfg.diagnose_interval_s, self._findings_tick)
        # the lake: closed minutes as Parquet
        exporter = ParquetExporter(cfg.parquet_dir, writer=cfg.replica) if cfg.parquet_dir else None
        if exporter is not None:
            self._periodic("parquet", 10.0, exporter.export_closed_minutes)
        await asyncio.to_thread(self._on_cursor, store, self._whole_from_at_start)
        if cfg.retention_requests or cfg.retention_s:
            self._periodic("retention", RETENTION_INTERVAL_S, lambda c: self._prune(c, exporter))
        if cfg.db != ":memory:":
            host = split_host_port(cfg.listen)[0]
            host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
            host = f"[{host}]" if ":" in host else host
            try:
                write_discovery(cfg.db, f"http://{host}:{self.ports['api']}")
                self._discovery = True
            except OSError as exc:  # e.g. a full volume: the sidecar's work goes on
                log.warning(
                    "cannot write %s (%s): running without it; commands on this machine will "
                    "not find this sidecar by its --db, pass them --sidecar URL",
                    discovery_path(cfg.db), exc.strerror or exc,
                )  # fmt: skip
        self._started = True
        log.info(
            "slokit sidecar ready: %s; db %s; %d scrape targets",
            ", ".join(f"{k} port {v}" for k, v in self.ports.items()),
            cfg.db,
            len(targets),
        )

    def _limits(self, max_connections: int) -> Limits:
        cfg = self.config
        return Limits(header_timeout_s=cfg.header_timeout_s, body_timeout_s=cfg.body_timeout_s,
                      idle_timeout_s=cfg.idle_timeout_s, max_connections=max_connections)  # fmt: skip

    async def _serve(
        self,
        app: web.Application,
        address: str,
        name: str,
        max_connections: int,
        metrics: ConnectionMetrics,
        *,
        max_line_size: int = 8190,
        **server_kw: Any,
    ) -> int:
        """Serve ``app`` on ``address`` behind a connection guard (header/body/idle timeouts,
        a cap that evicts incomplete requests first: see slokit.sidecar.connections)."""
        host, port = split_host_port(address)
        guard = self.guards[name] = ConnectionGuard(name, self._limits(max_connections),
                                                    metrics=metrics)  # fmt: skip
        guard.install(app)
        runner = web.AppRunner(
            app, access_log=None, handle_signals=False, shutdown_timeout=10.0,
            **handler_kwargs(max_line_size), **server_kw,
        )  # fmt: skip
        await runner.setup()
        site = GuardedSite(runner, host, port, guard, reuse_address=True)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise BadInput(f"cannot listen on {address}: {exc.strerror or exc}") from None
        self._runners.append(runner)
        return site.port

    def _periodic(self, name: str, every_s: float, fn: Callable[[Any], Any]) -> None:
        store = self.store
        assert store is not None

        def once() -> None:
            if not self._stopping.is_set():
                self._on_cursor(store, fn)

        async def loop() -> None:
            while True:
                await asyncio.sleep(every_s)
                # A thread cannot be cancelled: track its future so stop() waits for it
                # (interrupting its queries) before closing the store under it.
                fut = asyncio.get_running_loop().run_in_executor(None, once)
                self._inflight.add(fut)
                fut.add_done_callback(self._inflight.discard)
                try:
                    await asyncio.shield(fut)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    if self._stopping.is_set():  # its query was interrupted by stop()
                        log.debug("periodic task %s interrupted by stop", name)
                    else:
                        log.exception("periodic task %s failed", name)

        self._tasks.append(asyncio.create_task(loop(), name=name))

    def _on_cursor(self, store: Store, fn: Callable[[Any], Any]) -> None:
        """``fn`` on a cursor of its own, never the writer's connection (a read there would
        run inside the writer's transaction); stop() interrupts it while it runs."""
        cur = store.cursor()
        with self._cursors_lock:
            self._cursors.add(cur)
        try:
            fn(cur)
        finally:
            with self._cursors_lock:
                self._cursors.discard(cur)
            cur.close()

    def _store_usage_tick(self, con: Any) -> None:
        self.metrics.set_store_usage(read_usage(con))

    def _sli_tick(self, con: Any) -> None:
        assert self.sli is not None
        self.sli.tick(con)

    def _prune(self, con: Any, lake: ParquetExporter | None) -> None:
        """Delete the requests past the retention bounds and the time series' rows older
        than ``retention_s`` (slokit.store.retention); with a lake, only what it has written
        and no longer revisits."""
        store, cfg = self.store, self.config
        if store is None or self._stopping.is_set():
            return
        # per table, what the lake has not written is kept (nothing written yet: all of it)
        keep = {t.name: lake.settled_before(t.name) or 0.0 for t in LAKE_TABLES} if lake else {}
        now = store.clock()
        pruned = prune_requests(
            store,
            now=now,
            max_age_s=cfg.retention_s or None,
            max_requests=cfg.retention_requests or None,
            keep_arrivals_from=keep.get("requests"),
        )
        if pruned.requests:
            self.metrics.requests_pruned.inc(pruned.requests)
            log.debug("retention: deleted %d requests (%d fragments)", pruned.requests,
                      pruned.fragments)  # fmt: skip
        if lake is not None and cfg.retention_requests:
            self._prune_past_hold(store, lake, cfg.retention_requests + cfg.lake_hold_requests)
        self._export_whole_from(con)
        if not cfg.retention_s:
            return
        rows = prune_samples(store, now=now, max_age_s=cfg.retention_s, keep_from=keep)
        for table, n in rows.items():
            self.metrics.rows_pruned.labels(table=table).inc(n)

    def _export_whole_from(self, con: Any) -> None:
        """The gauge of where the store's requests are whole from, as the file keeps it
        (retention raises it in the transaction that deletes them)."""
        mark = requests_whole_from(con)
        if mark is not None:
            self.metrics.requests_whole_from.set(mark)

    def _whole_from_at_start(self, con: Any) -> None:
        """A file pruned before schema 11 keeps no mark: one already at
        ``retention_requests`` had its older requests deleted by an earlier run; it is
        marked whole from its oldest arrival on (the next deletion raises it)."""
        bound = self.config.retention_requests
        if bound and requests_whole_from(con) is None:
            sql = "SELECT count(*), epoch(min(arrival_ts)) FROM requests"
            n, oldest = con.execute(sql).fetchall()[0]
            if n >= bound:
                raise_whole_from(con, oldest)
        self._export_whole_from(con)

    def _prune_past_hold(self, store: Store, lake: ParquetExporter, bound: int) -> None:
        """Keep the store within ``bound`` requests whatever the lake has written (a lake
        that cannot write would hold every request): the oldest go, and the lake stops
        revisiting their minutes, which would otherwise be written again without them."""
        gone = prune_past_lake_hold(store, lake, max_requests=bound, wait_s=LAKE_PAUSE_WAIT_S)
        if gone is None:
            log.debug("retention: the lake's tick is running; the bound waits a round")
            return
        if not gone.requests:
            return
        self.metrics.requests_pruned.inc(gone.requests)
        m = self.metrics.requests_pruned_before_lake
        m.labels(state="unwritten").inc(gone.unwritten)
        m.labels(state="revisited").inc(gone.requests - gone.unwritten)
        log.warning(
            "retention: the store holds more than %d requests (retention_requests + "
            "lake_hold_requests): deleted the oldest %d before the lake settled them, %d of "
            "them in minutes it has not written",
            bound, gone.requests, gone.unwritten,
        )  # fmt: skip

    def _findings_tick(self, con: Any) -> None:
        """Diagnose the recent window, store its findings (``explain`` reads them) and export
        the ones still active.

        The one steady-state user of the analysis stack (pandas and the rules): imported here at
        the first tick, in this process (the sidecar holds the DuckDB file, which one process
        alone may write), never at start; ``diagnose_interval_s: 0`` keeps it out for good."""
        try:
            from slokit.analysis.diagnose import run_diagnosis, store_findings
        except ImportError:
            return
        if self._stopping.is_set():  # the first tick's imports can take seconds
            return
        from slokit.errors import NotFound
        from slokit.store.reader import LocalReader

        reader = LocalReader(con, requests_from=requests_whole_from(con))  # one read a tick
        store = self.store
        if store is None:
            return
        window = diagnosis_window(reader, store.clock(), ongoing_s=self._findings_recent_s(),
                                  requests_from=reader.requests_from)  # fmt: skip
        if window is None:
            return
        since, until = window
        try:
            result = run_diagnosis(reader, since=since, until=until)
        except NotFound:
            return
        if self._stopping.is_set() or self.store is None:
            return
        store_findings(self.store, result.findings, window=(result.since, result.until))
        recent = until - self._findings_recent_s()
        g = self.metrics.findings_active
        g.clear()
        for f in result.findings:
            if f.end_ts >= recent:
                replica = f.replica or "fleet"
                if f.replica and self.sli is not None:  # the label budget of the SLI series
                    replica = self.sli.label("replica", f.replica)
                g.labels(f.rule, replica, f.severity).set(1)

    def _findings_recent_s(self) -> float:
        """How recently a finding ended for it to count as still going on."""
        return max(FINDINGS_ACTIVE_S, 2 * self.config.diagnose_interval_s)

    async def stop(self) -> None:
        """Stop receiving, commit what is queued, close the store (checkpointing it), even
        when stopping a component fails."""
        self._started = False
        self._stopping.set()
        try:
            if self._discovery:
                try:
                    remove_discovery(self.config.db)
                except OSError as exc:
                    log.warning("cannot remove %s: %s", discovery_path(self.config.db), exc)
                self._discovery = False
            for task in self._tasks:
                task.cancel()
            for task in self._tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            self._tasks.clear()
            await self._end_periodic_work()
            for runner in self._runners:
                await runner.cleanup()
            self._runners.clear()
            for stop in reversed(self._stoppables):
                await _stop_component(stop)
            self._stoppables.clear()
        finally:
            if self.writer is not None:
                await asyncio.to_thread(self.writer.stop)  # commits what the journal holds
            if self._journal is not None:
                self._journal.close()
                self._journal = None
            if self.store is not None:
                # checkpoints: the rows move from the WAL into the file, the WAL is emptied
                await asyncio.to_thread(self.store.close)
                self.store = None

    async def _end_periodic_work(self) -> None:
        """Periodic work already running in threads (a findings tick, an SLI tick, a Parquet
        export) finishes before the store closes. Its queries are interrupted (again every
        ``STOP_POLL_S``, so the next query of a multi-query tick ends at once too) and the
        ticks check ``_stopping`` between steps, so stop waits for one step's Python work
        at most, not for a whole diagnosis."""
        while self._inflight:
            with self._cursors_lock:
                cursors = list(self._cursors)
            for cur in cursors:
                with contextlib.suppress(Exception):  # a cursor closing meanwhile
                    cur.interrupt()
            await asyncio.wait(set(self._inflight), timeout=STOP_POLL_S)

    async def __aenter__(self) -> Sidecar:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


async def _stop_component(stop: Callable[[], Awaitable[None]]) -> None:
    """``stop()``, given up after :data:`STOP_COMPONENT_S` (cancelled, not waited for: a stop
    that ignores cancelling cannot hold the sidecar either) and logged; its errors are logged,
    not raised, so the components after it still stop."""
    name = getattr(stop, "__qualname__", repr(stop))
    task = asyncio.ensure_future(stop())
    done, _ = await asyncio.wait({task}, timeout=STOP_COMPONENT_S)
    if not done:
        task.cancel()
        log.error("stopping: %s did not stop in %.0f s; going on without it", name,
                  STOP_COMPONENT_S)  # fmt: skip
    elif task.cancelled():  # its stop ended by cancelling itself: exception() would raise
        log.error("stopping: %s was cancelled", name)
    elif (exc := task.exception()) is not None:
        log.error("stopping: %s failed: %s", name, exc)


def run(config: SidecarConfig) -> None:
    """Run until SIGINT/SIGTERM (the CLI's entry point)."""
    from slokit._arrow import defer_pandas
    from slokit._gc import tune_gc

    defer_pandas()  # before any thread: pandas loads with the findings, not the first commit

    async def main() -> None:
        sidecar = Sidecar(config)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            await sidecar.start()
            tune_gc(freeze=True)  # what startup built is never walked again (see slokit._gc)
            await stop.wait()
        finally:
            log.info("slokit sidecar stopping: committing queued records")
            await sidecar.stop()

    asyncio.run(main())
