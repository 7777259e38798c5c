"""Issue 2's proof on real vLLM: records and explain agree with what the client measured.

Real vLLM (tiny model, CPU) exports its ``llm_request`` spans to an in-test OTLP receiver; the
test streams requests with ``X-Request-Id``, measures TTFT and E2E itself, scrapes /metrics
before and after, then runs the product path: ``slokit ingest otlp|metrics|requests`` and
``slokit explain``. It shares the smoke test's server configuration (one server start).
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from slokit.cli import main
from slokit.lab.otlp_capture import OtlpHttpCapture, attributes_dict
from slokit.lab.vllm_server import VllmServer

pytestmark = pytest.mark.vllm

POD = "pod-a"


@dataclass(frozen=True)
class Measured:
    request_id: str
    send_ts: float
    ttft_s: float
    e2e_s: float
    usage: dict[str, int]


@dataclass(frozen=True)
class Run:
    db: str
    measured: dict[str, Measured]
    spans: dict[str, dict[str, Any]]  # request id -> llm_request attributes (+ _start_s)


def _stream_one(client: httpx.Client, rid: str, max_tokens: int) -> Measured:
    body = {
        "model": "tiny",
        "prompt": f"records {rid} 1 2 3",
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    send = time.time()
    t0 = time.perf_counter()
    first = None
    usage: dict[str, int] = {}
    with client.stream("POST", "/v1/completions", json=body, headers={"X-Request-Id": rid}) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices") and first is None:
                first = time.perf_counter() - t0
            if chunk.get("usage"):
                usage = chunk["usage"]
    assert first is not None
    return Measured(rid, send, first, time.perf_counter() - t0, usage)


def _scrape(server: VllmServer, path: Path) -> None:
    path.write_text(httpx.get(server.base_url + "/metrics", timeout=10).text)


@pytest.fixture(scope="module")
def run(
    smoke_server: VllmServer,
    otlp_http_capture: OtlpHttpCapture,
    tmp_path_factory: pytest.TempPathFactory,
) -> Run:
    server = smoke_server
    tmp = tmp_path_factory.mktemp("records")
    tag = uuid.uuid4().hex[:8]
    measured: dict[str, Measured] = {}
    t_before = time.time()
    _scrape(server, tmp / "before.prom")
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        for i, n in enumerate((24, 64, 8, 128)):
            m = _stream_one(client, f"rec-{tag}-{i}", n)
            measured[m.request_id] = m
    t_after = time.time()
    _scrape(server, tmp / "after.prom")

    def ours(spans: list[Any]) -> dict[str, dict[str, Any]]:
        found = {}
        for _res, span in spans:
            if span.name != "llm_request":
                continue
            a = attributes_dict(span.attributes)
            rid = str(a.get("gen_ai.request.id", ""))
            for want in measured:
                if rid == f"cmpl-{want}-0":
                    found[want] = a | {"_start_s": span.start_time_unix_nano / 1e9}
        return found

    spans = ours(otlp_http_capture.wait_for(lambda s: len(ours(s)) == len(measured), 20))
    assert len(spans) == len(measured), "vLLM did not export every llm_request span"
    otlp_dir = tmp / "otlp"
    otlp_dir.mkdir()
    for i, post in enumerate(otlp_http_capture.snapshot()):
        (otlp_dir / f"export_{i:03d}.pb").write_bytes(post.payload())
    records = tmp / "client.jsonl"
    with records.open("w") as f:
        for m in measured.values():
            f.write(
                json.dumps(
                    {
                        "request_id": m.request_id,
                        "trace_id": None,
                        "model": "tiny",
                        "slo_class": "interactive",
                        "task_id": None,
                        "tenant": None,
                        "send_ts": m.send_ts,
                        "first_token_ts": m.send_ts + m.ttft_s,
                        "finish_ts": m.send_ts + m.e2e_s,
                        "ttft_s": m.ttft_s,
                        "e2e_s": m.e2e_s,
                        "itl_s": [],
                        "prompt_tokens": m.usage["prompt_tokens"],
                        "output_tokens": m.usage["completion_tokens"],
                        "max_tokens": None,
                        "status": "ok",
                        "http_status": 200,
                        "error_type": None,
                        "finish_reason": "length",
                        "scheduled_ts": m.send_ts,
                    }
                )
                + "\n"
            )
    db = str(tmp / "slokit.duckdb")
    runner = CliRunner()
    for args in (
        ["ingest", "otlp", str(otlp_dir)],
        ["ingest", "metrics", str(tmp / "before.prom"), "--instance", POD, "--ts", str(t_before)],
        ["ingest", "metrics", str(tmp / "after.prom"), "--instance", POD, "--ts", str(t_after)],
        ["ingest", "requests", str(records)],
    ):
        res = runner.invoke(main, [*args, "--db", db])
        assert res.exit_code == 0, res.output
    return Run(db, measured, spans)


def _explain(run: Run, rid: str) -> dict[str, Any]:
    res = CliRunner().invoke(main, ["explain", rid, "--json", "--db", run.db])
    assert res.exit_code == 0, res.output
    return json.loads(res.output)  # type: ignore[no-any-return]


def test_every_request_is_one_record_joining_client_and_vllm(run: Run) -> None:
    import duckdb

    con = duckdb.connect(run.db, read_only=True)
    rows = con.execute(
        "SELECT request_id, sources, replica FROM requests WHERE request_id IN "
        f"({', '.join('?' * len(run.measured))}) ORDER BY request_id",
        list(run.measured),
    ).fetchall()
    assert [r[0] for r in rows] == sorted(run.measured)
    assert all(r[1] == ["client", "vllm"] and r[2] == POD for r in rows)


def test_explain_components_equal_the_span_attributes(run: Run) -> None:
    rid = sorted(run.measured)[3]  # the 128-token request
    doc = _explain(run, f"cmpl-{rid}-0")
    a = run.spans[rid]
    c = doc["components"]
    assert c["queue_s"] == a["gen_ai.latency.time_in_queue"]
    assert c["prefill_s"] == a["gen_ai.latency.time_in_model_prefill"]
    assert c["decode_s"] == a["gen_ai.latency.time_in_model_decode"]
    assert c["ttft_s"] == a["gen_ai.latency.time_to_first_token"]
    assert c["e2e_s"] == a["gen_ai.latency.e2e"]
    assert doc["tokens"]["output_tokens"] == a["gen_ai.usage.completion_tokens"] == 128


def test_explain_agrees_with_what_the_client_measured(run: Run) -> None:
    for rid, m in run.measured.items():
        doc = _explain(run, rid)
        c = doc["components"]
        assert c["client_ttft_s"] == pytest.approx(m.ttft_s)
        assert c["client_e2e_s"] == pytest.approx(m.e2e_s)
        # The client waits at least as long as the server measured, plus loopback HTTP overhead.
        assert c["client_e2e_s"] >= c["e2e_s"] - 0.005
        assert c["client_s"] == pytest.approx(m.e2e_s - c["e2e_s"], abs=1e-9)
        assert c["client_s"] < 0.5
        assert abs(c["client_ttft_s"] - c["ttft_s"]) < 0.5
        assert doc["tokens"]["prompt_tokens"] == m.usage["prompt_tokens"]


def test_explain_has_the_replica_state_from_the_scrape(run: Run) -> None:
    doc = _explain(run, sorted(run.measured)[0])
    state = doc["context"]["replica_state_at_arrival"]
    assert state is not None and state["kv_usage_ratio"] is not None
    assert doc["context"]["during"]["samples"] >= 0
    assert not any("no engine samples" in u for u in doc["unknown"])
