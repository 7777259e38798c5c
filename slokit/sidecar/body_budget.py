"""The bytes of OTLP export bodies the receivers hold at once, bounded.

Each connection may send a body up to ``max_body_bytes`` (20 MiB), and 256 connections may be
open on each OTLP listener: without a bound across them, one client opening many connections
could make the sidecar hold gigabytes (16 bodies of 60 MB at once took its RSS to 759-861 MB).
A receiver asks :meth:`ByteBudget.hold` for a body's bytes before it reads the body (OTLP/HTTP:
its ``Content-Length``), and gives them back once it has answered. A body that finds no room
waits, its bytes left in the socket, up to ``wait_s``; then it is answered 503 (UNAVAILABLE)
with Retry-After, like any overload. A body larger than the whole budget takes all of it,
alone.

A hold grows (:meth:`Held.grow`): an OTLP/HTTP body without a ``Content-Length`` is held chunk
by chunk as it is read, and a compressed one at what it inflates to, counted before it is
inflated (before, a 454 KiB gzip body that inflates to 59 MiB held 454 KiB, and eight such
bodies at once took the sidecar to 2.4 GB). An OTLP/gRPC message, whose size is not known
until gRPC has read it, is held at the largest it may be before it is read, then at its size
(:meth:`Held.resize`). ``benchmarks/body_budget.py`` measures each.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator

from slokit.sidecar.otlp_ingest import Overloaded

#: How long a body waits for room before it is refused.
WAIT_S = 5.0


class Held:
    """One body's hold on the budget: :meth:`grow` adds to it (a compressed body as it
    inflates, a body without ``Content-Length`` as it is read); everything held is given back
    when the ``async with`` block ends, and a hold given back grows no more."""

    def __init__(self, budget: ByteBudget) -> None:
        self._budget = budget
        self.nbytes = 0
        self.closed = False

    async def grow(self, nbytes: int) -> None:
        """Hold ``nbytes`` more (one body never holds more than the whole budget); raises
        :class:`Overloaded` when they do not fit within the budget's ``wait_s``, or when the
        hold was given back meanwhile."""
        await self._budget._take(self, nbytes)

    async def resize(self, nbytes: int) -> None:
        """Hold ``nbytes`` in all: what was held for a body not yet read (its largest size)
        becomes what it turned out to be. Growing waits as :meth:`grow` does."""
        if nbytes > self.nbytes:
            await self.grow(nbytes - self.nbytes)
        else:
            await self._budget._keep(self, max(0, nbytes))


class ByteBudget:
    def __init__(self, limit_bytes: int, *, wait_s: float = WAIT_S) -> None:
        if limit_bytes < 1:
            raise ValueError(f"a byte budget must be >= 1, got {limit_bytes}")
        self.limit = limit_bytes
        self.wait_s = wait_s
        self.used = 0  # the bytes held now (slokit_otlp_body_bytes_held reads it)
        self._room = asyncio.Condition()

    @contextlib.asynccontextmanager
    async def hold(self, nbytes: int) -> AsyncIterator[Held]:
        """Hold ``nbytes`` (at most the whole budget) for the ``async with`` block; raises
        :class:`Overloaded` when they do not fit within ``wait_s``. The block gets the
        :class:`Held`, to grow."""
        held = Held(self)
        try:
            await held.grow(nbytes)
            yield held
        finally:
            held.closed = True
            await self._keep(held, 0)

    async def _keep(self, held: Held, nbytes: int) -> None:
        """Give back what ``held`` holds past ``nbytes``."""
        async with self._room:
            self.used -= held.nbytes - nbytes
            held.nbytes = nbytes
            self._room.notify_all()

    async def _take(self, held: Held, nbytes: int) -> None:
        """Add ``nbytes`` to ``held`` once they fit, capped so that one body holds at most
        the whole budget. The count and the hold change together, under the lock."""
        async with self._room:
            n = max(0, min(nbytes, self.limit - held.nbytes))
            if held.closed:
                raise Overloaded(1, "the body's hold was given back")
            if n == 0:
                return
            try:
                async with asyncio.timeout(self.wait_s):
                    await self._room.wait_for(lambda: held.closed or self.used + n <= self.limit)
            except TimeoutError:
                retry = max(1, math.ceil(self.wait_s))
                raise Overloaded(retry, f"{self.used} bytes of export bodies held, "
                                        f"{n} more do not fit the {self.limit}-byte budget"
                                 ) from None  # fmt: skip
            if held.closed:
                raise Overloaded(1, "the body's hold was given back")
            self.used += n
            held.nbytes += n
