"""Virtual time: an asyncio event loop whose clock jumps instead of waiting.

:class:`VirtualTimeLoop` is a selector event loop whose ``time()`` is a counter. When the
loop would block until its next timer (every task is sleeping and no socket has data),
the counter jumps to that timer at once; I/O that is ready is handled first, without
advancing the counter. CPU time spent in callbacks costs no virtual time, so a run
takes as long as its CPU work, whatever the machine's load, and its timeline is the
one its sleeps describe: the engine's steps last what the roofline says, arrivals come
when the load schedule says, scrapes every ``scrape_interval_s``.

Everything on the loop runs on this clock: ``asyncio.sleep``, timeouts, aiohttp's
timers, and :class:`LoopClock` (the simulator's :class:`~slokit.lab.sim.clock.Clock`,
Unix seconds from a fixed epoch). Real sockets on 127.0.0.1 still work: loopback
delivers a write to the peer's socket before ``send`` returns, so the data is readable
in the same loop iteration and no virtual time passes in transit. Work handed to
threads (``run_in_executor``) is not on the virtual timeline: the loop may jump ahead
while it runs; the simulator does not use it on the request path.

:func:`run_virtual` runs a coroutine on a fresh virtual loop, like ``asyncio.run``.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

# A fixed epoch (2023-11-14T22:13:20Z, in the past: ingest rejects times ahead of the
# clock): the same scenario gives the same timestamps.
DEFAULT_EPOCH = 1_700_000_000.0


class _JumpingSelector(selectors.DefaultSelector):
    """Polls without blocking; when nothing is ready, advances the loop's clock by the
    timeout the loop would have waited (the time to its next timer)."""

    def __init__(self) -> None:
        super().__init__()
        self.loop: VirtualTimeLoop | None = None

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:  # no timer at all: only I/O or another thread can wake us
            return super().select(None)
        events = super().select(0)
        if not events and timeout > 0 and self.loop is not None:
            self.loop.advance(timeout)
        return events


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """A selector event loop on virtual time (see the module docstring)."""

    def __init__(self) -> None:
        selector = _JumpingSelector()
        super().__init__(selector)
        selector.loop = self
        self._virtual_now = 0.0

    def time(self) -> float:
        return self._virtual_now

    def advance(self, seconds: float) -> None:
        """Let ``seconds`` of virtual time pass (never backwards)."""
        if seconds > 0:
            self._virtual_now += seconds


class LoopClock:
    """The simulator's clock on the running event loop's time: Unix seconds from
    ``epoch`` at the loop time when it was made. On a :class:`VirtualTimeLoop` it is
    virtual time; ``sleep`` is ``asyncio.sleep``, so it takes no wall time there."""

    def __init__(self, epoch: float = DEFAULT_EPOCH, loop: asyncio.AbstractEventLoop | None = None):
        self._loop = loop or asyncio.get_running_loop()
        self._epoch = epoch
        self._t0 = self._loop.time()

    def now(self) -> float:
        return self._epoch + (self._loop.time() - self._t0)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))

    async def sleep_until(self, ts: float) -> None:
        """The load generator's clock interface (:class:`slokit.lab.load.Clock`)."""
        delay = ts - self.now()
        if delay > 0:
            await asyncio.sleep(delay)


def run_virtual(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` to completion on a fresh :class:`VirtualTimeLoop`."""
    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        return runner.run(main)
