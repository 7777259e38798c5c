"""The store's usage: DuckDB's memory by tag against its limit, and its file's blocks."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from slokit.store.usage import StoreUsage, parse_size, read_usage


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0 bytes", 0),
        ("5.1 KiB", round(5.1 * 1024)),
        ("122.0 MiB", 122 * 2**20),
        ("1.5 GB", 1_500_000_000),
        ("18.8 GiB", round(18.8 * 2**30)),
        ("512", 512),
    ],
)
def test_parse_size_reads_sizes_as_duckdb_writes_them(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["Unlimited", "", "12 parsecs", "-1 MiB"])
def test_parse_size_refuses_what_is_not_a_size(text: str) -> None:
    with pytest.raises(ValueError, match="not a size"):
        parse_size(text)


def test_read_usage_reports_the_memory_limit_that_is_set(tmp_path: Path) -> None:
    con = duckdb.connect(str(tmp_path / "s.duckdb"))
    con.execute("SET memory_limit = '64MB'")
    limit = read_usage(con).memory_limit_bytes
    assert limit is not None
    assert abs(limit - 64_000_000) <= 64_000_000 * 0.01  # DuckDB shows it rounded, in MiB


def test_read_usage_counts_an_index_under_its_tag(tmp_path: Path) -> None:
    con = duckdb.connect(str(tmp_path / "s.duckdb"))
    before = read_usage(con)
    con.execute("CREATE TABLE t (id VARCHAR PRIMARY KEY)")
    con.execute("INSERT INTO t SELECT 'request-' || range FROM range(200000)")
    after = read_usage(con)
    assert before.memory_by_tag.get("ART_INDEX", 0) == 0
    assert after.memory_by_tag["ART_INDEX"] > 200_000  # at least a byte a key


def test_read_usage_reports_the_file_s_used_and_freed_blocks(tmp_path: Path) -> None:
    con = duckdb.connect(str(tmp_path / "s.duckdb"))
    con.execute("SET max_vacuum_tasks = 0")
    con.execute("CREATE TABLE t AS SELECT range AS i, md5(range::VARCHAR) AS s FROM range(2000000)")
    con.execute("CHECKPOINT")
    full = read_usage(con)
    con.execute("DROP TABLE t")
    con.execute("CHECKPOINT")
    dropped = read_usage(con)
    assert full.file_used_bytes > 10_000_000
    assert full.file_free_bytes < full.file_used_bytes
    assert dropped.file_free_bytes > full.file_free_bytes  # the table's blocks freed for reuse
    assert dropped.file_used_bytes < full.file_used_bytes
    assert dropped.wal_bytes == 0  # checkpointed


def test_read_usage_of_an_in_memory_database_has_no_file() -> None:
    usage = read_usage(duckdb.connect())
    assert isinstance(usage, StoreUsage)
    assert usage.file_used_bytes == 0 and usage.file_free_bytes == 0
