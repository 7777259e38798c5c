"""The load runner against a vLLM-like SSE server on 127.0.0.1 (see conftest.py)."""

from __future__ import annotations

import asyncio
import json
import re
import statistics
from pathlib import Path
from typing import Any

import pytest
from load_fake_server import FakeVllm, serve_fake_vllm

import slokit.lab.load.run as load_run
from slokit.lab.load import (
    RECORD_KEYS,
    LoadConfig,
    LoadResult,
    format_summary,
    format_sweep_table,
    run_load,
    run_sweep,
    sweep_out_path,
)
from slokit.lab.workload import parse_prompts_jsonl, parse_workload_yaml

TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-01$")


def _workload(output: int = 5, input_: int = 8) -> Any:
    return parse_workload_yaml(
        f"classes:\n  - {{name: chat, slo_class: interactive, input: {input_}, output: {output}}}\n"
    )


def _run(config: LoadConfig, **kw: Any) -> LoadResult:
    return asyncio.run(run_load(config, **kw))


def _config(server: FakeVllm, **kw: Any) -> LoadConfig:
    base: dict[str, Any] = {
        "url": server.url,
        "duration_s": 0.5,
        "rate": 10.0,
        "workload": _workload(),
        "run_id": "t1",
        "timeout_s": 5.0,
    }
    base.update(kw)
    return LoadConfig(**base)


def test_ttft_itl_and_e2e_match_the_servers_delays(fake_vllm: FakeVllm) -> None:
    # The client cannot see a token before the server writes it: tight bounds per request,
    # against the times the server itself stamped before each write (on a busy machine its
    # sleeps run long). How much later the client sees it is the loopback and a shared
    # machine's scheduling: bounded on the median of the requests, so one request caught
    # behind other work does not fail it, while a client that timed the wrong chunk would.
    fake_vllm.behaviour.ttft_s = 0.10
    fake_vllm.behaviour.itl_s = 0.05
    result = _run(_config(fake_vllm, rate=4.0, duration_s=1.0, workload=_workload(output=6)))
    assert len(result.records) == 4
    served = {r["headers"]["x-request-id"]: r["token_ts"] for r in fake_vllm.received}
    clocks = 0.002  # the client's clock and the server's time.time(), anchored apart
    first_lags, last_lags = [], []
    for rec in result.records:
        assert rec["status"] == "ok"
        writes = served[rec["request_id"]]
        assert len(writes) == 6
        assert rec["ttft_s"] >= 0.10
        assert len(rec["itl_s"]) == 5
        last_token_ts = rec["first_token_ts"] + sum(rec["itl_s"])
        assert rec["first_token_ts"] >= writes[0] - clocks
        assert last_token_ts >= writes[-1] - clocks
        first_lags.append(rec["first_token_ts"] - writes[0])
        last_lags.append(last_token_ts - writes[-1])
        assert rec["e2e_s"] >= rec["ttft_s"] + sum(rec["itl_s"])
        assert rec["first_token_ts"] == pytest.approx(rec["send_ts"] + rec["ttft_s"])
        assert rec["finish_ts"] == pytest.approx(rec["send_ts"] + rec["e2e_s"])
        assert rec["finish_ts"] >= writes[-1] - clocks
    # Seen within 50 ms (one token's gap) of being written, for most requests.
    assert statistics.median(first_lags) < 0.05
    assert statistics.median(last_lags) < 0.05


def test_token_counts_and_finish_reason_come_from_the_stream(fake_vllm: FakeVllm) -> None:
    rec = _run(_config(fake_vllm, rate=2.0, workload=_workload(output=7, input_=12))).records[0]
    assert rec["output_tokens"] == 7
    assert rec["prompt_tokens"] == 12
    assert rec["max_tokens"] == 7
    assert rec["finish_reason"] == "length"
    assert rec["http_status"] == 200
    assert rec["model"] == "tiny"  # discovered from /v1/models
    assert rec["slo_class"] == "interactive"


def test_requests_stream_with_usage_and_ignore_eos(fake_vllm: FakeVllm) -> None:
    _run(_config(fake_vllm, rate=2.0))
    body = fake_vllm.received[0]["body"]
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["ignore_eos"] is True
    assert body["max_tokens"] == 5
    assert body["model"] == "tiny"


def test_every_request_carries_its_id_and_a_fresh_w3c_traceparent(fake_vllm: FakeVllm) -> None:
    result = _run(_config(fake_vllm, rate=10.0, duration_s=0.5))
    sent = [r["headers"] for r in fake_vllm.received]
    assert sorted(h["x-request-id"] for h in sent) == [f"t1-{i}" for i in range(1, 6)]
    parents = [TRACEPARENT.match(h["traceparent"]) for h in sent]
    assert all(parents)
    trace_ids = {m.group(1) for m in parents if m}
    assert len(trace_ids) == 5 and "0" * 32 not in trace_ids
    by_id = {h["x-request-id"]: h["traceparent"] for h in sent}
    for rec in result.records:
        assert by_id[rec["request_id"]].split("-")[1] == rec["trace_id"]


def _sequence_numbers(server: FakeVllm) -> list[int]:
    return sorted(int(r["headers"]["x-request-id"].rsplit("-", 1)[1]) for r in server.received)


def test_several_urls_get_the_requests_round_robin(
    fake_vllm: FakeVllm, vllm_fixtures: Path
) -> None:
    with serve_fake_vllm(vllm_fixtures) as second:
        result = _run(
            _config(
                fake_vllm, more_urls=(second.url,), arrival="constant", rate=10.0, duration_s=0.6
            )
        )
    assert len(result.records) == 6
    assert all(r["status"] == "ok" for r in result.records)
    assert _sequence_numbers(fake_vllm) == [1, 3, 5]
    assert _sequence_numbers(second) == [2, 4, 6]


def test_extra_headers_are_sent(fake_vllm: FakeVllm) -> None:
    _run(_config(fake_vllm, rate=2.0, headers={"Authorization": "Bearer k"}))
    assert fake_vllm.received[0]["headers"]["authorization"] == "Bearer k"


def test_records_have_exactly_the_contract_keys_in_order(
    fake_vllm: FakeVllm, tmp_path: Path
) -> None:
    out = tmp_path / "rec.jsonl"
    _run(_config(fake_vllm, rate=6.0, out=out))
    lines = out.read_text().splitlines()
    assert len(lines) == 3
    for line in lines:
        rec = json.loads(line)
        assert tuple(rec) == RECORD_KEYS
        for key in ("send_ts", "first_token_ts", "finish_ts", "scheduled_ts", "ttft_s", "e2e_s"):
            assert isinstance(rec[key], float)
        assert rec["send_ts"] > 1.7e9  # Unix epoch seconds
        assert all(isinstance(x, float) for x in rec["itl_s"])


def test_an_http_400_is_an_error_record_with_vllms_error_type(fake_vllm: FakeVllm) -> None:
    fake_vllm.behaviour.status = 400
    rec = _run(_config(fake_vllm, rate=2.0)).records[0]
    assert rec["status"] == "error"
    assert rec["http_status"] == 400
    assert rec["error_type"] == "BadRequestError"
    assert rec["ttft_s"] is None and rec["first_token_ts"] is None
    assert rec["itl_s"] == []
    assert rec["e2e_s"] is not None


def test_an_http_500_without_a_json_body_is_an_error_record(fake_vllm: FakeVllm) -> None:
    fake_vllm.behaviour.status = 500
    result = _run(_config(fake_vllm, rate=2.0))
    rec = result.records[0]
    assert (rec["status"], rec["http_status"], rec["error_type"]) == ("error", 500, "http_500")
    assert result.summary.errors == 1 and result.summary.ok == 0


def test_a_request_past_its_timeout_is_a_timeout_record(fake_vllm: FakeVllm) -> None:
    fake_vllm.behaviour.ttft_s = 1.0
    rec = _run(_config(fake_vllm, rate=2.0, timeout_s=0.3)).records[0]
    assert rec["status"] == "timeout"
    assert rec["http_status"] == 200  # headers came back, tokens did not
    assert rec["e2e_s"] == pytest.approx(0.3, abs=0.1)
    assert rec["output_tokens"] is None


def test_a_stream_that_ends_without_done_is_an_error(fake_vllm: FakeVllm) -> None:
    fake_vllm.behaviour.truncate_after = 2
    rec = _run(_config(fake_vllm, rate=2.0)).records[0]
    assert rec["status"] == "error"
    assert rec["error_type"] == "stream_truncated"
    assert rec["ttft_s"] is not None


def test_a_refused_connection_is_an_error_record() -> None:
    cfg = LoadConfig(url="http://127.0.0.1:9", duration_s=0.5, rate=2.0, model="m", timeout_s=2.0)
    rec = _run(cfg).records[0]
    assert rec["status"] == "error"
    assert rec["error_type"] == "connect_error"
    assert rec["http_status"] is None


def test_chat_ttft_ignores_the_role_chunk_sent_before_the_first_token(fake_vllm: FakeVllm) -> None:
    fake_vllm.behaviour.ttft_s = 0.15
    rec = _run(_config(fake_vllm, rate=2.0, endpoint="chat")).records[0]
    assert fake_vllm.received[0]["body"]["messages"][0]["role"] == "user"
    assert rec["status"] == "ok"
    # The role chunk comes at once, the first token after the server's 0.15 s: TTFT is the
    # latter (a busy machine can only add to it).
    assert rec["ttft_s"] >= 0.15
    assert len(rec["itl_s"]) == 4


def test_the_open_loop_keeps_its_schedule_when_the_server_is_slow(fake_vllm: FakeVllm) -> None:
    fake_vllm.behaviour.ttft_s = 0.5  # each answer takes longer than the gap between sends
    result = _run(_config(fake_vllm, rate=20.0, duration_s=1.0, arrival="constant"))
    sends = sorted(r["send_ts"] for r in result.records)
    assert len(sends) == 20
    lags = [r["send_ts"] - r["scheduled_ts"] for r in result.records]
    # A sender that waited for answers would fall the server's 0.5 s further behind on every
    # request: 9.5 s by the last, its sends 9.5 s apart. Half that is the bound: relative to
    # the server's own delay, not to the wall clock, so a starved CI machine (a 0.34 s lag
    # was seen with both cores busy) does not fail it while a waiting sender still would.
    waiting = fake_vllm.behaviour.ttft_s * (len(sends) - 1)
    assert max(lags) < waiting / 2
    assert sends[-1] - sends[0] < waiting / 2


def test_an_idle_connection_is_given_up_before_vllm_closes_it() -> None:
    # vLLM's server closes a connection idle for 5 s (VLLM_HTTP_TIMEOUT_KEEP_ALIVE); one the
    # client reuses at that moment fails the request without reaching vLLM
    assert load_run.KEEPALIVE_S < 5.0


def test_a_connection_idle_past_the_keepalive_is_not_reused(
    fake_vllm: FakeVllm, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(load_run, "KEEPALIVE_S", 0.01)
    cfg = _config(fake_vllm, rate=4.0, duration_s=0.75, arrival="constant",
                  workload=_workload(output=1))  # fmt: skip
    result = _run(cfg)
    assert [r["status"] for r in result.records] == ["ok"] * 3
    peers = [r["peer"] for r in fake_vllm.received]  # 0.25 s apart: each on a new connection
    assert len(set(peers)) == 3, peers


def test_a_connection_idle_within_the_keepalive_is_reused(fake_vllm: FakeVllm) -> None:
    cfg = _config(fake_vllm, rate=4.0, duration_s=0.75, arrival="constant",
                  workload=_workload(output=1))  # fmt: skip
    _run(cfg)
    peers = [r["peer"] for r in fake_vllm.received]  # what the test above rules out
    assert len(set(peers)) < 3, peers


def test_errors_are_summarised_by_their_type(fake_vllm: FakeVllm) -> None:
    fake_vllm.behaviour.status = 500
    summary = _run(_config(fake_vllm, rate=4.0, duration_s=0.75, arrival="constant")).summary
    assert summary.error_types == {"http_500": 3}
    assert summary.errors_text() == "errors 3 (http_500: 3)"


def test_closed_loop_users_send_back_to_back(fake_vllm: FakeVllm) -> None:
    fake_vllm.behaviour.ttft_s = 0.1
    cfg = _config(fake_vllm, rate=None, users=2, duration_s=0.45, workload=_workload(output=1))
    result = _run(cfg)
    # Back to back: never more than the 2 users' requests in flight, each user sends again
    # as soon as its answer is in (at most 5 of ~0.1 s into 0.45 s each; fewer when the
    # machine is busy, never fewer than one per user).
    assert 2 <= len(result.records) <= 10
    spans = sorted((r["send_ts"], r["finish_ts"]) for r in result.records)
    for i, (send, _) in enumerate(spans):
        assert sum(1 for s0, f0 in spans[:i] if f0 > send) < 2, spans
    assert all(r["scheduled_ts"] is None for r in result.records)
    assert result.summary.mode == "closed"


def test_jsonl_prompts_are_sent_with_their_labels(fake_vllm: FakeVllm) -> None:
    w = parse_prompts_jsonl(
        '{"prompt": "hello there", "max_tokens": 3, "slo_class": "x", "tenant": "t"}\n'
    )
    rec = _run(_config(fake_vllm, rate=2.0, workload=w)).records[0]
    body = fake_vllm.received[0]["body"]
    assert body["prompt"] == "hello there" and "ignore_eos" not in body
    assert (rec["slo_class"], rec["tenant"], rec["output_tokens"]) == ("x", "t", 3)


def test_client_spans_use_the_sent_ids_and_carry_the_contract_attributes(
    fake_vllm: FakeVllm,
) -> None:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import SpanKind

    exporter = InMemorySpanExporter()
    result = _run(_config(fake_vllm, rate=4.0), span_exporter=exporter)
    spans = exporter.get_finished_spans()
    assert len(spans) == len(result.records) == 2
    sent = {r["headers"]["x-request-id"]: r["headers"]["traceparent"] for r in fake_vllm.received}
    for span in spans:
        attrs = dict(span.attributes or {})
        rid = attrs["slokit.request_id"]
        assert span.kind == SpanKind.CLIENT
        assert sent[rid] == f"00-{span.context.trace_id:032x}-{span.context.span_id:016x}-01"
        assert attrs["http.request.method"] == "POST"
        assert attrs["http.response.status_code"] == 200
        assert attrs["url.full"] == f"{fake_vllm.url}/v1/completions"
        assert attrs["gen_ai.request.model"] == "tiny"
        assert attrs["gen_ai.usage.input_tokens"] == 8
        assert attrs["gen_ai.usage.output_tokens"] == 5
        assert attrs["slokit.slo_class"] == "interactive"
        assert isinstance(attrs["slokit.client.ttft_s"], float)
    rec = result.records[0]
    span = next(s for s in spans if s.attributes["slokit.request_id"] == rec["request_id"])  # type: ignore[index]
    assert span.start_time == int(rec["send_ts"] * 1e9)


def test_a_sweep_writes_one_file_per_rate_and_summarises_each(
    fake_vllm: FakeVllm, tmp_path: Path
) -> None:
    out = tmp_path / "sweep.jsonl"
    results = asyncio.run(run_sweep(_config(fake_vllm, out=out, duration_s=0.5), [4.0, 8.0]))
    assert [r.summary.target_rate for r in results] == [4.0, 8.0]
    assert len(sweep_out_path(out, 4.0).read_text().splitlines()) == 2
    assert len(sweep_out_path(out, 8.0).read_text().splitlines()) == 4
    ids = [r["request_id"] for res in results for r in res.records]
    assert len(set(ids)) == len(ids) == 6
    table = format_sweep_table([r.summary for r in results]).splitlines()
    assert table[0].split()[:2] == ["rate", "achieved"]
    assert [row.split()[0] for row in table[1:]] == ["4", "8"]


def test_the_summary_counts_outcomes_and_reports_latency_percentiles(fake_vllm: FakeVllm) -> None:
    fake_vllm.behaviour.ttft_s = 0.05
    result = _run(_config(fake_vllm, rate=10.0))
    s = result.summary
    assert (s.sent, s.ok, s.errors, s.timeouts) == (5, 5, 0, 0)
    # The server holds each first token 50 ms: a floor; the p50 is the records' own median
    # (a busy machine adds client time, never removes the server's).
    ttfts = sorted(r["ttft_s"] for r in result.records)
    assert s.ttft_p50_s == pytest.approx(ttfts[2]) and s.ttft_p50_s >= 0.05
    assert s.output_tokens == 25
    text = format_summary(s)
    assert "sent 5  ok 5" in text and "TTFT" in text


def test_with_a_fake_clock_every_send_happens_exactly_at_its_scheduled_time(
    fake_vllm: FakeVllm,
) -> None:
    class FakeClock:
        t = 1_800_000_000.0

        def now(self) -> float:
            return self.t

        async def sleep_until(self, ts: float) -> None:
            self.t = max(self.t, ts)

    result = _run(_config(fake_vllm, rate=5.0, duration_s=2.0), clock=FakeClock())
    assert len(result.records) == 10
    assert [r["send_ts"] for r in result.records] == [r["scheduled_ts"] for r in result.records]
    assert result.summary.send_lag_max_s == 0.0
    assert result.summary.achieved_rate == pytest.approx(5.0)


def test_a_replayed_vllm_stream_counts_every_engine_step_including_empty_text(
    fake_vllm: FakeVllm,
) -> None:
    fake_vllm.behaviour.replay = "completion_stream.http"
    fake_vllm.behaviour.itl_s = 0.01
    rec = _run(_config(fake_vllm, rate=2.0)).records[0]
    assert rec["status"] == "ok"
    assert (rec["prompt_tokens"], rec["output_tokens"], rec["finish_reason"]) == (4, 6, "length")
    assert len(rec["itl_s"]) == 5  # six chunks with choices (one with empty text): five gaps


def test_a_replayed_vllm_chat_stream_skips_the_role_chunk(fake_vllm: FakeVllm) -> None:
    fake_vllm.behaviour.replay = "chat_stream.http"
    rec = _run(_config(fake_vllm, rate=2.0, endpoint="chat")).records[0]
    assert (rec["status"], rec["output_tokens"]) == ("ok", 6)
    assert len(rec["itl_s"]) == 5  # six content chunks after the role chunk


def test_records_are_read_back_by_slokit_ingest_requests(
    fake_vllm: FakeVllm, tmp_path: Path
) -> None:
    from slokit.sources.files import parse_requests_file

    fake_vllm.behaviour.ttft_s = 0.05
    out = tmp_path / "rec.jsonl"
    result = _run(_config(fake_vllm, rate=6.0, out=out))
    fragments = parse_requests_file(out.read_bytes(), name=str(out))
    by_id = {f.request_id: f for f in fragments}
    assert sorted(by_id) == sorted(r["request_id"] for r in result.records)
    for rec in result.records:
        frag = by_id[rec["request_id"]]
        assert frag.source == "client"
        assert frag.trace_id == rec["trace_id"]
        assert frag.client_ttft_s == rec["ttft_s"]
        assert frag.arrival_ts == rec["send_ts"]
        assert (frag.status, frag.output_tokens) == ("ok", 5)


def test_otlp_endpoint_exports_client_spans_over_http_protobuf(fake_vllm: FakeVllm) -> None:
    from slokit.lab.otlp_capture import OtlpHttpCapture, attributes_dict

    with OtlpHttpCapture() as capture:
        base = capture.endpoint.removesuffix("/v1/traces")  # the path is added when missing
        result = _run(_config(fake_vllm, rate=6.0, otlp_endpoint=base))
        spans = capture.spans()  # run_load flushes its exporter before returning
    assert capture.posts[0].headers["content-type"] == "application/x-protobuf"
    ids = {attributes_dict(s.attributes)["slokit.request_id"] for _, s in spans}
    assert ids == {r["request_id"] for r in result.records}
    assert {res.get("service.name") for res, _ in spans} == {"slokit-load"}
