"""Client-side request files (vLLM bench JSON, slokit load JSONL) and quality rows -> fragments."""

from __future__ import annotations

import json

import pytest

from slokit.errors import BadInput
from slokit.sources.files import (
    parse_load_jsonl,
    parse_quality,
    parse_requests_file,
    parse_vllm_bench,
    read_text,
)

# --- vllm bench serve --save-result --save-detailed ---------------------------------------


@pytest.fixture(scope="module")
def bench(data_dir) -> str:
    return (data_dir / "vllm-bench-tiny.json").read_text()


def test_bench_gives_one_client_fragment_per_request_with_synthesized_ids(bench):
    frags = parse_vllm_bench(bench, name="runs/vllm-bench-tiny.json")
    assert [f.request_id for f in frags] == [f"vllm-bench-tiny-{i}" for i in range(4)]
    assert {f.source for f in frags} == {"client"}
    assert frags[0].fragment_id == "client:vllm-bench-tiny-0"
    assert frags[0].model == "tiny"


def test_bench_latencies_and_tokens_are_copied_and_tpot_derived(bench):
    f = parse_vllm_bench(bench, name="vllm-bench-tiny.json")[0]
    assert (f.client_ttft_s, f.client_e2e_s) == (0.0812, 0.3812)
    assert (f.prompt_tokens, f.output_tokens, f.status) == (400, 16, "ok")
    assert f.tpot_s == pytest.approx((0.3812 - 0.0812) / 15)
    assert f.itl_p95_s == pytest.approx(0.02)


def test_bench_itl_p95_is_interpolated(bench):
    f = parse_vllm_bench(bench, name="vllm-bench-tiny.json")[1]
    # 14 x 0.021 then 0.09: position 0.95 * 14 = 13.3 -> 0.021 + 0.3 * (0.09 - 0.021)
    assert f.itl_p95_s == pytest.approx(0.021 + 0.3 * 0.069)


def test_bench_failed_request_is_an_error_without_fake_zero_latencies(bench):
    f = parse_vllm_bench(bench, name="vllm-bench-tiny.json")[3]
    assert f.status == "error"
    assert f.error_type == "Traceback (most recent call last):"
    assert (f.client_ttft_s, f.client_e2e_s, f.output_tokens, f.tpot_s) == (None, None, None, None)
    assert f.prompt_tokens == 400


def test_bench_never_keeps_generated_text_and_has_no_arrival_time(bench):
    for f in parse_vllm_bench(bench, name="vllm-bench-tiny.json"):
        assert "lorem" not in repr(f)
        assert f.arrival_ts is None  # start_times are perf_counter readings, not epoch


def test_bench_ids_from_the_json_are_used_when_present(bench):
    doc = json.loads(bench)
    doc["request_ids"] = ["a", "b", "cmpl-c", "d"]
    frags = parse_vllm_bench(json.dumps(doc), name="x.json")
    assert [f.request_id for f in frags] == ["a", "b", "c", "d"]


def test_bench_appended_runs_get_per_run_ids(bench):
    text = json.dumps(json.loads(bench)) + "\n" + json.dumps(json.loads(bench)) + "\n"
    ids = [f.request_id for f in parse_vllm_bench(text, name="b.json")]
    assert ids[:2] == ["b-0-0", "b-0-1"] and ids[4:6] == ["b-1-0", "b-1-1"]


def test_bench_without_detailed_fields_is_badinput(bench):
    doc = json.loads(bench)
    del doc["ttfts"]
    with pytest.raises(BadInput, match="--save-detailed"):
        parse_vllm_bench(json.dumps(doc), name="b.json")


def test_bench_lists_of_unequal_length_are_badinput(bench):
    doc = json.loads(bench)
    doc["latencies"].pop()
    with pytest.raises(BadInput, match="latencies must be a list as long as ttfts"):
        parse_vllm_bench(json.dumps(doc), name="b.json")


def test_requests_file_tells_bench_from_load_jsonl(bench):
    assert parse_requests_file(bench, name="b.json")[0].request_id == "b-0"
    line = json.dumps({"request_id": "r1", "ttft_s": 0.1})
    assert parse_requests_file(line + "\n", name="l.jsonl")[0].request_id == "r1"


# --- slokit load JSONL -------------------------------------------------------------------

LOAD = {
    "request_id": "r24",
    "trace_id": "0af7651916cd43dd8448eb211c80319c",
    "model": "tiny",
    "slo_class": "chat",
    "task_id": "t-9",
    "tenant": "acme",
    "send_ts": 1795958400.25,
    "first_token_ts": 1795958400.40,
    "finish_ts": 1795958401.25,
    "ttft_s": 0.15,
    "e2e_s": 1.0,
    "itl_s": [0.05, 0.06, 0.07],
    "prompt_tokens": 120,
    "output_tokens": 18,
    "max_tokens": 32,
    "status": "ok",
    "http_status": 200,
    "error_type": None,
    "finish_reason": "length",
    "scheduled_ts": 1795958400.2,
}


def load_text(*recs) -> str:
    return "".join(json.dumps(r) + "\n" for r in recs)


def test_load_record_maps_to_a_client_fragment():
    (f,) = parse_load_jsonl(load_text(LOAD), name="load.jsonl")
    assert (f.request_id, f.source, f.fragment_id) == ("r24", "client", "client:r24")
    assert (f.trace_id, f.model, f.slo_class, f.task_id, f.tenant) == (
        "0af7651916cd43dd8448eb211c80319c",
        "tiny",
        "chat",
        "t-9",
        "acme",
    )
    assert (f.arrival_ts, f.first_token_ts, f.finish_ts) == (
        1795958400.25,
        1795958400.40,
        1795958401.25,
    )
    assert (f.client_ttft_s, f.client_e2e_s) == (0.15, 1.0)
    assert (f.prompt_tokens, f.output_tokens, f.max_tokens) == (120, 18, 32)
    assert (f.status, f.http_status, f.error_type, f.finish_reason) == ("ok", 200, None, "length")


def test_load_tpot_is_decode_time_over_tokens_after_the_first():
    (f,) = parse_load_jsonl(load_text(LOAD), name="load.jsonl")
    assert f.tpot_s == pytest.approx((1.0 - 0.15) / 17)
    assert f.itl_p95_s == pytest.approx(0.069)


def test_load_tpot_is_none_for_a_single_token():
    (f,) = parse_load_jsonl(load_text({**LOAD, "output_tokens": 1}), name="l")
    assert f.tpot_s is None


def test_load_missing_optional_keys_are_none():
    (f,) = parse_load_jsonl(load_text({"request_id": "x", "status": "timeout"}), name="l")
    assert (f.status, f.client_ttft_s, f.itl_p95_s, f.tpot_s) == ("timeout", None, None, None)


@pytest.mark.parametrize(
    ("rec", "words"),
    [
        ({**LOAD, "ttft_s": "fast"}, "ttft_s must be a finite number"),
        ({**LOAD, "output_tokens": 2.5}, "output_tokens must be a non-negative integer"),
        ({**LOAD, "status": "meh"}, "status must be one of"),
        ({**LOAD, "itl_s": [0.1, "x"]}, "itl_s must be a list"),
        ({k: v for k, v in LOAD.items() if k != "request_id"}, "request_id is required"),
    ],
)
def test_load_bad_record_names_file_and_line(rec, words):
    text = load_text({**LOAD, "request_id": "ok-1"}, rec)
    with pytest.raises(BadInput, match=rf"^load\.jsonl:2: {words}"):
        parse_load_jsonl(text, name="load.jsonl")


def test_load_broken_json_line_rejects_the_whole_file():
    text = load_text(LOAD) + '{"request_id": "r25", "ttft_s": 0.1\n'
    with pytest.raises(BadInput, match=r"^load\.jsonl:2: not JSON"):
        parse_load_jsonl(text, name="load.jsonl")


def test_load_duplicate_request_id_is_badinput():
    with pytest.raises(BadInput, match=r"^l:2: request_id 'r24' appears twice"):
        parse_load_jsonl(load_text(LOAD, LOAD), name="l")


# --- quality rows --------------------------------------------------------------------------


def test_quality_csv_rows_become_quality_fragments():
    frags = parse_quality("request_id,quality_pass\nr1,true\nr2,0\nr3,FAIL\n", name="q.csv")
    assert [(f.request_id, f.source, f.fragment_id, f.quality_pass) for f in frags] == [
        ("r1", "quality", "quality:r1", True),
        ("r2", "quality", "quality:r2", False),
        ("r3", "quality", "quality:r3", False),
    ]


def test_quality_jsonl_rows_become_quality_fragments():
    text = (
        '{"request_id": "r1", "quality_pass": true}\n{"request_id": "r2", "quality_pass": false}\n'
    )
    assert [(f.request_id, f.quality_pass) for f in parse_quality(text, name="q.jsonl")] == [
        ("r1", True),
        ("r2", False),
    ]


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("request_id,quality_pass\nr1,true\nr2,maybe\n", r"q:3: quality_pass must be"),
        ("request_id,quality_pass\nr1,true\nr2\n", r"q:3: 1 fields"),
        ("id,ok\nr1,true\n", r"q:1: header must name"),
        ("request_id,quality_pass\nr1,true\nr1,false\n", r"q:3: request_id 'r1' appears twice"),
        ('{"request_id": "r1", "quality_pass": "sure"}\n', r"q:1: quality_pass must be"),
    ],
)
def test_quality_bad_rows_are_badinput_naming_file_and_line(text, words):
    with pytest.raises(BadInput, match=rf"^{words}"):
        parse_quality(text, name="q")


def test_read_text_reports_missing_file_and_invalid_utf8(tmp_path):
    with pytest.raises(BadInput, match="cannot read"):
        read_text(tmp_path / "nope.jsonl")
    p = tmp_path / "bad.jsonl"
    p.write_bytes(b'{"a": 1}\n{"b": "\xff"}\n')
    with pytest.raises(BadInput, match=r"bad\.jsonl:2: invalid UTF-8"):
        read_text(p)
