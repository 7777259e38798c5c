"""The fleet view from Prometheus versus each pod's own sidecar, live.

Three simulated vLLM replicas (one :class:`SimCluster` each, like three pods), each with its
own ``slokit sidecar`` process that scrapes only its pod's vLLM and DCGM and receives only
its pod's spans, and a real ``prometheus`` on 127.0.0.1 scraping the three vLLM endpoints,
the three DCGM endpoints and the three sidecars' ``/metrics`` every second, a ``pod`` label
per target. The incident: one pod serves a few shared prefixes, then the fleet scales out to
three and a cache-unaware gateway spreads the same prefixes round-robin (as
``examples/scenarios/prefix_affinity_loss.yaml``): the new pods have never seen them.

* No single sidecar reports ``prefix_affinity_loss``: the pod that served alone keeps its
  hit ratio (its cache holds every prefix), the new pods have no baseline to fall from.
  ``slokit diagnose --prometheus`` sees the fleet's hit ratio fall as the serving pods grow
  1 -> 3, with each pod's ratio before and after.
* The control runs at the same time on three more pods (their own Prometheus): the same
  scale-out routed by prefix (each prefix always on the same pod: the first pod keeps a
  third of the prefixes it holds, each new pod gets a third of its own) is not reported.
* A burst on one pod with a capped batch (its own Prometheus) is ``queue_saturation`` on
  that pod, from Prometheus alone.
* ``slokit slo report --prometheus`` counts exactly what the three sidecars judged.

Everything runs at once, in real time: Prometheus stamps its samples with the wall clock, so
the simulator runs at speed 1 (at a higher speed its spans, hence the sidecars' records,
would run ahead of Prometheus' clock and no window would mean the same to both). Assertions
are relative (ratios, counts), never wall-clock bounds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from slokit.cli import main
from slokit.lab.load import LoadConfig, run_load
from slokit.lab.sim.child import cluster_process
from slokit.lab.sim.server import SimSettings
from slokit.lab.workload import DEFAULT_WORKLOAD, Workload, parse_workload_yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "sidecar"))  # the sidecar harness lives there
from sidecar_harness import LoopThread, sidecar_process  # noqa: E402

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

#: Seconds of the warm phase (one pod) and of the scale-out (three pods); requests per second.
WARM_S, SCALED_S, WARM_RATE, SCALED_RATE = 40.0, 15.0, 10.0, 12.0
#: The baseline diagnose is given: the warm phase's last 30 s (3 buckets of 10 s).
BASELINE = "30s"
#: The burst pod: quiet, then a burst, then quiet again.
QUIET_S, BURST_S, TAIL_S = 40.0, 10.0, 5.0
#: Prompts of 600 tokens, 512 of them one of PREFIXES shared prefixes. The warm phase
#: (400 requests) has seen nearly all of them before the baseline's last 30 s; after the
#: scale-out each new pod gets ~60 requests, ~38 of them its first of a prefix.
PREFIX_LEN, PROMPT, PREFIXES = 512, 600, 60

#: Each pod's simulator runs in a process of its own (seven on one event loop, beside the
#: load generators, starved together on a busy machine: the burst pod's scrapes timed out for
#: 30 s and its queue never drained). A stall of a pod's process up to this long is caught up
#: on its ideal timeline instead of showing as latency (by default, 5 ms, a pod models an
#: overloaded server): the pods' physics are the modeled GPU's, not the CI machine's.
STALL_S = 2.0

SLO = """\
slokit: v1
service: fleet
classes:
  - name: default
    good_when: {ttft_ms: 150, e2e_ms: 30000}
    objective: 0.95
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if check():
                return
        time.sleep(0.2)
    raise TimeoutError(what)


def _workload(name: str, prefixes: int) -> Workload:
    return parse_workload_yaml(
        "workload: v1\nclasses:\n"
        f"  - {{name: {name}, weight: 1, input: {PROMPT}, output: 16, shared_prefix: "
        f"{{fraction: 1.0, length: {PREFIX_LEN}, count: {prefixes}}}}}\n"
    )


@dataclass
class Pod:
    name: str
    pid: int  # its simulator's process
    vllm_port: int
    dcgm_port: int
    sidecar: str | None = None  # its sidecar's API URL

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.vllm_port}"


def _pod(stack: contextlib.ExitStack, name: str, settings: SimSettings) -> Pod:
    """A simulated pod in a process of its own (stopped when ``stack`` closes)."""
    port, dcgm = _free_port(), _free_port()
    pid = stack.enter_context(cluster_process(settings, port=port, dcgm_port=dcgm))
    return Pod(name, pid, port, dcgm)


@dataclass
class Prom:
    url: str
    proc: subprocess.Popen[bytes]


def _prometheus(tmp: Path, name: str, pods: list[Pod], sidecars: dict[str, str]) -> Prom:
    """A real Prometheus scraping the pods' vLLM and DCGM (and ``sidecars``: pod -> host:port)
    every second, each target labelled with its pod."""

    def job(job_name: str, targets: dict[str, str]) -> str:
        statics = "".join(
            f"      - targets: ['{t}']\n        labels: {{pod: '{p}'}}\n"
            for p, t in targets.items()
        )
        return f"  - job_name: {job_name}\n    static_configs:\n{statics}"

    jobs = job("vllm", {p.name: f"127.0.0.1:{p.vllm_port}" for p in pods})
    jobs += job("dcgm", {p.name: f"127.0.0.1:{p.dcgm_port}" for p in pods})
    if sidecars:
        jobs += job("slokit", sidecars)
    cfg = tmp / f"{name}.yml"
    cfg.write_text("global: {scrape_interval: 1s, scrape_timeout: 900ms}\nscrape_configs:\n" + jobs)
    port = _free_port()
    proc = subprocess.Popen(
        [str(shutil.which("prometheus")), f"--config.file={cfg}",
         f"--storage.tsdb.path={tmp / (name + '-tsdb')}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    _wait(lambda: httpx.get(f"{url}/-/ready").status_code == 200, 30, f"{name} ready")
    return Prom(url, proc)


@dataclass
class Fleet:
    rr: Prom
    control: Prom
    burst: Prom
    rr_pods: list[Pod]
    burst_pod: str
    slo: Path
    scale_out_at: float = 0.0  # wall clock
    burst_at: float = 0.0
    started_at: float = 0.0
    ended_at: float = 0.0
    loads: dict[str, int] = field(default_factory=dict)


async def _run(
    cfg: LoadConfig, delay: float, fleet: Fleet, key: str, at: str | None = None
) -> None:
    await asyncio.sleep(delay)
    if at is not None:
        setattr(fleet, at, time.time())
    result = await run_load(cfg)
    fleet.loads[key] = fleet.loads.get(key, 0) + len(result.records)


async def _drive(fleet: Fleet, control: list[Pod], burst: Pod) -> None:
    rr = fleet.rr_pods

    def load(pods: list[Pod], rate: float, duration: float, wl: Workload, seed: int) -> LoadConfig:
        return LoadConfig(
            url=pods[0].url, more_urls=tuple(p.url for p in pods[1:]), duration_s=duration,
            rate=rate, workload=wl, seed=seed, timeout_s=120.0, drain_s=30.0,
        )  # fmt: skip

    shared = _workload("w", PREFIXES)
    share = PREFIXES // 3
    # each pod its own share: the first pod's are prefixes it already holds
    prefix_routed = [
        _run(load([p], SCALED_RATE / 3, SCALED_S, _workload(f"w{j or ''}", share), 3 + j),
             WARM_S, fleet, "control")
        for j, p in enumerate(control)
    ]  # fmt: skip
    quiet = load([burst], 1.0, QUIET_S + BURST_S + TAIL_S, DEFAULT_WORKLOAD, 7)
    await asyncio.gather(
        # The incident: one pod, then round-robin over three with the same prefixes.
        _run(load(rr[:1], WARM_RATE, WARM_S, shared, 1), 0.0, fleet, "rr"),
        _run(load(rr, SCALED_RATE, SCALED_S, shared, 2), WARM_S, fleet, "rr", "scale_out_at"),
        # The control: the same warm phase, then routed by prefix.
        _run(load(control[:1], WARM_RATE, WARM_S, shared, 1), 0.0, fleet, "control"),
        *prefix_routed,
        # The burst pod.
        _run(quiet, 0.0, fleet, "burst"),
        _run(load([burst], 8.0, BURST_S, DEFAULT_WORKLOAD, 8), QUIET_S, fleet, "burst", "burst_at"),
    )


def _sidecar_metrics_settled(prom: str, expected: int, seen: list[float]) -> bool:
    """Whether the sidecars' ``slokit_requests_total`` in Prometheus reached ``expected``; each
    new value read is appended to ``seen``."""
    got = httpx.get(f"{prom}/api/v1/query", params={"query": "sum(slokit_requests_total)"})
    result = got.json()["data"]["result"]
    if not result:
        return False
    value = float(result[0]["value"][1])
    if not seen or seen[-1] != value:
        seen.append(value)
    return round(value) >= expected


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    if shutil.which("prometheus") is None:
        pytest.skip("prometheus not found (scripts/system-deps.sh)")
    tmp = tmp_path_factory.mktemp("fleet")
    (tmp / "slo.yaml").write_text(SLO)
    (tmp / "sidecar.yaml").write_text(
        "sli_grace_s: 1\nsli_interval_s: 0.5\ndiagnose_interval_s: 0\n"
    )
    lt = LoopThread()
    with contextlib.ExitStack() as stack:
        stack.callback(lt.close)
        prefix_pool = dict(model="7b", gpu="h100", max_lag_s=STALL_S)
        # The incident's pods, each with its sidecar (started first: the pod's spans go to it).
        rr: list[Pod] = []
        sidecars: dict[str, str] = {}
        for i in range(3):
            name = f"rr-{i}"
            vllm_port, dcgm_port = _free_port(), _free_port()
            _, ports = stack.enter_context(sidecar_process(
                ["--vllm-url", f"{name}=http://127.0.0.1:{vllm_port}/metrics",
                 "--dcgm-url", f"http://127.0.0.1:{dcgm_port}/metrics",
                 "--otlp-http", "127.0.0.1:0", "--otlp-grpc", "", "--listen", "127.0.0.1:0",
                 "--db", str(tmp / f"{name}.duckdb"), "--slo", str(tmp / "slo.yaml"),
                 "--replica", name, "--config", str(tmp / "sidecar.yaml")],
                tmp / f"{name}.log",
            ))  # fmt: skip
            settings = SimSettings(
                **prefix_pool, name_prefix=name, seed=i, hostname_prefix=f"node-{name}",
                otlp_endpoint=f"http://127.0.0.1:{ports['otlp_http']}",
                otlp_protocol="http/protobuf",
            )  # fmt: skip
            pid = stack.enter_context(
                cluster_process(settings, port=vllm_port, dcgm_port=dcgm_port)
            )
            pod = Pod(name, pid, vllm_port, dcgm_port, f"http://127.0.0.1:{ports['api']}")
            rr.append(pod)
            sidecars[name] = f"127.0.0.1:{ports['api']}"
        control = []
        for i in range(3):
            name = f"ctl-{i}"
            settings = SimSettings(**prefix_pool, name_prefix=name, seed=i,
                                   hostname_prefix=f"node-{name}")  # fmt: skip
            control.append(_pod(stack, name, settings))
        burst = _pod(stack, "burst-0", SimSettings(model="7b", gpu="l4", max_num_seqs=16,
                                                   max_lag_s=STALL_S, name_prefix="burst",
                                                   hostname_prefix="node-b"))  # fmt: skip

        proms = {
            "rr": _prometheus(tmp, "rr", rr, sidecars),
            "control": _prometheus(tmp, "control", control, {}),
            "burst": _prometheus(tmp, "burst", [burst], {}),
        }
        for p in proms.values():
            stack.callback(lambda p=p: (p.proc.terminate(), p.proc.wait(10)))
        fleet = Fleet(
            proms["rr"], proms["control"], proms["burst"], rr, burst.name, tmp / "slo.yaml"
        )
        time.sleep(3.0)  # a few idle scrapes before any traffic
        fleet.started_at = time.time()
        lt.call(_drive(fleet, control, burst), timeout=WARM_S + SCALED_S + 120)
        # Every request judged by its sidecar (grace 1 s) and scraped by Prometheus: seconds on
        # a quiet machine, a minute or more while other work holds both cores.
        seen: list[float] = []
        try:
            _wait(lambda: _sidecar_metrics_settled(fleet.rr.url, fleet.loads["rr"], seen), 180,
                  "the sidecars' SLI counters in Prometheus")  # fmt: skip
        except TimeoutError:
            raise TimeoutError(f"the sidecars' SLI counters in Prometheus: {fleet.loads['rr']} "
                               f"requests sent, counted {seen}") from None  # fmt: skip
        time.sleep(2.0)
        fleet.ended_at = time.time()
        yield fleet


def _cli(*args: str) -> dict[str, Any]:
    res = CliRunner().invoke(main, [*args, "--json"])
    assert res.exit_code == 0, res.output[-3000:]
    doc: dict[str, Any] = json.loads(res.output)
    return doc


def _diagnose_scale_out(source: str, url: str, fleet: Fleet) -> dict[str, Any]:
    return _cli("diagnose", source, url, "--since", f"{fleet.scale_out_at:.3f}",
                "--until", f"{fleet.ended_at:.3f}", "--baseline", BASELINE)  # fmt: skip


def _found(doc: dict[str, Any], rule: str) -> list[dict[str, Any]]:
    return [f for f in doc["findings"] if f["rule"] == rule]


def test_no_single_sidecar_sees_the_prefix_affinity_loss(fleet: Fleet) -> None:
    for pod in fleet.rr_pods:
        assert pod.sidecar is not None
        doc = _diagnose_scale_out("--sidecar", pod.sidecar, fleet)
        # Each sidecar saw its own pod only, and had its prefix counters.
        assert doc["coverage"]["sources"]["engine"]["replicas"] == [pod.name], doc["coverage"]
        assert not _found(doc, "prefix_affinity_loss"), (pod.name, doc["findings"])


def test_prometheus_sees_the_fleet_s_prefix_affinity_loss_per_pod(fleet: Fleet) -> None:
    doc = _diagnose_scale_out("--prometheus", fleet.rr.url, fleet)
    found = _found(doc, "prefix_affinity_loss")
    assert found, json.dumps(doc["coverage"], indent=1)[:4000]
    ev = found[0]["evidence"]
    assert (ev["replicas_baseline"], ev["replicas_after"], ev["scale_out"]) == (1, 3, True)
    assert ev["hit_ratio_after"] < 0.7 * ev["hit_ratio_baseline"], ev
    per_pod = ev["per_replica"]
    assert set(per_pod) == {p.name for p in fleet.rr_pods}, per_pod
    # The pod that served alone keeps its ratio (what its own sidecar sees); the new pods,
    # without a baseline of their own, are where the fleet's hits went.
    first = per_pod["rr-0"]
    assert first["baseline"] is not None and first["after"] >= 0.9 * first["baseline"], per_pod
    for pod in ("rr-1", "rr-2"):
        assert per_pod[pod]["baseline"] is None, per_pod
        assert per_pod[pod]["after"] < 0.7 * first["baseline"], per_pod


def test_prefix_routed_scale_out_is_not_reported(fleet: Fleet) -> None:
    doc = _diagnose_scale_out("--prometheus", fleet.control.url, fleet)
    assert doc["coverage"]["rules"]["prefix_affinity_loss"]["status"] == "ran", doc["coverage"]
    assert sorted(doc["coverage"]["sources"]["engine"]["replicas"]) == ["ctl-0", "ctl-1", "ctl-2"]
    assert not _found(doc, "prefix_affinity_loss"), json.dumps(doc["findings"], indent=1)


def test_queue_burst_on_one_pod_is_queue_saturation_from_prometheus(fleet: Fleet) -> None:
    doc = _cli("diagnose", "--prometheus", fleet.burst.url, "--since", f"{fleet.burst_at:.3f}",
               "--until", f"{fleet.ended_at:.3f}", "--baseline", f"{QUIET_S - 5:.0f}s")  # fmt: skip
    found = _found(doc, "queue_saturation")
    assert found, json.dumps(doc["coverage"]["rules"]["queue_saturation"], indent=1)
    assert found[0]["replica"] == fleet.burst_pod
    assert doc["coverage"]["basis"] == "histograms"


def _outcomes(doc: dict[str, Any]) -> dict[str, dict[str, int]]:
    return {c["name"]: dict(c["outcomes"]) for c in doc["classes"]}


def test_slo_report_from_prometheus_counts_what_the_sidecars_judged(fleet: Fleet) -> None:
    # The whole run, with idle seconds at both edges: no request straddles either.
    window = ("--since", f"{fleet.started_at - 2:.3f}", "--until", f"{fleet.ended_at:.3f}")
    spec = str(fleet.slo)
    totals: dict[str, dict[str, int]] = {}
    for pod in fleet.rr_pods:
        assert pod.sidecar is not None
        own = _cli("slo", "report", "--slo", spec, "--sidecar", pod.sidecar, *window)
        for cls, outcomes in _outcomes(own).items():
            mine = totals.setdefault(cls, {})
            for k, v in outcomes.items():
                mine[k] = mine.get(k, 0) + v
    prom = _cli("slo", "report", "--slo", spec, "--prometheus", fleet.rr.url, *window)
    assert prom["basis"] == "counts"
    assert sum(totals["default"].values()) == fleet.loads["rr"]
    # slo_counts reads each counter's value at the window's ends (no extrapolation), so with
    # idle edges the counts are exactly the sidecars' verdicts.
    assert _outcomes(prom) == totals, (prom, totals)
