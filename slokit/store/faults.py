"""Storage faults: a damaged DuckDB file or WAL, a full or failing volume.

Three checks, each cheap and each free of false alarms on a healthy file:

- :func:`truncation_reason`: a database file shorter than the blocks it says are in use (the
  block manager's own count, ``pragma_database_size``) was cut short; DuckDB would open it and
  fail later, on the first read or write that reaches a missing block. The deeper
  :func:`missing_blocks_reason` (the sidecar runs it at start) compares the highest block any
  table segment uses with the file size: about 0.2 s per GB of data.
- :func:`inspect_wal`: walks the framing of a DuckDB WAL (a header, then entries of
  ``[u64 size][u64 checksum][payload]``; a transaction ends with a ``WAL_FLUSH`` entry) and
  says how many bytes after the last complete commit DuckDB will drop on replay. DuckDB
  replays the complete transactions of a WAL with a torn tail, and ignores a WAL it does not
  recognise, both without a word: the sidecar logs and counts both (see runner.py).
- :func:`storage_fault`: tells a write that failed because the volume or file is broken (I/O
  error, disk full, file too large, read-only volume, an invalidated database) from an error
  of the data or the transaction; :func:`is_damage` tells a damaged file (which no later
  write mends) from a volume that is full or failing for now.
"""

from __future__ import annotations

import errno
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

#: DuckDB's file starts with three 4 KiB headers; blocks follow.
_HEADERS_BYTES = 3 * 4096

#: WAL entry types (DuckDB's WALType) that the walk needs.
_WAL_VERSION = 98
_WAL_FLUSH = 100

#: Phrases of DuckDB and OS errors that mean the storage, not the data, is at fault.
_STORAGE_PHRASES = (
    "no space left on device",
    "file too large",
    "disk quota exceeded",
    "input/output error",
    "read-only file system",
    "could not write file",
    "could not read enough bytes",
    "could not fsync",
    "could not truncate",
    "corrupt database file",
    "database has been invalidated",
    "checksum",
)
_STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EIO, errno.EFBIG, errno.EROFS, errno.EDQUOT})
#: Of those, the ones that say the file itself is damaged: no later write makes them go away.
_DAMAGE_PHRASES = (
    "corrupt database file",
    "checksum",
    "could not read enough bytes",
    "database has been invalidated",
)


class StorageFault(OSError):
    """A write failed because of the storage (disk full, I/O error), not the records: every
    write would fail alike until the volume is fixed, so retrying later can help, splitting
    the batch cannot."""


def storage_fault(exc: BaseException) -> str | None:
    """One line saying what is wrong with the storage when ``exc`` is a storage fault, else
    None (a constraint, a conflict, a bad value: the next batch may well succeed)."""
    if isinstance(exc, StorageFault):
        return str(exc)
    if isinstance(exc, OSError) and exc.errno in _STORAGE_ERRNOS:
        return f"{exc.strerror or exc} ({exc.filename})" if exc.filename else str(exc)
    text = str(exc)
    low = text.lower()
    name = type(exc).__name__
    if name in ("IOException", "FatalException") or any(p in low for p in _STORAGE_PHRASES):
        return text.splitlines()[0] if text else name
    return None


def is_damage(fault: str) -> bool:
    """True when a :func:`storage_fault` reason says the file is damaged (a corrupt or missing
    block, an invalidated database) rather than the volume full or failing for now."""
    low = fault.lower()
    return any(p in low for p in _DAMAGE_PHRASES)


def truncation_reason(con: Any, path: str) -> str | None:
    """Why the file at ``path`` is too short for the blocks ``con`` says are in use, or None.

    ``con`` is a DuckDB connection to that file. Blocks that are free may legitimately be cut
    from the end of the file, so only the used ones count."""
    try:
        size = os.path.getsize(path)
        row = con.execute(
            "SELECT block_size, used_blocks FROM pragma_database_size() "
            "WHERE database_name = current_database()"
        ).fetchone()
    except Exception:  # a missing pragma or file: no opinion, let the reads decide
        return None
    if not row or row[0] is None or row[1] is None:
        return None
    block_size, used = int(row[0]), int(row[1])
    need = _HEADERS_BYTES + used * block_size
    if size < need:
        return (
            f"the file is truncated: {used} blocks of {block_size} bytes are in use "
            f"({need} bytes) but the file has {size}"
        )
    return None


def missing_blocks_reason(con: Any, path: str) -> str | None:
    """Like :func:`truncation_reason`, from the highest block each table's segments use."""
    try:
        size = os.path.getsize(path)
        block_size = int(
            con.execute(
                "SELECT block_size FROM pragma_database_size() "
                "WHERE database_name = current_database()"
            ).fetchone()[0]
        )
        tables = [
            r[0]
            for r in con.execute(
                "SELECT table_name FROM duckdb_tables() "
                "WHERE database_name = current_database() AND NOT temporary"
            ).fetchall()
        ]
    except Exception:
        return None
    top = -1
    for t in tables:
        quoted = t.replace("'", "''")
        try:
            row = con.execute(
                f"SELECT max(block_id) FROM pragma_storage_info('{quoted}') WHERE persistent"
            ).fetchone()
        except Exception as exc:  # the table's metadata itself is unreadable
            fault = storage_fault(exc)
            if fault:
                return f"table {t} cannot be read: {fault}"
            continue
        if row and row[0] is not None:
            top = max(top, int(row[0]))
    need = _HEADERS_BYTES + (top + 1) * block_size
    if top >= 0 and size < need:
        return (
            f"the file is truncated: table data reaches block {top} ({need} bytes) "
            f"but the file has {size}"
        )
    return None


# -- the WAL ------------------------------------------------------------------------------


@dataclass(frozen=True)
class WalCheck:
    """What a WAL holds before DuckDB replays it.

    ``state``: ``clean`` (ends at a commit), ``torn_tail`` (bytes after the last complete
    commit, which DuckDB drops on replay), ``unreadable`` (not a WAL DuckDB recognises: it
    is ignored whole), ``unknown`` (a header this code cannot walk: no opinion)."""

    state: Literal["clean", "torn_tail", "unreadable", "unknown"]
    size: int
    committed: int  # bytes up to the end of the last complete commit
    commits: int

    @property
    def dropped(self) -> int:
        return self.size - self.committed


class _Truncated(ValueError):
    """The WAL stops inside its header."""


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if shift > 63:
            raise ValueError("overlong varint")
        if pos >= len(data):
            raise _Truncated("truncated varint")
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7


def _header_end(data: bytes) -> int:
    """End of the WAL's (unframed) version entry: ValueError if it is not one this code
    knows, _Truncated if it stops short."""
    pos = 0
    (field,) = struct.unpack_from("<H", data, pos)
    if field != 100:
        raise ValueError("no entry type")
    typ, pos = _varint(data, pos + 2)
    if typ != _WAL_VERSION:
        raise ValueError("not a version entry")
    while True:
        if pos + 2 > len(data):
            raise _Truncated("truncated header")
        (field,) = struct.unpack_from("<H", data, pos)
        pos += 2
        if field == 0xFFFF:
            return pos
        if field == 102:  # the database identifier: a list of bytes
            n, pos = _varint(data, pos)
            if n > 64:
                raise ValueError("implausible identifier")
            for _ in range(n):
                _, pos = _varint(data, pos)
        elif field in (101, 103):  # version, checkpoint iteration
            _, pos = _varint(data, pos)
        else:
            raise ValueError(f"unknown header field {field}")


def inspect_wal(path: str | Path) -> WalCheck | None:
    """Walk the WAL at ``path`` (None when there is none or it is empty)."""
    p = Path(path)
    try:
        size = p.stat().st_size
    except FileNotFoundError:
        return None
    if size == 0:
        return None
    with p.open("rb") as f:
        head = f.read(4096)
        if head[:3] != b"\x64\x00\x62":  # field 100 (entry type) = 98 (WAL_VERSION)
            return WalCheck("unreadable", size, 0, 0)
        try:
            pos = _header_end(head)
        except _Truncated:
            return WalCheck("torn_tail", size, 0, 0)
        except (ValueError, struct.error):
            return WalCheck("unknown", size, 0, 0)
        committed, commits = pos, 0
        while pos < size:
            f.seek(pos)
            frame = f.read(19)
            if len(frame) < 16:
                break  # a torn frame header
            length = struct.unpack_from("<Q", frame)[0]
            end = pos + 16 + length
            if length < 4 or end > size or frame[16:18] != b"\x64\x00":
                break  # a torn entry, or garbage where an entry should start
            f.seek(end - 2)
            if f.read(2) != b"\xff\xff":
                break
            try:
                f.seek(pos + 18)
                typ, _ = _varint(f.read(10), 0)
            except ValueError:
                break
            pos = end
            if typ == _WAL_FLUSH:
                committed, commits = pos, commits + 1
    return WalCheck("clean" if committed == size else "torn_tail", size, committed, commits)
