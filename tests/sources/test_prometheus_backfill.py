"""``slokit backfill``: vLLM and DCGM history from a Prometheus HTTP API into the store.

The end-to-end test writes recorded history as OpenMetrics, turns it into TSDB blocks with
``promtool tsdb create-blocks-from openmetrics``, starts a real Prometheus on those blocks
and backfills from it.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from slokit.cli import main
from slokit.errors import BadInput
from slokit.sources.prometheus import PrometheusClient, Series, chunks, samples_from_series
from slokit.store.db import open_store

STEP = 15


# ---- unit: chunking, grouping, errors ---------------------------------------------------


def test_chunks_cover_the_window_without_repeating_a_step() -> None:
    got = list(chunks(0, 100, 10, max_points=4))
    assert got == [(0, 30), (40, 70), (80, 100)]


def test_a_short_window_is_one_chunk() -> None:
    assert list(chunks(1000, 1060, 15)) == [(1000, 1060)]


def test_chunks_refuse_a_window_that_ends_before_it_starts() -> None:
    with pytest.raises(BadInput):
        list(chunks(10, 0, 1))


def test_points_become_one_engine_sample_per_replica_and_timestamp() -> None:
    def s(name: str, pod: str, pts: list[tuple[float, float]], **extra: str) -> Series:
        return Series(
            {"__name__": name, "model_name": "tiny", "engine": "0", "pod": pod, **extra}, pts
        )

    engine, gpu = samples_from_series(
        [
            s("vllm:num_requests_running", "a", [(100.0, 3.0), (115.0, 4.0)]),
            s("vllm:num_requests_waiting", "a", [(100.0, 1.0), (115.0, 0.0)]),
            s("vllm:num_requests_running", "b", [(100.0, 7.0)]),
        ]
    )
    got = sorted((e.replica, e.ts, e.running, e.waiting) for e in engine)
    assert got == [("a", 100.0, 3.0, 1.0), ("a", 115.0, 4.0, 0.0), ("b", 100.0, 7.0, None)]
    assert gpu == []


def test_without_the_replica_label_the_instance_names_the_replica() -> None:
    series = Series(
        {"__name__": "vllm:num_requests_running", "model_name": "m", "instance": "10.0.0.5:8000"},
        [(1.0, 2.0)],
    )
    engine, _ = samples_from_series([series])
    assert engine[0].replica == "10.0.0.5:8000"


def _client(handler: Callable[[httpx.Request], httpx.Response]) -> PrometheusClient:
    return PrometheusClient(
        "http://prom.test", httpx.Client(transport=httpx.MockTransport(handler))
    )


def test_a_prometheus_error_is_bad_input_with_its_message() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            400, json={"status": "error", "errorType": "bad_data", "error": "parse error"}
        )

    with pytest.raises(BadInput, match="bad_data: parse error"):
        _client(handler).query_range("up", 0, 10, 1)


def test_an_answer_that_is_not_the_prometheus_api_is_bad_input() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text="<html>login</html>")

    with pytest.raises(BadInput, match="not a Prometheus API answer"):
        _client(handler).server_time()


def test_an_unreachable_prometheus_exits_2_with_a_message(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed once the block ends: nothing listens there
    result = CliRunner().invoke(
        main,
        ["backfill", "--prometheus", f"http://127.0.0.1:{port}", "--start", "1h", "--end", "0s",
         "--db", str(tmp_path / "s.duckdb")],
    )  # fmt: skip
    assert result.exit_code == 2
    assert "cannot reach Prometheus" in result.output


# ---- end to end: promtool-made blocks served by a real Prometheus -------------------------


def _history(t0: int, n: int) -> str:
    """n steps of two replicas and their GPUs, OpenMetrics with timestamps (real metric names)."""
    lines: list[str] = []

    def family(name: str, kind: str, rows: list[tuple[str, str, list[float]]]) -> None:
        lines.append(f"# TYPE {name} {kind}")
        for sample, labels, values in rows:
            lines.extend(
                f"{sample}{{{labels}}} {v:g} {t0 + i * STEP}" for i, v in enumerate(values)
            )

    vllm = 'engine="0",instance="10.0.0.{i}:8000",job="vllm",model_name="tiny",pod="vllm-{i}"'
    family(
        "vllm:num_requests_running",
        "gauge",
        [
            (
                "vllm:num_requests_running",
                vllm.format(i=i),
                [float(i * 10 + k % 5) for k in range(n)],
            )
            for i in (0, 1)
        ],
    )
    family(
        "vllm:kv_cache_usage_perc",
        "gauge",
        [
            ("vllm:kv_cache_usage_perc", vllm.format(i=i), [0.5 + 0.01 * k for k in range(n)])
            for i in (0, 1)
        ],
    )
    family(
        "vllm:num_preemptions",
        "counter",
        [
            ("vllm:num_preemptions_total", vllm.format(i=i), [float(3 * k) for k in range(n)])
            for i in (0, 1)
        ],
    )
    rows: list[tuple[str, str, list[float]]] = []
    for i in (0, 1):
        for le, frac in (("0.1", 0.5), ("1.0", 0.9), ("+Inf", 1.0)):
            rows.append(
                (
                    "vllm:time_to_first_token_seconds_bucket",
                    f'{vllm.format(i=i)},le="{le}"',
                    [float(round(frac * 10 * k)) for k in range(n)],
                )
            )
        rows.append(
            (
                "vllm:time_to_first_token_seconds_count",
                vllm.format(i=i),
                [10.0 * k for k in range(n)],
            )
        )
        rows.append(
            ("vllm:time_to_first_token_seconds_sum", vllm.format(i=i), [2.5 * k for k in range(n)])
        )
    family("vllm:time_to_first_token_seconds", "histogram", rows)
    dcgm = 'gpu="0",UUID="GPU-{i}",Hostname="node-{i}",instance="node-{i}:9400",job="dcgm",pod="vllm-{i}"'
    family(
        "DCGM_FI_DEV_GPU_UTIL",
        "gauge",
        [("DCGM_FI_DEV_GPU_UTIL", dcgm.format(i=i), [80.0 + i for _ in range(n)]) for i in (0, 1)],
    )
    lines.append("# EOF")
    return "\n".join(lines) + "\n"  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def prometheus_with_history(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[str, int, int]]:
    promtool, prometheus = shutil.which("promtool"), shutil.which("prometheus")
    if promtool is None or prometheus is None:
        raise RuntimeError("promtool/prometheus not found: install the Debian package 'prometheus'")
    tmp = tmp_path_factory.mktemp("backfill")
    n = 40  # 10 minutes at 15s
    t0 = (int(time.time()) // 3600 - 1) * 3600  # within the last two hours, inside retention
    (tmp / "history.om").write_text(_history(t0, n))
    made = subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", str(tmp / "history.om"), str(tmp / "tsdb")],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert made.returncode == 0, made.stdout + made.stderr
    (tmp / "prometheus.yml").write_text("global: {scrape_interval: 15s}\n")
    port = _free_port()
    proc = subprocess.Popen(
        [prometheus, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=(tmp / "prometheus.log").open("wb"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/-/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, (tmp / "prometheus.log").read_text()[-2000:]
            time.sleep(0.5)
        yield url, t0, n
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.prometheus
def test_backfill_from_promtool_blocks_fills_engine_and_gpu_samples(
    prometheus_with_history: tuple[str, int, int], tmp_path: Path
) -> None:
    url, t0, n = prometheus_with_history
    db = tmp_path / "s.duckdb"
    end = t0 + (n - 1) * STEP
    result = CliRunner().invoke(
        main,
        ["backfill", "--prometheus", url, "--start", str(t0), "--end", str(end), "--step", f"{STEP}s",
         "--db", str(db)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    with open_store(db, read_only=True) as store:
        rows = store.con.execute(
            "SELECT replica, count(*), min(running), max(running), max(preemptions_total), max(kv_usage_ratio) "
            "FROM engine_samples GROUP BY replica ORDER BY replica"
        ).fetchall()
        gpus = store.con.execute(
            "SELECT replica, count(*) FROM gpu_samples GROUP BY replica ORDER BY 1"
        ).fetchall()
        hist = store.con.execute(
            "SELECT count(DISTINCT replica), count(*) FROM histogram_samples"
        ).fetchone()
    assert rows == [
        ("vllm-0", n, 0.0, 4.0, 3.0 * (n - 1), pytest.approx(0.5 + 0.01 * (n - 1))),
        ("vllm-1", n, 10.0, 14.0, 3.0 * (n - 1), pytest.approx(0.5 + 0.01 * (n - 1))),
    ]
    assert gpus == [("vllm-0", n), ("vllm-1", n)]
    assert hist is not None and hist[0] == 2 and hist[1] >= 2 * n
    assert f"backfilled {2 * n} engine samples, {2 * n} GPU samples" in result.output


@pytest.mark.prometheus
def test_backfill_in_small_chunks_gives_the_same_samples(
    prometheus_with_history: tuple[str, int, int],
) -> None:
    from slokit.sources.prometheus import backfill_samples

    url, t0, n = prometheus_with_history
    client = PrometheusClient(url)
    end = float(t0 + (n - 1) * STEP)
    whole = [e for engine, _, _, _ in backfill_samples(client, t0, end, STEP) for e in engine]
    parts = list(backfill_samples(client, t0, end, STEP, max_points=7))
    pieces = [e for engine, _, _, _ in parts for e in engine]
    assert len(parts) == 6  # 40 steps, at most 7 per query
    key = [(e.replica, e.ts, e.running, e.preemptions_total) for e in whole]
    assert sorted(key) == sorted((e.replica, e.ts, e.running, e.preemptions_total) for e in pieces)
