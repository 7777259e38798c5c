"""Router samples (:class:`~slokit.records.RouterSample`) as ``router_samples`` rows."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import pyarrow as pa

from slokit.records import RouterSample
from slokit.store.append import HISTOGRAM_TYPE, append_table, ts_array

if TYPE_CHECKING:
    from slokit.store.db import Store

#: The float columns of ``router_samples`` (RouterSample fields of the same name).
ROUTER_SCALARS: tuple[str, ...] = (
    "flow_queue_size",
    "flow_queue_bytes",
    "pool_saturation",
    "avg_kv_usage_ratio",
    "avg_queue_size",
    "avg_running",
    "ready_endpoints",
    "running",
    "requests_total",
    "errors_total",
)
#: The map columns (label value -> counter).
ROUTER_MAPS: tuple[str, ...] = ("errors_by_code", "flow_outcomes")


def router_table(samples: Sequence[RouterSample]) -> pa.Table:
    """Router samples as ``router_samples`` rows, histograms in the row's list column."""
    cols: dict[str, pa.Array] = {
        "ts": ts_array([s.ts for s in samples]),
        "router": pa.array([s.router for s in samples], pa.string()),
        "pool": pa.array([s.pool for s in samples], pa.string()),
        "model": pa.array([s.model for s in samples], pa.string()),
    }
    for name in ROUTER_SCALARS:
        cols[name] = pa.array([getattr(s, name) for s in samples], pa.float64())
    for name in ROUTER_MAPS:
        cols[name] = pa.array(
            [list(getattr(s, name).items()) for s in samples], pa.map_(pa.string(), pa.float64())
        )
    cols["histograms"] = pa.array(
        [
            [
                {
                    "metric": h.metric,
                    "upper_bounds": h.upper_bounds,
                    "cumulative_counts": h.cumulative_counts,
                    "sum": h.sum,
                    "count": h.count,
                }
                for h in s.histograms.values()
            ]
            for s in samples
        ],
        HISTOGRAM_TYPE,
    )
    return pa.table(cols)


def append_router_samples(store: Store, samples: Sequence[RouterSample]) -> int:
    """One ``router_samples`` row per sample, in one statement."""
    return append_table(store, "router_samples", router_table(samples))
