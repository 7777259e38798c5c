"""Run a :class:`~slokit.lab.sim.server.SimCluster` on its own event loop thread.

For tests, benchmarks and the demo: ``with running_cluster(settings) as sim: ...`` gives
the started cluster (ephemeral ports unless given) and stops it on exit."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from slokit.lab.sim.server import SimCluster, SimSettings

T = TypeVar("T")


@dataclass
class BackgroundSim:
    cluster: SimCluster
    loop: asyncio.AbstractEventLoop

    @property
    def url(self) -> str:
        return self.cluster.urls()[0]

    @property
    def dcgm_url(self) -> str:
        return self.cluster.dcgm_urls()[0]

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        """Run a coroutine on the simulator's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)


@contextmanager
def running_cluster(
    settings: SimSettings,
    replicas: int = 1,
    port: int = 0,
    dcgm_port: int | None = 0,
    exporter_factory: Callable[[], Any] | None = None,
) -> Iterator[BackgroundSim]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="slokit-sim", daemon=True)
    thread.start()

    async def build() -> SimCluster:  # aiohttp objects must be created on their loop
        c = SimCluster(settings, replicas, port, dcgm_port, exporter_factory=exporter_factory)
        await c.start()
        return c

    try:
        cluster = asyncio.run_coroutine_threadsafe(build(), loop).result(30)
        try:
            yield BackgroundSim(cluster, loop)
        finally:
            asyncio.run_coroutine_threadsafe(cluster.stop(), loop).result(30)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
