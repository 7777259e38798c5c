"""What the store holds: DuckDB's memory by tag, against its limit, and its file's blocks.

Read by the sidecar every few seconds and exported as ``slokit_db_memory_bytes{tag}``,
``slokit_db_memory_limit_bytes``, ``slokit_db_temp_storage_bytes`` and
``slokit_db_file_bytes{part}`` (docs/metrics.md): how close the store is to the
``db_memory_limit`` at which its commits fail, and where its memory goes (an index, the
buffered blocks of the file, a query's hash table).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import duckdb

_UNITS = {
    "": 1, "b": 1, "bytes": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}  # fmt: skip
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-z]*)\s*$", re.I)


def parse_size(text: str) -> int:
    """Bytes in a size as DuckDB writes it (``"128.0 MiB"``, ``"1.5 GB"``, ``"0 bytes"``).

    Raises ValueError for anything else."""
    m = _SIZE.match(text)
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _UNITS:
        raise ValueError(f"not a size: {text!r}")
    return round(float(m.group(1)) * _UNITS[unit])


@dataclass(frozen=True)
class StoreUsage:
    """One reading of the store's memory and file."""

    memory_by_tag: dict[str, int] = field(default_factory=dict)  # duckdb_memory(), bytes
    temp_storage_bytes: int = 0  # spilled to temporary files (over the limit)
    memory_limit_bytes: int | None = None  # None: no limit DuckDB reports
    file_used_bytes: int = 0  # blocks in use
    file_free_bytes: int = 0  # blocks freed (pruned data) that new writes reuse
    wal_bytes: int = 0


def read_usage(con: duckdb.DuckDBPyConnection) -> StoreUsage:
    """Read the usage of the database ``con`` is attached to (an in-memory one has no
    file: its file parts are 0)."""
    rows = con.execute(
        "SELECT tag, memory_usage_bytes, temporary_storage_bytes FROM duckdb_memory()"
    ).fetchall()
    by_tag = {str(tag): int(mem) for tag, mem, _ in rows}
    temp = sum(int(t) for _, _, t in rows)
    size = con.execute(
        "SELECT block_size, used_blocks, free_blocks, wal_size, memory_limit "
        "FROM pragma_database_size() WHERE database_name = current_database()"
    ).fetchone()
    if size is None:
        return StoreUsage(by_tag, temp)
    block, used, free, wal, limit = size
    try:
        limit_bytes: int | None = parse_size(str(limit))
    except ValueError:  # e.g. "Unlimited"
        limit_bytes = None
    try:
        wal_bytes = parse_size(str(wal))
    except ValueError:
        wal_bytes = 0
    return StoreUsage(
        memory_by_tag=by_tag,
        temp_storage_bytes=temp,
        memory_limit_bytes=limit_bytes,
        file_used_bytes=int(block or 0) * int(used or 0),
        file_free_bytes=int(block or 0) * int(free or 0),
        wal_bytes=wal_bytes,
    )
