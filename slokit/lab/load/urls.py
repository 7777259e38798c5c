"""Where requests go: the (chat) completions URL of a base URL, and model discovery."""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit, urlunsplit

import aiohttp

from slokit.errors import BadInput
from slokit.lab.load.config import Endpoint


def request_url(base: str, endpoint: Endpoint) -> str:
    """``http://h:8000`` (or ``.../v1``) -> the completions or chat completions URL; a URL
    that already names a ``.../completions`` path is used as given."""
    u = base.rstrip("/")
    if u.endswith("/completions"):
        return u
    if u.endswith("/v1"):
        u = u[: -len("/v1")]
    return u + ("/v1/completions" if endpoint == "completions" else "/v1/chat/completions")


def models_url(base: str) -> str:
    parts = urlsplit(base)
    path = parts.path.rstrip("/")
    cut = path.find("/v1")
    root = path[:cut] if cut >= 0 else path
    return urlunsplit(parts._replace(path=root + "/v1/models", query="", fragment=""))


async def discover_model(session: aiohttp.ClientSession, base: str) -> str:
    """The first model the server lists at ``/v1/models``."""
    url = models_url(base)
    try:
        async with asyncio.timeout(10.0), session.get(url) as resp:
            resp.raise_for_status()
            doc = await resp.json(content_type=None)
        return str(doc["data"][0]["id"])
    except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, IndexError, TypeError) as exc:
        raise BadInput(
            f"could not discover the model from {url} ({type(exc).__name__}); pass --model"
        ) from exc
