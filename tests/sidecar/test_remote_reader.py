"""`--sidecar URL` for slo report, report and gate: SidecarReader over the sidecar's data API.

A sidecar is fed a real vLLM export and client spans of the same requests; the same two
exports go into a DuckDB file through `slokit ingest otlp`. Each command must answer the same
through the sidecar as from the file. The records come a page at a time: every record exactly
once, in the store's order, whatever the page size, microseconds shared by many requests and
records without an arrival time included.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
from click.testing import CliRunner, Result
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from sidecar_harness import (
    Running,
    StartSidecar,
    TargetServer,
    post,
    relabel,
    sidecar_process,
    wait_for,
)

from slokit.cli import main
from slokit.errors import BadInput, NotFound, SlokitError
from slokit.store.reader import LocalReader
from slokit.store.remote import SidecarReader

REPO = Path(__file__).resolve().parents[2]
SLO = str(REPO / "examples" / "slo" / "chat.yaml")
TOKEN = "s3cret-token"
SPAN_KIND_CLIENT = 3


def _client_export(vllm_body: bytes) -> bytes:
    """A CLIENT span for each vLLM request (what `slokit load` exports): a little earlier
    and later than vLLM's, an SLO class, the client's TTFT; one request failed (500)."""
    src = ExportTraceServiceRequest()
    src.ParseFromString(vllm_body)
    out = ExportTraceServiceRequest()
    rs = out.resource_spans.add()
    rs.resource.attributes.add(key="service.name").value.string_value = "slokit-load"
    ss = rs.scope_spans.add()
    ss.scope.name = "slokit.lab.load"
    rng = random.Random(7)
    spans = [s for r in src.resource_spans for sc in r.scope_spans for s in sc.spans]
    for i, vs in enumerate(sorted(spans, key=lambda s: s.start_time_unix_nano)):
        attrs = {kv.key: kv.value for kv in vs.attributes}
        rid = attrs["gen_ai.request.id"].string_value.removeprefix("cmpl-").rsplit("-", 1)[0]
        span = ss.spans.add(
            trace_id=vs.trace_id, span_id=rng.randbytes(8), name="chat", kind=SPAN_KIND_CLIENT,
            start_time_unix_nano=vs.start_time_unix_nano - 3_000_000,
            end_time_unix_nano=vs.end_time_unix_nano + 2_000_000,
        )  # fmt: skip
        failed = i == 5
        values: dict[str, Any] = {
            "slokit.request_id": rid,
            "http.response.status_code": 500 if failed else 200,
            "slokit.client.ttft_s": attrs["gen_ai.latency.time_to_first_token"].double_value
            + 0.003,
        }
        if i % 3:
            values["slokit.slo_class"] = "interactive" if i % 3 == 1 else "batch"
        for key, value in values.items():
            kv = KeyValue(key=key)
            if isinstance(value, str):
                kv.value.string_value = value
            elif isinstance(value, int):
                kv.value.int_value = value
            else:
                kv.value.double_value = value
            span.attributes.append(kv)
    return out.SerializeToString()


def _cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


@pytest.fixture
def exports(export_body: bytes) -> list[bytes]:
    return [export_body, _client_export(export_body)]


@pytest.fixture
def sidecar(start_sidecar: StartSidecar, exports: list[bytes]) -> Running:
    sc = start_sidecar(slo=SLO)
    for body in exports:
        assert post(sc.otlp, body).status_code == 200  # acknowledged once committed
    return sc


@pytest.fixture
def db_file(tmp_path: Path, exports: list[bytes]) -> str:
    """The same exports in a DuckDB file, through `slokit ingest otlp`."""
    paths = []
    for i, body in enumerate(exports):
        p = tmp_path / f"export_{i}.pb"
        p.write_bytes(body)
        paths.append(str(p))
    db = str(tmp_path / "copy.duckdb")
    res = _cli("ingest", "otlp", *paths, "--db", db, "--replica", "test-pod")
    assert res.exit_code == 0, res.output
    return db


@pytest.fixture
def local(sidecar: Running) -> Iterator[LocalReader]:
    """The running sidecar's own store, read on a cursor of its connection."""
    cur = sidecar.committed().cursor()
    yield LocalReader(cur)
    cur.close()


# -- the commands ----------------------------------------------------------------------------
def test_slo_report_through_the_sidecar_equals_the_file(sidecar: Running, db_file: str) -> None:
    remote = _cli("slo", "report", "--sidecar", sidecar.api, "--slo", SLO, "--json")
    assert remote.exit_code == 0, remote.output
    local = _cli("slo", "report", "--db", db_file, "--slo", SLO, "--json")
    assert local.exit_code == 0, local.output
    doc = json.loads(remote.output)
    assert doc == json.loads(local.output)
    assert doc["overall"]["requests"] == 64
    assert {c["name"]: c["requests"] for c in doc["classes"]}["interactive"] > 0


def test_a_file_a_sidecar_process_holds_is_read_through_it(
    tmp_path: Path, exports: list[bytes], db_file: str
) -> None:
    db = tmp_path / "held.duckdb"
    args = ["--db", str(db), "--listen", "127.0.0.1:0", "--otlp-http", "127.0.0.1:0",
            "--otlp-grpc", "", "--replica", "test-pod"]  # fmt: skip
    env = {**os.environ, "SLOKIT_DIAGNOSE_INTERVAL_S": "0", "PYTHONUNBUFFERED": "1"}
    with sidecar_process(args, tmp_path / "sidecar.log", env) as (_, ports):
        api = f"http://127.0.0.1:{ports['api']}"
        for body in exports:
            assert post(f"http://127.0.0.1:{ports['otlp_http']}/v1/traces", body).status_code == 200
        held = _cli("slo", "report", "--db", str(db), "--slo", SLO, "--json")
        assert held.exit_code == 0, held.output
        assert f"held by the sidecar at {api}; asking it" in held.stderr
    local = _cli("slo", "report", "--db", db_file, "--slo", SLO, "--json")
    assert json.loads(held.stdout) == json.loads(local.output)


@pytest.mark.parametrize(
    "window",
    [("--since", "2026-11-29T13:18:49.318Z", "--until", "2026-11-29T13:18:49.3195Z"),
     ("--since", "3.053s", "--until", "3.051s")],  # durations back from the newest data
)  # fmt: skip
def test_a_windowed_slo_report_through_the_sidecar_equals_the_file(
    sidecar: Running, db_file: str, window: tuple[str, ...]
) -> None:
    remote = _cli("slo", "report", "--sidecar", sidecar.api, "--slo", SLO, "--json", *window)
    local = _cli("slo", "report", "--db", db_file, "--slo", SLO, "--json", *window)
    assert remote.exit_code == local.exit_code == 0, remote.output + local.output
    doc = json.loads(remote.output)
    assert doc == json.loads(local.output)
    assert 0 < doc["overall"]["requests"] < 64


def test_gate_through_the_sidecar_equals_the_file(sidecar: Running, db_file: str) -> None:
    remote = _cli("gate", "--sidecar", sidecar.api, "--slo", SLO, "--json")
    local = _cli("gate", "--db", db_file, "--slo", SLO, "--json")
    assert remote.exit_code == local.exit_code, remote.output + local.output
    assert remote.exit_code in (0, 1), remote.output
    assert json.loads(remote.output) == json.loads(local.output)


def test_report_through_the_sidecar_writes_the_page(
    sidecar: Running, db_file: str, tmp_path: Path
) -> None:
    remote = _cli(
        "report", "--sidecar", sidecar.api, "--slo", SLO, "--out", str(tmp_path / "r.html")
    )
    local = _cli("report", "--db", db_file, "--slo", SLO, "--out", str(tmp_path / "l.html"))
    assert remote.exit_code == local.exit_code == 0, remote.output + local.output
    assert "64 requests" in remote.output and "64 requests" in local.output
    assert "<svg" in (tmp_path / "r.html").read_text(encoding="utf-8")


def test_without_the_token_a_protected_sidecar_is_a_clear_error(
    start_sidecar: StartSidecar, export_body: bytes
) -> None:
    sc = start_sidecar(token=TOKEN)
    assert post(sc.otlp, export_body, Authorization=f"Bearer {TOKEN}").status_code == 200
    for args in (("slo", "report", "--slo", SLO), ("gate", "--slo", SLO)):
        res = _cli(*args, "--sidecar", sc.api)
        assert res.exit_code == 2, res.output
        assert f"sidecar at {sc.api} refused the request (401" in res.output
        assert "--token" in res.output
    ok = _cli("slo", "report", "--slo", SLO, "--sidecar", sc.api, "--token", TOKEN, "--json")
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.output)["overall"]["requests"] == 64


# -- the reader --------------------------------------------------------------------------------
def test_the_reader_answers_what_the_store_does(
    start_sidecar: StartSidecar, target: TargetServer, export_body: bytes
) -> None:
    sc = start_sidecar(vllm_urls=(target.url,), scrape_interval_s=0.2, diagnose_interval_s=0)
    assert post(sc.otlp, export_body).status_code == 200
    cur = sc.committed().cursor()
    try:
        here = LocalReader(cur)

        def two_samples() -> bool:
            sc.committed()  # the held samples committed first, as the API's reads do
            return len(here.engine_series(None, None).get("test-pod", [])) >= 2

        wait_for(two_samples, what="two engine samples")
        with SidecarReader(sc.api) as there:
            newest = there.bounds()[1]
            assert newest is not None
            # ends at the newest sample already stored: the sidecar goes on scraping every
            # 0.2 s, and a later sample must not land between the two reads
            window = (newest - 3600.0, newest)
            assert there.engine_series(*window) == here.engine_series(*window)
            assert there.engine_series(*window)["test-pod"]
            assert there.cache_config() == here.cache_config()
            assert there.energy_increase(*window) == here.energy_increase(*window)
            assert there.findings(None, None) == here.findings(None, None)
            assert there.slowest_request() == here.slowest_request() is not None
            assert there.request("cmpl-r9-0") == json.loads(
                json.dumps(here.request("r9"), default=str)
            )
            assert there.request("no-such-request") is None
            assert there.basis == "records"
    finally:
        cur.close()


@pytest.mark.parametrize("page_size", [2, 7, 1000])
def test_paging_returns_every_record_once_in_the_store_order(
    start_sidecar: StartSidecar, export_body: bytes, page_size: int
) -> None:
    sc = start_sidecar(diagnose_interval_s=0)
    # three requests arrive in each microsecond (the same times under new ids), and two
    # have no arrival time at all (quality feedback for requests never seen)
    for body in (export_body, relabel(export_body, "a")[0], relabel(export_body, "b")[0]):
        assert post(sc.otlp, body).status_code == 200
    fb = [{"request_id": f"ghost-{i}", "quality_pass": True} for i in range(2)]
    assert httpx.post(f"{sc.api}/v1/feedback", json=fb).status_code == 200
    cur = sc.committed().cursor()
    try:
        here = LocalReader(cur)
        with SidecarReader(sc.api, page_size=page_size) as there:
            every = there.requests(None, None)
            assert every == here.requests(None, None)
            assert len(every) == len({r["request_id"] for r in every}) == 3 * 64 + 2
            assert [r["request_id"] for r in every[-2:]] == ["ghost-0", "ghost-1"]
            times = sorted({r["arrival_ts"] for r in every if r["arrival_ts"] is not None})
            for since, until in ((times[5], times[40]), (None, times[10]), (times[50], None),
                                 (times[3], times[3] + 1e-6), (times[9], times[9])):  # fmt: skip
                assert there.requests(since, until) == here.requests(since, until)
    finally:
        cur.close()


def test_each_page_holds_at_most_its_limit_and_matches_its_schema(sidecar: Running) -> None:
    schema = json.loads((REPO / "docs" / "schema" / "requests-page.schema.json").read_text())
    validator = jsonschema.Draft202012Validator(schema)
    validator.check_schema(schema)
    seen: list[str] = []
    params: dict[str, str] = {"limit": "5"}
    pages = 0
    while True:
        resp = httpx.get(f"{sidecar.api}/api/requests", params=params)
        assert resp.status_code == 200, resp.text
        doc = resp.json()
        assert len(doc["records"]) <= 5
        validator.validate(doc)
        seen += [r["request_id"] for r in doc["records"]]
        pages += 1
        if doc["next"] is None:
            break
        params["after"] = doc["next"]
    assert len(seen) == len(set(seen)) == 64
    assert pages >= 13


@pytest.mark.parametrize(
    "query",
    [{"limit": "0"}, {"limit": "10001"}, {"limit": "x"}, {"limit": "²"}, {"after": "garbage"},
     {"after": "WzEsIDIsIDNd"},  # [1, 2, 3]
     {"after": "WzFlMzAwLCBudWxsXQ"},  # [1e300, null]
     {"after": "WzAsICJcdWQ4MDAiXQ"},  # [0, "\ud800"]: a lone surrogate
     {"after": "WzEwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAsICJhIl0"},  # [10**30, "a"]
     {"since": "yesterday"}, {"until": "nan"}],
)  # fmt: skip
def test_a_bad_page_request_is_400(sidecar: Running, query: dict[str, str]) -> None:
    resp = httpx.get(f"{sidecar.api}/api/requests", params=query)
    assert resp.status_code == 400, resp.text
    assert "error" in resp.json()


def test_the_data_endpoints_need_the_token(start_sidecar: StartSidecar) -> None:
    sc = start_sidecar(token=TOKEN)
    for path in ("/api/bounds", "/api/requests", "/api/energy", "/api/engine_series",
                 "/api/findings", "/api/cache_config", "/api/request?id=r1",
                 "/api/slowest_request"):  # fmt: skip
        assert httpx.get(f"{sc.api}{path}").status_code == 401, path
        auth = {"Authorization": f"Bearer {TOKEN}"}
        assert httpx.get(f"{sc.api}{path}", headers=auth).status_code == 200, path


# -- errors, without a sidecar -----------------------------------------------------------------
def _answering(status: int, body: object) -> SidecarReader:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, json=body)

    return SidecarReader("http://sidecar:9464", transport=httpx.MockTransport(handler))


def test_errors_map_as_the_client_maps_them() -> None:
    with pytest.raises(NotFound, match="Not Found"):
        _answering(404, {"error": "Not Found"}).bounds()
    with pytest.raises(BadInput, match="since: not a time"):
        _answering(400, {"error": "since: not a time"}).requests(0.0, None)
    with pytest.raises(SlokitError, match="sidecar at http://sidecar:9464 answered 503"):
        _answering(503, {"error": "sidecar overloaded; retry"}).energy_increase(None, None)
    with pytest.raises(SlokitError, match="unreachable"):
        SidecarReader("http://127.0.0.1:1", timeout_s=2).bounds()


def test_what_only_the_sidecar_can_compute_says_where_to_ask() -> None:
    reader = _answering(200, {})
    with pytest.raises(BadInput, match="slokit diagnose --sidecar http://sidecar:9464"):
        reader.engine_buckets(0.0, 60.0, 10.0, 60.0)
    with pytest.raises(BadInput, match="slokit explain ID --sidecar"):
        reader.percentile_ranks({"ttft_s": 1.0}, 0.0, 60.0, None)


def test_a_sidecar_repeating_a_page_is_an_error_not_a_loop() -> None:
    reader = _answering(200, {"records": [], "next": "abc"})
    with pytest.raises(SlokitError, match="same page twice"):
        reader.requests(None, None)
