"""What the sidecar's writer raises and how it tells the database's errors from the records'.

:class:`QueueFull` and :class:`WriterStopped` turn into 503 with ``Retry-After``;
:class:`RecordsRefused` into spans rejected in ``partial_success`` (a retry cannot help). An
error of the database or its storage (:func:`systemic`) fails a whole batch for a retry;
any other error is the records', and their batch is committed again without them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import duckdb

from slokit.store.faults import storage_fault

__all__ = ["QueueFull", "RecordsRefused", "WriterStopped", "describe", "first_error", "systemic"]


class QueueFull(Exception):
    """The write queue is at its bound; retry after ``retry_after_s``."""

    def __init__(self, retry_after_s: int) -> None:
        super().__init__(f"write queue full; retry after {retry_after_s} s")
        self.retry_after_s = retry_after_s


class WriterStopped(Exception):
    """The writer is not running (stopping, or never started)."""


class RecordsRefused(Exception):
    """The store refused these records even on their own: retrying them cannot help.

    ``__cause__`` is the database's first error; the other items of the batch were committed.
    """


#: Errors of the database itself, not of the records: every item would fail alike. (A first
#: error that is itself "transaction is aborted" predates these records.)
_SYSTEMIC = (
    duckdb.TransactionException,
    duckdb.IOException,
    duckdb.ConnectionException,
    duckdb.FatalException,
    duckdb.InternalException,
    duckdb.OutOfMemoryException,
    MemoryError,
    OSError,
)


def systemic(first: BaseException) -> bool:
    """An error of the database or its storage (a damaged block, a full disk: the store's own
    :func:`~slokit.store.faults.storage_fault` says which), not of the records."""
    return isinstance(first, _SYSTEMIC) or storage_fault(first) is not None


def first_error(exc: BaseException) -> BaseException:
    """The error that started ``exc``'s chain (its deepest cause or context).

    DuckDB answers every statement after a failed one in a transaction with "Current
    transaction is aborted"; the error that aborted it is further down the chain.
    """
    seen = {id(exc)}
    while True:
        nxt = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
        if nxt is None or id(nxt) in seen:
            return exc
        seen.add(id(nxt))
        exc = nxt


def describe(kind: str, records: Sequence[Any], limit: int = 3) -> str:
    """A few ids of ``records`` for the log: which export (or scrape) this was."""
    ids = []
    for r in records[:limit]:
        rid = (
            getattr(r, "fragment_id", None)
            or getattr(r, "replica", None)
            or getattr(r, "router", None)
            or type(r).__name__
        )
        ids.append(str(rid)[:80])
    more = f" (+{len(records) - limit} more)" if len(records) > limit else ""
    return f"{len(records)} {kind} records: {', '.join(ids)}{more}"
