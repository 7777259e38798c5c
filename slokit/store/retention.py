"""Bounded request history: a long-running store keeps its recent requests, not all of them.

DuckDB holds a table's ART indexes in memory as they grow (random keys, as request, span and
trace ids are, touch every part of the tree) and counts them against ``memory_limit``. The
request tables have up to three such indexes (``requests``'s key; ``request_fragments``'s
request id, and its trace id once the trace join has built it): about 193 bytes of memory per
stored request without the trace id's, 280 with it (schema 10). A store that keeps every
request fails a commit once the indexes fill the limit and spilling to disk cannot make room,
and a checkpoint that fails so invalidates the database until the process restarts
(``benchmarks/store_memory.py``: after 373,000 requests with ``memory_limit`` 128MB and the
four indexes of schema 8). With the oldest requests deleted as new ones arrive, the indexes'
memory is reused and stays flat (150,000 kept while 700,000 passed through 128MB: 50 MB of
index throughout with those four; 30.9 MB with schema 10's two, 150,000 kept of 300,000).

:func:`prune_requests` deletes, with all their fragments and oldest first, the requests first
seen (``first_ingested_at``: the store's own clock, not a sender's) before
``now - max_age_s``, and the oldest beyond the newest ``max_requests`` (ties broken by request
id). ``keep_arrivals_from`` keeps the requests that arrived at or after it (the Parquet lake's:
minutes it has not written yet, or may still write again).

:func:`prune_past_hold` is the bound that nothing holds back: the oldest requests beyond
``max_requests`` are deleted whatever a lake has written. A lake that cannot write (its volume
full, its bucket unreachable) would otherwise keep every request, and the indexes would grow
until DuckDB's commits fail; and a healthy lake revisits its minutes for 30 minutes, more
requests than the bound at a high rate. It says how many of those it deleted arrived in
minutes the lake had not written, and the newest arrival it deleted in a minute the lake had
written (the lake stops revisiting the minutes up to it, which would otherwise be written
again without the deleted rows). A request stamped in a minute not written yet (a sender's
clock ahead) does not count there: that minute is written with the rows left, and ending the
revisits up to it would end them for every minute written, where late fragments still land.

Both say from which arrival on the requests kept are whole (``whole_from``): the newest
arrival they deleted, leaving out arrivals a sender's clock stamped ahead of the store's. A
diagnosis of the store starts no earlier (the engine and GPU samples go back further, by age
alone: a baseline of samples whose requests are gone would blind the request rules). The
store keeps it too (``store_marks``, schema 11), raised in the transaction that deletes the
requests, never lowered: :func:`requests_whole_from` reads it, so a sidecar restarted on the
file and ``slokit diagnose --db`` of a stopped sidecar's know it as the running one did.

:func:`prune_samples` deletes, by age alone, the rows of the store's time series (engine, GPU
and router samples, scrapes, findings, rejection and unjoined-span counts) dated before
``now - max_age_s``, except those a lake has not written yet. They have no index: the delete
costs little, and without it the file grows by every scrape (about 1 row a second per
replica) for as long as the sidecar runs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from slokit.store.append import run

if TYPE_CHECKING:
    from slokit.store.db import Store
    from slokit.store.lake_export import ParquetExporter

__all__ = [
    "ARRIVAL_SLACK_S",
    "PRUNE_CHUNK",
    "SAMPLE_TABLES",
    "Pruned",
    "PrunedPastHold",
    "prune_past_hold",
    "prune_past_lake_hold",
    "prune_requests",
    "prune_samples",
    "raise_whole_from",
    "requests_whole_from",
    "skip_vacuum",
]

#: The store's time series and the column that dates each row: pruned by age alone.
SAMPLE_TABLES: tuple[tuple[str, str], ...] = (
    ("engine_samples", "ts"),
    ("gpu_samples", "ts"),
    ("router_samples", "ts"),
    ("scrapes", "ts"),
    ("findings", "end_ts"),
    ("ingest_rejections", "ts"),
    ("unjoined_spans", "ts"),
)
#: When a request was first seen; one stored before the column existed counts as the oldest.
_FIRST_SEEN = "coalesce(first_ingested_at, to_timestamp(0))"
#: An arrival stamped more than this after the store first saw its request is a sender's
#: clock running ahead (spans up to a day ahead are accepted): it says nothing of what the
#: store holds.
ARRIVAL_SLACK_S = 60.0
#: ``whole_from`` of the requests being deleted (``slokit_gone``, columns ``a``: arrival and
#: ``f``: first seen, epoch seconds): the newest arrival among them, leaving out those stamped
#: more than ``ARRIVAL_SLACK_S`` after the store first saw them. A request that arrived
#: before it may be gone, so the store's requests are whole only from then on (a diagnosis
#: whose baseline reached further back would compare with too few).
_WHOLE_FROM = f"max(a) FILTER (WHERE a <= f + {ARRIVAL_SLACK_S})"
#: The ``store_marks`` row that keeps ``whole_from``.
_WHOLE_FROM_MARK = "requests_whole_from"
#: Raise the stored ``whole_from`` to ``?`` (epoch seconds), never lower it.
_KEEP_WHOLE_FROM = (
    "INSERT INTO store_marks VALUES (?, to_timestamp(?)) "
    "ON CONFLICT (name) DO UPDATE SET ts = greatest(store_marks.ts, excluded.ts)"
)
#: Requests deleted per transaction, the writer getting the store between them. From a store
#: of 150,000 a chunk costs about 14 µs of CPU per request: choosing them 5, the deletes 3,
#: taking their keys out of the indexes at commit 5 (37 before schema 8 stored the ids
#: uncompressed): 5,000 hold the store about 70 ms.
PRUNE_CHUNK = 5_000


@dataclass(frozen=True)
class Pruned:
    """What one :func:`prune_requests` deleted; ``whole_from``: the requests kept are whole
    from this arrival on (:data:`_WHOLE_FROM`; None: no deleted request says)."""

    requests: int = 0
    fragments: int = 0
    whole_from: float | None = None


@dataclass(frozen=True)
class PrunedPastHold:
    """What one :func:`prune_past_hold` deleted: ``unwritten`` of the ``requests`` arrived at
    or after ``written_before`` (in minutes the lake had not written); ``newest_written`` is
    the latest arrival of the others, those in minutes the lake had written (epoch seconds;
    None when there were none); ``whole_from`` as :class:`Pruned`'s."""

    requests: int = 0
    fragments: int = 0
    unwritten: int = 0
    newest_written: float | None = None
    whole_from: float | None = None


def prune_requests(
    store: Store,
    *,
    now: float,
    max_age_s: float | None = None,
    max_requests: int | None = None,
    keep_arrivals_from: float | None = None,
) -> Pruned:
    """Delete the oldest requests (and their fragments) past either bound (None: no bound);
    ``now`` is the store's clock, in epoch seconds."""
    requests = fragments = 0
    whole: float | None = None
    while True:
        n_req, n_frag, last = _prune_chunk(store, now, max_age_s, max_requests, keep_arrivals_from)
        requests += n_req
        fragments += n_frag
        whole = _later(whole, last)
        if n_req < PRUNE_CHUNK:
            return Pruned(requests, fragments, whole)


def _later(a: float | None, b: float | None) -> float | None:
    return a if b is None else b if a is None else max(a, b)


def _prune_chunk(
    store: Store,
    now: float,
    max_age_s: float | None,
    max_requests: int | None,
    keep_arrivals_from: float | None,
) -> tuple[int, int, float | None]:
    """Requests and fragments deleted, and the ``whole_from`` of the requests."""
    with store.transaction() as con:
        lake, lake_params = "true", []
        if keep_arrivals_from is not None:
            lake, lake_params = (
                "(arrival_ts IS NULL OR arrival_ts < to_timestamp(?))",
                [keep_arrivals_from],
            )
        parts: list[str] = []
        params: list[Any] = []
        if max_age_s is not None and math.isfinite(max_age_s):
            parts.append(
                f"SELECT request_id, arrival_ts, {_FIRST_SEEN} AS t FROM requests "
                f"WHERE {_FIRST_SEEN} < to_timestamp(?) AND {lake}"
            )
            params += [now - max_age_s, *lake_params]
        if max_requests is not None:
            excess = int(run(con, "SELECT count(*) FROM requests")[0][0]) - max_requests
            if excess > 0:  # exactly the excess oldest, ties broken by id
                parts.append(
                    f"SELECT request_id, arrival_ts, t FROM (SELECT request_id, arrival_ts, "
                    f"{_FIRST_SEEN} AS t FROM requests ORDER BY t, request_id LIMIT ?) "
                    f"WHERE {lake}"
                )
                params += [excess, *lake_params]
        if not parts:
            return 0, 0, None
        slokit_gone = con.sql(  # the statements below read it by name
            f"SELECT request_id, epoch(arrival_ts) AS a, epoch(t) AS f "
            f"FROM ({' UNION '.join(parts)}) ORDER BY t, request_id LIMIT ?",
            params=[*params, PRUNE_CHUNK],
        ).to_arrow_table()
        if slokit_gone.num_rows == 0:
            return 0, 0, None
        last = con.execute(f"SELECT {_WHOLE_FROM} FROM slokit_gone").fetchall()[0][0]
        gone = "request_id IN (SELECT request_id FROM slokit_gone)"
        # execute here, not in a helper: DuckDB finds slokit_gone among the caller's locals
        fragments = con.execute(f"DELETE FROM request_fragments WHERE {gone}").fetchall()[0][0]
        requests = con.execute(f"DELETE FROM requests WHERE {gone}").fetchall()[0][0]
        raise_whole_from(con, last)
    if store._rows_estimate is not None:
        store._rows_estimate = max(0, store._rows_estimate - fragments)
    return int(requests), int(fragments), None if last is None else float(last)


def prune_past_hold(store: Store, *, max_requests: int, written_before: float) -> PrunedPastHold:
    """Delete the oldest requests (first seen, ties by id) beyond the newest ``max_requests``,
    whatever a lake holds back; ``written_before`` (epoch seconds): the lake has written every
    minute before it."""
    requests = fragments = unwritten = 0
    newest = whole = None
    while True:
        with store.transaction() as con:
            excess = int(run(con, "SELECT count(*) FROM requests")[0][0]) - max_requests
            if excess <= 0:
                break
            slokit_gone = con.sql(  # noqa: F841 - the statements below read it by name
                f"SELECT request_id, epoch(arrival_ts) AS a, epoch({_FIRST_SEEN}) AS f "
                f"FROM requests ORDER BY {_FIRST_SEEN}, request_id LIMIT ?",
                params=[min(excess, PRUNE_CHUNK)],
            ).to_arrow_table()
            n_new, last, last_whole = con.execute(
                "SELECT count(*) FILTER (WHERE a >= $w), max(a) FILTER (WHERE a < $w), "
                f"{_WHOLE_FROM} FROM slokit_gone",
                {"w": written_before},
            ).fetchall()[0]
            gone = "request_id IN (SELECT request_id FROM slokit_gone)"
            n_frag = con.execute(f"DELETE FROM request_fragments WHERE {gone}").fetchall()[0][0]
            n_req = con.execute(f"DELETE FROM requests WHERE {gone}").fetchall()[0][0]
            raise_whole_from(con, last_whole)
        requests += int(n_req)
        fragments += int(n_frag)
        unwritten += int(n_new)
        newest = _later(newest, None if last is None else float(last))
        whole = _later(whole, None if last_whole is None else float(last_whole))
        if store._rows_estimate is not None:
            store._rows_estimate = max(0, store._rows_estimate - int(n_frag))
    return PrunedPastHold(requests, fragments, unwritten, newest, whole)


def prune_past_lake_hold(
    store: Store, lake: ParquetExporter, *, max_requests: int, wait_s: float
) -> PrunedPastHold | None:
    """:func:`prune_past_hold` beside a lake: with its ticks paused, the oldest requests
    beyond ``max_requests`` go, and the lake stops revisiting the written minutes that lost
    rows (a revisit would write them again without those rows). None: a lake tick was still
    running after ``wait_s`` (a slow bucket); nothing was deleted, the next round tries."""
    with lake.paused(wait_s) as paused:
        if not paused:
            return None
        gone = prune_past_hold(
            store, max_requests=max_requests, written_before=lake.written_before("requests")
        )
        if gone.newest_written is not None:
            lake.stop_revisiting("requests", gone.newest_written)
    return gone


def raise_whole_from(con: Any, arrival: float | None) -> None:
    """Keep in the file that the store's requests are whole only from ``arrival`` on (epoch
    seconds; None: nothing to say), unless it already says a later one."""
    if arrival is not None:
        run(con, _KEEP_WHOLE_FROM, [_WHOLE_FROM_MARK, float(arrival)])


def requests_whole_from(con: Any) -> float | None:
    """The store's requests are whole from this arrival on (epoch seconds): the newest that
    retention deleted, as kept in the file. None where none was deleted, or the file is of a
    schema before 11 (opened read-only, not migrated)."""
    # asked first, not tried: a failed statement would abort the caller's transaction
    if not run(con, "SELECT 1 FROM duckdb_tables() WHERE table_name = 'store_marks'"):
        return None
    rows = run(con, "SELECT epoch(ts) FROM store_marks WHERE name = ?", [_WHOLE_FROM_MARK])
    return float(rows[0][0]) if rows else None


def prune_samples(
    store: Store,
    *,
    now: float,
    max_age_s: float,
    keep_from: Mapping[str, float] | None = None,
) -> dict[str, int]:
    """Delete the rows of :data:`SAMPLE_TABLES` dated before ``now - max_age_s`` (epoch
    seconds, the store's clock), keeping a table's rows from ``keep_from[table]`` on (a lake's
    unwritten minutes); returns the rows deleted per table (tables with none left out)."""
    cutoff = now - max_age_s
    deleted: dict[str, int] = {}
    with store.transaction() as con:
        for table, column in SAMPLE_TABLES:
            until = min(cutoff, (keep_from or {}).get(table, cutoff))
            sql = f"DELETE FROM {table} WHERE {column} < to_timestamp(?)"
            n = int(run(con, sql, [until])[0][0])
            if n:
                deleted[table] = n
    return deleted


def skip_vacuum(store: Store) -> None:
    """Turn off DuckDB's vacuum at checkpoints, for a store pruned by this module.

    A checkpoint vacuums the row groups that have deleted rows: it merges them, moving rows and
    so rewriting their keys in the indexes. In a store pruned oldest first, row groups empty out
    whole and are dropped without it, and the vacuum made a request's append cost 52 µs
    instead of 31, DuckDB's own checkpoints included (``benchmarks/retention_cost.py``, 150,000
    kept; without the vacuum the file stayed at 123 MB while 1.3 million requests went through).
    Without pruning, a request merged again (deleted and appended) leaves a dead row that only
    the vacuum reclaims: keep it on there. DuckDB holds the setting for the whole database."""
    run(store.con, "SET max_vacuum_tasks = 0")
