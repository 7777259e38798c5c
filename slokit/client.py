"""A small client for a running sidecar's HTTP API (used when the DuckDB file is locked).

:meth:`SidecarClient.get` is the one place an answer becomes JSON or an error: 404
:class:`~slokit.errors.NotFound`, any other 4xx :class:`~slokit.errors.BadInput` (401: the
token is missing or wrong), anything else a :class:`~slokit.errors.SlokitError` naming the
sidecar. :class:`slokit.store.remote.SidecarReader` reads through it too.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

import httpx

from slokit.errors import BadInput, NotFound, SlokitError


def _message(resp: httpx.Response) -> str:
    """The API's ``{"error": ...}`` text, else the body as sent (first 200 characters)."""
    try:
        doc = resp.json()
    except ValueError:
        doc = None
    if isinstance(doc, dict) and isinstance(doc.get("error"), str):
        return str(doc["error"])
    return resp.text[:200] or resp.reason_phrase


class SidecarClient:
    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        timeout_s: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"), headers=headers, timeout=timeout_s, transport=transport
        )

    @property
    def url(self) -> str:
        """The sidecar's base URL."""
        return str(self._http.base_url).rstrip("/")

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> SidecarClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def get(self, path: str, params: dict[str, Any] | None = None) -> Any:
        """GET ``path`` and return its JSON document; errors mapped as the module says."""
        try:
            resp = self._http.get(path, params=params)
        except httpx.HTTPError as exc:
            raise SlokitError(f"sidecar at {self.url} unreachable: {exc}") from None
        if resp.status_code == 404:
            raise NotFound(_message(resp) if resp.content else "not found")
        if resp.status_code in (401, 403):
            raise BadInput(
                f"sidecar at {self.url} refused the request ({resp.status_code}: "
                f"{_message(resp)}); give its token with --token or SLOKIT_TOKEN"
            )
        if 400 <= resp.status_code < 500:
            raise BadInput(_message(resp))
        if resp.status_code != 200:
            raise SlokitError(
                f"sidecar at {self.url} answered {resp.status_code}: {_message(resp)}"
            )
        try:
            return resp.json()
        except ValueError:
            raise SlokitError(f"sidecar at {self.url} answered {path} with non-JSON") from None

    def explain(self, request_id: str) -> dict[str, Any]:
        # the query form carries any id ("..", "a/b", "{x}") the way it was given
        doc: dict[str, Any] = self.get("/api/explain", {"id": request_id})
        return doc

    def diagnose(self, since: str | None = None, until: str | None = None) -> dict[str, Any]:
        params = {k: v for k, v in (("since", since), ("until", until)) if v}
        doc: dict[str, Any] = self.get("/api/diagnose", params)
        return doc
