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
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
from aiohttp import web
from prometheus_client import CollectorRegistry

from slokit.errors import BadInput
from slokit.sidecar.api import Api
from slokit.sidecar.config import SidecarConfig, split_host_port
from slokit.sidecar.discovery import remove_discovery, write_discovery
from slokit.sidecar.forward import Forwarder
from slokit.sidecar.metrics import SidecarMetrics
from slokit.sidecar.otlp_http import OtlpHttpReceiver
from slokit.sidecar.otlp_ingest import OtlpIngest
from slokit.sidecar.parquet import ParquetExporter
from slokit.sidecar.scrape import NvmlLoop, Scraper
from slokit.sidecar.sli import SliAccountant
from slokit.sidecar.writer import Writer
from slokit.store.db import Store, open_store

log = logging.getLogger("slokit.sidecar")


def open_store_quarantining(path: str, metrics: SidecarMetrics) -> Store:
    """Open the store; if DuckDB cannot replay its WAL, set the WAL aside loudly and retry."""
    try:
        return open_store(path)
    except BadInput as exc:
        wal = Path(path + ".wal")
        if "WAL" not in str(exc) or not wal.exists():
            raise
        aside = wal.with_name(
            f"{wal.name}.quarantined-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
        )
        wal.rename(aside)
        metrics.wal_quarantined.inc()
        log.error(
            "CORRUPT WAL: %s could not be replayed (%s); moved to %s and starting without it. "
            "Records written since the last checkpoint are in that file, not in the store.",
            wal,
            exc,
            aside,
        )
        return open_store(path)


#: How far back the sidecar's periodic diagnosis looks from the newest data.
FINDINGS_WINDOW_S = 900.0
#: A finding counts as active (slokit_findings_active) while it ended this recently.
FINDINGS_ACTIVE_S = 60.0


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
        self._runners: list[web.AppRunner] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._inflight: set[asyncio.Future[None]] = set()
        self._stoppables: list[Callable[[], Awaitable[None]]] = []
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
        spec = None
        if cfg.slo:
            from slokit.analysis.slo_spec import load_spec

            spec = load_spec(cfg.slo)
        store = self.store = await asyncio.to_thread(open_store_quarantining, cfg.db, self.metrics)
        if cfg.db_memory_limit:
            try:
                store.con.execute("SET memory_limit = ?", [cfg.db_memory_limit])
            except Exception as exc:  # duckdb.Error: a bad size string
                raise BadInput(f"db_memory_limit {cfg.db_memory_limit!r}: {exc}") from None
        writer = self.writer = Writer(
            store, metrics=self.metrics, capacity=cfg.queue_capacity, batch_max=cfg.batch_max,
            linger_s=cfg.batch_linger_s,
            before_commit=self._before_commit,
        )  # fmt: skip
        writer.start()
        self.sli = SliAccountant(self.metrics, spec, grace_s=cfg.sli_grace_s)

        forward = None
        if cfg.forward_otlp:
            fwd = Forwarder(cfg.forward_otlp, self.metrics, transport=self._forward_transport)
            fwd.start()
            self._stoppables.append(fwd.stop)
            forward = fwd.submit
        ingest = OtlpIngest(
            writer, self.metrics, max_bytes=cfg.max_body_bytes, default_replica=cfg.replica,
            ack_timeout_s=cfg.ack_timeout_s, forward=forward,
        )  # fmt: skip

        api = Api(store, writer, self.metrics, spec=spec, ready=lambda: self._started,
                  ack_timeout_s=cfg.ack_timeout_s)  # fmt: skip
        self.ports["api"] = await self._serve(api.app(cfg.token), cfg.listen)
        if cfg.otlp_http:
            app = OtlpHttpReceiver(ingest).app(cfg.token)
            # the decoder undoes Content-Encoding itself, stopping at the limit (gzip bombs)
            self.ports["otlp_http"] = await self._serve(app, cfg.otlp_http, auto_decompress=False)
        if cfg.otlp_grpc:
            from slokit.sidecar.otlp_grpc import OtlpGrpcReceiver

            grpc_rx = OtlpGrpcReceiver(ingest, cfg.token)
            self.ports["otlp_grpc"] = await grpc_rx.start(cfg.otlp_grpc)
            self._stoppables.append(grpc_rx.stop)

        targets = cfg.targets()
        if targets:
            sli = self.sli
            scraper = Scraper(
                targets, writer, self.metrics, interval_s=cfg.scrape_interval_s,
                timeout_s=cfg.timeout_s, transport=self._scrape_transport,
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

        self._periodic("sli", cfg.sli_interval_s, self._sli_tick)
        self._periodic("findings", cfg.diagnose_interval_s, self._findings_tick)
        if cfg.parquet_dir:
            exporter = ParquetExporter(cfg.parquet_dir)
            self._periodic("parquet", 60.0, lambda con: exporter.export_closed_hours(con))
        if cfg.db != ":memory:":
            host = split_host_port(cfg.listen)[0]
            host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
            host = f"[{host}]" if ":" in host else host
            write_discovery(cfg.db, f"http://{host}:{self.ports['api']}")
            self._discovery = True
        self._started = True
        log.info(
            "slokit sidecar ready: %s; db %s; %d scrape targets",
            ", ".join(f"{k} port {v}" for k, v in self.ports.items()),
            cfg.db,
            len(targets),
        )

    async def _serve(self, app: web.Application, address: str, **server_kw: Any) -> int:
        host, port = split_host_port(address)
        runner = web.AppRunner(
            app, access_log=None, handle_signals=False, shutdown_timeout=10.0, **server_kw
        )
        await runner.setup()
        site = web.TCPSite(runner, host, port, reuse_address=True)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise BadInput(f"cannot listen on {address}: {exc.strerror or exc}") from None
        self._runners.append(runner)
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        return int(sockets[0].getsockname()[1]) if sockets else port

    def _periodic(self, name: str, every_s: float, fn: Callable[[Any], Any]) -> None:
        store = self.store
        assert store is not None

        def once() -> None:
            cur = store.cursor()
            try:
                fn(cur)
            finally:
                cur.close()

        async def loop() -> None:
            while True:
                await asyncio.sleep(every_s)
                # A thread cannot be cancelled: track its future so stop() waits for it
                # before closing the store under it.
                fut = asyncio.get_running_loop().run_in_executor(None, once)
                self._inflight.add(fut)
                fut.add_done_callback(self._inflight.discard)
                try:
                    await asyncio.shield(fut)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("periodic task %s failed", name)

        self._tasks.append(asyncio.create_task(loop(), name=name))

    def _sli_tick(self, con: Any) -> None:
        assert self.sli is not None
        self.sli.tick(con)

    def _findings_tick(self, con: Any) -> None:
        """Diagnose the recent window, store its findings (``explain`` reads them) and export
        the ones still active."""
        try:
            from slokit.analysis.diagnose import run_diagnosis, store_findings
        except ImportError:
            return
        from slokit.errors import NotFound
        from slokit.store.queries import data_span

        oldest, newest = data_span(con)
        if oldest is None or newest is None:
            return
        # A window that starts before the data would leave the rules no baseline to compare
        # with: use all the data until there is more than a window of it.
        since = newest - FINDINGS_WINDOW_S if oldest < newest - FINDINGS_WINDOW_S else None
        try:
            result = run_diagnosis(con, since=since)
        except NotFound:
            return
        assert self.store is not None
        store_findings(self.store, result.findings, window=(result.since, result.until))
        recent = newest - max(FINDINGS_ACTIVE_S, 2 * self.config.diagnose_interval_s)
        g = self.metrics.findings_active
        g.clear()
        for f in result.findings:
            if f.end_ts >= recent:
                g.labels(f.rule, f.replica or "fleet", f.severity).set(1)

    async def stop(self) -> None:
        """Stop receiving, commit what is queued, close the store."""
        self._started = False
        if self._discovery:
            remove_discovery(self.config.db)
            self._discovery = False
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        if self._inflight:  # periodic work already running in threads finishes first
            await asyncio.wait(set(self._inflight))
        for runner in self._runners:
            await runner.cleanup()
        self._runners.clear()
        for stop in reversed(self._stoppables):
            with contextlib.suppress(Exception):
                await stop()
        self._stoppables.clear()
        if self.writer is not None:
            await asyncio.to_thread(self.writer.stop)
        if self.store is not None:
            self.store.close()
            self.store = None

    async def __aenter__(self) -> Sidecar:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


def run(config: SidecarConfig) -> None:
    """Run until SIGINT/SIGTERM (the CLI's entry point)."""

    async def main() -> None:
        sidecar = Sidecar(config)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            await sidecar.start()
            await stop.wait()
        finally:
            log.info("slokit sidecar stopping: committing queued records")
            await sidecar.stop()

    asyncio.run(main())
