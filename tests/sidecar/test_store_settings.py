"""The sidecar's DuckDB runs with the configured thread count and memory bound."""

from __future__ import annotations

import duckdb
from sidecar_harness import Running, StartSidecar


def _setting(sc: Running, name: str) -> str:
    cur = sc.sidecar.store.cursor()
    try:
        return str(cur.execute(f"SELECT current_setting('{name}')").fetchall()[0][0])
    finally:
        cur.close()


def test_the_store_runs_one_thread_and_the_memory_bound_by_default(
    start_sidecar: StartSidecar,
) -> None:
    sc = start_sidecar()
    assert _setting(sc, "threads") == "1"
    assert _setting(sc, "memory_limit") == "122.0 MiB"  # 128MB, as DuckDB shows it


def test_the_store_runs_the_threads_it_is_given(start_sidecar: StartSidecar) -> None:
    assert _setting(start_sidecar(db_threads=3), "threads") == "3"


def test_the_store_turns_its_allocators_background_thread_on_by_default(
    start_sidecar: StartSidecar,
) -> None:
    assert _setting(start_sidecar(), "allocator_background_threads") == "True"


def test_the_allocators_background_thread_can_be_left_off(start_sidecar: StartSidecar) -> None:
    sc = start_sidecar(db_allocator_background_threads=False)
    assert _setting(sc, "allocator_background_threads") == "False"


def test_the_store_starts_one_async_io_thread_by_default(start_sidecar: StartSidecar) -> None:
    # DuckDB's default is four per core of the machine, started at connect
    assert _setting(start_sidecar(), "async_threads") == "1"


def test_native_threads_zero_leaves_duckdbs_async_threads_at_its_default(
    start_sidecar: StartSidecar,
) -> None:
    con = duckdb.connect()
    try:
        default = str(con.execute("SELECT current_setting('async_threads')").fetchall()[0][0])
    finally:
        con.close()
    assert _setting(start_sidecar(native_threads=0), "async_threads") == default
