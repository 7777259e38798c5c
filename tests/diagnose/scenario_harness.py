"""Run a scenario of examples/scenarios/ on the simulator and collect what a sidecar would.

A scenario file (YAML, ``scenario: v1``) says how to reproduce one incident::

    name: queue_saturation          # also the file name
    rule: queue_saturation          # the rule diagnose must report
    root_cause: [queue_saturation]  # the true cause(s), ranked first (test_rca_accuracy.py)
    rules_out: [kv_pressure, ...]   # rules it must not report
    sim: {replicas: 1, model: 7b, gpu: l4, max_num_seqs: 16, scenario: healthy}
    speed: 4                        # simulated seconds per wall second
    duration_s: 120                 # simulated seconds
    scrape_interval_s: 1
    load:                           # open-loop phases, simulated time
      - {at_s: 0, duration_s: 120, rate: 3, replicas: [0], workload: {...}}
    faults:                         # POST /admin/faults at a simulated time
      - {at_s: 60, replicas: [0], set: {gpu_clock_ratio: 0.45}}
      - {at_s: 50, router: true, set: {router_max_inflight: 2}}  # on the router's port

``sim: {router: true}`` puts the simulator's gateway router (:mod:`slokit.lab.sim.router`)
in front of the replicas: every load request passes its flow control first (in process, on
either clock), and its ``/metrics`` is scraped like the replicas' into router samples.

The run is the real thing end to end, on one event loop: the simulator's HTTP servers, the
load generator (on simulated time, so rates and durations mean the same as in the file),
``/metrics`` and DCGM scraped over HTTP and parsed by slokit's sources, vLLM spans exported
in memory and decoded by slokit's OTLP decoder, client records parsed as load JSONL. Rules
then see what they would see in production, only faster.

Two clocks: :func:`run_scenario_virtual` (the pack's) runs it on virtual time
(:mod:`slokit.lab.sim.vtime`): the loop's clock jumps to the next timer whenever every
task waits, so engine steps last exactly what the roofline says, the run takes as long as
its CPU work and a loaded machine cannot bend the physics; ``speed`` is ignored. There the
load generator's requests skip HTTP (``_InProcessRunner``: the same seeded schedule,
bodies, headers and records, through ``Replica.generate_in_process``); scrapes and faults
still go over HTTP, and every wire format (exposition text, OTLP bytes, load JSONL) is
still produced and parsed by the real code. ``run_scenario`` (in an ``asyncio.run``) runs
it all in real time at ``speed``, over HTTP.
"""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from slokit.lab.load import LoadConfig, Runner, make_schedule, request_url, run_load
from slokit.lab.sim.clock import Clock, WallClock
from slokit.lab.sim.engine import SimRequest
from slokit.lab.sim.faults import scenario_faults
from slokit.lab.sim.server import ApiError, Replica, SimCluster, SimRouter, SimSettings
from slokit.lab.sim.vtime import LoopClock, VirtualTimeLoop, run_virtual
from slokit.lab.workload import DEFAULT_WORKLOAD, parse_workload_yaml
from slokit.records import EngineSample, GpuSample, RequestFragment, RouterSample, ScrapeResult
from slokit.sources.dcgm import parse_dcgm_metrics
from slokit.sources.files import parse_load_jsonl
from slokit.sources.otlp import decode_traces
from slokit.sources.router_metrics import parse_router_metrics
from slokit.sources.vllm_metrics import parse_vllm_metrics
from slokit.store.db import Store

SCENARIO_DIR = Path(__file__).resolve().parents[2] / "examples" / "scenarios"
#: The name the simulated gateway router's samples and scrapes carry.
ROUTER_NAME = "sim-epp"
_SIM_KEYS = {
    "replicas",
    "model",
    "gpu",
    "max_num_seqs",
    "max_num_batched_tokens",
    "num_gpu_blocks",
    "scenario",
    "enable_prefix_caching",
    "max_model_len",
    "router",
}


@dataclass
class Phase:
    at_s: float
    duration_s: float
    rate: float
    replicas: list[int] | None = None  # None: all
    workload: dict[str, Any] | None = None


@dataclass
class FaultAt:
    at_s: float
    set: dict[str, Any]
    replicas: list[int] | None = None
    router: bool = False  # POST to the gateway router's /admin/faults instead


@dataclass
class Scenario:
    name: str
    rule: str | None
    rules_out: list[str]
    sim: dict[str, Any]
    speed: float
    duration_s: float
    scrape_interval_s: float
    load: list[Phase]
    faults: list[FaultAt] = field(default_factory=list)
    description: str = ""
    # How to diagnose it: ``since_s`` (window start, seconds after the scenario starts) and
    # ``baseline_s`` (how much history before it is the baseline); default: all the data.
    diagnose: dict[str, float] = field(default_factory=dict)
    # The true cause(s) of the incident: what diagnose's ``root_causes`` must rank first.
    root_cause: list[str] = field(default_factory=list)


def load_scenario(path: Path) -> Scenario:
    doc = yaml.safe_load(path.read_text())
    if not isinstance(doc, dict) or doc.get("scenario") != "v1":
        raise ValueError(f"{path}: not a scenario file (scenario: v1)")
    unknown = set(doc.get("sim", {})) - _SIM_KEYS
    if unknown:
        raise ValueError(f"{path}: unknown sim keys {sorted(unknown)}")
    return Scenario(
        name=doc["name"],
        rule=doc.get("rule"),
        rules_out=list(doc.get("rules_out", [])),
        sim=dict(doc.get("sim", {})),
        speed=float(doc.get("speed", 1.0)),
        duration_s=float(doc["duration_s"]),
        scrape_interval_s=float(doc.get("scrape_interval_s", 1.0)),
        load=[Phase(**p) for p in doc["load"]],
        faults=[FaultAt(**f) for f in doc.get("faults", [])],
        description=doc.get("description", ""),
        diagnose={k: float(v) for k, v in (doc.get("diagnose") or {}).items()},
        root_cause=list(doc.get("root_cause") or []),
    )


def all_scenarios() -> list[Path]:
    return sorted(SCENARIO_DIR.glob("*.yaml"))


class _SimTime:
    """The load generator's clock on simulated time (the cluster's own clock)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    def now(self) -> float:
        return self.clock.now()

    async def sleep_until(self, ts: float) -> None:
        delay = ts - self.clock.now()
        if delay > 0:
            await self.clock.sleep(delay)


class _InProcessRunner(Runner):
    """The load generator's runner whose exchange calls the replica in-process instead of
    over HTTP (virtual time): the same request bodies, headers, ids, schedule and record;
    a streaming client's token times are the engine steps that made the tokens. With a
    ``router``, each request passes its flow control before it reaches the replica."""

    def __init__(
        self,
        cfg: LoadConfig,
        clock: _SimTime,
        model: str,
        by_url: dict[str, Replica],
        router: SimRouter | None = None,
    ):
        super().__init__(cfg, None, clock, model, None, None)  # type: ignore[arg-type]
        self._by_url = by_url
        self._router = router

    async def _exchange(
        self,
        url: str,
        body: dict[str, Any],
        headers: dict[str, str],
        rec: dict[str, Any],
        token_ts: list[float],
    ) -> None:
        now = self.clock.now

        def on_tokens(req: SimRequest) -> None:
            token_ts.extend([now()] * req.new_tokens)
            req.new_tokens = 0

        kind = "chat" if self.cfg.endpoint == "chat" else "completion"
        replica = self._by_url[url]
        try:
            if self._router is not None:
                async with self._router.admit():
                    req = await replica.generate_in_process(kind, body, headers, on_tokens)
            else:
                req = await replica.generate_in_process(kind, body, headers, on_tokens)
        except ApiError as exc:
            rec["http_status"] = exc.status
            rec["status"], rec["error_type"] = "error", exc.err_type
            return
        rec["http_status"] = 200
        if req.finish_reason == "error":  # vLLM's error event in the stream
            rec["status"], rec["error_type"] = "error", "InternalServerError"
            return
        rec["finish_reason"] = req.finish_reason
        rec["prompt_tokens"], rec["output_tokens"] = req.num_prompt_tokens, req.num_output
        rec["status"] = "ok"


async def _run_load_in_process(
    cfg: LoadConfig, clock: Clock, replica: Replica, router: SimRouter | None = None
) -> list[dict[str, Any]]:
    """``run_load``'s open loop (same seeded sampler and schedule) on ``_InProcessRunner``."""
    cfg.validate()
    assert cfg.rate is not None
    rng = random.Random(cfg.seed)
    by_url = {request_url(cfg.url, cfg.endpoint): replica}
    model = cfg.model or cfg.workload.model or replica.settings.model_name
    runner = _InProcessRunner(cfg, _SimTime(clock), model, by_url, router)
    sampler = cfg.workload.sampler(rng, runner.run_id)
    schedule = make_schedule(cfg.arrival, cfg.rate, cfg.duration_s, rng)
    await runner.open_loop(clock.now(), schedule, sampler.next)
    return runner.records


@dataclass
class Collected:
    started_at: float = 0.0
    fragments: list[RequestFragment] = field(default_factory=list)
    engine: list[EngineSample] = field(default_factory=list)
    gpu: list[GpuSample] = field(default_factory=list)
    scrapes: list[ScrapeResult] = field(default_factory=list)
    router: list[RouterSample] = field(default_factory=list)

    def diagnose_args(self, sc: Scenario) -> dict[str, Any]:
        """``diagnose()`` arguments for the scenario's ``diagnose`` section."""
        from slokit.analysis.diagnose import DiagnoseOptions

        args: dict[str, Any] = {}
        if "since_s" in sc.diagnose:
            args["since"] = self.started_at + sc.diagnose["since_s"]
        if "baseline_s" in sc.diagnose:
            args["options"] = DiagnoseOptions(baseline_lookback_s=sc.diagnose["baseline_s"])
        return args

    def store_into(self, store: Store) -> None:
        store.append_fragments(self.fragments)
        store.append_engine_samples(self.engine)
        store.append_gpu_samples(self.gpu)
        store.append_scrapes(self.scrapes)
        store.append_router_samples(self.router)


async def _scrape_one(
    http: aiohttp.ClientSession, kind: str, url: str, name: str, ts: float, out: Collected
) -> None:
    """One scrape of one target, parsed as a sidecar would and recorded in ``scrapes``."""
    try:
        async with http.get(url) as resp:
            body = await resp.read()
            ok = resp.status == 200
    except aiohttp.ClientError as exc:
        ok, body = False, str(exc).encode()
    out.scrapes.append(
        ScrapeResult(
            ts=ts,
            target=url,
            kind=kind,
            replica=name,
            up=ok,
            error=None if ok else body[:80].decode(),
        )
    )
    if ok and kind == "vllm":
        out.engine.extend(parse_vllm_metrics(body, ts=ts, replica=name))
    elif ok and kind == "router":
        out.router.extend(parse_router_metrics(body, ts=ts, router=name))
    elif ok:
        out.gpu.extend(parse_dcgm_metrics(body, ts=ts))


async def _scrape_loop(
    cluster: SimCluster,
    clock: Clock,
    every_s: float,
    until: float,
    done: asyncio.Event,
    out: Collected,
) -> None:
    """Scrape every replica (and the router) until the scenario's end and every request has
    finished."""
    async with aiohttp.ClientSession() as http:
        while clock.now() < until or not done.is_set():
            for r in cluster.replicas:
                ts = clock.now()
                await _scrape_one(
                    http, "vllm", f"http://127.0.0.1:{r.port}/metrics", r.name, ts, out
                )
                await _scrape_one(
                    http, "dcgm", f"http://127.0.0.1:{r.dcgm_port}/metrics", r.name, ts, out
                )
            if cluster.router is not None:
                await _scrape_one(
                    http, "router", cluster.router.url(), ROUTER_NAME, clock.now(), out
                )
            await clock.sleep(every_s)


async def _fault_at(cluster: SimCluster, clock: Clock, t0: float, fault: FaultAt) -> None:
    await clock.sleep(max(0.0, t0 + fault.at_s - clock.now()))
    if fault.router:
        if cluster.router is None:
            raise RuntimeError(f"fault {fault.set} is for the router: set sim.router: true")
        ports = [cluster.router.port]
    else:
        targets = fault.replicas if fault.replicas is not None else range(len(cluster.replicas))
        ports = [cluster.replicas[i].port for i in targets]
    async with aiohttp.ClientSession() as http:
        for port in ports:
            async with http.post(f"http://127.0.0.1:{port}/admin/faults", json=fault.set) as resp:
                if resp.status != 200:
                    raise RuntimeError(f"fault {fault.set} refused: {await resp.text()}")


async def _phase(
    cluster: SimCluster,
    clock: Clock,
    t0: float,
    phase: Phase,
    seed: int,
    out: Collected,
    in_process: bool = False,
) -> None:
    await clock.sleep(max(0.0, t0 + phase.at_s - clock.now()))
    targets = phase.replicas if phase.replicas is not None else range(len(cluster.replicas))
    workload = (
        parse_workload_yaml(yaml.safe_dump({"workload": "v1", **phase.workload}))
        if phase.workload
        else DEFAULT_WORKLOAD
    )
    n = len(list(targets))

    async def one(i: int) -> list[dict[str, Any]]:
        cfg = LoadConfig(
            url=f"http://127.0.0.1:{cluster.replicas[i].port}",
            duration_s=phase.duration_s,
            rate=phase.rate / n,
            workload=workload,
            seed=seed * 31 + i,
            run_id=f"p{seed}r{i}",
            timeout_s=600.0,
        )
        if in_process or cluster.router is not None:  # the router admits in process
            return await _run_load_in_process(cfg, clock, cluster.replicas[i], cluster.router)
        result = await run_load(cfg, clock=_SimTime(clock))
        return result.records

    for records in await asyncio.gather(*(one(i) for i in targets)):
        text = "\n".join(json.dumps(r) for r in records)
        out.fragments.extend(parse_load_jsonl(text, name=f"phase{seed}"))


def run_scenario_virtual(sc: Scenario) -> Collected:
    """Run the scenario on virtual time (a fresh :class:`VirtualTimeLoop`)."""
    return run_virtual(run_scenario(sc, virtual=True))


async def run_scenario(sc: Scenario, *, virtual: bool = False) -> Collected:
    """Run the scenario on a fresh simulator cluster; return what a sidecar would store.

    ``virtual``: on the running :class:`VirtualTimeLoop`'s time from a fixed epoch;
    otherwise in real time at the scenario's ``speed``."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    sim = dict(sc.sim)
    replicas = int(sim.pop("replicas", 1))
    preset = sim.pop("scenario", "healthy")
    faults, engine_overrides = scenario_faults(preset)
    settings = SimSettings(
        speed=sc.speed, faults=faults, scenario=preset, **{**engine_overrides, **sim}
    )
    clock: Clock
    if virtual:
        if not isinstance(asyncio.get_running_loop(), VirtualTimeLoop):
            raise RuntimeError("virtual=True needs a VirtualTimeLoop (use run_scenario_virtual)")
        clock = LoopClock()
    else:
        clock = WallClock(sc.speed)
    exporters: list[InMemorySpanExporter] = []

    def exporter() -> InMemorySpanExporter:
        exporters.append(InMemorySpanExporter())
        return exporters[-1]

    cluster = SimCluster(
        settings,
        replicas,
        port=0,
        dcgm_port=0,
        clock_factory=lambda: clock,
        exporter_factory=exporter,
    )
    out = Collected()
    await cluster.start()
    try:
        t0 = out.started_at = clock.now()
        done = asyncio.Event()

        async def load() -> None:
            await asyncio.gather(
                *(_phase(cluster, clock, t0, p, i, out, virtual) for i, p in enumerate(sc.load))
            )
            done.set()

        await asyncio.gather(
            _scrape_loop(cluster, clock, sc.scrape_interval_s, t0 + sc.duration_s, done, out),
            load(),
            *(_fault_at(cluster, clock, t0, f) for f in sc.faults),
        )
    finally:
        await cluster.stop()
    for exp in exporters:
        spans = exp.get_finished_spans()
        if spans:
            body = encode_spans(spans).SerializeToString()
            out.fragments.extend(decode_traces(body).fragments)
    return out
