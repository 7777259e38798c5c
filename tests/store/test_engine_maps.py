"""vLLM's labelled series kept per label value (schema 4): waiting by reason and prompt tokens
by source stored as MAP columns, on both insert paths, and bucketed by engine_buckets."""

from __future__ import annotations

import pandas as pd
import pytest

from slokit.records import EngineSample
from slokit.store.append import ENGINE_PARAMS_MAX
from slokit.store.db import open_store
from slokit.store.migrations import MIGRATIONS

T0 = 1_700_000_000.0


def _sample(i: int) -> EngineSample:
    return EngineSample(
        ts=T0 + i,
        replica="pod-a",
        model="tiny",
        waiting=float(10 + i),
        waiting_by_reason={"capacity": float(8 + i), "deferred": 2.0},
        prompt_tokens_by_source={
            "local_compute": 100.0 * i,
            "local_cache_hit": 50.0 * i,
            "external_kv_transfer": 0.0,
        },
        request_success_by_reason={"stop": float(i), "abort": 1.0},
    )


def test_schema_4_adds_the_map_columns() -> None:
    assert MIGRATIONS[3].version == 4
    with open_store(":memory:") as store:
        cols = {r[0]: r[1] for r in store.con.execute("DESCRIBE engine_samples").fetchall()}
    assert cols["waiting_by_reason"] == "MAP(VARCHAR, DOUBLE)"
    assert cols["prompt_tokens_by_source"] == "MAP(VARCHAR, DOUBLE)"


@pytest.mark.parametrize("n", [2, ENGINE_PARAMS_MAX + 2])  # parameters, then Arrow
def test_maps_round_trip_on_both_insert_paths(n: int) -> None:
    with open_store(":memory:") as store:
        store.append_engine_samples([_sample(i) for i in range(n)])
        row = store.con.execute(
            "SELECT waiting_by_reason, prompt_tokens_by_source, request_success_by_reason "
            "FROM engine_samples ORDER BY ts LIMIT 1 OFFSET 1"
        ).fetchone()
    assert row is not None
    assert dict(row[0]) == {"capacity": 9.0, "deferred": 2.0}
    assert dict(row[1])["local_compute"] == 100.0
    assert dict(row[2]) == {"stop": 1.0, "abort": 1.0}


def test_engine_buckets_peak_waiting_reasons_and_sum_source_increases() -> None:
    with open_store(":memory:") as store:
        store.append_engine_samples([_sample(i) for i in range(6)])
        frame = store.reader().engine_buckets(T0, T0 + 10, 10.0, 0.0)
    (row,) = frame.to_dict("records")
    assert row["waiting_capacity_max"] == 13.0 and row["waiting_deferred_max"] == 2.0
    assert row["prompt_computed"] == 500.0  # 0 -> 500 over the bucket
    assert row["prompt_cached"] == 250.0
    assert row["prompt_external"] == 0.0


def test_samples_without_the_series_read_as_null() -> None:
    with open_store(":memory:") as store:
        store.append_engine_samples(
            [EngineSample(ts=T0 + i, replica="pod-a", model="tiny", waiting=1.0) for i in range(3)]
        )
        frame = store.reader().engine_buckets(T0, T0 + 10, 10.0, 0.0)
    (row,) = frame.to_dict("records")
    assert pd.isna(row["waiting_capacity_max"]) and pd.isna(row["prompt_computed"])
