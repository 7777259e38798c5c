"""The read interface analysis depends on: one method per question it asks of the data.

:class:`Reader` is the protocol; :class:`LocalReader` answers it from a slokit DuckDB file
(a connection or a cursor: the sidecar's API hands each request its own cursor). Another
backend (a sidecar's HTTP API, a Parquet lake of many pods, Prometheus for the engine
series) implements the same methods and analysis does not change.

Times in and out are epoch seconds (float). Frames are pandas DataFrames keyed by
``(replica, bucket)``; their columns are listed in :mod:`slokit.store.frames`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from slokit.store import frames, gaps, queries
from slokit.store.queries import PageKey
from slokit.store.retention import requests_whole_from

if TYPE_CHECKING:  # pandas and duckdb are imported by the modules that run the queries
    import duckdb
    import pandas as pd

__all__ = ["LocalReader", "Reader", "RouterReader"]


@runtime_checkable
class Reader(Protocol):
    """What analysis asks of the data. Every method is read-only.

    ``basis`` says where request-level facts come from: ``"records"`` (one merged record per
    request) or ``"histograms"`` (a backend with only aggregate series, such as Prometheus:
    the request frames are built from vLLM's histograms and counters, and diagnose's
    coverage says so)."""

    basis: Literal["records", "histograms"]

    # -- extent --------------------------------------------------------------------------
    def bounds(self) -> tuple[float | None, float | None]:
        """Oldest and newest time over requests, engine and GPU samples (None: no data)."""
        ...

    # -- requests ------------------------------------------------------------------------
    def request(self, request_id: str) -> dict[str, Any] | None:
        """The merged record of any accepted form of the id (``r24``, ``cmpl-r24-0``...)."""
        ...

    def requests(self, since: float | None, until: float | None) -> list[dict[str, Any]]:
        """Merged records arriving in ``[since, until)``, oldest first."""
        ...

    def requests_page(
        self, since: float | None, until: float | None, after: PageKey | None, limit: int
    ) -> tuple[list[dict[str, Any]], PageKey | None]:
        """One page of :meth:`requests` (same order) after the key ``after``, at most
        ``limit`` records, and the key of the next page (None: the last page)."""
        ...

    def peer_count(self, since: float, until: float, slo_class: str | None) -> int:
        """Requests of the class arriving in ``[since, until]``."""
        ...

    def percentile_ranks(
        self,
        values: Mapping[str, float | None],
        since: float,
        until: float,
        slo_class: str | None,
        model: str | None = None,
    ) -> dict[str, Any]:
        """Mid-rank percentile of each value among successful peers, with their p50/p95."""
        ...

    def request_summary(self, replica: str | None, since: float, until: float) -> dict[str, Any]:
        """Exact statistics of the requests arriving in ``[since, until)`` (None: all)."""
        ...

    def request_summaries(self, since: float, until: float) -> dict[str, dict[str, Any]]:
        """:meth:`request_summary` of every replica (``""``: requests with no replica)."""
        ...

    # -- window frames (bucketed by replica) ---------------------------------------------
    def request_buckets(self, origin: float, until: float, bucket_s: float) -> pd.DataFrame: ...

    def finished_buckets(self, origin: float, until: float, bucket_s: float) -> pd.DataFrame: ...

    def engine_buckets(
        self, origin: float, until: float, bucket_s: float, lookback_s: float
    ) -> pd.DataFrame: ...

    def gpu_buckets(
        self, origin: float, until: float, bucket_s: float, busy_util: float
    ) -> pd.DataFrame: ...

    # -- engine and GPU state ------------------------------------------------------------
    def engine_window(self, replica: str, since: float, until: float) -> list[dict[str, Any]]:
        """The replica's engine samples in ``[since, until]``, oldest first."""
        ...

    def engine_series(
        self, since: float | None, until: float | None
    ) -> dict[str, list[tuple[float, float | None, float | None]]]:
        """Replica -> ``[(ts, running, waiting)]``."""
        ...

    def has_engine_samples(self, replica: str) -> bool: ...

    def engine_counter_increase(
        self, column: str, replica: str, since: float, until: float
    ) -> dict[str, Any]:
        """Increase of an engine counter over ``[since, until]`` counting resets:
        ``{"increase", "samples", "resets"}``."""
        ...

    def cache_config(self) -> dict[str, float] | None:
        """The newest ``num_gpu_blocks`` and ``block_size`` the engine reported."""
        ...

    def gpu_state_at(self, replica: str, ts: float, *, max_age_s: float) -> dict[str, Any] | None:
        """The replica's newest GPU sample at or before ``ts``, if younger than ``max_age_s``."""
        ...

    def energy_increase(self, since: float | None, until: float | None) -> float | None:
        """Joules used by all GPUs over the window (None: no energy counter)."""
        ...

    # -- telemetry health ----------------------------------------------------------------
    def last_seen(self, source: str, before: float) -> float | None: ...

    def sample_gaps(
        self, source: str, since: float, until: float, *, stale_factor: float, min_gap_s: float
    ) -> list[tuple[str, float, float, float | None]]: ...

    def failed_scrapes(self, since: float, until: float) -> list[dict[str, Any]]: ...

    # -- findings ------------------------------------------------------------------------
    def findings_overlapping(
        self, replica: str | None, since: float, until: float
    ) -> list[dict[str, Any]]:
        """Stored findings overlapping the window, for this replica or the whole fleet."""
        ...

    def findings(
        self, since: float | None, until: float | None, limit: int = 200
    ) -> list[dict[str, Any]]:
        """Stored findings overlapping the window: most severe first, then newest."""
        ...

    def slowest_request(self, *, source: str = "vllm") -> str | None:
        """The successful request with ``source``'s fragment that waited longest for its
        first token."""
        ...


@runtime_checkable
class RouterReader(Protocol):
    """A reader that also knows the gateway router's series (``router_samples``). Apart from
    :class:`Reader` so that backends without router series (Prometheus, a sidecar's API) stay
    readers: the diagnosis asks :meth:`router_buckets` only of a reader that has it."""

    def router_buckets(self, origin: float, until: float, bucket_s: float) -> pd.DataFrame:
        """The router's flow-control queue, pool saturation, pool averages and request and
        error increases per ``(replica, bucket)``, ``replica`` being the router's name."""
        ...


class LocalReader:
    """:class:`Reader` over a slokit DuckDB connection (or cursor)."""

    basis: Literal["records", "histograms"] = "records"

    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        *,
        requests_from: float | Literal["stored"] | None = "stored",
    ) -> None:
        """``requests_from``: the store's requests are whole from this arrival on (a
        sidecar's retention deleted older ones while its samples go back further); a
        diagnosis starts no earlier (:func:`slokit.analysis.diagnose.run_diagnosis`).
        ``"stored"`` (the default): what the file says, read at each use
        (:func:`slokit.store.retention.requests_whole_from`); None: none."""
        self.con = con
        self._requests_from = requests_from

    @property
    def requests_from(self) -> float | None:
        if self._requests_from == "stored":
            return requests_whole_from(self.con)
        return self._requests_from

    def bounds(self) -> tuple[float | None, float | None]:
        return frames.data_bounds(self.con)

    def request(self, request_id: str) -> dict[str, Any] | None:
        return queries.get_request(self.con, request_id)

    def requests(self, since: float | None, until: float | None) -> list[dict[str, Any]]:
        return queries.load_records(self.con, since, until)

    def requests_page(
        self, since: float | None, until: float | None, after: PageKey | None, limit: int
    ) -> tuple[list[dict[str, Any]], PageKey | None]:
        return queries.requests_page(self.con, since, until, after, limit)

    def peer_count(self, since: float, until: float, slo_class: str | None) -> int:
        return queries.peer_count(self.con, since, until, slo_class)

    def percentile_ranks(
        self,
        values: Mapping[str, float | None],
        since: float,
        until: float,
        slo_class: str | None,
        model: str | None = None,
    ) -> dict[str, Any]:
        return queries.percentile_ranks(
            self.con, values=dict(values), since=since, until=until, slo_class=slo_class,
            model=model,
        )  # fmt: skip

    def request_summary(self, replica: str | None, since: float, until: float) -> dict[str, Any]:
        return frames.request_summary(self.con, replica, since, until)

    def request_summaries(self, since: float, until: float) -> dict[str, dict[str, Any]]:
        return frames.request_summaries(self.con, since, until)

    def request_buckets(self, origin: float, until: float, bucket_s: float) -> pd.DataFrame:
        return frames.request_buckets(self.con, origin, until, bucket_s)

    def finished_buckets(self, origin: float, until: float, bucket_s: float) -> pd.DataFrame:
        return frames.finished_buckets(self.con, origin, until, bucket_s)

    def engine_buckets(
        self, origin: float, until: float, bucket_s: float, lookback_s: float
    ) -> pd.DataFrame:
        return frames.engine_buckets(self.con, origin, until, bucket_s, lookback_s)

    def gpu_buckets(
        self, origin: float, until: float, bucket_s: float, busy_util: float
    ) -> pd.DataFrame:
        return frames.gpu_buckets(self.con, origin, until, bucket_s, busy_util)

    def router_buckets(self, origin: float, until: float, bucket_s: float) -> pd.DataFrame:
        return frames.router_buckets(self.con, origin, until, bucket_s)

    def engine_window(self, replica: str, since: float, until: float) -> list[dict[str, Any]]:
        return queries.engine_window(self.con, replica, since, until)

    def engine_series(
        self, since: float | None, until: float | None
    ) -> dict[str, list[tuple[float, float | None, float | None]]]:
        return queries.engine_series(self.con, since, until)

    def has_engine_samples(self, replica: str) -> bool:
        return queries.has_rows(self.con, "engine_samples", replica)

    def engine_counter_increase(
        self, column: str, replica: str, since: float, until: float
    ) -> dict[str, Any]:
        return queries.counter_increase(
            self.con, table="engine_samples", column=queries.engine_counter(column),
            replica=replica, since=since, until=until,
        )  # fmt: skip

    def cache_config(self) -> dict[str, float] | None:
        return queries.cache_config(self.con)

    def gpu_state_at(self, replica: str, ts: float, *, max_age_s: float) -> dict[str, Any] | None:
        return queries.gpu_state_at(self.con, replica, ts, max_age_s=max_age_s)

    def energy_increase(self, since: float | None, until: float | None) -> float | None:
        return queries.energy_increase(self.con, since, until)

    def last_seen(self, source: str, before: float) -> float | None:
        return gaps.last_seen(self.con, source, before)

    def sample_gaps(
        self, source: str, since: float, until: float, *, stale_factor: float, min_gap_s: float
    ) -> list[tuple[str, float, float, float | None]]:
        return gaps.sample_gaps(
            self.con, source, since, until, stale_factor=stale_factor, min_gap_s=min_gap_s
        )

    def failed_scrapes(self, since: float, until: float) -> list[dict[str, Any]]:
        return gaps.failed_scrapes(self.con, since, until)

    def findings_overlapping(
        self, replica: str | None, since: float, until: float
    ) -> list[dict[str, Any]]:
        return queries.findings_overlapping(self.con, replica, since, until)

    def findings(
        self, since: float | None, until: float | None, limit: int = 200
    ) -> list[dict[str, Any]]:
        return queries.stored_findings(self.con, since, until, limit)

    def slowest_request(self, *, source: str = "vllm") -> str | None:
        return queries.slowest_request(self.con, source=source)

    def unjoined(self, since: float | None, until: float | None) -> dict[str, int]:
        """Gateway spans that never joined a request by trace id, by reason (``expired``,
        ``overflow``, ``no_trace_id``), dropped in the window. Not part of :class:`Reader`:
        only a store that joins spans knows them."""
        return queries.unjoined(self.con, since, until)
