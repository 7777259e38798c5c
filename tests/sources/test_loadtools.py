"""Load tools' per-request files (AIPerf, GuideLLM, inference-perf) -> client fragments, told
apart by content; their aggregates refused with the file to give instead.

The files under tests/fixtures/loadtools/ follow each tool's source schema (see its README).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from slokit.errors import BadInput
from slokit.ids import checked_request_id
from slokit.sources import loadtools
from slokit.sources.files import parse_requests_file, read_text
from slokit.sources.runs import load_run_file

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "loadtools"
NOW = 1767225600.0 + 86400.0


def _read(name: str) -> str:
    return (FIXTURES / name).read_text()


def _parse(name: str, *, as_name: str | None = None) -> list:
    return parse_requests_file(_read(name), name=as_name or name, now=NOW)


# --- recognised by content, not by name --------------------------------------------------


@pytest.mark.parametrize(
    ("fixture", "tool"),
    [
        ("aiperf-profile_export.jsonl", "AIPerf"),
        ("guidellm-benchmarks.json", "GuideLLM"),
        ("inference-perf-per_request_lifecycle_metrics.json", "inference-perf"),
    ],
)
def test_each_tools_file_is_recognised_by_content_whatever_its_name(fixture, tool):
    imp = loadtools.detect(_read(fixture))
    assert imp is not None and tool == imp.TOOL
    renamed = _parse(fixture, as_name="results.txt")
    assert renamed and {f.source for f in renamed} == {"client"}


def test_slokit_jsonl_and_vllm_bench_are_no_tools_file(data_dir):
    assert loadtools.detect((data_dir / "vllm-bench-tiny.json").read_text()) is None
    line = json.dumps({"request_id": "r1", "status": "ok"})
    assert loadtools.detect(line + "\n") is None
    assert parse_requests_file(line + "\n", name="l.jsonl")[0].request_id == "r1"


# --- AIPerf profile_export.jsonl ---------------------------------------------------------------


def test_aiperf_records_keep_x_request_id_times_and_figures():
    frags = {f.request_id: f for f in _parse("aiperf-profile_export.jsonl")}
    # aiperf-req-0 is a warmup record: AIPerf's statistics leave it out, and so does slokit
    assert sorted(frags) == [f"aiperf-req-{i}" for i in range(1, 6)]
    f = frags["aiperf-req-1"]
    assert f.status == "ok" and f.arrival_ts == pytest.approx(1767225601.0)
    assert f.client_ttft_s == pytest.approx(0.050) and f.client_e2e_s == pytest.approx(0.210)
    assert f.first_token_ts == pytest.approx(1767225601.05)
    assert f.finish_ts == pytest.approx(1767225601.21)
    assert f.tpot_s == pytest.approx(0.160 / 8) and f.itl_p95_s == pytest.approx(0.02)
    assert (f.prompt_tokens, f.output_tokens) == (20, 9)


def test_aiperf_errors_are_kept_and_cancelled_ones_are_incomplete():
    frags = {f.request_id: f for f in _parse("aiperf-profile_export.jsonl")}
    err = frags["aiperf-req-4"]
    assert (err.status, err.error_type, err.http_status) == ("error", "Internal Server Error", 500)
    assert err.client_ttft_s is None
    assert frags["aiperf-req-5"].status == "incomplete"


def test_aiperf_units_are_converted_and_unknown_ones_refused():
    line = json.loads(_read("aiperf-profile_export.jsonl").splitlines()[1])
    line["metrics"]["time_to_first_token"] = {"value": 50_000_000, "unit": "ns"}
    assert _one(json.dumps(line)).client_ttft_s == pytest.approx(0.05)
    line["metrics"]["time_to_first_token"] = {"value": 5, "unit": "fortnights"}
    with pytest.raises(BadInput, match=r"x.jsonl:1: time_to_first_token has unit 'fortnights'"):
        _one(json.dumps(line))


def _one(line: str):
    (frag,) = parse_requests_file(line + "\n", name="x.jsonl", now=NOW)
    return frag


def test_aiperf_aggregate_names_the_tool_and_the_file_to_give():
    with pytest.raises(BadInput) as exc:
        _parse("aiperf-profile_export_aiperf.json")
    msg = str(exc.value)
    assert "AIPerf's aggregate" in msg and "profile_export.jsonl" in msg
    assert "not JSON" not in msg


# --- GuideLLM report ---------------------------------------------------------------------------


def test_guidellm_response_ids_normalise_to_the_servers_request_id():
    frags = {f.request_id: f for f in _parse("guidellm-benchmarks.json")}
    assert {"00ab00cd", "01ab01cd", "02ab02cd"} <= set(frags)  # chatcmpl-<id> -> <id>
    f = frags["00ab00cd"]
    assert f.status == "ok" and f.arrival_ts == pytest.approx(1767225600.0)
    assert f.client_ttft_s == pytest.approx(0.05) and f.client_e2e_s == pytest.approx(0.25)
    assert f.tpot_s == pytest.approx(0.20 / 8)  # inter_token_latency_ms, not time_per_output
    assert (f.prompt_tokens, f.output_tokens, f.itl_p95_s) == (20, 9, None)


def test_guidellm_errored_are_errors_and_incomplete_are_incomplete():
    frags = {f.request_id: f for f in _parse("guidellm-benchmarks.json")}
    # no response came: GuideLLM's own request id is the key
    assert frags["9f0c0004-guidellm"].status == "error"
    assert frags["9f0c0004-guidellm"].error_type == (
        "HTTPStatusError: Server error '500 Internal Server Error'"
    )
    assert frags["9f0c0003-guidellm"].status == "incomplete"


def test_guidellm_summary_without_requests_is_refused_naming_the_tool():
    with pytest.raises(BadInput, match="GuideLLM report without per-request entries"):
        _parse("guidellm-summary.json")


#: Trimmed from a real ``guidellm run`` (0.8.1) against ``slokit sim`` with a 500-error fault
#: and a max_duration cut (tests/loadtools/test_guidellm_real.py): two successful requests,
#: one errored, three incomplete (the second dispatched as the benchmark ended, after its
#: measurement window), request_totals trimmed with them.
GUIDELLM_RUN = "guidellm-0.8.1-run.json"
GUIDELLM_NOW = 1796099292.0 + 86400.0  # a day after the run


def _guidellm_run(doc: dict | None = None) -> list:
    text = json.dumps(doc) if doc is not None else _read(GUIDELLM_RUN)
    return parse_requests_file(text, name=GUIDELLM_RUN, now=GUIDELLM_NOW)


def test_guidellm_real_report_imports_what_guidellm_measured_with_its_status():
    frags = {f.request_id: f for f in _guidellm_run()}
    assert [f.status for f in frags.values()] == ["ok", "ok", "error", "incomplete", "incomplete"]
    ok = frags["b547a7b4a34df4c6b08766cd8cd45828"]  # chatcmpl-<id> -> <id>
    assert ok.arrival_ts == pytest.approx(1796099287.3517501)
    assert ok.finish_ts == pytest.approx(1796099287.8769433)
    assert ok.client_ttft_s == pytest.approx(0.016773462295532227)
    assert ok.client_e2e_s == pytest.approx(0.5251932144165039)
    assert ok.tpot_s == pytest.approx(0.008055558280339318)  # inter_token_latency_ms
    assert (ok.prompt_tokens, ok.output_tokens, ok.http_status, ok.error_type) == (
        14,
        64,
        None,
        None,
    )


def test_guidellm_real_error_is_the_exception_type_and_http_status():
    (err,) = [f for f in _guidellm_run() if f.status == "error"]
    # info.error is repr(httpx.HTTPStatusError(...)): one line naming the URL
    assert (err.error_type, err.http_status) == ("HTTPStatusError", 500)
    assert err.request_id.count("-") == 4  # no answer: GuideLLM's own request id (a UUID)
    assert err.finish_ts is None and err.client_e2e_s is None


def test_guidellm_real_incomplete_requests_are_incomplete_not_errors():
    cut = [f for f in _guidellm_run() if f.status == "incomplete"]
    assert [f.request_id for f in cut] == [
        "d675d133f2669da0a1595c099fe2142a",
        "3da52d4183e421a50ccc6462d833bbb0",
    ]
    assert all(f.error_type is None and f.http_status is None for f in cut)
    assert [f.output_tokens for f in cut] == [49, 35]  # streamed until cancelled
    assert all(f.client_ttft_s is not None and f.client_e2e_s is None for f in cut)


def test_guidellm_requests_outside_its_measurement_window_are_left_out_as_guidellm_does():
    doc = json.loads(_read(GUIDELLM_RUN))
    late = doc["benchmarks"][0]["requests"]["incomplete"][1]
    window_end = doc["benchmarks"][0]["scheduler_metrics"]["measure_end_time"]
    assert late["request_start_time"] > window_end
    assert checked_request_id(late["request_id"]) not in {f.request_id for f in _guidellm_run()}
    del doc["benchmarks"][0]["scheduler_metrics"]  # no window: every entry counts
    assert len(_guidellm_run(doc)) == 6


def test_guidellm_sampled_report_is_refused_naming_sample_size():
    doc = json.loads(_read(GUIDELLM_RUN))
    doc["benchmarks"][0]["metrics"]["request_totals"]["successful"] = 25
    with pytest.raises(BadInput, match=r"kept 2 of its 25 successful requests.*sample_size"):
        _guidellm_run(doc)


# --- inference-perf per_request_lifecycle_metrics.json --------------------------------------


def test_inference_perf_figures_follow_its_own_summarize_requests():
    frags = _parse("inference-perf-per_request_lifecycle_metrics.json", as_name="run/lc.json")
    assert [f.request_id for f in frags] == [f"lc-{i}" for i in range(4)]
    f = frags[0]
    assert f.arrival_ts is None  # perf_counter readings are no wall clock
    assert f.client_ttft_s == pytest.approx(0.050) and f.client_e2e_s == pytest.approx(0.121)
    assert f.tpot_s == pytest.approx(0.010) and f.itl_p95_s == pytest.approx(0.010)
    assert (f.model, f.prompt_tokens, f.output_tokens, f.status) == (
        "facebook/opt-125m",
        12,
        8,
        "ok",
    )
    assert (frags[3].status, frags[3].error_type) == ("error", "ClientResponseError")


def test_inference_perf_summary_names_the_per_request_file():
    with pytest.raises(BadInput, match=r"per_request_lifecycle_metrics\.json"):
        _parse("inference-perf-summary_lifecycle_metrics.json")


# --- gate's run files ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fixture",
    [
        "aiperf-profile_export.jsonl",
        "guidellm-benchmarks.json",
        "inference-perf-per_request_lifecycle_metrics.json",
    ],
)
def test_gate_run_files_accept_each_tools_file(fixture, tmp_path):
    path = tmp_path / "run.json"
    shutil.copy(FIXTURES / fixture, path)
    run = load_run_file(str(path), "records")
    assert len(run.records) == len(parse_requests_file(read_text(path), name=str(path)))
    assert {r["status"] for r in run.records} >= {"ok", "error"}


def test_gate_run_file_refuses_an_aggregate(tmp_path):
    path = tmp_path / "agg.json"
    shutil.copy(FIXTURES / "aiperf-profile_export_aiperf.json", path)
    with pytest.raises(BadInput, match="AIPerf's aggregate"):
        load_run_file(str(path), "records")


# --- inference-perf: what its real output holds (inference-perf-0.5.0-run.json) -------------

IP_RUN = "inference-perf-0.5.0-run.json"


def _ip_records() -> list[dict]:
    return json.loads(_read(IP_RUN))


def _ip_parse(records: list[dict]) -> list:
    """``records`` written as inference-perf writes them (``json.dumps(..., indent=2)``)."""
    return parse_requests_file(json.dumps(records, indent=2), name="run/lc.json", now=NOW)


def test_inference_perf_file_with_long_request_and_stream_first_is_recognised():
    # inference-perf writes request and response (the whole SSE stream) before info: a long
    # prompt pushes info far past the head of the file
    ok = next(r for r in _ip_records() if r["error"] is None)
    body = json.loads(ok["request"])
    body["prompt"] = "x " * 5000
    ok["request"] = json.dumps(body)
    text = json.dumps([ok], indent=2)
    assert text.index('"info"') > 4096
    imp = loadtools.detect(text)
    assert imp is not None and imp.TOOL == "inference-perf"
    (frag,) = _ip_parse([ok])
    assert frag.status == "ok" and frag.client_ttft_s is not None


def test_inference_perf_request_is_keyed_by_the_servers_response_id():
    ok = next(r for r in _ip_records() if r["error"] is None)
    raw_id = json.loads(ok["response"].removeprefix("data: "))["id"]
    assert raw_id.startswith("cmpl-")
    (streamed,) = _ip_parse([ok])
    assert streamed.request_id == checked_request_id(raw_id) == raw_id.removeprefix("cmpl-")
    assert streamed.fragment_id == f"client:{streamed.request_id}"
    unary = dict(ok, response=json.dumps({"id": "chatcmpl-u1", "choices": []}))
    assert _ip_parse([unary])[0].request_id == "u1"
    anthropic = dict(
        ok,
        response='event: message_start\ndata: {"type": "message_start", "message": {"id": "msg_1"}}\n\n',
    )
    assert _ip_parse([anthropic])[0].request_id == "msg_1"
    nothing = dict(ok, response="not json")
    assert _ip_parse([nothing])[0].request_id == "lc-0"
    # a server that gives two requests one id (a mock): every request keyed by its position
    assert [f.request_id for f in _ip_parse([ok, ok, unary])] == ["lc-0", "lc-1", "lc-2"]


def test_inference_perf_http_error_gives_its_status_and_no_prompt_count():
    err = next(r for r in _ip_records() if r["error"] is not None)
    assert err["error"]["error_type"] == "HTTP Error 500"
    assert err["info"]["request_metrics"]["text"]["input_tokens"] == 0  # its placeholder
    (frag,) = _ip_parse([err])
    assert (frag.status, frag.http_status, frag.error_type) == ("error", 500, "HTTP Error 500")
    assert frag.request_id == "lc-0" and frag.prompt_tokens is None and frag.output_tokens is None
    other = dict(err, error={"error_type": "ClientConnectorError", "error_msg": "refused"})
    assert _ip_parse([other])[0].http_status is None


def test_inference_perf_output_tokens_are_the_servers_tpot_its_own_rule():
    ok = next(r for r in _ip_records() if r["error"] is None)
    rm = ok["info"]["response_metrics"]
    client, server = rm["output_tokens"], rm["server_usage"]["completion_tokens"]
    assert client > server  # a byte-level tokenizer re-counted the text
    (frag,) = _ip_parse([ok])
    times = rm["output_token_times"]
    assert frag.output_tokens == server
    assert frag.tpot_s == (times[-1] - times[0]) / (client - 1)  # inference-perf's TPOT
    del rm["server_usage"]
    assert _ip_parse([ok])[0].output_tokens == client
