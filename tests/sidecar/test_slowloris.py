"""Slowloris: thousands of connections that never finish a request must not take the sidecar
down. The sidecar runs as a real process under the default 1,024 file descriptors; the test
holds 2,000 raw sockets against it (partial headers, and headers then a stalled body) while
it asks ``/healthz`` and sends a real OTLP export, then checks that what it left open is
closed by the header timeout and that the log stayed small. Then each defence alone (header,
body and idle timeouts, eviction and refusal at the cap, gRPC's limits) on an in-process
sidecar, and the log filter that keeps a flood of bad requests to a few lines.
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sidecar_harness import StartSidecar, post, relabel, request_ids, sidecar_process, wait_for

from slokit.sidecar.lograte import RateLimitFilter
from slokit.sidecar.otlp_grpc import METHOD

ATTACKERS = 2000
FD_LIMIT = 1024
HEADER_TIMEOUT_S = 2.0
#: Generous bound on one probe on a busy 2-core machine (the goal is 1 s; before the guard
#: the probe did not connect at all once descriptors ran out).
PROBE_BOUND_S = 5.0
PB = {"Content-Type": "application/x-protobuf"}


@dataclass
class Proc:
    popen: subprocess.Popen[bytes]
    log: Path
    ports: dict[str, int]

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.ports['api']}"


def _limit_fds() -> None:  # runs in the child between fork and exec
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))


@pytest.fixture
def sidecar_proc(tmp_path: Path) -> Iterator[Proc]:
    log = tmp_path / "sidecar.log"
    env = {**os.environ, "SLOKIT_HEADER_TIMEOUT_S": str(HEADER_TIMEOUT_S),
           "SLOKIT_BODY_TIMEOUT_S": str(HEADER_TIMEOUT_S), "PYTHONUNBUFFERED": "1"}  # fmt: skip
    args = ["--db", str(tmp_path / "s.duckdb"), "--listen", "127.0.0.1:0",
            "--otlp-http", "127.0.0.1:0", "--otlp-grpc", "", "--replica", "slow-pod"]  # fmt: skip
    with sidecar_process(args, log, env, preexec_fn=_limit_fds) as (popen, ports):
        yield Proc(popen, log, ports)


@pytest.fixture
def many_fds() -> Iterator[None]:
    """This process needs a descriptor per attacking socket."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = ATTACKERS + 512
    if soft != resource.RLIM_INFINITY and soft < want:
        if hard != resource.RLIM_INFINITY and hard < want:
            pytest.skip(f"needs {want} open files, the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _attack(port: int, kind: str) -> socket.socket | None:
    """One incomplete request: ``headers`` stops mid-headers, ``body`` mid-body."""
    s = socket.socket()
    s.settimeout(5)
    try:
        s.connect(("127.0.0.1", port))
        if kind == "headers":
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        else:
            s.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-"
                      b"protobuf\r\nContent-Length: 100000\r\n\r\n0123456789")  # fmt: skip
    except OSError:  # refused, or reset by an eviction before we wrote: also fine
        s.close()
        return None
    return s


def _closed_by_peer(s: socket.socket) -> bool:
    s.settimeout(0)
    try:
        while True:
            data = s.recv(4096)
            if not data:
                return True  # EOF (after a 408, or straight away)
    except BlockingIOError:
        return False
    except OSError:
        return True  # reset


def _probe(proc: Proc, timings: list[float]) -> None:
    t0 = time.monotonic()
    resp = httpx.get(f"{proc.api}/healthz", timeout=30)
    timings.append(time.monotonic() - t0)
    assert resp.status_code == 200


def _closed_counts(proc: Proc) -> dict[tuple[str, str], float]:
    text = httpx.get(f"{proc.api}/metrics", timeout=30).text
    return {(s.labels["listener"], s.labels["reason"]): s.value
            for f in text_string_to_metric_families(text) for s in f.samples
            if s.name == "slokit_http_connections_closed_total"}  # fmt: skip


def test_2000_incomplete_requests_leave_probes_and_exports_working(
    sidecar_proc: Proc, many_fds: None, export_body: bytes
) -> None:
    proc = sidecar_proc
    otlp = f"http://127.0.0.1:{proc.ports['otlp_http']}/v1/traces"
    targets = [(proc.ports["api"], "headers"), (proc.ports["otlp_http"], "headers"),
               (proc.ports["otlp_http"], "body"), (proc.ports["api"], "headers")]  # fmt: skip
    held: list[socket.socket] = []
    timings: list[float] = []
    exports = 0
    started = time.monotonic()
    try:
        for i in range(ATTACKERS):
            port, kind = targets[i % len(targets)]
            s = _attack(port, kind)
            if s is not None:
                held.append(s)
            if i % 250 == 249:
                _probe(proc, timings)
                resp = httpx.post(otlp, content=export_body, headers=PB, timeout=30)
                assert resp.status_code == 200, resp.text
                exports += 1
            assert time.monotonic() - started < 120, "the attack loop itself is too slow"
        attack_s = time.monotonic() - started
        _probe(proc, timings)
        assert max(timings) < PROBE_BOUND_S, timings
        assert exports == ATTACKERS // 250

        # What is still open is closed once its headers (or body) are overdue.
        open_after_attack = [s for s in held if not _closed_by_peer(s)]
        deadline = time.monotonic() + HEADER_TIMEOUT_S + 10
        still = open_after_attack
        while still and time.monotonic() < deadline:
            time.sleep(0.2)
            still = [s for s in still if not _closed_by_peer(s)]
        assert still == [], f"{len(still)} of {len(open_after_attack)} still open"
        closed = _closed_counts(proc)
        assert closed.get(("api", "header_timeout"), 0) > 0
        assert closed.get(("otlp_http", "body_timeout"), 0) + closed.get(
            ("otlp_http", "evicted"), 0) > 0  # fmt: skip
        _probe(proc, timings)
    finally:
        for s in held:
            s.close()
    assert proc.popen.poll() is None, "the sidecar died"
    size = proc.log.stat().st_size
    print(f"\nattack {attack_s:.1f} s; /healthz max {max(timings) * 1000:.0f} ms over "
          f"{len(timings)} probes; {len(open_after_attack)} left open after the attack; "
          f"log {size} bytes; closed {closed}")  # fmt: skip
    assert size < 1_000_000, proc.log.read_text()[-2000:]
    with contextlib.suppress(UnicodeDecodeError):
        assert "Traceback" not in proc.log.read_text()


def test_a_flood_of_malformed_requests_costs_a_few_log_lines(sidecar_proc: Proc) -> None:
    bad = (b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
           b"Transfer-Encoding: chunked\r\n\r\nZZZ\r\n")  # fmt: skip
    for _ in range(300):
        with socket.create_connection(("127.0.0.1", sidecar_proc.ports["otlp_http"]), 10) as s:
            s.sendall(bad)
            assert s.recv(64).split(b" ")[1] == b"400"
    assert httpx.get(f"{sidecar_proc.api}/healthz", timeout=30).status_code == 200
    text = sidecar_proc.log.read_text()
    lines = [ln for ln in text.splitlines() if "Invalid character in chunk size" in ln]
    assert 1 <= len(lines) <= 5, text[-2000:]
    assert "Traceback" not in text


# -- the same defences, one at a time, on an in-process sidecar ------------------------------


def _partial(port: int, data: bytes = b"GET /healthz HTTP/1.1\r\nHost: x\r\n") -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(data)
    return s


def _wait_closed(s: socket.socket, within_s: float) -> bytes:
    """What the server sent before closing ``s`` (fails if it is still open after a while)."""
    s.settimeout(within_s)
    got = b""
    try:
        while chunk := s.recv(4096):
            got += chunk
    except TimeoutError:
        raise AssertionError(f"still open after {within_s} s (got {got[:80]!r})") from None
    except ConnectionResetError:
        pass
    return got


def test_headers_that_do_not_arrive_in_time_get_408_and_the_connection_closed(
    start_sidecar: StartSidecar,
) -> None:
    sc = start_sidecar(header_timeout_s=1.0)
    t0 = time.monotonic()
    with _partial(sc.sidecar.ports["api"]) as s:
        answer = _wait_closed(s, within_s=10)
    assert time.monotonic() - t0 >= 1.0  # not before the timeout
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert sc.value("slokit_http_connections_closed_total", listener="api",
                    reason="header_timeout") == 1  # fmt: skip


def test_a_body_that_stalls_is_dropped_while_a_full_export_is_accepted(
    start_sidecar: StartSidecar, export_body: bytes
) -> None:
    sc = start_sidecar(body_timeout_s=1.0)
    stalled = _partial(sc.sidecar.ports["otlp_http"],
                       b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-"
                       b"protobuf\r\nContent-Length: 5000\r\n\r\n" + export_body[:100])  # fmt: skip
    with stalled:
        assert post(sc.otlp, export_body).status_code == 200
        _wait_closed(stalled, within_s=10)
    assert sc.value("slokit_http_connections_closed_total", listener="otlp_http",
                    reason="body_timeout") == 1  # fmt: skip
    assert len(request_ids(sc)) == 64  # the stalled half-export left nothing behind


def test_an_idle_keep_alive_connection_is_closed_after_the_idle_timeout(
    start_sidecar: StartSidecar,
) -> None:
    sc = start_sidecar(idle_timeout_s=1.0)
    with _partial(sc.sidecar.ports["api"], b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n") as s:
        answer = _wait_closed(s, within_s=10)
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert sc.value("slokit_http_connections_closed_total", listener="api",
                    reason="idle_timeout") == 1  # fmt: skip


def test_at_the_cap_a_probe_evicts_the_oldest_incomplete_request(
    start_sidecar: StartSidecar,
) -> None:
    sc = start_sidecar(api_max_connections=8)
    port = sc.sidecar.ports["api"]
    held = [_partial(port) for _ in range(8)]
    try:
        wait_for(lambda: len(sc.sidecar.guards["api"]) == 8, what="8 connections held")
        assert httpx.get(f"{sc.api}/healthz", timeout=10).status_code == 200
        _wait_closed(held[0], within_s=10)  # the oldest made room
        for s in held[1:]:
            assert not _closed_by_peer(s)
        assert sc.value("slokit_http_connections_closed_total", listener="api",
                        reason="evicted") == 1  # fmt: skip
    finally:
        for s in held:
            s.close()


def test_at_the_cap_with_every_request_being_answered_a_new_connection_is_refused(
    start_sidecar: StartSidecar, export_body: bytes
) -> None:
    release = threading.Event()
    sc = start_sidecar(otlp_max_connections=8, before_commit=lambda: release.wait(20))
    bodies = [relabel(export_body, f"cap{i}")[0] for i in range(8)]
    guard = sc.sidecar.guards["otlp_http"]
    try:
        with ThreadPoolExecutor(max_workers=8) as pool:
            pending = [pool.submit(post, sc.otlp, b) for b in bodies]
            wait_for(lambda: guard.phases()["request"] == 8, what="8 exports in their handlers")
            with pytest.raises(httpx.TransportError):
                httpx.post(sc.otlp, content=export_body, headers=PB, timeout=10)
            assert guard.closed == {"refused": 1}
            release.set()
            assert [f.result(30).status_code for f in pending] == [200] * 8
    finally:
        release.set()


def test_grpc_closes_silent_connections_and_those_over_its_cap(
    start_sidecar: StartSidecar, export_body: bytes
) -> None:
    sc = start_sidecar(header_timeout_s=1.0, otlp_max_connections=16)
    port = sc.sidecar.ports["otlp_grpc"]
    silent = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(40)]
    try:
        deadline = time.monotonic() + 15
        still = silent
        while still and time.monotonic() < deadline:
            time.sleep(0.2)
            still = [s for s in still if not _closed_by_peer(s)]
        assert still == []
        with grpc.insecure_channel(sc.grpc_target) as ch:
            ch.unary_unary(METHOD, request_serializer=None, response_deserializer=None)(
                export_body, timeout=10
            )
        assert "r0" in request_ids(sc)
    finally:
        for s in silent:
            s.close()


# -- log floods ------------------------------------------------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _record(msg: str, *args: object, name: str = "aiohttp.server") -> logging.LogRecord:
    return logging.LogRecord(name, logging.INFO, __file__, 1, msg, args, None)


def test_a_repeated_log_line_passes_a_few_times_per_window_then_is_counted() -> None:
    clock = _Clock()
    f = RateLimitFilter(burst=3, window_s=10.0, clock=clock)
    passed = [f.filter(_record("bad request from %s", f"10.0.0.{i}")) for i in range(1000)]
    assert passed.count(True) == 3 and passed[:3] == [True] * 3
    assert f.suppressed_total == 997
    clock.now = 10.0
    nxt = _record("bad request from %s", "10.0.0.9")
    assert f.filter(nxt)
    assert nxt.getMessage() == "bad request from 10.0.0.9 [997 similar lines suppressed]"


def test_distinct_log_lines_are_limited_separately() -> None:
    f = RateLimitFilter(burst=1, window_s=10.0, clock=_Clock())
    assert f.filter(_record("one"))
    assert f.filter(_record("two"))
    assert f.filter(_record("one", name="asyncio"))
    assert not f.filter(_record("one"))


def test_the_filter_forgets_old_kinds_so_its_memory_is_bounded() -> None:
    clock = _Clock()
    f = RateLimitFilter(burst=1, window_s=1.0, clock=clock, max_kinds=100)
    for i in range(10_000):
        clock.now = i * 0.01
        f.filter(_record(f"preformatted line {i}"))
    assert len(f._windows) <= 100
