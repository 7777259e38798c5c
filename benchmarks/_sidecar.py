"""What the benchmarks that run a sidecar process share: a free port, a scrape target served
from a thread, starting it and waiting until it is ready or its writer has drained, and
reading its CPU time and RSS from /proc."""

from __future__ import annotations

import asyncio
import os
import re
import socket
import subprocess
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

TICK_S = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve_in_thread(routes: dict[str, Callable[[Any], Awaitable[Any]]]) -> int:
    """Serve aiohttp GET ``routes`` (path -> handler) on 127.0.0.1 from an event loop in a
    daemon thread (a scrape target the sidecar process reads); returns the port."""
    from aiohttp import web

    port = free_port()
    loop = asyncio.new_event_loop()

    async def start() -> None:
        app = web.Application()
        for path, handler in routes.items():
            app.router.add_get(path, handler)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()

    threading.Thread(target=loop.run_forever, daemon=True).start()
    asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    return port


def proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK_S  # utime + stime


def proc_threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def proc_rss_mb(pid: int) -> float:
    return proc_rss_parts_mb(pid).get("VmRSS", float("nan"))


def proc_rss_parts_mb(pid: int) -> dict[str, float]:
    """``VmRSS`` and its parts: ``RssAnon`` (the process's own memory: heaps, DuckDB's
    buffers) and ``RssFile`` (pages of mapped files, mostly shared libraries: clean, shared
    with the page cache, and dropped by the kernel under memory pressure)."""
    parts: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile"):
            parts[key] = int(value.split()[0]) / 1024
    return parts


def wait_ready(base: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 60) -> None:
    """Poll ``base``/readyz until it answers 200; exit with the log's path if it never does."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(f"{base}/readyz").status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"sidecar did not start; see {log}")
        time.sleep(0.2)


def wait_drained(base: str, timeout_s: float = 60) -> None:
    """Poll ``base``/metrics until the writer has nothing waiting (``slokit_write_queue_depth``
    0), or give up after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = httpx.get(f"{base}/metrics").text
        m = re.search(r"^slokit_write_queue_depth ([0-9.e+]+)$", text, re.M)
        if m and float(m.group(1)) == 0:
            return
        time.sleep(0.2)
