"""The generated dashboards and alerts against a real Prometheus scraping a simulated fleet.

Two simulated vLLM replicas (each with its dcgm-exporter endpoint) send their spans to a
slokit sidecar; Prometheus (127.0.0.1, free port, 1s scrapes) scrapes the replicas, their
GPUs and the sidecar, with the generated rules loaded at a window scale of 60 (5m -> 5s).
After a short mixed load, every dashboard query returns data; a burst on one replica with a
small running batch (queue saturation) makes ``VllmQueueSaturated`` fire for that replica
in Prometheus' alerts API.
"""

from __future__ import annotations

import json
import math
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from slokit.analysis.slo_spec import load_spec
from slokit.generate.alerts import AlertOptions, build_alert_files
from slokit.generate.dashboards import DashboardOptions, build_dashboards
from slokit.generate.promql import DEFAULT_SUBSTITUTIONS, PanelQuery, panel_queries, substitute
from slokit.lab.sim.background import running_cluster
from slokit.lab.sim.server import SimSettings

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
SPEC = REPO / "examples" / "slo" / "chat.yaml"
SCALE = 60.0  # the rules' windows: 5m -> 5s, 1h -> 1m, for 5m -> 5s
SLOKIT = str(Path(sys.executable).parent / "slokit")

HEALTHY_WORKLOAD = {
    "workload": "v1",
    "classes": [
        {"name": "chat", "weight": 4, "slo_class": "interactive", "input": 64,
         "output": {"dist": "uniform", "min": 16, "max": 48},
         "shared_prefix": {"fraction": 0.5, "length": 32, "count": 2}},
        {"name": "agent", "weight": 2, "slo_class": "interactive", "input": 64, "output": 16, "task_size": 2},
        {"name": "batch", "weight": 1, "slo_class": "batch", "input": 256, "output": 64},
        {"name": "misc", "weight": 1, "slo_class": "misc", "input": 32, "output": 16},  # -> class default
    ],
}  # fmt: skip
BURST_WORKLOAD = {
    "workload": "v1",
    "classes": [{"name": "burst", "slo_class": "interactive", "input": 256, "output": 256}],
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@dataclass
class Lab:
    prom: str
    replicas: list[str]  # pod names
    started: float
    procs: list[subprocess.Popen[bytes]]
    logs: Path

    def query_range(
        self, expr: str, start: float, end: float, step: str = "2s"
    ) -> list[dict[str, Any]]:
        r = httpx.get(
            f"{self.prom}/api/v1/query_range",
            params={"query": expr, "start": start, "end": end, "step": step},
            timeout=30,
        )
        body = r.json()
        assert body.get("status") == "success", (expr, body)
        return list(body["data"]["result"])

    def alerts(self) -> list[dict[str, Any]]:
        return list(httpx.get(f"{self.prom}/api/v1/alerts", timeout=10).json()["data"]["alerts"])

    def load(
        self, url: str, workload: dict[str, Any], rate: float, duration: int, name: str, otlp: str
    ) -> subprocess.Popen[bytes]:
        wl = self.logs / f"{name}.yaml"
        wl.write_text(yaml.safe_dump(workload))
        log = (self.logs / f"{name}.log").open("wb")
        proc = subprocess.Popen(
            [SLOKIT, "load", "--url", url, "--rate", str(rate), "--duration", str(duration),
             "--workload", str(wl), "--otlp-endpoint", otlp, "--no-progress", "--run-id", name,
             "--out", str(self.logs / f"{name}.jsonl")],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        self.procs.append(proc)
        return proc


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        raise RuntimeError(
            "prometheus not found: install the Debian package 'prometheus' (scripts/system-deps.sh)"
        )
    tmp = tmp_path_factory.mktemp("live")
    sidecar_port, otlp_port, prom_port = _free_port(), _free_port(), _free_port()
    otlp = f"http://127.0.0.1:{otlp_port}/v1/traces"
    settings = SimSettings(
        max_num_seqs=16,
        otlp_endpoint=otlp,
        otlp_protocol="http/protobuf",
        scenario="queue_saturation",
    )
    procs: list[subprocess.Popen[bytes]] = []
    with running_cluster(settings, replicas=2) as sim:
        reps = sim.cluster.replicas
        names = [r.name for r in reps]
        # the sidecar: scrapes both replicas and their GPUs, receives the spans, exports the SLI
        cfg = tmp / "sidecar.yaml"
        cfg.write_text(
            yaml.safe_dump({"sli_grace_s": 2.0, "sli_interval_s": 1.0, "diagnose_interval_s": 5.0})
        )
        cmd = [sys.executable, "-m", "slokit.sidecar", "--config", str(cfg), "--db", str(tmp / "s.duckdb"),
               "--slo", str(SPEC), "--listen", f"127.0.0.1:{sidecar_port}",
               "--otlp-http", f"127.0.0.1:{otlp_port}", "--otlp-grpc", ""]  # fmt: skip
        for r in reps:
            cmd += ["--vllm-url", f"{r.name}=http://127.0.0.1:{r.port}/metrics"]
            cmd += ["--dcgm-url", f"{r.name}=http://127.0.0.1:{r.dcgm_port}/metrics"]
        procs.append(
            subprocess.Popen(cmd, stdout=(tmp / "sidecar.log").open("wb"), stderr=subprocess.STDOUT)
        )
        # Prometheus with the generated rules, windows scaled down
        rules = tmp / "rules"
        rules.mkdir()
        for name, text in build_alert_files(
            load_spec(SPEC), AlertOptions(scale=SCALE, evaluation_interval="1s")
        ).items():
            if name.endswith(".rules.yaml"):
                (rules / name).write_text(text)
        prom_cfg = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "900ms", "evaluation_interval": "1s"},
            "rule_files": [str(rules / "*.rules.yaml")],
            "scrape_configs": [
                {"job_name": "vllm", "static_configs": [
                    {"targets": [f"127.0.0.1:{r.port}"], "labels": {"pod": r.name}} for r in reps]},
                {"job_name": "dcgm", "static_configs": [{"targets": [f"127.0.0.1:{r.dcgm_port}" for r in reps]}]},
                {"job_name": "slokit", "static_configs": [{"targets": [f"127.0.0.1:{sidecar_port}"]}]},
            ],
        }  # fmt: skip
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(prom_cfg))
        procs.append(
            subprocess.Popen(
                [prometheus, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{prom_port}"],
                stdout=(tmp / "prometheus.log").open("wb"), stderr=subprocess.STDOUT,
            )
        )  # fmt: skip
        prom = f"http://127.0.0.1:{prom_port}"
        lab = Lab(prom, names, time.time(), procs, tmp)
        try:
            _wait(
                lambda: httpx.get(f"{prom}/-/ready", timeout=2).status_code == 200,
                60,
                "prometheus ready",
            )
            _wait(
                lambda: (
                    httpx.get(f"http://127.0.0.1:{sidecar_port}/readyz", timeout=2).status_code
                    == 200
                ),
                60,
                "sidecar ready",
            )
            lab.started = time.time()
            urls = sim.cluster.urls()
            for i, u in enumerate(urls):
                lab.load(u, HEALTHY_WORKLOAD, 3, 75, f"healthy{i}", otlp)
            # the sidecar's diagnosis takes the first 30s as its baseline: keep them healthy
            time.sleep(35)
            # the incident: 20 requests/s of 256 tokens against replica 0, which serves ~8/s
            # with 16 running at most: its waiting queue fills and drains only after ~30s
            lab.load(urls[0], BURST_WORKLOAD, 20, 12, "burst", otlp)
            yield lab
        finally:
            for p in procs:
                if p.poll() is None:
                    p.terminate()
            for p in procs:
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    p.kill()


def _queries() -> list[PanelQuery]:
    built = build_dashboards(DashboardOptions(spec=load_spec(SPEC)))
    return [q for text in built.values() for q in panel_queries(json.loads(text))]


def _has_value(result: list[dict[str, Any]]) -> bool:
    return any(not math.isnan(float(v)) for series in result for _, v in series["values"])


def test_queue_saturation_incident_fires_the_matching_alert(lab: Lab) -> None:
    def firing() -> bool:
        return any(
            a["labels"]["alertname"] == "VllmQueueSaturated" and a["state"] == "firing"
            and a["labels"].get("pod") == lab.replicas[0]
            for a in lab.alerts()
        )  # fmt: skip

    _wait(firing, 60, "VllmQueueSaturated firing for the saturated replica")
    alert = next(
        a
        for a in lab.alerts()
        if a["labels"]["alertname"] == "VllmQueueSaturated" and a["state"] == "firing"
    )
    assert alert["labels"]["severity"] == "ticket"
    assert alert["annotations"]["runbook_url"] == "runbooks/queue_saturation.md"
    assert f"waiting on {lab.replicas[0]}" in alert["annotations"]["summary"]


FINDINGS_PANEL = "Active findings"


def _assert_data(lab: Lab, queries: list[PanelQuery], timeout: float) -> None:
    values = {**DEFAULT_SUBSTITUTIONS, "__rate_interval": "5s", "__range": "2m"}
    empty: list[str] = []

    def all_have_data() -> bool:
        empty.clear()
        now = time.time()
        for q in queries:
            if not _has_value(lab.query_range(substitute(q.expr, values), lab.started, now)):
                empty.append(f"{q.dashboard} / {q.panel} [{q.ref_id}]: {q.expr}")
        return not empty

    try:
        _wait(all_have_data, timeout, "every dashboard query to return data")
    except AssertionError:
        pytest.fail("panels without data:\n" + "\n".join(empty))


def test_every_dashboard_query_returns_data(lab: Lab) -> None:
    _assert_data(lab, [q for q in _queries() if q.panel != FINDINGS_PANEL], 90)


def test_active_findings_panel_shows_the_incident(lab: Lab) -> None:
    _assert_data(lab, [q for q in _queries() if q.panel == FINDINGS_PANEL], 30)


def test_backfill_from_the_live_prometheus_brings_the_incident_into_the_store(
    lab: Lab, tmp_path: Path
) -> None:
    from click.testing import CliRunner

    from slokit.cli import main
    from slokit.store.db import open_store

    db = tmp_path / "backfill.duckdb"
    args = ["backfill", "--prometheus", lab.prom, "--start", str(int(lab.started)), "--end", "0s"]
    result = CliRunner().invoke(main, [*args, "--step", "1s", "--db", str(db)])
    assert result.exit_code == 0, result.output
    with open_store(db, read_only=True) as store:
        engine = dict(
            store.con.execute(
                "SELECT replica, max(waiting) FROM engine_samples GROUP BY replica"
            ).fetchall()
        )
        gpus = {
            r[0] for r in store.con.execute("SELECT DISTINCT replica FROM gpu_samples").fetchall()
        }
    assert set(engine) == set(lab.replicas) == gpus
    assert engine[lab.replicas[0]] >= 10  # the saturated queue, as Prometheus recorded it
