"""The CLI contract on the real vLLM captures: ingest otlp, then explain."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner
from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from slokit.cli import main
from slokit.store.db import open_store


def _attrs_of(vllm_fixtures: Path, request_id: str) -> dict[str, float]:
    msg = ExportTraceServiceRequest()
    msg.ParseFromString((vllm_fixtures / "otlp" / "export_06.pb").read_bytes())
    for rs in MessageToDict(msg)["resourceSpans"]:
        for span in rs["scopeSpans"][0]["spans"]:
            attrs = {a["key"]: next(iter(a["value"].values())) for a in span["attributes"]}
            if attrs["gen_ai.request.id"] == request_id:
                return {k: float(v) for k, v in attrs.items() if k.startswith("gen_ai.latency")}
    raise AssertionError(request_id)


def test_ingest_then_explain_json_matches_the_span_attributes(
    vllm_fixtures: Path, tmp_path: Path
) -> None:
    db = str(tmp_path / "s.duckdb")
    runner = CliRunner()
    res = runner.invoke(main, ["ingest", "otlp", str(vllm_fixtures / "otlp"), "--db", db])
    assert res.exit_code == 0, res.output
    assert "64 fragments (64 new) -> 64 requests" in res.output
    res = runner.invoke(main, ["explain", "cmpl-r24-0", "--json", "--db", db])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    span = _attrs_of(vllm_fixtures, "cmpl-r24-0")
    c = doc["components"]
    assert doc["request_id"] == "r24"
    assert c["queue_s"] == span["gen_ai.latency.time_in_queue"]
    assert c["prefill_s"] == span["gen_ai.latency.time_in_model_prefill"]
    assert c["decode_s"] == span["gen_ai.latency.time_in_model_decode"]
    assert c["e2e_s"] == span["gen_ai.latency.e2e"]
    assert c["ttft_s"] == span["gen_ai.latency.time_to_first_token"]
    assert doc["dominant"] == "decode"
    assert set(doc) >= {
        "request_id",
        "replica",
        "model",
        "status",
        "timeline",
        "components",
        "dominant",
        "context",
        "findings",
        "slo",
        "runbook",
    }


def test_both_id_forms_explain_the_same_request(vllm_fixtures: Path, tmp_path: Path) -> None:
    db = str(tmp_path / "s.duckdb")
    runner = CliRunner()
    runner.invoke(main, ["ingest", "otlp", str(vllm_fixtures / "otlp"), "--db", db])
    a = json.loads(runner.invoke(main, ["explain", "r24", "--json", "--db", db]).output)
    b = json.loads(runner.invoke(main, ["explain", "cmpl-r24-0", "--json", "--db", db]).output)
    assert a == b


def test_reingesting_the_same_exports_adds_nothing(vllm_fixtures: Path, tmp_path: Path) -> None:
    db = str(tmp_path / "s.duckdb")
    runner = CliRunner()
    runner.invoke(main, ["ingest", "otlp", str(vllm_fixtures / "otlp"), "--db", db])
    res = runner.invoke(main, ["ingest", "otlp", str(vllm_fixtures / "otlp"), "--db", db])
    assert "64 fragments (0 new) -> 64 requests" in res.output


def test_unknown_request_exits_3_with_a_message(vllm_fixtures: Path, tmp_path: Path) -> None:
    db = str(tmp_path / "s.duckdb")
    runner = CliRunner()
    runner.invoke(main, ["ingest", "otlp", str(vllm_fixtures / "otlp"), "--db", db])
    res = runner.invoke(main, ["explain", "r999", "--db", db])
    assert res.exit_code == 3
    assert "no request 'r999'" in res.output


@pytest.mark.parametrize(
    ("request_id", "why"),
    [
        ("", "empty once normalized"),
        ("chatcmpl-", "empty once normalized"),
        ("a\x01b", "control characters"),
        ("x" * 600, "longer than 512 characters"),
    ],
    ids=["empty", "prefix-only", "control-character", "too-long"],
)
def test_an_id_no_request_can_have_exits_2_saying_why(
    tmp_path: Path, request_id: str, why: str
) -> None:
    """Not 3 ("not in the store"): no store could hold it, as ingest refuses such ids."""
    db = str(tmp_path / "s.duckdb")
    open_store(db).close()
    res = CliRunner().invoke(main, ["explain", request_id, "--db", db])
    assert res.exit_code == 2, res.output
    assert why in res.output


def test_truncated_export_is_rejected_whole_and_others_are_kept(
    vllm_fixtures: Path, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.pb"
    bad.write_bytes((vllm_fixtures / "otlp" / "export_06.pb").read_bytes()[:1000])
    db = str(tmp_path / "s.duckdb")
    res = CliRunner().invoke(
        main, ["ingest", "otlp", str(bad), str(vllm_fixtures / "otlp" / "export_06.pb"), "--db", db]
    )
    assert res.exit_code == 2
    assert "rejected" in res.output and "bad.pb" in res.output
    assert "64 fragments (64 new)" in res.output


def test_explain_on_a_missing_database_is_bad_input(tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["explain", "r1", "--db", str(tmp_path / "none.duckdb")])
    assert res.exit_code == 2 and "no slokit database" in res.output


def test_ingest_metrics_stores_the_engine_state_of_a_saved_scrape(
    vllm_fixtures: Path, tmp_path: Path
) -> None:
    import duckdb

    db = str(tmp_path / "s.duckdb")
    res = CliRunner().invoke(
        main,
        [
            "ingest",
            "metrics",
            str(vllm_fixtures / "metrics_after_load.prom"),
            "--instance",
            "pod-a",
            "--ts",
            "1795958400",
            "--db",
            db,
        ],
    )
    assert res.exit_code == 0, res.output
    con = duckdb.connect(db, read_only=True)
    row = con.execute(
        "SELECT epoch(ts), replica, model, preemptions_total, num_gpu_blocks FROM engine_samples"
    ).fetchall()
    assert row == [(1795958400.0, "pod-a", "tiny", 33.0, 128.0)]


def test_ingest_metrics_without_instance_names_the_problem(
    vllm_fixtures: Path, tmp_path: Path
) -> None:
    res = CliRunner().invoke(
        main,
        [
            "ingest",
            "metrics",
            str(vllm_fixtures / "metrics_idle.prom"),
            "--db",
            str(tmp_path / "s.duckdb"),
        ],
    )
    assert res.exit_code == 2 and "instance" in res.output


def test_client_records_and_quality_join_the_vllm_spans(
    vllm_fixtures: Path, tmp_path: Path
) -> None:
    db = str(tmp_path / "s.duckdb")
    records = tmp_path / "load.jsonl"
    records.write_text(
        json.dumps(
            {
                "request_id": "r24",
                "trace_id": None,
                "model": "tiny",
                "slo_class": "interactive",
                "task_id": "t1",
                "tenant": None,
                "send_ts": 1795958329.30,
                "first_token_ts": 1795958329.38,
                "finish_ts": 1795958331.33,
                "ttft_s": 0.08,
                "e2e_s": 2.03,
                "itl_s": [0.005, 0.006],
                "prompt_tokens": 401,
                "output_tokens": 400,
                "max_tokens": 400,
                "status": "ok",
                "http_status": 200,
                "error_type": None,
                "finish_reason": "length",
                "scheduled_ts": 1795958329.30,
            }
        )
        + "\n"
    )
    quality = tmp_path / "q.csv"
    quality.write_text("request_id,quality_pass\nr24,false\n")
    runner = CliRunner()
    for args in (
        ["otlp", str(vllm_fixtures / "otlp")],
        ["requests", str(records)],
        ["quality", str(quality)],
    ):
        res = runner.invoke(main, ["ingest", *args, "--db", db])
        assert res.exit_code == 0, res.output
    doc = json.loads(runner.invoke(main, ["explain", "r24", "--json", "--db", db]).output)
    assert doc["sources"] == ["client", "quality", "vllm"]
    assert doc["components"]["client_ttft_s"] == 0.08
    assert doc["components"]["client_s"] is not None and doc["components"]["client_s"] > 0


@pytest.mark.parametrize("kind", ["otlp", "metrics", "requests", "quality"])
def test_ingesting_a_pipe_says_it_is_not_a_file(tmp_path: Path, kind: str) -> None:
    """A FIFO is read whole files only (each is sized before it is read): named as what it
    is, not reported missing."""
    fifo = tmp_path / "export.pb"
    os.mkfifo(fifo)
    res = CliRunner().invoke(main, ["ingest", kind, str(fifo), "--db", str(tmp_path / "s.db")])
    assert res.exit_code == 2, res.output
    assert "not a regular file" in res.output and "no such file" not in res.output


def test_ingesting_a_missing_path_says_so(tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["ingest", "otlp", str(tmp_path / "nope.pb"),
                                    "--db", str(tmp_path / "s.db")])  # fmt: skip
    assert res.exit_code == 2, res.output
    assert "no such file or directory" in res.output
