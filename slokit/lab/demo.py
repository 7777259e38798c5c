"""``slokit demo``: the main job of slokit on one machine, no GPU, no network.

Two simulated vLLM replicas (each with a dcgm-exporter endpoint) export their ``llm_request``
spans to a slokit sidecar, which scrapes them every second and merges everything into one
DuckDB file. A load generator drives a quiet baseline, then an incident: a burst that saturates
replica 0's queue while replica 1's KV pool shrinks. The demo then runs the commands an
on-call engineer would (``diagnose``, ``slo report``, ``explain`` of the worst request,
``report``), printing each command before its output.

With ``engine="vllm"`` the replicas are real vLLM servers on the CPU (needs ``.venv-vllm``,
see scripts/vllm-env.sh); there is no GPU exporter and no KV fault then, and the burst is
scaled to what a CPU serves.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from slokit.data import data_path
from slokit.errors import SlokitError
from slokit.lab.load import LoadConfig, run_load
from slokit.lab.tiny_model import build_with_interpreter, default_model_dir
from slokit.lab.vllm_server import (
    VllmServer,
    VllmServerConfig,
    start_together,
    vllm_available,
    vllm_python,
)
from slokit.lab.workload import load_workload
from slokit.store.db import open_store
from slokit.timeutil import iso

# Package data (slokit/data, copies of examples/slo/chat.yaml and examples/workloads/), so the
# demo runs from an installed wheel as well as from a checkout.
DEFAULT_SLO = data_path("slo/chat.yaml")
DEFAULT_WORKLOAD = data_path("workloads/chat_mix.yaml")
#: The same mix in the tiny CPU model's tokens (its tokenizer makes ~2.9 tokens of a word).
TINY_WORKLOAD = data_path("workloads/chat_mix_tiny.yaml")

Echo = Callable[[str], None]


@dataclass(frozen=True)
class Phase:
    """One stretch of load: a rate per replica, and faults applied when it starts."""

    name: str
    duration_s: float
    rates: tuple[float, ...]
    faults: tuple[dict[str, Any] | None, ...] = ()


@dataclass(frozen=True)
class DemoConfig:
    out_dir: Path = Path("demo-out")
    engine: str = "sim"  # "sim" | "vllm"
    scale: float = 1.0  # multiplies every phase's duration (CI smoke tests use less)
    slo: Path = DEFAULT_SLO
    workload: Path = DEFAULT_WORKLOAD
    phases: tuple[Phase, ...] = field(
        default_factory=lambda: (
            # Longer than three of diagnose's 10 s buckets, so that the incident is judged
            # against this quiet history (diagnose --since the incident's start).
            Phase("baseline", 35.0, (4.0, 4.0)),
            Phase("incident", 25.0, (40.0, 8.0), (None, {"kv_blocks": 120})),
        )
    )
    python: str = sys.executable
    #: The load generator's per-request timeout. A request it abandons is a failure the
    #: client felt (status ``timeout``), so it must stay well above the queueing the
    #: incident is meant to cause, or the demo reports its own impatience as an error burst.
    request_timeout_s: float = 60.0
    #: How long each phase's requests in flight may still finish after it ends (before the
    #: next phase starts); the rest are cut and recorded ``incomplete``, not as errors. At the
    #: default scale every phase's duration plus this stays below ``request_timeout_s``, so
    #: what a phase's end takes away is incomplete, never a timeout.
    drain_s: float = 30.0


def free_port_block(n: int, host: str = "127.0.0.1", avoid: Collection[int] = ()) -> int:
    """A base port such that base..base+n-1 are all free now and none is in ``avoid``
    (ports already handed out but not bound yet: the OS may offer them again)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind((host, 0))
            base = s.getsockname()[1]
        if base + n > 65535 or any(p in avoid for p in range(base, base + n)):
            continue
        ok = True
        for p in range(base, base + n):
            with socket.socket() as t:
                try:
                    t.bind((host, p))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise SlokitError("no block of free ports found")


def _wait_http(url: str, timeout_s: float, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SlokitError(
                f"{url}: process exited ({proc.returncode}); see {log}:\n" + _tail(log)
            )
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        time.sleep(0.2)
    raise SlokitError(f"{url} not ready after {timeout_s:.0f} s; see {log}:\n" + _tail(log))


def _tail(log: Path, n: int = 15) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


@contextlib.contextmanager
def _process(cmd: list[str], log: Path, echo: Echo) -> Iterator[subprocess.Popen[bytes]]:
    echo(f"$ {shlex.join(cmd)}  > {log}")
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield proc
    finally:
        stop_process(proc)


def stop_process(proc: subprocess.Popen[bytes], timeout_s: float = 20.0) -> None:
    """SIGTERM (a graceful stop: the sidecar flushes its writer), then SIGKILL."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _slokit(cfg: DemoConfig, *args: str) -> list[str]:
    return [cfg.python, "-m", "slokit", *args]


async def _drive(
    cfg: DemoConfig, urls: list[str], otlp: str, echo: Echo
) -> tuple[list[Any], dict[str, float]]:
    """Run the phases one after another; the load summaries and each phase's start time."""
    workload = load_workload(cfg.workload)
    summaries = []
    starts: dict[str, float] = {}
    for n, phase in enumerate(cfg.phases):
        starts[phase.name] = time.time()
        duration = phase.duration_s * cfg.scale
        echo(
            f"-- load phase {phase.name!r}: {duration:.0f} s, "
            + ", ".join(f"{r:g} req/s -> {u}" for r, u in zip(phase.rates, urls, strict=False))
        )
        async with httpx.AsyncClient(timeout=5.0) as client:
            for url, faults in zip(urls, phase.faults, strict=False):
                if faults and cfg.engine == "sim":
                    echo(f"   fault on {url}: {faults}")
                    (await client.post(f"{url}/admin/faults", json=faults)).raise_for_status()
        runs = [
            run_load(
                LoadConfig(
                    url=url,
                    duration_s=duration,
                    rate=rate,
                    workload=workload,
                    seed=10 * n + i,
                    run_id=f"{phase.name}{i}",
                    otlp_endpoint=otlp,
                    out=cfg.out_dir / f"load-{phase.name}-{i}.jsonl",
                    keep_records=False,
                    timeout_s=cfg.request_timeout_s,
                    drain_s=cfg.drain_s,
                )
            )
            for i, (url, rate) in enumerate(zip(urls, phase.rates, strict=False))
            if rate > 0
        ]
        for res in await asyncio.gather(*runs):
            s = res.summary
            echo(
                f"   {s.run_id}: sent {s.sent}, ok {s.ok}, {s.errors_text()}, "
                f"timeouts {s.timeouts}, incomplete {s.incomplete}, "
                f"TTFT p50 {_ms(s.ttft_p50_s)} p95 {_ms(s.ttft_p95_s)}"
            )
            summaries.append(s)
    return summaries, starts


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.0f} ms"


def _worst_request(db: Path) -> str | None:
    """The interactive request that waited longest for its first token."""
    with open_store(db, read_only=True) as store:
        return store.reader().slowest_request(source="vllm")


def _run_cli(cfg: DemoConfig, echo: Echo, *args: str) -> int:
    cmd = _slokit(cfg, *args)
    echo("")
    echo(f"$ slokit {shlex.join(args)}")
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    for line in (res.stdout + res.stderr).rstrip().splitlines():
        echo(line)
    return res.returncode


def _take(taken: set[int], n: int = 1) -> int:
    """The base of ``n`` free ports not handed out yet, now handed out."""
    base = free_port_block(n, avoid=taken)
    taken.update(range(base, base + n))
    return base


def _start_engines(
    cfg: DemoConfig, stack: contextlib.ExitStack, otlp: str, echo: Echo, taken: set[int]
) -> tuple[list[str], list[str], list[str]]:
    """Start the replicas on ``stack`` (closing it stops them, flushing their spans) on ports
    not in ``taken`` (added to it); returns (base URLs, sidecar --vllm-url args, --dcgm-url
    args)."""
    logs = cfg.out_dir
    if cfg.engine == "sim":
        port, dcgm = _take(taken, 2), _take(taken, 2)
        proc = stack.enter_context(
            _process(
                _slokit(
                    cfg,
                    "sim",
                    "--replicas",
                    "2",
                    "--port",
                    str(port),
                    "--dcgm-port",
                    str(dcgm),
                    "--otlp-endpoint",
                    otlp,
                    "--otlp-protocol",
                    "http/protobuf",
                    "--scenario",
                    "queue_saturation",
                ),
                logs / "sim.log",
                echo,
            )
        )
        urls = [f"http://127.0.0.1:{port + i}" for i in range(2)]
        for u in urls:
            _wait_http(u + "/health", 60, proc, logs / "sim.log")
        vllm_args = [f"sim-vllm-{i}={u}/metrics" for i, u in enumerate(urls)]
        dcgm_args = [f"http://127.0.0.1:{dcgm + i}/metrics" for i in range(2)]
        return urls, vllm_args, dcgm_args
    if cfg.engine == "vllm":
        if not vllm_available():
            raise SlokitError("real vLLM is not installed: run `make vllm-env` first")
        model_dir = default_model_dir()
        build_with_interpreter(model_dir, vllm_python())
        servers = {
            pod: VllmServer(
                VllmServerConfig(
                    model_dir=model_dir,
                    max_num_seqs=2,
                    # The tiny model's own limit; its workload (chat_mix_tiny.yaml) stays
                    # below ~1,800 tokens a request, so 64 blocks of 128 hold both
                    # sequences (no KV pressure in this demo).
                    max_model_len=4096,
                    num_gpu_blocks_override=64,
                    otlp_traces_endpoint=otlp,
                    otlp_protocol="http/protobuf",
                    otel_resource_attributes=(("k8s.pod.name", pod),),
                    otel_bsp_schedule_delay_ms=500,
                ),
                port=_take(taken),
                log_path=logs / f"{pod}.log",
            )
            for pod in ("vllm-0", "vllm-1")
        }
        for server in servers.values():
            stack.callback(server.stop)
        start_together(list(servers.values()))
        urls, vllm_args = [], []
        for pod, server in servers.items():
            echo(f"   real vLLM {pod} on {server.base_url}")
            urls.append(server.base_url)
            vllm_args.append(f"{pod}={server.base_url}/metrics")
        return urls, vllm_args, []
    raise SlokitError(f"unknown engine {cfg.engine!r}: sim or vllm")


def run_demo(cfg: DemoConfig, echo: Echo = print) -> int:
    """Run the demo; returns 0 when every step answered."""
    t0 = time.monotonic()
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    db = cfg.out_dir / "slokit.duckdb"
    for stale in (db, db.with_suffix(".duckdb.wal")):
        stale.unlink(missing_ok=True)
    if cfg.engine == "vllm":
        cfg = DemoConfig(
            **{
                **cfg.__dict__,
                "workload": TINY_WORKLOAD if cfg.workload == DEFAULT_WORKLOAD else cfg.workload,
                # A baseline longer than diagnose's own (the first 40 s of the window), so
                # that the baseline it compares with ends before the burst. The burst, 12
                # req/s, is past what vllm-0 (2 sequences) serves on a 2-core machine: one of
                # 2026-12 served about 7.6 req/s of this mix even beside two busy loops (at
                # 8 req/s its queue peaked at 8 and TTFT p95 rose only 2.9x over a baseline
                # the loops had inflated: not a warning), an older one about 1.5 (the burst
                # then drains in ~160 s). The clients wait for their turn instead of giving
                # up, so both the drain and the timeout stay long: every request of the burst
                # is answered, which the demo shows. A phase plus its drain (at most 285 s)
                # stays below the timeout, so nothing the generator cuts reads as a timeout.
                "phases": (
                    Phase("baseline", 45.0, (1.0, 1.0)),
                    Phase("incident", 20.0, (12.0, 1.0)),
                ),
                "request_timeout_s": 300.0,
                "drain_s": 240.0,
            }
        )
    taken: set[int] = set()
    otlp_port, api_port = _take(taken), _take(taken)
    otlp = f"http://127.0.0.1:{otlp_port}/v1/traces"
    api = f"http://127.0.0.1:{api_port}"
    echo(f"slokit demo ({cfg.engine}): output in {cfg.out_dir}/")
    with contextlib.ExitStack() as stack, contextlib.ExitStack() as engines:
        urls, vllm_args, dcgm_args = _start_engines(cfg, engines, otlp, echo, taken)
        sidecar_cmd = _slokit(
            cfg,
            "sidecar",
            "--otlp-http",
            f"127.0.0.1:{otlp_port}",
            "--otlp-grpc",
            "",
            "--listen",
            f"127.0.0.1:{api_port}",
            "--db",
            str(db),
            "--slo",
            str(cfg.slo),
            "--replica",
            "demo",
            "--scrape-interval",
            "1",
            *[a for u in vllm_args for a in ("--vllm-url", u)],
            *[a for u in dcgm_args for a in ("--dcgm-url", u)],
        )
        sidecar = stack.enter_context(_process(sidecar_cmd, cfg.out_dir / "sidecar.log", echo))
        _wait_http(api + "/readyz", 60, sidecar, cfg.out_dir / "sidecar.log")
        echo(f"   sidecar ready: {api}/metrics, OTLP/HTTP {otlp}")
        _, starts = asyncio.run(_drive(cfg, urls, otlp, echo))
        echo("-- stopping the replicas (they flush their last spans to the sidecar)")
        engines.close()
        with contextlib.suppress(httpx.HTTPError):
            sli = [
                ln
                for ln in httpx.get(api + "/metrics", timeout=5).text.splitlines()
                if ln.startswith("slokit_requests_total{")
            ]
            echo(f"   sidecar SLI series: {len(sli)} (slokit_requests_total)")
        echo("-- stopping the sidecar (it flushes and closes the DuckDB file)")
        stop_process(sidecar)
    rc = 0
    # The incident judged against the quiet history before it (the baseline phase).
    incident = iso(starts[cfg.phases[-1].name]) or ""
    rc |= _run_cli(cfg, echo, "diagnose", "--save", "--since", incident, "--db", str(db))
    rc |= _run_cli(cfg, echo, "slo", "report", "--slo", str(cfg.slo), "--db", str(db))
    worst = _worst_request(db)
    if worst:
        rc |= _run_cli(cfg, echo, "explain", worst, "--slo", str(cfg.slo), "--db", str(db))
    report = cfg.out_dir / "report.html"
    rc |= _run_cli(
        cfg, echo, "report", "--out", str(report), "--slo", str(cfg.slo), "--db", str(db)
    )
    echo("")
    echo(f"records:    {db}  (slokit explain ID --db {db})")
    echo(f"report:     {report}")
    echo(f"dashboards: slokit dashboards build --slo {cfg.slo} --out DIR  (Grafana JSON)")
    echo(f"alerts:     slokit alerts build --slo {cfg.slo} --out DIR  (Prometheus rules)")
    echo(f"demo took {time.monotonic() - t0:.0f} s")
    return 0 if rc == 0 else 1
