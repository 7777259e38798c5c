"""A sidecar's threads do not grow with the node's cores (``native_threads``).

numpy's OpenBLAS, Arrow's CPU pool and DuckDB's async I/O threads are sized by the machine's
core count, not by the pod's CPU limit. The process tests run the real ``slokit sidecar``
under a library that makes it believe it has 64 CPUs (``fake_cpus``), beside the same sidecar
believing it has 2, and count its threads in ``/proc``. The control runs the libraries' own
defaults (``native_threads: 0``) under the same library: it shows the belief took hold.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import fake_cpus
import httpx
import pytest
from sidecar_harness import sidecar_process

from slokit._native_threads import THREAD_ENV, bound_native_threads
from slokit.errors import BadInput
from slokit.sidecar.config import load_config

#: Threads a sidecar may run beyond what it runs on 2 CPUs when it sees 64: the asyncio
#: executor's lazily started workers (min(32, cores + 4)) and scheduling noise, not a pool
#: per core (those would be 60 or more).
SLACK = 4
#: Counts taken 0.5 s apart before a changing count is settled by its highest.
STEADY_TRIES = 60


# -- the environment the libraries read ----------------------------------------------------


def test_each_librarys_variable_defaults_to_the_bound() -> None:
    env: dict[str, str] = {}
    assert bound_native_threads(1, env) == {key: "1" for key in THREAD_ENV}
    assert env == {key: "1" for key in THREAD_ENV}


def test_a_variable_the_user_exported_wins() -> None:
    env = {"OPENBLAS_NUM_THREADS": "8"}
    bound_native_threads(2, env)
    assert env == {"OPENBLAS_NUM_THREADS": "8", "OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"}


def test_an_empty_variable_counts_as_unset() -> None:
    env = {"OMP_NUM_THREADS": ""}
    bound_native_threads(1, env)
    assert env["OMP_NUM_THREADS"] == "1"


def test_zero_leaves_the_libraries_their_defaults() -> None:
    env: dict[str, str] = {}
    assert bound_native_threads(0, env) == {}
    assert env == {}


def test_native_threads_is_one_by_default_and_read_from_the_environment() -> None:
    assert load_config(env={}).native_threads == 1
    assert load_config(env={"SLOKIT_NATIVE_THREADS": "0"}).validate().native_threads == 0


@pytest.mark.parametrize("value", ["-1", "1025"])
def test_native_threads_out_of_range_is_refused(value: str) -> None:
    with pytest.raises(BadInput, match="native_threads"):
        load_config(env={"SLOKIT_NATIVE_THREADS": value}).validate()


# -- a real sidecar process on a node of 2 and of 64 cores --------------------------------


@pytest.fixture(scope="module")
def fake_cpus_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fake_cpus.build(tmp_path_factory.mktemp("fake_cpus"))


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def _count(tmp_path: Path, lib: Path, ncpu: int, export_body: bytes, **env: str) -> int:
    """Start a sidecar believing it has ``ncpu`` CPUs, commit a vLLM export through it (the
    writer's Arrow and DuckDB paths), and return its thread count once steady."""
    log = tmp_path / f"sidecar-{ncpu}.log"
    full_env = {**os.environ, **fake_cpus.environment(lib, ncpu), "PYTHONUNBUFFERED": "1",
                "SLOKIT_DIAGNOSE_INTERVAL_S": "0", **env}  # fmt: skip
    for key in THREAD_ENV:  # what the test process was started with must not decide it
        full_env.pop(key, None)
    args = ["--db", str(tmp_path / f"s{ncpu}.duckdb"), "--listen", "127.0.0.1:0",
            "--otlp-http", "127.0.0.1:0", "--otlp-grpc", ""]  # fmt: skip
    with sidecar_process(args, log, full_env) as (popen, ports):
        r = httpx.post(f"http://127.0.0.1:{ports['otlp_http']}/v1/traces", content=export_body,
                       headers={"Content-Type": "application/x-protobuf"}, timeout=60)  # fmt: skip
        assert r.status_code == 200, r.text
        url = f"http://127.0.0.1:{ports['api']}/api/request?id=r63"  # reads commit first
        assert httpx.get(url, timeout=60).json()["record"] is not None
        seen = [_threads(popen.pid)]
        while len(seen) < 3 or seen[-1] != seen[-2]:  # steady: the same count 0.5 s apart
            if len(seen) >= STEADY_TRIES:
                break  # still changing after 30 s: the highest count seen is the answer
            time.sleep(0.5)
            seen.append(_threads(popen.pid))
        assert popen.poll() is None, log.read_text()[-3000:]
        return max(seen) if seen[-1] != seen[-2] else seen[-1]


@pytest.mark.slow
def test_a_sidecar_on_64_cores_runs_the_threads_it_runs_on_2(
    tmp_path: Path, fake_cpus_lib: Path, export_body: bytes
) -> None:
    on_2 = _count(tmp_path, fake_cpus_lib, 2, export_body)
    on_64 = _count(tmp_path, fake_cpus_lib, 64, export_body)
    assert on_64 <= on_2 + SLACK, f"{on_64} threads on 64 cores, {on_2} on 2"


@pytest.mark.slow
def test_the_libraries_defaults_start_threads_by_the_core(
    tmp_path: Path, fake_cpus_lib: Path, export_body: bytes
) -> None:
    # the control: without the bound, OpenBLAS alone starts 63 threads on 64 cores and 1 on 2
    on_2 = _count(tmp_path, fake_cpus_lib, 2, export_body, SLOKIT_NATIVE_THREADS="0")
    on_64 = _count(tmp_path, fake_cpus_lib, 64, export_body, SLOKIT_NATIVE_THREADS="0")
    assert on_64 >= on_2 + 62 * 2, f"{on_64} threads on 64 cores, {on_2} on 2"
