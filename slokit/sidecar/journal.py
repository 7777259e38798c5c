"""The ingest journal: an append-only file of the fragment batches acknowledged but not yet
committed to DuckDB.

With ``commit_interval_s`` set, the writer answers an OTLP export as soon as its fragments
are appended here and the file is synced (``fdatasync``), and commits the journal's content
to DuckDB about once per interval, in one transaction, instead of one transaction per export.
After that commit the journal is emptied. After a crash, :meth:`Journal.replay` gives back
every batch that was synced; storing them again is a no-op for those DuckDB already holds
(fragments are stored once per ``fragment_id``), so a crash between DuckDB's commit and the
journal's reset loses and doubles nothing.

A frame is ``MAGIC``, the payload's length and its CRC-32 (little-endian u32 each), then an
Arrow IPC stream of the batch's fragments table. Replay stops at the first frame that is
incomplete or whose checksum does not match: a write the crash cut short was never synced,
so never acknowledged. The bytes after it are kept in a ``.torn-<time>`` file beside the
journal rather than thrown away.

Batches the store refuses even on their own (after they were acknowledged) are appended to
``<journal>.refused`` in the same format, so nothing acknowledged is deleted.
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
import time
import zlib
from pathlib import Path

import pyarrow as pa

__all__ = ["MAGIC", "Journal", "JournalError", "read_frames"]

log = logging.getLogger("slokit.sidecar.journal")

MAGIC = b"SKJ1"
_HEADER = struct.Struct("<4sII")


class JournalError(Exception):
    """The journal cannot be written (its storage) or a frame cannot be decoded."""


def _encode(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    payload = sink.getvalue().to_pybytes()
    return _HEADER.pack(MAGIC, len(payload), zlib.crc32(payload)) + payload


def read_frames(data: bytes) -> tuple[list[pa.Table], int]:
    """The tables of the whole frames at the start of ``data``, and the offset where the
    first incomplete or damaged frame begins (``len(data)`` when there is none)."""
    tables: list[pa.Table] = []
    pos = 0
    while pos < len(data):
        if len(data) - pos < _HEADER.size:
            break
        magic, size, crc = _HEADER.unpack_from(data, pos)
        start = pos + _HEADER.size
        payload = data[start : start + size]
        if magic != MAGIC or len(payload) < size or zlib.crc32(payload) != crc:
            break
        try:
            tables.append(pa.ipc.open_stream(payload).read_all())
        except pa.ArrowInvalid:
            break
        pos = start + size
    return tables, pos


class Journal:
    """An append-only journal file at ``path`` (created with its directory)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        self._size = os.fstat(self._fd).st_size

    @property
    def size(self) -> int:
        """Bytes in the journal."""
        return self._size

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def replay(self) -> list[pa.Table]:
        """The batches in the journal (from a run that ended before committing them). A torn
        or damaged tail is moved to a ``.torn-<unix time>`` file beside the journal."""
        data = self.path.read_bytes()
        tables, good = read_frames(data)
        if good < len(data):
            torn = self.path.with_name(f"{self.path.name}.torn-{int(time.time())}")
            torn.write_bytes(data[good:])
            log.error("journal %s: %d bytes after the last whole frame (offset %d) moved to %s",
                      self.path, len(data) - good, good, torn)  # fmt: skip
            os.ftruncate(self._fd, good)
            os.fsync(self._fd)
            self._size = good
        return tables

    def append(self, tables: list[pa.Table]) -> None:
        """Append ``tables`` as frames and sync the file: once this returns they survive a
        crash. On an error the journal is cut back to where it was (JournalError)."""
        blob = b"".join(_encode(t) for t in tables)
        before = self._size
        try:
            written = 0
            while written < len(blob):
                written += os.write(self._fd, blob[written:])
            os.fdatasync(self._fd)
        except OSError as exc:
            with contextlib.suppress(OSError):  # replay drops a torn tail anyway
                os.ftruncate(self._fd, before)
            raise JournalError(f"journal {self.path}: {exc.strerror or exc}") from exc
        self._size = before + len(blob)

    def reset(self) -> None:
        """Empty the journal: everything in it is committed to the store."""
        os.ftruncate(self._fd, 0)
        os.fdatasync(self._fd)
        self._size = 0

    def quarantine(self, tables: list[pa.Table]) -> Path:
        """Keep ``tables`` (refused by the store) in ``<journal>.refused``; its path."""
        path = self.path.with_name(self.path.name + ".refused")
        with open(path, "ab") as f:
            for t in tables:
                f.write(_encode(t))
            f.flush()
            os.fsync(f.fileno())
        return path
