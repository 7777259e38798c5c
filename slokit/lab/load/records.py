"""The client record a load run writes: a new record per request, and the JSONL writer.

The fields (names, meaning, units) are defined in :mod:`slokit.clientlog`, which the
reader (``slokit ingest requests``) shares.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from slokit import clientlog as cl
from slokit.errors import BadInput


def new_record(
    *,
    request_id: str,
    trace_id: str,
    model: str,
    slo_class: str | None,
    task_id: str | None,
    tenant: str | None,
    send_ts: float,
    max_tokens: int,
    scheduled_ts: float | None,
) -> dict[str, Any]:
    """The record of a request just sent: every key of :data:`~slokit.clientlog.RECORD_KEYS`
    in order, what is known at the send filled in, the rest ``None`` (no gaps yet)."""
    rec: dict[str, Any] = dict.fromkeys(cl.RECORD_KEYS)
    rec[cl.REQUEST_ID] = request_id
    rec[cl.TRACE_ID] = trace_id
    rec[cl.MODEL] = model
    rec[cl.SLO_CLASS] = slo_class
    rec[cl.TASK_ID] = task_id
    rec[cl.TENANT] = tenant
    rec[cl.SEND_TS] = send_ts
    rec[cl.MAX_TOKENS] = max_tokens
    rec[cl.ITL_S] = []
    rec[cl.SCHEDULED_TS] = scheduled_ts
    return rec


class RecordWriter:
    """Appends client records as JSON lines, flushing every ``batch`` records or
    ``flush_interval_s`` seconds, so a crash loses at most one small batch."""

    def __init__(
        self,
        path: Path,
        *,
        batch: int = 64,
        flush_interval_s: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._fh: IO[str] = path.open("w", encoding="utf-8")
        except OSError as exc:
            raise BadInput(f"cannot write records to {path}: {exc.strerror or exc}") from exc
        self._buf: list[str] = []
        self._batch = batch
        self._interval = flush_interval_s
        self._clock = clock
        self._last_flush = clock()

    def write(self, record: dict[str, Any]) -> None:
        self._buf.append(cl.record_line(record))
        if len(self._buf) >= self._batch or self._clock() - self._last_flush >= self._interval:
            self.flush()

    def flush(self) -> None:
        if self._buf:
            self._fh.write("\n".join(self._buf) + "\n")
            self._buf.clear()
        self._fh.flush()
        self._last_flush = self._clock()

    def close(self) -> None:
        self.flush()
        self._fh.close()
