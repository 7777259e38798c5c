"""The one writer: a thread that owns the store and appends batches from a bounded queue.

Producers (OTLP receivers, scrape loops, feedback) call :meth:`Writer.submit`, which never
blocks: it either admits the records and returns a future resolved once they are committed,
or raises :class:`QueueFull` (the receivers answer 503/UNAVAILABLE with Retry-After). An OTLP
request is answered 200 only after its future resolves, so an acknowledged span is in a
committed DuckDB transaction, and DuckDB's own WAL keeps it across ``kill -9``.

The bound counts records (spans, samples), not requests, and a batch keeps its weight until
it is committed, so the records held in memory never exceed ``capacity`` (plus one item when
the queue was empty: a single body bigger than the bound is admitted alone rather than
refused forever).

One item never costs the others of its batch their commit. Values are validated before they
are submitted (:mod:`slokit.sources.validate`), but should a batch still fail in the database,
its items are committed apart (the batch is halved until the failing items stand alone), so
only the item that fails on its own gets an error: :class:`RecordsRefused`, which says
retrying cannot help, with the database's *first* error as its cause (DuckDB reports later
statements of an aborted transaction as "Current transaction is aborted"). Its records are
counted in ``slokit_write_refused_total{kind}`` and logged with their ids. An error of the
database itself (I/O, out of memory, a closed connection) fails the whole batch with that
error instead: retrying later can help there, halving cannot.

With a :class:`~slokit.sidecar.journal.Journal` (``commit_interval_s`` in the sidecar's
config, 5 s by default), fragments are acknowledged once they are in the journal and the journal is synced,
and the journal's content is committed to DuckDB in one transaction about every
``commit_interval_s`` (sooner when ``batch_max`` fragments wait, when :meth:`Writer.flush` is
called, and on stop). Their weight stays on the queue's bound until DuckDB has them. A commit
that fails on the database itself is retried at the next interval with nothing lost (new
exports meanwhile get the error, so clients back off); fragments the store refuses on their
own after they were acknowledged are kept in ``<journal>.refused`` and counted. A sidecar
that ended before committing replays its journal at start (:meth:`Writer.start`).

With ``samples_interval_s`` (the sidecar's ``sample_commit_interval_s``, 5 s by default), what
the scrape loops submit (:data:`SAMPLE_KINDS`) is held and committed together that often, one
statement per kind, instead of one transaction per scrape tick; :meth:`Writer.flush` and a stop
commit them too. Nobody awaits a scrape's future, so nothing acknowledged waits on them.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import pyarrow as pa

from slokit.records import (
    EngineSample,
    Finding,
    GpuSample,
    RequestFragment,
    RouterSample,
    ScrapeResult,
)
from slokit.sidecar.journal import Journal, JournalError
from slokit.sidecar.metrics import SidecarMetrics
from slokit.sidecar.write_errors import (
    QueueFull,
    RecordsRefused,
    WriterStopped,
    describe,
    first_error,
    systemic,
)
from slokit.store.append import fragments_table
from slokit.store.db import Store

log = logging.getLogger("slokit.sidecar.writer")

Kind = Literal["fragments", "engine", "gpu", "router_samples", "scrapes", "findings"]
_ORDER: tuple[Kind, ...] = ("fragments", "engine", "gpu", "router_samples", "scrapes", "findings")
#: What the scrape loops write: held and committed together every ``samples_interval_s``.
SAMPLE_KINDS: frozenset[Kind] = frozenset({"engine", "gpu", "router_samples", "scrapes"})


@dataclass
class _Item:
    kind: Kind
    records: Sequence[Any]
    enqueued_at: float
    future: concurrent.futures.Future[int] = field(default_factory=concurrent.futures.Future)
    #: Journaled fragments and held samples: its weight is released when DuckDB has it, not
    #: after its batch.
    deferred: bool = False

    @property
    def weight(self) -> int:
        return max(1, len(self.records))


class Writer:
    """Owns ``store`` for writing; run with :meth:`start`, end with :meth:`stop`.

    ``before_commit`` is called in the writer thread before each batch (tests stall the
    writer with it); ``clock`` is monotonic seconds (ingest lag).
    """

    def __init__(
        self,
        store: Store,
        *,
        metrics: SidecarMetrics,
        capacity: int = 100_000,
        batch_max: int = 5000,
        linger_s: float = 0.0,
        retry_after_s: int = 1,
        before_commit: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        journal: Journal | None = None,
        commit_interval_s: float = 1.0,
        samples_interval_s: float = 0.0,
    ) -> None:
        self.store = store
        self.metrics = metrics
        self.capacity = capacity
        self.batch_max = batch_max
        self.linger_s = linger_s
        self.retry_after_s = retry_after_s
        self.before_commit = before_commit
        self.clock = clock
        self._cond = threading.Condition()
        self._queue: deque[_Item] = deque()
        self._weight = 0  # queued + in flight
        self._inflight_since: float | None = None
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.committed_batches = 0
        self.refused_items = 0
        self.last_error: str | None = None
        metrics.queue_capacity.set(capacity)
        # the journal (None: every batch is committed before it is acknowledged)
        self.journal = journal
        self.commit_interval_s = commit_interval_s
        self._pending: list[tuple[_Item, pa.Table]] = []  # journaled, not yet in DuckDB
        self._pending_due: float | None = None  # when the pending fragments are committed
        self._stalled: BaseException | None = None  # the database error the last commit met
        self._acked_seq = 0  # journal appends so far
        self._committed_seq = 0  # journal appends in DuckDB
        self._flush_wanted = False
        self._commit_attempts = 0  # commits of the journaled fragments tried
        self.replayed_fragments = 0
        #: Why the journal's last append failed (its volume full or failing), None once one
        #: succeeds: the readiness probe reports it as it does the store's own storage fault.
        self.journal_fault: str | None = None
        # scraped samples held for one commit per ``samples_interval_s`` (0: none held)
        self.samples_interval_s = samples_interval_s
        self._held: list[_Item] = []
        self._held_due: float | None = None
        self._held_seq = 0  # hold() calls so far
        self._held_done_seq = 0  # of those, committed (or refused)

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> None:
        if self.journal is not None:
            self._replay(self.journal)
        self._thread = threading.Thread(target=self._run, name="slokit-writer", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stopping

    def stop(self, timeout_s: float = 30.0) -> None:
        """Commit what is queued, then end the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout_s)

    # -- producers -----------------------------------------------------------------------
    def submit(self, kind: Kind, records: Sequence[Any]) -> concurrent.futures.Future[int]:
        """Queue ``records``; the future gives how many were committed. Never blocks.

        Raises :class:`QueueFull` at the bound, :class:`WriterStopped` when not running.
        """
        item = _Item(kind, records, self.clock())
        with self._cond:
            if self._stopping or self._thread is None:
                raise WriterStopped("the writer is not running")
            if self._weight and self._weight + item.weight > self.capacity:
                self.metrics.dropped.labels(reason="queue_full").inc(len(records))
                raise QueueFull(self.retry_after_s)
            self._queue.append(item)
            self._weight += item.weight
            self.metrics.queue_depth.set(self._weight)
            self._cond.notify()
        return item.future

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait until every fragment acknowledged and every sample submitted so far is in
        DuckDB (readers call this first, so they see what was acknowledged and scraped).
        False when ``timeout_s`` passed first or the writer is not running. Without a journal
        and held samples there is nothing to wait for."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            target = self._acked_seq
            held_target = self._held_seq
            attempts = self._commit_attempts
            while self._committed_seq < target or self._held_done_seq < held_target:
                left = deadline - time.monotonic()
                if left <= 0 or self._thread is None or not self._thread.is_alive():
                    return False
                if self._stalled is None or self._committed_seq >= target:
                    self._flush_wanted = True
                    self._cond.notify_all()
                elif self._commit_attempts > attempts:
                    return False  # the database failed again: retried at the interval
                # a failing database is retried at the interval, not at each read
                self._cond.wait(left)
        return True

    @property
    def depth(self) -> int:
        """Records queued or being committed."""
        return self._weight

    def lag_s(self) -> float:
        """Age of the oldest record not yet committed (0 when idle)."""
        with self._cond:
            oldest = self._inflight_since
            if self._pending:
                first = self._pending[0][0].enqueued_at
                oldest = first if oldest is None else min(oldest, first)
            if self._queue:
                head = self._queue[0].enqueued_at
                oldest = head if oldest is None else min(oldest, head)
        return 0.0 if oldest is None else max(0.0, self.clock() - oldest)

    # -- the thread ----------------------------------------------------------------------
    def _take(self) -> list[_Item] | None:
        with self._cond:
            while not self._queue:
                if self._stopping:
                    return None
                due = self._next_due()
                if due is None:
                    self._cond.wait(0.5)
                    continue
                left = due - self.clock()
                if left <= 0 or self._flush_wanted:
                    return []  # no new items: commit the pending or held ones
                self._cond.wait(min(0.5, left))
            if self.linger_s > 0 and not self._stopping:
                deadline = self.clock() + self.linger_s
                while self._queued_weight() < self.batch_max and not self._stopping:
                    left = deadline - self.clock()
                    if left <= 0:
                        break
                    self._cond.wait(left)
            batch: list[_Item] = []
            n = 0
            while self._queue and (not batch or n + self._queue[0].weight <= self.batch_max):
                item = self._queue.popleft()
                batch.append(item)
                n += item.weight
            self._inflight_since = min(i.enqueued_at for i in batch)
            return batch

    def _next_due(self) -> float | None:
        """When the earlier of the journal's commit and the held samples' commit is due."""
        dues = [d for d in (self._pending_due, self._held_due) if d is not None]
        return min(dues) if dues else None

    def _queued_weight(self) -> int:
        return sum(i.weight for i in self._queue)

    def _run(self) -> None:
        while True:
            batch = self._take()
            if batch is None:
                self._commit_held()
                self._commit_pending(final=True)
                return
            try:
                if self.before_commit is not None:
                    self.before_commit()
                if batch:
                    self._commit(batch)
                if self._held and self._held_is_due():
                    self._commit_held()
                if self._pending and self._pending_is_due():
                    self._commit_pending()
            except BaseException as exc:  # never let the writer die on one batch
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.exception("writer batch failed")
                for item in batch:
                    if not item.future.done():
                        item.future.set_exception(exc)
            finally:
                with self._cond:
                    self._weight -= sum(i.weight for i in batch if not i.deferred)
                    self._inflight_since = None
                    self.metrics.queue_depth.set(self._weight)

    # -- the journal ---------------------------------------------------------------------
    def _replay(self, journal: Journal) -> None:
        """Store what a run that ended before committing left in ``journal``, then empty it.
        A database error propagates (the sidecar does not start; the journal is kept)."""
        tables = journal.replay()
        for table in tables:
            try:
                self.store.append_fragment_table(table)
            except Exception as exc:
                first = first_error(exc)
                if systemic(first):
                    raise
                self._keep_refused(journal, [table], first)
            else:
                self.replayed_fragments += table.num_rows
        if tables:
            log.warning("writer: replayed %d fragments from the journal %s",
                        self.replayed_fragments, journal.path)  # fmt: skip
        journal.reset()

    def _pending_count(self) -> int:
        """Fragments journaled, not yet in DuckDB."""
        return sum(t.num_rows for _, t in self._pending)

    def _pending_is_due(self) -> bool:
        due = self._pending_due
        return (
            self._flush_wanted
            or self._pending_count() >= self.batch_max
            or (due is not None and self.clock() >= due)
        )

    def _journal_items(self, journal: Journal, items: list[_Item]) -> None:
        """Append ``items`` to the journal and acknowledge them; they wait in ``_pending``."""
        if self._stalled is not None:  # the database is failing: do not pile up more
            for i in items:
                i.future.set_exception(self._stalled)
            return
        tables: list[pa.Table] = []
        kept: list[_Item] = []
        for item in items:
            try:
                tables.append(fragments_table(item.records))
            except Exception as exc:  # BadInput: a value of the wrong type or size
                self._refuse("fragments", item, exc)
                continue
            kept.append(item)
        if not kept:
            return
        try:
            journal.append(tables)
        except JournalError as exc:
            self.last_error = self.journal_fault = str(exc)
            log.error("writer: %s", exc)
            for i in kept:
                i.future.set_exception(exc)
            return
        if self.journal_fault is not None:
            log.info("writer: the journal takes writes again (after: %s)", self.journal_fault)
            self.journal_fault = None
        with self._cond:
            for item in kept:
                item.deferred = True
            self._pending.extend(zip(kept, tables, strict=True))
            if self._pending_due is None:
                self._pending_due = self.clock() + self.commit_interval_s
            self._acked_seq += 1
        for item, table in zip(kept, tables, strict=True):
            item.future.set_result(table.num_rows)

    def _commit_pending(self, *, final: bool = False) -> None:
        """Commit the journaled fragments to DuckDB in one transaction, then empty the
        journal. On a database error they stay (journal and memory) for the next try."""
        journal = self.journal
        if journal is None or not self._pending:
            return
        pending = list(self._pending)
        t0 = time.perf_counter()
        error = self._append_tables([t for _, t in pending])
        self._commit_attempts += 1
        if error is not None:
            first = first_error(error)
            if systemic(first):
                self._stalled = error
                self.last_error = f"{type(first).__name__}: {first}"
                log.error("writer: committing %d journaled fragments failed (kept, retried in "
                          "%.1f s): %s", self._pending_count(), self.commit_interval_s,
                          self.last_error)  # fmt: skip
                with self._cond:
                    self._pending_due = self.clock() + self.commit_interval_s
                    self._flush_wanted = False
                    self._cond.notify_all()
                if final:
                    log.error("writer: stopping with %d fragments in the journal %s; they are "
                              "stored at the next start", self._pending_count(), journal.path)  # fmt: skip
                return
            self._isolate_tables([t for _, t in pending])
        else:
            self.metrics.commit_seconds.observe(time.perf_counter() - t0)
            self.committed_batches += 1
        self._stalled = None
        try:
            journal.reset()
        except OSError as exc:  # its content is in DuckDB: a replay would store nothing twice
            log.error("writer: emptying the journal %s failed: %s", journal.path, exc)
        with self._cond:
            self._weight -= sum(i.weight for i, _ in pending)
            self.metrics.queue_depth.set(self._weight)
            self._pending = []
            self._pending_due = None
            self._flush_wanted = False
            self._committed_seq = self._acked_seq
            self._cond.notify_all()

    def _append_tables(self, tables: list[pa.Table]) -> Exception | None:
        """Store ``tables`` in one transaction; the error, or None."""
        try:
            result = self.store.append_fragment_table(pa.concat_tables(tables))
        except Exception as exc:
            return exc
        for reason, n in result.unjoined.items():
            self.metrics.spans_unjoined.labels(reason=reason).inc(n)
        return None

    def _isolate_tables(self, tables: list[pa.Table]) -> None:
        """Commit ``tables`` (which failed together, not on the database) apart, halving until
        the ones the store refuses stand alone; those are kept in ``<journal>.refused``."""
        assert self.journal is not None
        todo = [tables]
        while todo:
            part = todo.pop()
            error = self._append_tables(part)
            if error is None:
                continue
            first = first_error(error)
            if len(part) > 1 and not systemic(first):
                todo += [part[: len(part) // 2], part[len(part) // 2 :]]
                continue
            self._keep_refused(self.journal, part, first)

    def _keep_refused(self, journal: Journal, tables: list[pa.Table], first: BaseException) -> None:
        """``tables`` (acknowledged) were refused by the store on their own: keep them in
        ``<journal>.refused``, count and log them."""
        rows = sum(t.num_rows for t in tables)
        try:
            path = str(journal.quarantine(tables))
        except OSError as exc:
            path = f"nowhere ({exc})"
        self.refused_items += len(tables)
        self.metrics.write_refused.labels(kind="fragments").inc(rows)
        self.last_error = f"{type(first).__name__}: {first}"
        log.error("writer: the store refused %d journaled fragments (%s); kept in %s",
                  rows, self.last_error, path)  # fmt: skip

    def _commit(self, batch: list[_Item]) -> None:
        by_kind: dict[Kind, list[_Item]] = {}
        for item in batch:
            by_kind.setdefault(item.kind, []).append(item)
        for kind in _ORDER:
            items = by_kind.get(kind)
            if not items:
                continue
            if kind == "fragments" and self.journal is not None:
                self._journal_items(self.journal, items)
                continue
            if kind in SAMPLE_KINDS and self.samples_interval_s > 0:
                self._hold(items)
                continue
            self._commit_kind(kind, items)

    def _commit_kind(self, kind: Kind, items: list[_Item]) -> None:
        """Append ``items`` (all of ``kind``) in one go; should that fail on the records, apart."""
        error = self._try(kind, items)
        if error is None:
            return
        first = first_error(error)
        self.last_error = f"{type(first).__name__}: {first}"
        if systemic(first):
            log.error("writer: appending %d %s items failed: %s", len(items), kind,
                      self.last_error)  # fmt: skip
            for i in items:
                i.future.set_exception(error)
        elif len(items) == 1:
            self._refuse(kind, items[0], first)
        else:
            log.error("writer: a batch of %d %s items failed: %s; committing them apart",
                      len(items), kind, self.last_error)  # fmt: skip
            self._isolate(kind, items)

    # -- held samples --------------------------------------------------------------------
    def _hold(self, items: list[_Item]) -> None:
        """Keep scraped samples for the next samples commit: one transaction per kind every
        ``samples_interval_s`` instead of one per scrape tick (DuckDB's cost of an insert is
        mostly per statement). Their weight stays on the bound until they are committed."""
        with self._cond:
            for item in items:
                item.deferred = True
            self._held.extend(items)
            self._held_seq += 1
            if self._held_due is None:
                self._held_due = self.clock() + self.samples_interval_s

    def _held_is_due(self) -> bool:
        due = self._held_due
        return (
            self._flush_wanted
            or sum(i.weight for i in self._held) >= self.batch_max
            or (due is not None and self.clock() >= due)
        )

    def _commit_held(self) -> None:
        """Commit the held samples, one statement per kind. A failure is handled as for
        samples committed at once (refused items apart, a database error fails them: they are
        scrapes, which nobody was promised)."""
        with self._cond:
            held, self._held = self._held, []
            seq = self._held_seq
            self._held_due = None
        by_kind: dict[Kind, list[_Item]] = {}
        for item in held:
            by_kind.setdefault(item.kind, []).append(item)
        try:
            for kind in _ORDER:
                if kind in by_kind:
                    self._commit_kind(kind, by_kind[kind])
        finally:  # whatever happened, they leave the bound and nobody waits on them for ever
            for item in held:
                if not item.future.done():
                    item.future.set_exception(WriterStopped("held samples were not committed"))
            with self._cond:
                self._weight -= sum(i.weight for i in held)
                self.metrics.queue_depth.set(self._weight)
                self._held_done_seq = seq
                if not self._pending:
                    self._flush_wanted = False
                self._cond.notify_all()

    def _try(self, kind: Kind, items: list[_Item]) -> Exception | None:
        """Append ``items`` in one go; resolve their futures and return None, or return the
        error (never raised here: handling it inside an ``except`` would chain later errors
        to this one)."""
        records = [r for i in items for r in i.records]
        t0 = time.perf_counter()
        try:
            self._append(kind, records)
        except Exception as exc:
            return exc
        self.metrics.commit_seconds.observe(time.perf_counter() - t0)
        self.committed_batches += 1
        for i in items:
            i.future.set_result(len(i.records))
        return None

    def _isolate(self, kind: Kind, items: list[_Item]) -> None:
        """Commit ``items`` (which failed together) apart: halve until the failures stand alone.

        k failing items among n cost about 2k log2(n) extra transactions.
        """
        todo = [items[: len(items) // 2], items[len(items) // 2 :]]
        while todo:
            part = todo.pop()
            error = self._try(kind, part)
            if error is None:
                continue
            first = first_error(error)
            if systemic(first):  # the database, not the records: stop halving
                self.last_error = f"{type(first).__name__}: {first}"
                log.error("writer: appending %s items failed: %s", kind, self.last_error)
                for i in [*part, *(i for p in todo for i in p)]:
                    i.future.set_exception(error)
                return
            if len(part) == 1:
                self._refuse(kind, part[0], first)
            else:
                todo += [part[: len(part) // 2], part[len(part) // 2 :]]

    def _refuse(self, kind: Kind, item: _Item, first: BaseException) -> None:
        """``item`` fails on its own: the store cannot hold its records."""
        why = f"{type(first).__name__}: {first}"
        self.last_error = why
        self.refused_items += 1
        self.metrics.write_refused.labels(kind=kind).inc(len(item.records))
        log.error("writer: the store refused %s: %s", describe(kind, item.records), why)
        refused = RecordsRefused(f"the store refused {len(item.records)} {kind} records: {why}")
        refused.__cause__ = first
        item.future.set_exception(refused)

    def _append(self, kind: Kind, records: list[Any]) -> None:
        s = self.store
        if kind == "fragments":
            frags: list[RequestFragment] = records
            result = s.append_fragments(frags)
            for reason, n in result.unjoined.items():  # spans that can no longer join
                self.metrics.spans_unjoined.labels(reason=reason).inc(n)
        elif kind == "engine":
            engine: list[EngineSample] = records
            s.append_engine_samples(engine)
        elif kind == "gpu":
            gpu: list[GpuSample] = records
            s.append_gpu_samples(gpu)
        elif kind == "router_samples":
            router: list[RouterSample] = records
            s.append_router_samples(router)
        elif kind == "scrapes":
            scrapes: list[ScrapeResult] = records
            s.append_scrapes(scrapes)
        else:
            findings: list[Finding] = records
            s.append_findings(findings)
