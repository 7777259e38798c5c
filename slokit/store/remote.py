"""A :class:`~slokit.store.reader.Reader` over a running sidecar's HTTP API.

``slokit slo report``, ``slokit report`` and ``slokit gate`` read a sidecar's records this
way (``--sidecar URL``, or a DuckDB file a sidecar holds): what they ask is served by the
sidecar's read-only data endpoints (``/api/bounds``, ``/api/requests`` a page at a time,
``/api/energy``, ``/api/engine_series``, ``/api/findings``, ``/api/cache_config``,
``/api/request``, ``/api/slowest_request``; docs/sidecar.md). Diagnose and explain need the
engine frames and per-request context, which stay in the sidecar: the sidecar runs them
itself (``slokit diagnose --sidecar``, ``slokit explain --sidecar``), and asking this reader
for them is a :class:`~slokit.errors.BadInput` saying so.

Errors are :class:`slokit.client.SidecarClient`'s: 404 NotFound, other 4xx BadInput (a missing
or wrong token included), anything else a SlokitError naming the sidecar.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal

from slokit.client import SidecarClient
from slokit.errors import BadInput, SlokitError
from slokit.store.queries import PageKey

if TYPE_CHECKING:  # the frames are pandas'; this reader never builds one
    import httpx
    import pandas as pd

__all__ = ["SidecarReader"]

#: Records asked per ``/api/requests`` page (the sidecar allows up to 10,000).
PAGE_RECORDS = 1000

EngineSeries = dict[str, list[tuple[float, float | None, float | None]]]


def _param(ts: float | None) -> str | None:
    """A bound as the API reads it: Unix seconds, written so they parse back exactly."""
    return None if ts is None else repr(float(ts))


def _window(since: float | None, until: float | None) -> dict[str, str]:
    return {k: v for k, v in (("since", _param(since)), ("until", _param(until))) if v}


def encode_page_key(key: PageKey) -> str:
    """The ``next``/``after`` cursor of ``/api/requests``: opaque to clients."""
    return base64.urlsafe_b64encode(json.dumps(list(key)).encode()).decode().rstrip("=")


def decode_page_key(text: str) -> PageKey:
    """A cursor :func:`encode_page_key` made; BadInput on anything else."""
    bad = BadInput("after: not a cursor this API gave (pass the page before's next)")
    try:
        doc = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    except (ValueError, binascii.Error, RecursionError):
        raise bad from None
    if not (isinstance(doc, list) and len(doc) == 2 and isinstance(doc[1], str)):
        raise bad
    try:
        doc[1].encode("utf-8")  # JSON's escapes can spell a lone surrogate: no id has one
    except UnicodeEncodeError:
        raise bad from None
    at = doc[0]
    if at is not None and (isinstance(at, bool) or not isinstance(at, int) or
                           not -(2**63) <= at < 2**63):  # fmt: skip
        raise bad
    return at, doc[1]


class SidecarReader:
    """The data of the sidecar at ``url``; use it as a context manager (it holds an HTTP
    connection pool). ``page_size`` records are asked per page of a window."""

    basis: Literal["records", "histograms"] = "records"

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        timeout_s: float = 30.0,
        transport: httpx.BaseTransport | None = None,
        page_size: int = PAGE_RECORDS,
    ) -> None:
        self._client = SidecarClient(url, token=token, timeout_s=timeout_s, transport=transport)
        self.page_size = page_size

    @property
    def url(self) -> str:
        return self._client.url

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> SidecarReader:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _doc(self, path: str, params: Mapping[str, str] | None = None) -> dict[str, Any]:
        doc = self._client.get(path, dict(params or {}))
        if not isinstance(doc, dict):
            raise SlokitError(f"sidecar at {self.url} answered {path} with {type(doc).__name__}")
        return doc

    def _unserved(self, what: str) -> BadInput:
        return BadInput(
            f"the sidecar at {self.url} does not serve {what} over its API: it runs diagnose "
            f"and explain itself; use `slokit diagnose --sidecar {self.url}` or "
            f"`slokit explain ID --sidecar {self.url}`"
        )

    # -- served ----------------------------------------------------------------------------
    def bounds(self) -> tuple[float | None, float | None]:
        doc = self._doc("/api/bounds")
        return doc["oldest"], doc["newest"]

    def request(self, request_id: str) -> dict[str, Any] | None:
        record: dict[str, Any] | None = self._doc("/api/request", {"id": request_id})["record"]
        return record

    def requests(self, since: float | None, until: float | None) -> list[dict[str, Any]]:
        """Every record of the window, one page after another."""
        out: list[dict[str, Any]] = []
        params = {**_window(since, until), "limit": str(self.page_size)}
        after: str | None = None
        while True:
            doc = self._doc("/api/requests", {**params, **({"after": after} if after else {})})
            out.extend(doc["records"])
            nxt = doc["next"]
            if nxt is None:
                return out
            if nxt == after:
                raise SlokitError(f"sidecar at {self.url} gave the same page twice")
            after = nxt

    def requests_page(
        self, since: float | None, until: float | None, after: PageKey | None, limit: int
    ) -> tuple[list[dict[str, Any]], PageKey | None]:
        params = {**_window(since, until), "limit": str(limit)}
        if after is not None:
            params["after"] = encode_page_key(after)
        doc = self._doc("/api/requests", params)
        nxt = doc["next"]
        return doc["records"], (decode_page_key(nxt) if nxt is not None else None)

    def energy_increase(self, since: float | None, until: float | None) -> float | None:
        joules: float | None = self._doc("/api/energy", _window(since, until))["joules"]
        return joules

    def engine_series(self, since: float | None, until: float | None) -> EngineSeries:
        doc = self._doc("/api/engine_series", _window(since, until))["replicas"]
        return {
            replica: [(float(ts), running, waiting) for ts, running, waiting in rows]
            for replica, rows in doc.items()
        }

    def cache_config(self) -> dict[str, float] | None:
        config: dict[str, float] | None = self._doc("/api/cache_config")["cache_config"]
        return config

    def findings(
        self, since: float | None, until: float | None, limit: int = 200
    ) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self._doc(
            "/api/findings", {**_window(since, until), "limit": str(limit)}
        )["findings"]
        return found

    def slowest_request(self, *, source: str = "vllm") -> str | None:
        rid: str | None = self._doc("/api/slowest_request", {"source": source})["request_id"]
        return rid

    # -- run on the sidecar (diagnose, explain) ----------------------------------------------
    def peer_count(self, since: float, until: float, slo_class: str | None) -> int:
        raise self._unserved("peer counts")

    def percentile_ranks(
        self,
        values: Mapping[str, float | None],
        since: float,
        until: float,
        slo_class: str | None,
        model: str | None = None,
    ) -> dict[str, Any]:
        raise self._unserved("percentile ranks")

    def request_summary(self, replica: str | None, since: float, until: float) -> dict[str, Any]:
        raise self._unserved("request summaries")

    def request_summaries(self, since: float, until: float) -> dict[str, dict[str, Any]]:
        raise self._unserved("request summaries")

    def request_buckets(self, origin: float, until: float, bucket_s: float) -> pd.DataFrame:
        raise self._unserved("request frames")

    def finished_buckets(self, origin: float, until: float, bucket_s: float) -> pd.DataFrame:
        raise self._unserved("request frames")

    def engine_buckets(
        self, origin: float, until: float, bucket_s: float, lookback_s: float
    ) -> pd.DataFrame:
        raise self._unserved("engine frames")

    def gpu_buckets(
        self, origin: float, until: float, bucket_s: float, busy_util: float
    ) -> pd.DataFrame:
        raise self._unserved("GPU frames")

    def engine_window(self, replica: str, since: float, until: float) -> list[dict[str, Any]]:
        raise self._unserved("engine samples")

    def has_engine_samples(self, replica: str) -> bool:
        raise self._unserved("engine samples")

    def engine_counter_increase(
        self, column: str, replica: str, since: float, until: float
    ) -> dict[str, Any]:
        raise self._unserved("engine counters")

    def gpu_state_at(self, replica: str, ts: float, *, max_age_s: float) -> dict[str, Any] | None:
        raise self._unserved("GPU samples")

    def last_seen(self, source: str, before: float) -> float | None:
        raise self._unserved("telemetry gaps")

    def sample_gaps(
        self, source: str, since: float, until: float, *, stale_factor: float, min_gap_s: float
    ) -> list[tuple[str, float, float, float | None]]:
        raise self._unserved("telemetry gaps")

    def failed_scrapes(self, since: float, until: float) -> list[dict[str, Any]]:
        raise self._unserved("telemetry gaps")

    def findings_overlapping(
        self, replica: str | None, since: float, until: float
    ) -> list[dict[str, Any]]:
        raise self._unserved("findings per replica")
