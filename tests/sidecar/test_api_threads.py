"""The API's reads run on threads of their own (``api_threads``), apart from the event loop's
default executor, which decodes large exports and parses scrapes: a flood of API readers cannot
take the threads that ingest waits on."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from slokit.errors import BadInput
from slokit.sidecar.api import Api
from slokit.sidecar.config import SidecarConfig
from slokit.sidecar.metrics import SidecarMetrics
from slokit.sidecar.writer import Writer
from slokit.store.db import Store, open_store

#: Guards against a hang only (a read that never comes back); not a performance bound.
HANG_S = 60.0


@pytest.fixture
def parts(tmp_path: Path) -> Iterator[tuple[Store, Writer]]:
    store = open_store(tmp_path / "api.duckdb")
    writer = Writer(store, metrics=SidecarMetrics(CollectorRegistry()))
    writer.start()
    yield store, writer
    writer.stop()
    store.close()


def _reader_threads(store: Store, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the threads that open the store's cursors from now on."""
    names: list[str] = []
    cursor = store.cursor

    def named_cursor() -> Any:
        names.append(threading.current_thread().name)
        return cursor()

    monkeypatch.setattr(store, "cursor", named_cursor)
    return names


async def _get(api: Api, path: str) -> int:
    async with TestClient(TestServer(api.app())) as client:
        resp = await client.get(path)
        return resp.status


def _threads_that_read(
    parts: tuple[Store, Writer], monkeypatch: pytest.MonkeyPatch, threads: int
) -> list[str]:
    """The names of the threads that opened cursors for one API read, with ``threads``."""
    store, writer = parts
    names = _reader_threads(store, monkeypatch)
    api = Api(store, writer, writer.metrics, threads=threads)

    async def run() -> int:
        try:
            return await _get(api, "/api/bounds")
        finally:
            await api.close()

    assert asyncio.run(run()) == 200
    assert names, "the read opened no cursor"
    return names


def test_api_reads_run_on_the_apis_own_threads(
    parts: tuple[Store, Writer], monkeypatch: pytest.MonkeyPatch
) -> None:
    names = _threads_that_read(parts, monkeypatch, threads=2)
    assert all(n.startswith("slokit-api") for n in names), names


def test_api_threads_0_reads_on_the_default_executor(
    parts: tuple[Store, Writer], monkeypatch: pytest.MonkeyPatch
) -> None:
    names = _threads_that_read(parts, monkeypatch, threads=0)
    assert not any(n.startswith("slokit-api") for n in names), names


def test_an_api_read_is_answered_while_the_default_executor_is_taken(
    parts: tuple[Store, Writer],
) -> None:
    store, writer = parts
    api = Api(store, writer, writer.metrics, threads=2)
    taken, release = threading.Event(), threading.Event()

    def occupy() -> None:
        taken.set()
        release.wait(HANG_S)

    async def run() -> tuple[int, bool]:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(concurrent.futures.ThreadPoolExecutor(1))
        blocker = loop.run_in_executor(None, occupy)
        while not taken.is_set():  # the executor's one thread is held from now on
            await asyncio.sleep(0.01)
        try:
            status = await asyncio.wait_for(_get(api, "/api/bounds"), HANG_S)
            return status, release.is_set()
        finally:
            release.set()
            await blocker
            await api.close()

    loop_taken_status = asyncio.run(run())
    assert loop_taken_status == (200, False)  # answered while the default executor was held


def test_api_threads_default_to_two() -> None:
    assert SidecarConfig().api_threads == 2


@pytest.mark.parametrize("value", [-1, 65])
def test_api_threads_out_of_range_are_refused(value: int) -> None:
    with pytest.raises(BadInput, match="api_threads"):
        SidecarConfig(api_threads=value).validate()
