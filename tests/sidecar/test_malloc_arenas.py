"""glibc's malloc arenas in a sidecar: two (the main heap and one shared), not one per thread.

glibc gives each thread that allocates an arena of its own, up to eight per core, and an arena
keeps the pages it grew to. The arenas are counted from ``/proc/PID/maps``: each beyond the main
heap is a 64 MiB reservation aligned on 64 MiB, its used part read-write and the rest ``---p``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from sidecar_harness import sidecar_process

from slokit._malloc import SIDECAR_ARENAS, cap_malloc_arenas

HEAP_MAX = 64 << 20  # glibc's HEAP_MAX_SIZE on 64-bit

#: Eight threads that allocate at once (bytearrays above pymalloc's 512 bytes come from malloc).
THREADS = """
import sys, threading
from slokit._malloc import cap_malloc_arenas
if sys.argv[1] == "cap":
    cap_malloc_arenas(2)
start, keep = threading.Barrier(8), []
def work():
    start.wait()
    for _ in range(500):
        keep.append(bytearray(8192))
threads = [threading.Thread(target=work) for _ in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print("done", flush=True)
sys.stdin.read()  # held until the test has read its maps
"""


def glibc_arenas_beyond_main(pid: int) -> int:
    rows = []
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        m = re.match(r"([0-9a-f]+)-([0-9a-f]+) (\S{4}) \S+ \S+ \d+\s*(.*)", line)
        assert m, line
        rows.append((int(m[1], 16), int(m[2], 16), m[3], m[4].strip()))
    count = 0
    for i, (start, end, perm, path) in enumerate(rows):
        if path or start % HEAP_MAX or not perm.startswith("rw"):
            continue
        nxt = rows[i + 1] if i + 1 < len(rows) else None
        if nxt and nxt[0] == end and nxt[2] == "---p" and not nxt[3]:
            end = nxt[1]
        count += end - start == HEAP_MAX
    return count


def _arenas_after_eight_threads(mode: str) -> int:
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    proc = subprocess.Popen([sys.executable, "-c", THREADS, mode], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, env=env, text=True)  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "done"
        return glibc_arenas_beyond_main(proc.pid)
    finally:
        proc.communicate("")


def test_eight_allocating_threads_share_one_arena_beside_the_main_heap() -> None:
    assert _arenas_after_eight_threads("cap") <= SIDECAR_ARENAS - 1


def test_without_the_cap_each_allocating_thread_grows_an_arena() -> None:
    # the control: what the count reads when glibc makes an arena per thread
    assert _arenas_after_eight_threads("none") >= 4


def test_malloc_arena_max_in_the_environment_wins() -> None:
    assert cap_malloc_arenas(2, {"MALLOC_ARENA_MAX": "8"}) is False


def test_a_cap_below_one_is_not_set() -> None:
    assert cap_malloc_arenas(0, {}) is False


def _sidecar_arenas(tmp_path: Path, export_body: bytes, **env: str) -> int:
    """A real sidecar (gRPC receiver on, findings every 0.5 s) after five exports."""
    log = tmp_path / "sidecar.log"
    full_env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    full_env.update(PYTHONUNBUFFERED="1", SLOKIT_DIAGNOSE_INTERVAL_S="0.5", **env)
    args = ["--db", str(tmp_path / "s.duckdb"), "--listen", "127.0.0.1:0",
            "--otlp-http", "127.0.0.1:0", "--otlp-grpc", "127.0.0.1:0"]  # fmt: skip
    with sidecar_process(args, log, full_env) as (popen, ports):
        for _ in range(5):
            r = httpx.post(f"http://127.0.0.1:{ports['otlp_http']}/v1/traces",
                           content=export_body, timeout=60,
                           headers={"Content-Type": "application/x-protobuf"})  # fmt: skip
            assert r.status_code == 200, r.text
        url = f"http://127.0.0.1:{ports['api']}/api/diagnose"  # an API read in a worker thread
        assert httpx.get(url, timeout=120).status_code == 200
        time.sleep(1.0)  # a findings tick or two in their thread
        assert popen.poll() is None, log.read_text()[-3000:]
        return glibc_arenas_beyond_main(popen.pid)


@pytest.mark.slow
def test_a_running_sidecar_keeps_one_arena_beside_the_main_heap(
    tmp_path: Path, export_body: bytes
) -> None:
    arenas = _sidecar_arenas(tmp_path, export_body)
    assert arenas <= SIDECAR_ARENAS - 1, f"{arenas} arenas beside the main heap"


@pytest.mark.slow
def test_a_sidecar_told_otherwise_by_malloc_arena_max_grows_more(
    tmp_path: Path, export_body: bytes
) -> None:
    arenas = _sidecar_arenas(tmp_path, export_body, MALLOC_ARENA_MAX="16")
    assert arenas >= 2, f"{arenas} arenas beside the main heap"
