"""Run a :class:`~slokit.lab.sim.server.SimCluster` in a child process: a pod of its own.

Several simulated pods on one event loop share one core and one GIL with whatever else that
process runs (a load generator, a test); on a busy machine they fall behind together and
their physics bend. In child processes the OS schedules each pod as it would a real server.

    with cluster_process(settings, port=8000, dcgm_port=9400) as pid:
        ...  # the OpenAI API on 8000, DCGM on 9400
"""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from slokit.lab.sim.server import SimCluster, SimSettings

__all__ = ["cluster_process"]


def _serve(
    settings: SimSettings, replicas: int, port: int, dcgm_port: int | None, ready: Any, stop: Any
) -> None:
    async def main() -> None:
        cluster = SimCluster(settings, replicas, port=port, dcgm_port=dcgm_port)
        await cluster.start()
        ready.set()
        try:
            while not stop.is_set():
                await asyncio.sleep(0.1)
        finally:
            await cluster.stop()

    asyncio.run(main())


@contextmanager
def cluster_process(
    settings: SimSettings,
    *,
    port: int,
    dcgm_port: int | None = None,
    replicas: int = 1,
    start_timeout_s: float = 120.0,
) -> Iterator[int]:
    """Serve ``replicas`` simulated replicas (the OpenAI API from ``port``, DCGM from
    ``dcgm_port``) in a child process until the block ends; yields its pid once it serves."""
    ctx = multiprocessing.get_context("spawn")  # no copy of the parent's threads or loop
    ready, stop = ctx.Event(), ctx.Event()
    proc = ctx.Process(
        target=_serve, args=(settings, replicas, port, dcgm_port, ready, stop), daemon=True
    )
    proc.start()
    deadline = time.monotonic() + start_timeout_s
    try:
        while not ready.wait(0.2):
            if not proc.is_alive():
                raise RuntimeError(f"the simulator process exited with {proc.exitcode}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the simulator on port {port} did not start")
        assert proc.pid is not None
        yield proc.pid
    finally:
        stop.set()
        proc.join(30)
        if proc.is_alive():
            proc.kill()
            proc.join(5)
