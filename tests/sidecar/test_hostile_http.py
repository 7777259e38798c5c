"""Hostile input to the sidecar's HTTP listeners: a clear 4xx, never a 5xx, never a traceback.

One sidecar (module scope) holds a real vLLM export whose first spans carry awkward request
ids; every row of the tables below is a request a client could send, with the status it
must get.
"""

from __future__ import annotations

import gzip
import logging
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from prometheus_client import CollectorRegistry
from sidecar_harness import BASE, LoopThread, Running, post

from slokit.ids import MAX_REQUEST_ID_CHARS
from slokit.sidecar.runner import Sidecar

#: Ids a span can carry and a user may need to look up (each given to one span).
AWKWARD_IDS = [
    "a{b}",
    "{{}}",
    "50%off",
    "%41%2F",
    "with space",
    "ünïcödé-😀",
    "a/b/c",
    "q?x=1#frag",
    "semi;colon&amp",
    "x" * MAX_REQUEST_ID_CHARS,
]


def _with_ids(body: bytes, ids: list[str]) -> bytes:
    msg = ExportTraceServiceRequest()
    msg.ParseFromString(body)
    spans = [s for rs in msg.resource_spans for ss in rs.scope_spans for s in ss.spans]
    for span, rid in zip(spans, ids, strict=False):
        for kv in span.attributes:
            if kv.key == "gen_ai.request.id":
                kv.value.string_value = rid
    return msg.SerializeToString()


@pytest.fixture(scope="module")
def sc(tmp_path_factory: pytest.TempPathFactory, export_body: bytes) -> Iterator[Running]:
    lt = LoopThread()
    db = tmp_path_factory.mktemp("hostile") / "s.duckdb"
    reg = CollectorRegistry()
    sidecar = Sidecar(replace(BASE, db=str(db)), registry=reg)
    lt.call(sidecar.start())
    running = Running(sidecar, reg, Path(db))
    assert post(running.otlp, _with_ids(export_body, AWKWARD_IDS)).status_code == 200
    yield running
    lt.call(sidecar.stop())
    lt.close()


@pytest.fixture
def clean_log(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """Fails the test if the sidecar logged an error or a traceback meanwhile."""
    caplog.set_level(logging.DEBUG)
    yield
    bad = [r for r in caplog.get_records("call") if r.levelno >= logging.ERROR or r.exc_info]
    assert not bad, [(r.name, r.getMessage()[:200]) for r in bad]


@dataclass
class Case:
    method: str
    path: str
    status: int
    listener: str = "api"
    body: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)


JSON = {"Content-Type": "application/json"}
PB = {"Content-Type": "application/x-protobuf"}
LONG_ID = "y" * 10_000

# fmt: off
CASES = {
    # /api/diagnose: times that are not times
    "since=1e400": Case("GET", "/api/diagnose?since=1e400", 400),
    "since=-1e400": Case("GET", "/api/diagnose?since=-1e400", 400),
    "since=nan": Case("GET", "/api/diagnose?since=nan", 400),
    "since=inf": Case("GET", "/api/diagnose?since=inf", 400),
    "until=-inf": Case("GET", "/api/diagnose?until=-inf", 400),
    "since=1e19 (past year 9999)": Case("GET", "/api/diagnose?since=1e19", 400),
    "since=garbage": Case("GET", "/api/diagnose?since=garbage", 400),
    "garbage ISO": Case("GET", "/api/diagnose?since=2026-13-45T25:61:00Z", 400),
    "a huge duration": Case("GET", "/api/diagnose?since=99999999999999w", 400),
    "a 10 kB time": Case("GET", "/api/diagnose?since=" + "1" * 10_000, 400),
    "until before since": Case("GET", "/api/diagnose?since=1700000100&until=1700000000", 400),
    "until equal to since": Case("GET", "/api/diagnose?since=1700000000&until=1700000000", 400),
    "a window before the data": Case("GET", "/api/diagnose?since=0&until=1", 404),
    "a window after the data": Case("GET", "/api/diagnose?since=253402300000", 404),
    "since=0 is the data": Case("GET", "/api/diagnose?since=0", 200),
    # /api/explain: ids that are too long, empty or unprintable
    "10 kB id (path)": Case("GET", "/api/explain/" + LONG_ID, 414),
    "10 kB id (query)": Case("GET", "/api/explain?id=" + LONG_ID, 414),
    "id over the limit by one": Case("GET", "/api/explain/" + "z" * (MAX_REQUEST_ID_CHARS + 1),
                                     414),
    "blank id": Case("GET", "/api/explain/%20%20", 400),
    "NUL in the id": Case("GET", "/api/explain/a%00b", 400),
    "no id at all": Case("GET", "/api/explain", 400),
    "invalid UTF-8 escapes": Case("GET", "/api/explain/%FF%FE", 404),
    "unknown id with braces": Case("GET", "/api/explain/%7Bnope%7D", 404),
    "unknown path": Case("GET", "/api/nope", 404),
    "wrong method": Case("POST", "/api/explain/r1", 405, body=b"", headers=JSON),
    # POST /v1/feedback
    "feedback: not JSON": Case("POST", "/v1/feedback", 400, body=b"{nope", headers=JSON),
    "feedback: invalid UTF-8": Case("POST", "/v1/feedback", 400, body=b"\xff\xfe", headers=JSON),
    "feedback: nested 100k deep": Case("POST", "/v1/feedback", 400, body=b"[" * 100_000,
                                       headers=JSON),
    "feedback: a 5,000-digit number": Case(
        "POST", "/v1/feedback", 400, headers=JSON,
        body=b'{"request_id": "r1", "quality_pass": ' + b"1" * 5000 + b"}",
    ),
    "feedback: lone surrogate id": Case(
        "POST", "/v1/feedback", 400, headers=JSON,
        body=b'{"request_id": "\\ud800", "quality_pass": true}',
    ),
    "feedback: 10 kB id": Case(
        "POST", "/v1/feedback", 400, headers=JSON,
        body=b'{"request_id": "' + LONG_ID.encode() + b'", "quality_pass": true}',
    ),
    "feedback: id is a number": Case("POST", "/v1/feedback", 400, headers=JSON,
                                     body=b'{"request_id": 5, "quality_pass": true}'),
    "feedback: gzip that is not": Case("POST", "/v1/feedback", 400, body=b"plain",
                                       headers={**JSON, "Content-Encoding": "gzip"}),
    "feedback: an unknown encoding": Case("POST", "/v1/feedback", 415,
                                          body=b'{"request_id": "r1", "quality_pass": true}',
                                          headers={**JSON, "Content-Encoding": "compress"}),
    "feedback: two encodings": Case("POST", "/v1/feedback", 415,
                                    body=b'{"request_id": "r1", "quality_pass": true}',
                                    headers={**JSON, "Content-Encoding": "gzip, br"}),
    "feedback: gzip over 4 MiB": Case("POST", "/v1/feedback", 413,
                                      body=gzip.compress(b" " * (5 * 1024 * 1024)),
                                      headers={**JSON, "Content-Encoding": "gzip"}),
    # POST /v1/traces
    "OTLP: no Content-Type": Case("POST", "/v1/traces", 415, "otlp", body=b"\x0a\x00"),
    "OTLP: text/plain": Case("POST", "/v1/traces", 415, "otlp", body=b"hi",
                             headers={"Content-Type": "text/plain"}),
    "OTLP: garbage protobuf": Case("POST", "/v1/traces", 400, "otlp", body=b"\xff" * 64,
                                   headers=PB),
    "OTLP: gzip that is not": Case("POST", "/v1/traces", 400, "otlp", body=b"plain",
                                   headers={**PB, "Content-Encoding": "gzip"}),
}
# fmt: on


def _port(sc: Running, listener: str) -> int:
    return sc.sidecar.ports["api" if listener == "api" else "otlp_http"]


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_hostile_request_gets_its_status_and_no_traceback(
    sc: Running, clean_log: None, case: Case
) -> None:
    url = f"http://127.0.0.1:{_port(sc, case.listener)}{case.path}"
    resp = httpx.request(case.method, url, content=case.body, headers=case.headers, timeout=30)
    assert resp.status_code == case.status, resp.text[:300]
    if case.listener == "api" and resp.status_code != 200:
        assert resp.headers["Content-Type"].startswith("application/json")
        assert resp.json()["error"]


# fmt: off
RAW = {
    "broken chunked framing (API)": ("api", b"POST /v1/feedback HTTP/1.1\r\nHost: x\r\n"
                                     b"Content-Type: application/json\r\n"
                                     b"Transfer-Encoding: chunked\r\n\r\nZZZ\r\nabc\r\n"),
    "broken chunked framing (OTLP)": ("otlp", b"POST /v1/traces HTTP/1.1\r\nHost: x\r\n"
                                      b"Content-Type: application/x-protobuf\r\n"
                                      b"Transfer-Encoding: chunked\r\n\r\nZZZ\r\nabc\r\n"),
    "request line over 32 kB": ("api", b"GET /api/explain/" + b"w" * 40_000 + b" HTTP/1.1\r\n"
                                b"Host: x\r\n\r\n"),
    "header over 8 kB": ("api", b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * 10_000
                         + b"\r\n\r\n"),
    "not HTTP at all": ("otlp", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" * 8),
    "bare LF and NUL": ("api", b"GET /healthz\x00 HTTP/1.1\nHost: x\n\n"),
}
# fmt: on


@pytest.mark.parametrize("listener,data", list(RAW.values()), ids=list(RAW))
def test_malformed_http_is_400_and_logged_on_one_line(
    sc: Running, clean_log: None, listener: str, data: bytes
) -> None:
    with socket.create_connection(("127.0.0.1", _port(sc, listener)), timeout=10) as s:
        s.sendall(data)
        head = s.recv(64)
    assert head.split(b" ")[1] == b"400", head


@pytest.mark.parametrize("rid", AWKWARD_IDS, ids=[repr(i[:16]) for i in AWKWARD_IDS])
def test_any_id_a_span_carries_can_be_explained_by_path_or_query(sc: Running, rid: str) -> None:
    by_path = httpx.get(f"{sc.api}/api/explain/{quote(rid, safe='')}", timeout=30)
    assert by_path.status_code == 200, by_path.text[:300]
    assert by_path.json()["request_id"] == rid
    by_query = httpx.get(f"{sc.api}/api/explain", params={"id": rid}, timeout=30)
    assert by_query.status_code == 200, by_query.text[:300]
    assert by_query.json()["request_id"] == rid


def test_the_cli_explains_an_awkward_id_through_the_sidecar(sc: Running) -> None:
    from click.testing import CliRunner

    from slokit.cli import main

    res = CliRunner().invoke(main, ["explain", "a/b/c", "--sidecar", sc.api, "--json"])
    assert res.exit_code == 0, res.output
    assert '"request_id": "a/b/c"' in res.output
    too_long = CliRunner().invoke(main, ["explain", LONG_ID, "--sidecar", sc.api])
    assert too_long.exit_code == 2, too_long.output
    assert f"at most {MAX_REQUEST_ID_CHARS} characters" in too_long.output
