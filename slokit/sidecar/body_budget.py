"""The bytes of OTLP export bodies the receivers hold at once, bounded.

Each connection may send a body up to ``max_body_bytes`` (64 MiB), and 256 connections may be
open on each OTLP listener: without a bound across them, one client opening many connections
could make the sidecar hold gigabytes (16 bodies of 60 MB at once took its RSS to 759-861 MB;
with the default budget of 64 MiB, 277 MB: ``benchmarks/body_budget.py``). A
receiver asks :meth:`ByteBudget.hold` for a body's bytes before it reads the body (OTLP/HTTP:
its ``Content-Length``, or ``max_body_bytes`` when the length is not given) or decodes it
(OTLP/gRPC, whose server has read it already), and gives them back once it has answered. A
body that finds no room waits, its bytes left in the socket, up to ``wait_s``; then it is
answered 503 (UNAVAILABLE) with Retry-After, like any overload. A body larger than the whole
budget takes all of it, alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator

from slokit.sidecar.otlp_ingest import Overloaded

#: How long a body waits for room before it is refused.
WAIT_S = 5.0


class ByteBudget:
    def __init__(self, limit_bytes: int, *, wait_s: float = WAIT_S) -> None:
        if limit_bytes < 1:
            raise ValueError(f"a byte budget must be >= 1, got {limit_bytes}")
        self.limit = limit_bytes
        self.wait_s = wait_s
        self.used = 0  # the bytes held now (slokit_otlp_body_bytes_held reads it)
        self._room = asyncio.Condition()

    @contextlib.asynccontextmanager
    async def hold(self, nbytes: int) -> AsyncIterator[None]:
        """Hold ``nbytes`` (at most the whole budget) for the ``async with`` block; raises
        :class:`Overloaded` when they do not fit within ``wait_s``."""
        n = max(0, min(nbytes, self.limit))
        async with self._room:
            try:
                async with asyncio.timeout(self.wait_s):
                    await self._room.wait_for(lambda: self.used + n <= self.limit)
            except TimeoutError:
                retry = max(1, math.ceil(self.wait_s))
                raise Overloaded(retry, f"{self.used} bytes of export bodies held, "
                                        f"{n} more do not fit the {self.limit}-byte budget"
                                 ) from None  # fmt: skip
            self.used += n
        try:
            yield
        finally:
            async with self._room:
                self.used -= n
                self._room.notify_all()
