"""The DuckDB store: migrations, fragment merge, idempotency, counter resets."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from slokit.errors import BadInput, StoreBusy
from slokit.records import EngineSample, HistogramSnapshot, RequestFragment
from slokit.store._trace_join import TRACE_ONLY_ID
from slokit.store.db import open_store
from slokit.store.migrations import LATEST_VERSION, MIGRATIONS

T0 = 1_795_958_000.0


def vllm_frag(rid: str = "r1", **kw: object) -> RequestFragment:
    base: dict[str, object] = dict(
        request_id=rid,
        source="vllm",
        fragment_id=f"vllm:{rid}",
        replica="pod-a",
        arrival_ts=T0,
        ttft_s=0.2,
        e2e_s=2.2,
        queue_s=0.1,
        prefill_s=0.05,
        decode_s=2.0,
        prompt_tokens=100,
        output_tokens=101,
    )
    base.update(kw)
    return RequestFragment(**base)  # type: ignore[arg-type]


def client_frag(rid: str = "r1", **kw: object) -> RequestFragment:
    base: dict[str, object] = dict(
        request_id=rid,
        source="client",
        fragment_id=f"client:{rid}",
        arrival_ts=T0 - 0.01,
        client_ttft_s=0.25,
        client_e2e_s=2.3,
        status="ok",
        http_status=200,
        slo_class="interactive",
        prompt_tokens=99,
        model="tiny",
    )
    base.update(kw)
    return RequestFragment(**base)  # type: ignore[arg-type]


def test_new_file_is_migrated_to_the_latest_version(tmp_path: Path) -> None:
    with open_store(tmp_path / "s.duckdb") as store:
        assert store.schema_version() == MIGRATIONS[-1].version


def test_reopening_applies_no_migration_twice(tmp_path: Path) -> None:
    path = tmp_path / "s.duckdb"
    open_store(path).close()
    with open_store(path) as store:
        assert store.migrate() == []


def test_upgrading_a_file_stamps_each_request_with_its_first_fragments_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "s.duckdb"
    with monkeypatch.context() as m:  # a file as the schema before first_ingested_at left it
        m.setattr("slokit.store.db.MIGRATIONS", MIGRATIONS[:6])
        with open_store(path) as old:
            old.con.execute(
                "INSERT INTO request_fragments (fragment_id, request_id, source, ingested_at) "
                "VALUES ('vllm:a', 'a', 'vllm', to_timestamp(?)), "
                "('client:a', 'a', 'client', to_timestamp(?))",
                [T0 + 5, T0],
            )
            old.con.execute(
                "INSERT INTO requests (request_id, sources, updated_at) VALUES "
                "('a', ['client', 'vllm'], now()), ('lake-only', ['vllm'], now())"
            )
    with open_store(path) as store:
        rows = store.con.execute(
            "SELECT request_id, epoch(first_ingested_at) FROM requests ORDER BY 1"
        ).fetchall()
    assert rows == [("a", T0), ("lake-only", None)]


def _request_tables(con: duckdb.DuckDBPyConnection) -> dict[str, list[tuple[object, ...]]]:
    return {
        t: con.execute(f"SELECT * FROM {t} ORDER BY ALL").fetchall()
        for t in ("request_fragments", "requests")
    }


def _request_table_keys(con: duckdb.DuckDBPyConnection) -> list[tuple[object, ...]]:
    return con.execute(
        "SELECT table_name, constraint_column_names FROM duckdb_constraints() "
        "WHERE constraint_type = 'PRIMARY KEY' AND table_name LIKE 'request%' ORDER BY 1"
    ).fetchall()


def test_upgrading_to_uncompressed_ids_keeps_every_row_key_and_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "s.duckdb"
    with monkeypatch.context() as m:  # a file as schema 7 left it
        m.setattr("slokit.store.db.MIGRATIONS", MIGRATIONS[:7])
        with open_store(path, clock=lambda: T0) as old:
            old.append_fragments(
                [vllm_frag("r1", trace_id="t1"), client_frag("r1"), vllm_frag("r2")]
            )
            before = _request_tables(old.con)
    monkeypatch.setattr("slokit.store.db.MIGRATIONS", MIGRATIONS[:8])
    with open_store(path, clock=lambda: T0 + 60) as store:
        assert store.schema_version() == 8
        assert _request_tables(store.con) == before
        keys = _request_table_keys(store.con)
        assert keys == [("request_fragments", ["fragment_id"]), ("requests", ["request_id"])]
        indexes = store.con.execute(
            "SELECT index_name FROM duckdb_indexes() WHERE table_name = 'request_fragments' "
            "ORDER BY 1"
        ).fetchall()
        assert indexes == [("request_fragments_request_id",), ("request_fragments_trace_id",)]
        res = store.append_fragments([vllm_frag("r1", trace_id="t1"), client_frag("r2")])
        assert res.new == 1  # the stored copy is known; r2's client fragment is new
        assert store.con.execute("SELECT count(*) FROM requests").fetchone() == (2,)


def _trace_indexes(con: duckdb.DuckDBPyConnection) -> list[tuple[object, ...]]:
    return con.execute(
        "SELECT index_name FROM duckdb_indexes() WHERE index_name = 'request_fragments_trace_id'"
    ).fetchall()


def _gateway_of_trace(trace_id: str) -> RequestFragment:
    """A gateway span that names no request id: it joins the request of its trace."""
    return RequestFragment(
        TRACE_ONLY_ID, "gateway", "gateway:g1", trace_id=trace_id, gateway_e2e_s=1.5
    )


def test_a_store_builds_its_trace_id_index_when_a_fragment_first_joins_by_trace(
    tmp_path: Path,
) -> None:
    with open_store(tmp_path / "s.duckdb") as store:
        store.append_fragments([vllm_frag("r1", trace_id="ab" * 16), client_frag("r2")])
        assert _trace_indexes(store.con) == []  # nothing looked up by trace: none kept
        store.append_fragments([_gateway_of_trace("ab" * 16)])
        assert _trace_indexes(store.con) == [("request_fragments_trace_id",)]
        assert store.con.execute(
            "SELECT gateway_e2e_s FROM requests WHERE request_id = 'r1'"
        ).fetchall() == [(1.5,)]


def test_upgrading_to_schema_9_drops_the_trace_id_index_and_a_trace_join_builds_it_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "s.duckdb"
    with monkeypatch.context() as m:  # a file as schema 8 left it
        m.setattr("slokit.store.db.MIGRATIONS", MIGRATIONS[:8])
        with open_store(path) as old:
            old.append_fragments([vllm_frag("r1", trace_id="cd" * 16)])
            assert _trace_indexes(old.con) == [("request_fragments_trace_id",)]
    monkeypatch.setattr("slokit.store.db.MIGRATIONS", MIGRATIONS[:9])
    with open_store(path) as store:
        assert store.schema_version() == 9
        assert _trace_indexes(store.con) == []
        store.append_fragments([_gateway_of_trace("cd" * 16)])
        assert _trace_indexes(store.con) == [("request_fragments_trace_id",)]
        assert store.con.execute("SELECT request_id, sources FROM requests").fetchall() == [
            ("r1", ["gateway", "vllm"])
        ]
    with open_store(path) as reopened:  # kept in the file from then on
        assert _trace_indexes(reopened.con) == [("request_fragments_trace_id",)]


def test_upgrading_to_schema_10_keeps_every_row_and_drops_the_fragment_id_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "s.duckdb"
    with monkeypatch.context() as m:  # a file as schema 9 left it, its trace index built
        m.setattr("slokit.store.db.MIGRATIONS", MIGRATIONS[:9])
        with open_store(path, clock=lambda: T0) as old:
            old.append_fragments([vllm_frag("r1", trace_id="ef" * 16), client_frag("r1")])
            old.append_fragments([_gateway_of_trace("ef" * 16), vllm_frag("r2")])
            before = _request_tables(old.con)
    with open_store(path, clock=lambda: T0 + 60) as store:
        assert store.schema_version() == LATEST_VERSION  # 10 and every one after it
        assert _request_tables(store.con) == before
        keys = _request_table_keys(store.con)
        assert keys == [("requests", ["request_id"])]
        indexes = store.con.execute(
            "SELECT index_name FROM duckdb_indexes() WHERE table_name = 'request_fragments'"
        ).fetchall()
        assert indexes == [("request_fragments_request_id",)]  # the trace join builds its own
        res = store.append_fragments([vllm_frag("r1", trace_id="ef" * 16), client_frag("r3")])
        assert res.new == 1  # the stored copy is known; r3's client fragment is new
        assert _request_tables(store.con)["requests"][:2] == before["requests"]


def test_the_request_tables_indexed_ids_are_stored_uncompressed(tmp_path: Path) -> None:
    """A deleted row's keys are fetched one row at a time to take them out of the indexes:
    from a compressed string segment that costs several times more (retention's deletes)."""
    with open_store(tmp_path / "s.duckdb") as store:
        store.append_fragments(
            [
                vllm_frag(f"req-{i:05d}", fragment_id=f"vllm:{i:05d}", trace_id=f"{i:032x}")
                for i in range(5000)
            ]
        )
        store.con.execute("CHECKPOINT")
        rows = store.con.execute(
            "SELECT DISTINCT column_name, compression FROM pragma_storage_info(?) "
            "WHERE segment_type = 'VARCHAR' AND column_name IN (?, ?) ORDER BY 1",
            ["request_fragments", "request_id", "trace_id"],
        ).fetchall()
        assert rows == [("request_id", "Uncompressed"), ("trace_id", "Uncompressed")]
        rows = store.con.execute(
            "SELECT DISTINCT compression FROM pragma_storage_info('requests') "
            "WHERE column_name = 'request_id' AND segment_type = 'VARCHAR'"
        ).fetchall()
        assert rows == [("Uncompressed",)]


def test_a_request_keeps_the_time_its_first_fragment_was_ingested() -> None:
    now = [T0]
    with open_store(":memory:", clock=lambda: now[0]) as store:
        store.append_fragments([vllm_frag("r1")])
        now[0] += 60.0
        store.append_fragments([client_frag("r1"), vllm_frag("r2")])
        now[0] += 60.0
        store.append_fragments([vllm_frag("r1")])  # a resend changes nothing
        rows = store.con.execute(
            "SELECT request_id, epoch(first_ingested_at) FROM requests ORDER BY 1"
        ).fetchall()
    assert rows == [("r1", T0), ("r2", T0 + 60.0)]


def test_fragments_from_vllm_and_client_merge_into_one_request() -> None:
    with open_store(":memory:") as store:
        store.append_fragments([vllm_frag()])
        store.append_fragments([client_frag()])
        rec = store.reader().request("r1")
        assert rec is not None
        assert sorted(rec["sources"]) == ["client", "vllm"]
        assert rec["ttft_s"] == 0.2 and rec["client_ttft_s"] == 0.25
        assert rec["prompt_tokens"] == 100  # vLLM's count wins over the client's
        assert rec["arrival_ts"] == pytest.approx(T0)  # server arrival wins
        assert rec["slo_class"] == "interactive" and rec["model"] == "tiny"
        assert rec["tpot_s"] == pytest.approx((2.2 - 0.2) / 100)


def test_merge_result_does_not_depend_on_arrival_order() -> None:
    frags = [
        vllm_frag(),
        client_frag(status="timeout", http_status=None),
        RequestFragment("r1", "quality", "quality:r1", quality_pass=False),
    ]
    results = []
    for perm in itertools.permutations(frags):
        with open_store(":memory:") as store:
            for f in perm:
                store.append_fragments([f])
            rec = store.reader().request("r1")
            assert rec is not None
            rec.pop("updated_at")
            results.append(rec)
    assert all(r == results[0] for r in results)
    assert results[0]["status"] == "timeout" and results[0]["quality_pass"] is False


def test_same_span_twice_makes_one_fragment_and_one_record() -> None:
    with open_store(":memory:") as store:
        first = store.append_fragments([vllm_frag()])
        again = store.append_fragments([vllm_frag(), vllm_frag()])
        assert (first.new, again.new) == (1, 0)
        assert store.con.execute("SELECT count(*) FROM requests").fetchone() == (1,)
        assert store.con.execute("SELECT count(*) FROM request_fragments").fetchone() == (1,)


def test_client_outcome_wins_over_vllm_ok() -> None:
    with open_store(":memory:") as store:
        store.append_fragments([vllm_frag(), client_frag(status="cancelled")])
        rec = store.reader().request("r1")
        assert rec is not None and rec["status"] == "cancelled"


def test_vllm_only_request_is_ok_and_timestamps_derive_from_latencies() -> None:
    with open_store(":memory:") as store:
        store.append_fragments([vllm_frag()])
        rec = store.reader().request("cmpl-r1-0")
        assert rec is not None and rec["status"] == "ok"
        assert rec["first_token_ts"] == pytest.approx(T0 + 0.2)
        assert rec["finish_ts"] == pytest.approx(T0 + 2.2)


def test_missing_facts_stay_null() -> None:
    with open_store(":memory:") as store:
        store.append_fragments([vllm_frag()])
        rec = store.reader().request("r1")
        assert rec is not None
        assert rec["client_ttft_s"] is None and rec["quality_pass"] is None
        assert rec["preemptions"] is None and rec["model"] is None


def _engine(ts: float, preemptions: float) -> EngineSample:
    return EngineSample(ts=ts, replica="pod-a", model="tiny", preemptions_total=preemptions)


def test_counter_increase_counts_a_reset_as_a_restart_from_zero() -> None:
    with open_store(":memory:") as store:
        store.append_engine_samples([_engine(T0 + i, v) for i, v in enumerate([10, 12, 15, 2, 5])])
        inc = store.reader().engine_counter_increase("preemptions_total", "pod-a", T0, T0 + 10)
        assert inc == {"increase": 2 + 3 + 2 + 3, "samples": 5, "resets": 1}


def test_counter_increase_starts_from_the_sample_before_the_window() -> None:
    with open_store(":memory:") as store:
        store.append_engine_samples([_engine(T0 + i, v) for i, v in enumerate([10, 12, 15, 16])])
        inc = store.reader().engine_counter_increase("preemptions_total", "pod-a", T0 + 1.5, T0 + 3)
        assert inc["increase"] == 4  # 12 (at T0+1) -> 16


def test_histograms_are_stored_beside_the_engine_sample() -> None:
    h = HistogramSnapshot(
        "vllm:time_to_first_token_seconds", [0.1, 1.0, float("inf")], [1, 3, 4], 2.5, 4
    )
    with open_store(":memory:") as store:
        store.append_engine_samples([EngineSample(T0, "pod-a", "tiny", histograms={h.metric: h})])
        row = store.con.execute(
            "SELECT metric, upper_bounds, cumulative_counts, count FROM histogram_samples"
        ).fetchone()
        assert row == (h.metric, [0.1, 1.0, float("inf")], [1.0, 3.0, 4.0], 4.0)


def test_a_failed_append_writes_nothing() -> None:
    with open_store(":memory:") as store:
        bad = vllm_frag()._replace(prompt_tokens="many")
        with pytest.raises(Exception):  # noqa: B017 - arrow rejects the batch
            store.append_fragments([vllm_frag("r0"), bad])
        assert store.con.execute("SELECT count(*) FROM request_fragments").fetchone() == (0,)


def test_second_writer_gets_store_busy(tmp_path: Path) -> None:
    path = tmp_path / "s.duckdb"
    code = (
        "import duckdb,sys,time; c=duckdb.connect(sys.argv[1]); "
        "print('ready', flush=True); time.sleep(30)"
    )
    import subprocess
    import sys

    open_store(path).close()
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        with pytest.raises(StoreBusy, match="sidecar"):
            open_store(path)
    finally:
        proc.kill()
        proc.wait()


def test_read_only_open_of_a_missing_file_is_bad_input(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="no slokit database"):
        open_store(tmp_path / "nope.duckdb", read_only=True)


def test_read_only_open_of_a_foreign_duckdb_file_is_bad_input(tmp_path: Path) -> None:
    path = tmp_path / "other.duckdb"
    duckdb.connect(str(path)).close()
    with pytest.raises(BadInput, match="not a slokit database"):
        open_store(path, read_only=True)


_THREADS_PINNED = """
import os, sys
from slokit.store.db import open_store
os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
store = open_store(sys.argv[1])
print(store.con.execute("SELECT current_setting('threads')").fetchone()[0])
print(store.con.execute("SELECT current_setting('async_threads')").fetchone()[0])
store.close()
"""


needs_two_cpus = pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs two CPUs this process may use",
)


def _pinned_store_threads(tmp_path: Path) -> tuple[str, str]:
    """DuckDB's ``threads`` and ``async_threads`` in a store opened by a process pinned to
    one CPU."""
    out = subprocess.run(
        [sys.executable, "-c", _THREADS_PINNED, str(tmp_path / "s.duckdb")],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    threads, async_threads = out.split()
    return threads, async_threads


@needs_two_cpus
def test_a_store_opened_on_one_allowed_cpu_runs_one_duckdb_thread(tmp_path: Path) -> None:
    # DuckDB counts the machine's cores; a process pinned to one (taskset, a cpuset) would
    # run workers that only take turns on it.
    assert _pinned_store_threads(tmp_path)[0] == "1"


@needs_two_cpus
def test_a_store_opened_on_one_allowed_cpu_runs_one_async_io_thread(tmp_path: Path) -> None:
    # DuckDB starts four async I/O threads per core of the machine at connect
    assert _pinned_store_threads(tmp_path)[1] == "1"
