"""The simulator's clocks: wall time at a speed, and fake time for tests (the event loop on
virtual time is :mod:`slokit.lab.sim.vtime`)."""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Simulated time, Unix seconds."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Let ``seconds`` of simulated time pass."""
        ...


class WallClock:
    """Simulated time that runs ``speed`` times as fast as wall time, from now."""

    def __init__(self, speed: float = 1.0):
        if speed <= 0:
            raise ValueError("speed must be positive")
        self.speed = speed
        self._epoch = time.time()
        self._mono = time.monotonic()

    def now(self) -> float:
        return self._epoch + (time.monotonic() - self._mono) * self.speed

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds) / self.speed)


class VirtualClock:
    """Fake time for tests: ``sleep`` advances the clock and yields once, never waits."""

    def __init__(self, start: float = 1_800_000_000.0):
        self.t = start

    def now(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.t += max(0.0, seconds)
        await asyncio.sleep(0)
