"""The clock a load run takes: wall time, and a way to wait until a given instant.

The virtual-time harness (:class:`slokit.lab.sim.vtime.LoopClock`) implements the same
interface to run the generator without waiting.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    """Wall time in Unix epoch seconds, and a way to wait until a given instant."""

    def now(self) -> float: ...

    async def sleep_until(self, ts: float) -> None: ...


class SystemClock:
    """Epoch time read from the monotonic high-resolution counter, anchored once.

    Steps of the system clock during a run do not distort measured durations.
    """

    def __init__(self) -> None:
        self._epoch0 = time.time()
        self._perf0 = time.perf_counter()

    def now(self) -> float:
        return self._epoch0 + (time.perf_counter() - self._perf0)

    async def sleep_until(self, ts: float) -> None:
        delay = ts - self.now()
        if delay > 0:
            await asyncio.sleep(delay)
