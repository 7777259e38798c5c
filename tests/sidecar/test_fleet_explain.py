"""``slokit explain ID --fleet SPEC``: real sidecars, each holding part of a real vLLM export,
asked over HTTP; SPECs resolved from a list of URLs, a real DNS answer (a small UDP DNS
server on 127.0.0.1, two A records that differ by address only) and a kubernetes client;
a request whose gateway, vLLM and client fragments sit on three different pods is merged."""

from __future__ import annotations

import json
import socket
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from aiohttp import web
from click.testing import CliRunner
from kubernetes.client import V1ObjectMeta, V1Pod, V1PodList, V1PodStatus
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, Span
from sidecar_harness import LoopThread, Running, StartSidecar, post, serve_on_free_port

from slokit.cli import main
from slokit.errors import BadInput
from slokit.fleet import (
    FleetNotFound,
    FleetUnreachable,
    PodAnswer,
    explain_fleet,
    merge_documents,
    resolve_fleet,
)

TOKEN = "fleet-test-token-0123456789"
SCHEMA = Path(__file__).resolve().parents[2] / "docs" / "schema" / "explain.schema.json"


# --- feeding sidecars parts of the real export ---------------------------------------------


def _rid(span: Span) -> str | None:
    for kv in span.attributes:
        if kv.key == "gen_ai.request.id":
            return str(kv.value.string_value).removeprefix("cmpl-").rsplit("-", 1)[0]
    return None


def subset(body: bytes, keep: set[str]) -> bytes:
    """The export with only the ``llm_request`` spans of the request ids in ``keep``."""
    msg = ExportTraceServiceRequest()
    msg.ParseFromString(body)
    for rs in msg.resource_spans:
        for ss in rs.scope_spans:
            kept = [s for s in ss.spans if _rid(s) in keep]
            del ss.spans[:]
            ss.spans.extend(kept)
    return msg.SerializeToString()


def vllm_span(body: bytes, rid: str) -> Span:
    msg = ExportTraceServiceRequest()
    msg.ParseFromString(body)
    return next(
        s for rs in msg.resource_spans for ss in rs.scope_spans for s in ss.spans if _rid(s) == rid
    )


def http_span(of: Span, kind: int, status_code: int, extra_s: float) -> bytes:
    """A gateway (SERVER) or client (CLIENT) span naming the request of the vLLM span ``of``,
    in its trace, lasting its duration plus ``extra_s``."""
    msg = ExportTraceServiceRequest()
    rs: ResourceSpans = msg.resource_spans.add()
    attr = rs.resource.attributes.add()
    attr.key, attr.value.string_value = "service.name", "gateway" if kind == 2 else "client"
    span = rs.scope_spans.add().spans.add()
    span.trace_id = of.trace_id
    span.span_id = bytes([kind] * 8)
    span.name = "POST /v1/completions"
    span.kind = kind
    span.start_time_unix_nano = of.start_time_unix_nano - int(extra_s / 2 * 1e9)
    span.end_time_unix_nano = of.end_time_unix_nano + int(extra_s / 2 * 1e9)
    for key, value in (("slokit.request_id", _rid(of)), ("http.response.status_code", status_code)):
        kv = span.attributes.add()
        kv.key = key
        if isinstance(value, int):
            kv.value.int_value = value
        else:
            kv.value.string_value = str(value)
    return msg.SerializeToString()


def feed(sc: Running, body: bytes) -> None:
    resp = post(sc.otlp, body, Authorization=f"Bearer {TOKEN}")
    assert resp.status_code == 200, resp.text


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = int(s.getsockname()[1])
    s.close()
    return port


@pytest.fixture
def failing_server() -> Iterator[str]:
    """A 'sidecar' answering every API call with 500."""
    lt = LoopThread()

    async def boom(request: web.Request) -> web.Response:
        return web.json_response({"error": "store exploded"}, status=500)

    app = web.Application()
    app.router.add_get("/api/explain", boom)
    runner = web.AppRunner(app, shutdown_timeout=1.0)
    port = lt.call(serve_on_free_port(runner))
    yield f"http://127.0.0.1:{port}"
    lt.call(runner.cleanup())
    lt.close()


# --- a list of URLs, through the CLI ---------------------------------------------------------


@dataclass
class Fleet:
    a: Running
    b: Running
    closed: str
    failing: str

    @property
    def spec(self) -> str:
        return ",".join((self.a.api, self.b.api, self.closed, self.failing))


@pytest.fixture
def fleet(start_sidecar: StartSidecar, export_body: bytes, failing_server: str) -> Fleet:
    a = start_sidecar(replica="pod-a", token=TOKEN)
    b = start_sidecar(replica="pod-b", token=TOKEN)
    feed(a, subset(export_body, {f"r{i}" for i in range(0, 21)}))
    feed(b, subset(export_body, {f"r{i}" for i in range(21, 42)}))
    return Fleet(a, b, f"http://127.0.0.1:{closed_port()}", failing_server)


def test_explain_fleet_answers_from_the_pod_holding_the_request(fleet: Fleet) -> None:
    res = CliRunner().invoke(
        main, ["explain", "r30", "--fleet", fleet.spec, "--token", TOKEN, "--json"]
    )
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["request_id"] == "r30" and doc["sources"] == ["vllm"]
    assert doc["replica"] == "pod-b"
    assert doc["fleet"]["answered_by"] == fleet.b.api
    assert doc["fleet"]["merged_from"] == []
    assert doc["fleet"]["asked"] == fleet.spec.split(",")
    errors = {u["url"]: u["error"] for u in doc["fleet"]["unreachable"]}
    assert set(errors) == {fleet.closed, fleet.failing}
    assert "ConnectError" in errors[fleet.closed]
    assert errors[fleet.failing] == "answered 500: store exploded"
    jsonschema.validate(doc, json.loads(SCHEMA.read_text()))  # the fleet key is documented

    text = CliRunner().invoke(main, ["explain", "cmpl-r3-0", "--fleet", fleet.spec,
                                     "--token", TOKEN])  # fmt: skip
    assert text.exit_code == 0, text.output
    assert text.output.startswith("request r3  replica=pod-a")
    assert (
        f"fleet: answered by the sidecar at {fleet.a.api} (replica pod-a); 4 sidecars asked"
        in text.output
    )
    assert f"fleet: unreachable {fleet.closed}: ConnectError" in text.output
    assert f"fleet: unreachable {fleet.failing}: answered 500: store exploded" in text.output


def test_a_request_on_no_pod_exits_3_and_still_lists_the_unreachable(fleet: Fleet) -> None:
    res = CliRunner().invoke(main, ["explain", "r50", "--fleet", fleet.spec, "--token", TOKEN])
    assert res.exit_code == 3
    assert "no request 'r50' on any of the 2 sidecars that answered (4 asked)" in res.output
    assert (  # what both say they keep: where an older request went
        "  2 of them: this sidecar keeps its newest 150,000 requests and those first seen in "
        "the last 86400 s (retention); an older one is gone: no lake (parquet_dir) is set"
    ) in res.output
    assert f"unreachable {fleet.closed}: ConnectError" in res.output
    assert f"unreachable {fleet.failing}: answered 500" in res.output


def test_a_wrong_token_is_listed_not_taken_for_absence(fleet: Fleet) -> None:
    with pytest.raises(FleetUnreachable) as exc:
        explain_fleet("r30", [fleet.a.api, fleet.b.api], token="wrong-token-000000", timeout_s=30)
    assert [u.url for u in exc.value.unreachable] == [fleet.a.api, fleet.b.api]
    assert all(u.error.startswith("answered 401") for u in exc.value.unreachable)


def test_none_answering_exits_1(fleet: Fleet) -> None:
    res = CliRunner().invoke(main, ["explain", "r1", "--fleet", f"{fleet.closed},{fleet.failing}"])
    assert res.exit_code == 1
    assert "none of the 2 sidecars answered" in res.output


@pytest.mark.parametrize(
    "args",
    [
        ["--fleet", "ftp://pods:9464"],
        ["--fleet", "just-a-name"],
        ["--fleet", "http://a:9464,,http://b:9464"],
        ["--fleet", "http://:9464"],
        ["--fleet", "dns://pods:notaport"],
        ["--fleet", "k8s://Bad_Namespace/app=vllm"],
        ["--fleet", "k8s://serving"],
        ["--fleet", "k8s://serving/app=vllm?port=http"],
        ["--fleet", "k8s://serving/app=vllm?port=70000"],
        ["--fleet", "http://127.0.0.1:9", "--sidecar", "http://127.0.0.1:9"],
        ["--fleet", "http://127.0.0.1:9", "--db", "x.duckdb"],
        ["--fleet", "http://127.0.0.1:9", "--lake", "lake/"],
    ],
)
def test_a_bad_spec_exits_2(args: list[str]) -> None:
    res = CliRunner().invoke(main, ["explain", "r1", *args])
    assert res.exit_code == 2, res.output
    assert res.output.startswith("slokit: ")


def test_a_bad_id_is_refused_before_asking() -> None:
    with pytest.raises(BadInput):
        explain_fleet("   ", ["http://127.0.0.1:9"], token=None, timeout_s=30)


# --- a DNS name with several A records --------------------------------------------------------


class DnsServer:
    """A UDP DNS server on 127.0.0.1 answering A queries for the names it holds (other
    types: no records; unknown names: NXDOMAIN). Enough of RFC 1035 for a resolver."""

    def __init__(self, records: dict[str, list[str]]) -> None:
        self.records = {k.lower().rstrip("."): v for k, v in records.items()}
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.address: tuple[str, int] = self.sock.getsockname()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                query, peer = self.sock.recvfrom(512)
            except OSError:
                return
            try:
                answer = self._answer(query)
            except (struct.error, IndexError, UnicodeDecodeError):
                continue  # not a DNS query (a stray datagram to a reused port): dropped
            self.sock.sendto(answer, peer)

    def _answer(self, query: bytes) -> bytes:
        qid, _flags, _qd, _an, _ns, _ar = struct.unpack("!6H", query[:12])
        name, end = _read_name(query, 12)
        qtype, _qclass = struct.unpack("!2H", query[end : end + 4])
        question = query[12 : end + 4]
        addrs = self.records.get(name)
        rcode = 3 if addrs is None else 0
        answers = [a for a in addrs or [] if qtype == 1]
        head = struct.pack("!6H", qid, 0x8400 | rcode, 1, len(answers), 0, 0)
        rrs = b"".join(
            struct.pack("!HHHIH", 0xC00C, 1, 1, 5, 4) + socket.inet_aton(a) for a in answers
        )
        return head + question + rrs

    def close(self) -> None:
        self.sock.close()


def _read_name(msg: bytes, pos: int) -> tuple[str, int]:
    labels: list[str] = []
    while msg[pos]:
        if msg[pos] & 0xC0 == 0xC0:  # a compression pointer ends the name
            target = struct.unpack("!H", msg[pos : pos + 2])[0] & 0x3FFF
            return ".".join([*labels, _read_name(msg, target)[0]]).lower(), pos + 2
        labels.append(msg[pos + 1 : pos + 1 + msg[pos]].decode())
        pos += 1 + msg[pos]
    return ".".join(labels).lower(), pos + 1


def dns_resolver(server: tuple[str, int]) -> Any:
    """A resolver (``(name, port) -> addresses``) asking ``server`` over UDP for A records."""

    def resolve(name: str, port: int) -> list[str]:
        qname = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0"
        query = struct.pack("!6H", 0x1234, 0x0100, 1, 0, 0, 0) + qname + struct.pack("!2H", 1, 1)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.settimeout(2)
            s.sendto(query, server)
            msg = s.recv(512)
        qid, flags, _qd, ancount, _ns, _ar = struct.unpack("!6H", msg[:12])
        if qid != 0x1234 or flags & 0xF:
            raise BadInput(f"--fleet: cannot resolve {name!r} (rcode {flags & 0xF})")
        _, pos = _read_name(msg, 12)
        pos += 4
        out: list[str] = []
        for _ in range(ancount):
            _, pos = _read_name(msg, pos)
            rtype, _cls, _ttl, rdlen = struct.unpack("!HHIH", msg[pos : pos + 10])
            pos += 10
            if rtype == 1:
                out.append(socket.inet_ntoa(msg[pos : pos + rdlen]))
            pos += rdlen
        return out

    return resolve


@dataclass
class TwoPods:
    """Two sidecars on the same port, at 127.0.0.1 and 127.0.0.2."""

    port: int
    one: Running
    two: Running


@pytest.fixture
def two_pods(start_sidecar: StartSidecar, export_body: bytes) -> TwoPods:
    one = start_sidecar(replica="pod-1", listen="127.0.0.1:0")
    port = one.sidecar.ports["api"]
    two = start_sidecar(replica="pod-2", listen=f"127.0.0.2:{port}")
    feed(one, subset(export_body, {f"r{i}" for i in range(0, 32)}))
    feed(two, subset(export_body, {f"r{i}" for i in range(32, 64)}))
    return TwoPods(port, one, two)


@pytest.fixture
def dns() -> Iterator[DnsServer]:
    server = DnsServer({"slokit.serving.svc.cluster.local": ["127.0.0.1", "127.0.0.2"]})
    yield server
    server.close()


def test_a_dns_name_resolves_to_every_a_record(two_pods: TwoPods, dns: DnsServer) -> None:
    resolve = dns_resolver(dns.address)
    p = two_pods.port
    for spec in (f"dns://slokit.serving.svc.cluster.local:{p}",
                 f"slokit.serving.svc.cluster.local:{p}"):  # fmt: skip
        urls = resolve_fleet(spec, resolver=resolve)
        assert urls == [f"http://127.0.0.1:{p}", f"http://127.0.0.2:{p}"]
    found = explain_fleet("r40", urls, token=None, timeout_s=30)
    assert found.answered_by == f"http://127.0.0.2:{p}"
    assert found.doc["replica"] == "pod-2" and found.unreachable == ()
    found = explain_fleet("r7", urls, token=None, timeout_s=30)
    assert found.answered_by == f"http://127.0.0.1:{p}"
    with pytest.raises(BadInput, match="cannot resolve"):
        resolve_fleet("dns://nowhere.test:9464", resolver=resolve)


def test_a_name_through_the_system_resolver(two_pods: TwoPods) -> None:
    # localhost resolves through getaddrinfo (/etc/hosts); a ::1 record, where there is
    # one, is a sidecar that is not listening there: listed, not skipped
    urls = resolve_fleet(f"localhost:{two_pods.port}")
    assert f"http://127.0.0.1:{two_pods.port}" in urls
    res = CliRunner().invoke(main, ["explain", "r9", "--fleet", f"localhost:{two_pods.port}",
                                    "--json"])  # fmt: skip
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["fleet"]["answered_by"] == f"http://127.0.0.1:{two_pods.port}"
    assert [u["url"] for u in doc["fleet"]["unreachable"]] == [u for u in urls if "[" in u]


# --- k8s:// with an injected kubernetes client --------------------------------------------------


class FakeCoreV1:
    def __init__(self, pods: list[V1Pod]) -> None:
        self.pods = pods
        self.calls: list[tuple[str, str]] = []

    def list_namespaced_pod(self, namespace: str, *, label_selector: str) -> V1PodList:
        self.calls.append((namespace, label_selector))
        return V1PodList(items=self.pods)


def _pod(name: str, ip: str | None, phase: str = "Running") -> V1Pod:
    return V1Pod(metadata=V1ObjectMeta(name=name), status=V1PodStatus(pod_ip=ip, phase=phase))


def test_k8s_lists_the_pods_ips_at_the_sidecar_port(two_pods: TwoPods) -> None:
    api = FakeCoreV1([
        _pod("vllm-0", "127.0.0.1"),
        _pod("vllm-1", "127.0.0.2"),
        _pod("vllm-2", None, "Pending"),
        _pod("vllm-old", "10.0.0.9", "Failed"),
    ])  # fmt: skip
    p = two_pods.port
    urls = resolve_fleet(f"k8s://serving/app.kubernetes.io/name=vllm?port={p}", kubernetes=api)
    assert api.calls == [("serving", "app.kubernetes.io/name=vllm")]
    assert urls == [f"http://127.0.0.1:{p}", f"http://127.0.0.2:{p}"]
    assert explain_fleet("r63", urls, token=None, timeout_s=30).doc["replica"] == "pod-2"
    default = resolve_fleet("k8s://serving/app=vllm,tier!=canary", kubernetes=api)
    assert default == ["http://127.0.0.1:9464", "http://127.0.0.2:9464"]
    assert api.calls[-1] == ("serving", "app=vllm,tier!=canary")


def test_k8s_api_errors_are_one_line() -> None:
    class Denied:
        def list_namespaced_pod(self, namespace: str, *, label_selector: str) -> Any:
            raise RuntimeError("(403)\nReason: Forbidden")

    with pytest.raises(Exception, match=r"cannot list pods: \(403\)$"):
        resolve_fleet("k8s://serving/app=vllm", kubernetes=Denied())


# --- fragments of one request on several pods ---------------------------------------------------


def test_gateway_vllm_and_client_fragments_on_three_pods_merge(
    start_sidecar: StartSidecar, export_body: bytes
) -> None:
    gateway = start_sidecar(replica="gateway-0")
    serving = start_sidecar(replica="vllm-0")
    client = start_sidecar(replica="loadgen-0")
    span = vllm_span(export_body, "r12")
    feed(serving, subset(export_body, {"r12"}))
    feed(gateway, http_span(span, kind=2, status_code=502, extra_s=0.02))
    feed(client, http_span(span, kind=3, status_code=502, extra_s=0.06))
    urls = [client.api, gateway.api, serving.api]

    found = explain_fleet("r12", urls, token=None, timeout_s=30)
    doc = found.doc
    alone = explain_fleet("r12", [serving.api], token=None, timeout_s=30).doc
    assert alone["status"] == "ok" and alone["sources"] == ["vllm"]
    assert found.answered_by == serving.api
    assert found.merged_from == (gateway.api, client.api)  # in source precedence
    assert doc["sources"] == ["client", "gateway", "vllm"]
    assert doc["status"] == "error"  # what the gateway and client saw, not vLLM's "ok"
    assert doc["replica"] == "vllm-0"
    comps = doc["components"]
    assert comps["e2e_s"] == alone["components"]["e2e_s"]
    span_s = (span.end_time_unix_nano - span.start_time_unix_nano) / 1e9
    assert comps["client_e2e_s"] == pytest.approx(span_s + 0.06, abs=1e-6)  # the client's span
    assert comps["client_s"] == pytest.approx(comps["client_e2e_s"] - comps["e2e_s"])
    assert comps["shares"]["client"] == pytest.approx(
        comps["client_s"] / comps["client_e2e_s"], abs=1e-4
    )
    assert doc["timeline"][-1]["event"] == "client_done"
    assert not any(u.startswith("no client record") for u in doc["unknown"])
    assert any(u.startswith("no client record") for u in alone["unknown"])
    # still an explain document (the "fleet" key of --json aside)
    jsonschema.validate(doc, json.loads(SCHEMA.read_text()))
    # the server-side analysis is the serving pod's
    for key in ("dominant", "cause", "context", "findings", "runbook", "tokens"):
        assert doc[key] == alone[key], key

    res = CliRunner().invoke(main, ["explain", "r12", "--fleet", ",".join(urls)])
    assert res.exit_code == 0, res.output
    assert "status=error  sources=client,gateway,vllm" in res.output
    assert f"with fragments from {gateway.api}, {client.api}; 3 sidecars asked" in res.output


def test_merge_status_follows_the_outcome_precedence() -> None:
    def doc(sources: list[str], status: str | None, replica: str | None) -> dict[str, Any]:
        return {"request_id": "x", "sources": sources, "status": status, "replica": replica,
                "trace_id": None, "model": None, "slo_class": None,
                "tokens": {"prompt_tokens": None, "output_tokens": 5},
                "components": {"client_e2e_s": None, "e2e_s": 1.0}}  # fmt: skip

    answers = [
        PodAnswer("http://b", doc(["vllm"], "ok", "vllm-0")),
        PodAnswer("http://a", doc(["gateway"], "error", "gw")),
        PodAnswer("http://c", doc(["client"], "incomplete", None)),
    ]
    merged, base, others = merge_documents(answers)
    assert base.url == "http://b" and [o.url for o in others] == ["http://a", "http://c"]
    assert merged["status"] == "incomplete"  # the client first, as in the store
    assert merged["replica"] == "vllm-0"
    merged, _, _ = merge_documents(answers[:2])
    assert merged["status"] == "error"


def test_not_found_carries_the_unreachable() -> None:
    err = FleetNotFound("x", [])
    assert err.exit_code == 3 and FleetUnreachable("y", []).exit_code == 1
