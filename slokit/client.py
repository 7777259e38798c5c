"""A small client for a running sidecar's HTTP API (used when the DuckDB file is locked)."""

from __future__ import annotations

from typing import Any

import httpx

from slokit.errors import BadInput, NotFound, SlokitError


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

    def _get(self, path: str, params: dict[str, Any] | None = None) -> Any:
        try:
            resp = self._http.get(path, params=params)
        except httpx.HTTPError as exc:
            raise SlokitError(f"sidecar at {self._http.base_url} unreachable: {exc}") from None
        if resp.status_code == 404:
            raise NotFound(resp.json().get("error", "not found") if resp.content else "not found")
        if resp.status_code in (400, 413, 414):
            raise BadInput(resp.text)
        if resp.status_code != 200:
            raise SlokitError(f"sidecar answered {resp.status_code}: {resp.text[:200]}")
        return resp.json()

    def explain(self, request_id: str) -> dict[str, Any]:
        # the query form carries any id ("..", "a/b", "{x}") the way it was given
        return self._get("/api/explain", {"id": request_id})

    def diagnose(self, since: str | None = None, until: str | None = None) -> dict[str, Any]:
        params = {k: v for k, v in (("since", since), ("until", until)) if v}
        return self._get("/api/diagnose", params)
