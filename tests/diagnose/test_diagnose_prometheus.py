"""Diagnose through Prometheus alone: scenarios of the pack run on the simulator in virtual
time, their scrapes written as OpenMetrics with timestamps (every series labelled with its
pod), turned into TSDB blocks by ``promtool tsdb create-blocks-from openmetrics`` and served
by a real ``prometheus`` on 127.0.0.1. One block creation and one server per module."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import scenario_harness
from scenario_harness import SCENARIO_DIR, load_scenario, run_scenario_virtual

from slokit.analysis.diagnose import diagnose
from slokit.sources.exposition import parse_exposition
from slokit.store.prometheus import PrometheusReader

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

#: The scenarios are from 2023 (the virtual clock's epoch): look back far enough.
HISTORY_S = 5 * 365 * 86400.0


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def openmetrics_lines(body: bytes, ts: float, pod: str | None) -> Iterator[str]:
    """One scrape as untyped OpenMetrics samples stamped ``ts``, labelled ``pod``."""
    for fam in parse_exposition(body):
        for s in fam.samples:
            labels = dict(s.labels)
            if pod is not None:
                labels["pod"] = pod
            body_l = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
            yield f"{s.name}{{{body_l}}} {s.value!r} {ts:.3f}"


@dataclass
class Recorded:
    scrapes: list[tuple[bytes, float, str | None]]
    started_at: float


_PARSE_VLLM, _PARSE_DCGM = scenario_harness.parse_vllm_metrics, scenario_harness.parse_dcgm_metrics


def record(name: str, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Recorded]:
    """Run a scenario of the pack, keeping each scrape's exposition text."""
    rec = Recorded([], 0.0)
    vllm, dcgm = _PARSE_VLLM, _PARSE_DCGM

    def keep_vllm(body: bytes, *, ts: float, replica: str, **kw: Any) -> Any:
        rec.scrapes.append((body, ts, replica))
        return vllm(body, ts=ts, replica=replica, **kw)

    def keep_dcgm(body: bytes, *, ts: float, **kw: Any) -> Any:
        rec.scrapes.append((body, ts, None))
        return dcgm(body, ts=ts, **kw)

    monkeypatch.setattr(scenario_harness, "parse_vllm_metrics", keep_vllm)
    monkeypatch.setattr(scenario_harness, "parse_dcgm_metrics", keep_dcgm)
    sc = load_scenario(SCENARIO_DIR / f"{name}.yaml")
    got = run_scenario_virtual(sc)
    rec.started_at = got.started_at
    return sc, rec


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
        time.sleep(0.2)
    raise TimeoutError(what)


@dataclass
class Served:
    url: str
    runs: dict[str, tuple[Any, Recorded]]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    prometheus, promtool = shutil.which("prometheus"), shutil.which("promtool")
    if prometheus is None or promtool is None:
        pytest.skip("prometheus/promtool not found (scripts/system-deps.sh)")
    tmp = tmp_path_factory.mktemp("prom")
    mp = pytest.MonkeyPatch()
    try:
        runs = {n: record(n, mp) for n in ("queue_saturation", "prefix_affinity_loss")}
    finally:
        mp.undo()
    # Two scenarios on one virtual clock overlap in time: a namespace label keeps them apart
    # and the pods of the second are renamed.
    lines: list[str] = []
    for i, (_, rec) in enumerate(runs.values()):
        for body, ts, pod in rec.scrapes:
            name = f"s{i}-{pod}" if pod is not None else None
            for line in openmetrics_lines(body, ts + i * 86400, name):
                lines.append(line if pod is not None else line.replace('pod="', f'pod="s{i}-', 1))
    om = tmp / "data.om"
    om.write_text("\n".join(lines) + "\n# EOF\n")
    data = tmp / "tsdb"
    subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(om), str(data)],
                   check=True, capture_output=True)  # fmt: skip
    port = _free_port()
    proc = subprocess.Popen(
        [prometheus, f"--storage.tsdb.path={data}", f"--web.listen-address=127.0.0.1:{port}",
         "--storage.tsdb.retention.time=36500d", f"--config.file={_config(tmp)}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        _wait(lambda: httpx.get(f"{url}/-/ready").status_code == 200, 30, "prometheus ready")
        yield Served(url, runs)
    finally:
        proc.terminate()
        proc.wait(10)


def _config(tmp: Path) -> Path:
    cfg = tmp / "prometheus.yml"
    cfg.write_text("global: {scrape_interval: 15s}\nscrape_configs: []\n")
    return cfg


def _diagnose(served: Served, name: str, day: int, **kw: Any) -> dict[str, Any]:
    sc, rec = served.runs[name]
    args: dict[str, float] = {}
    kw_diag = rec_options(sc)
    if "since_s" in sc.diagnose:
        args["since"] = rec.started_at + day * 86400 + sc.diagnose["since_s"]
    with PrometheusReader(served.url, history_s=HISTORY_S, **kw) as reader:
        lo, hi = reader.bounds()
        assert lo is not None and hi is not None
        start = rec.started_at + day * 86400
        return diagnose(reader, args.get("since", start), start + sc.duration_s + 30, **kw_diag)


def rec_options(sc: Any) -> dict[str, Any]:
    from slokit.analysis.diagnose import DiagnoseOptions

    if "baseline_s" in sc.diagnose:
        return {"options": DiagnoseOptions(baseline_lookback_s=sc.diagnose["baseline_s"])}
    return {}


def test_the_extent_is_the_oldest_and_newest_vllm_sample_wherever_the_grid_falls(
    served: Served,
) -> None:
    # The coarse and fine grids are anchored on Prometheus' clock: a lower bound read off
    # the first grid point that sees data would land up to a fine step after the oldest
    # sample, and a diagnosis from it would start after the incident's baseline.
    stamps = [
        round(ts + day * 86400, 3)
        for day, (_, rec) in enumerate(served.runs.values())
        for _, ts, pod in rec.scrapes
        if pod is not None
    ]
    for history_s in (HISTORY_S, HISTORY_S + 86400 + 17.5):
        with PrometheusReader(served.url, history_s=history_s) as reader:
            assert reader.bounds() == (min(stamps), max(stamps))


def test_queue_saturation_through_prometheus(served: Served) -> None:
    doc = _diagnose(served, "queue_saturation", 0)
    rules = {(f["rule"], f["replica"]) for f in doc["findings"]}
    replica = next(r for rule, r in rules if rule == "queue_saturation")
    assert replica == "s0-" + served.runs["queue_saturation"][1].scrapes[0][2]
    cov = doc["coverage"]
    assert cov["basis"] == "histograms"
    assert "queue_saturation" in cov["histogram_rules"]
    assert any("histograms" in n for n in cov["rules"]["queue_saturation"]["notes"])


def test_prefix_affinity_scale_out_through_prometheus(served: Served) -> None:
    doc = _diagnose(served, "prefix_affinity_loss", 1)
    found = [f for f in doc["findings"] if f["rule"] == "prefix_affinity_loss"]
    assert found, doc["coverage"]
    assert found[0]["evidence"]["scale_out"] is True
    assert found[0]["evidence"]["replicas_after"] == 3
