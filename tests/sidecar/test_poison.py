"""One bad client never costs another client its data.

A span with a value the store cannot hold (or that would poison analysis) is rejected on its
own with a reason (OTLP ``partial_success``), before it reaches the writer's shared
transaction; good exports committed in the same batch are answered 200 and stored. Should a
record still fail in the database, the writer commits the rest of its batch without it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import duckdb
import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from prometheus_client import CollectorRegistry
from sidecar_harness import (
    BASE,
    LoopThread,
    Running,
    StartSidecar,
    TargetServer,
    post,
    relabel,
    request_ids,
    scrape_failures,
    stored_request_ids,
    wait_for,
)

from slokit.records import EngineSample, RequestFragment, ScrapeResult
from slokit.sidecar.metrics import SidecarMetrics
from slokit.sidecar.otlp_ingest import OtlpIngest
from slokit.sidecar.runner import Sidecar
from slokit.sidecar.write_errors import RecordsRefused, first_error
from slokit.sidecar.writer import Writer
from slokit.sources.otlp import DecodedTraces
from slokit.store.db import open_store

SPANS = 8  # per export: the real export trimmed, so that 80 exports stay quick
GOOD_CLIENTS = 8
EXPORTS_PER_CLIENT = 5


def _spans(msg: ExportTraceServiceRequest) -> list[Any]:
    return [s for rs in msg.resource_spans for ss in rs.scope_spans for s in ss.spans]


def export(body: bytes, prefix: str, n: int = SPANS) -> tuple[ExportTraceServiceRequest, list[str]]:
    """The real vLLM export with fresh ids ``<prefix>-<i>``, cut to its first ``n`` spans."""
    fresh, ids = relabel(body, prefix)
    msg = ExportTraceServiceRequest()
    msg.ParseFromString(fresh)
    spans = msg.resource_spans[0].scope_spans[0].spans
    del spans[n:]
    return msg, ids[:n]


def _set_attr(span: Any, key: str, **value: Any) -> None:
    for kv in span.attributes:
        if kv.key == key:
            kv.value.Clear()
            break
    else:
        kv = span.attributes.add()
        kv.key = key
    for k, v in value.items():
        setattr(kv.value, k, v)


@dataclass(frozen=True)
class Poison:
    name: str
    apply: Callable[[Any], None]
    reason: str  # what the rejection reason says


def _attr(key: str, **value: Any) -> Callable[[Any], None]:
    return lambda span: _set_attr(span, key, **value)


def _start_ns(ns: int) -> Callable[[Any], None]:
    def apply(span: Any) -> None:
        span.start_time_unix_nano = ns

    return apply


POISONS = [
    Poison("e2e NaN", _attr("gen_ai.latency.e2e", double_value=math.nan),
           "gen_ai.latency.e2e is not finite"),
    Poison("ttft +Inf", _attr("gen_ai.latency.time_to_first_token", double_value=math.inf),
           "gen_ai.latency.time_to_first_token is not finite"),
    Poison("e2e -Inf", _attr("gen_ai.latency.e2e", double_value=-math.inf),
           "gen_ai.latency.e2e is not finite"),
    Poison("ttft 1e308", _attr("gen_ai.latency.time_to_first_token", double_value=1e308),
           "gen_ai.latency.time_to_first_token is out of range"),
    Poison("1e30 tokens as double",
           _attr("gen_ai.usage.completion_tokens", double_value=1e30),
           "gen_ai.usage.completion_tokens is out of range"),
    Poison("negative latency", _attr("gen_ai.latency.e2e", double_value=-1.5),
           "gen_ai.latency.e2e is negative"),
    Poison("start in year 2554", _start_ns(2**64 - 1), "span start time more than a day ahead"),
    Poison("start in 1970", _start_ns(5 * 10**9), "span start time before 2000"),
    Poison("id blank", _attr("gen_ai.request.id", string_value=" "),
           "request id empty once normalized"),
    Poison("id tab", _attr("gen_ai.request.id", string_value="\t"),
           "request id empty once normalized"),
    Poison("id cmpl--0", _attr("gen_ai.request.id", string_value="cmpl--0"),
           "request id empty once normalized"),
    Poison("id chatcmpl-", _attr("gen_ai.request.id", string_value="chatcmpl-"),
           "request id empty once normalized"),
]  # fmt: skip


def _response(resp: httpx.Response) -> ExportTraceServiceResponse:
    out = ExportTraceServiceResponse()
    out.ParseFromString(resp.content)
    return out


def test_a_poison_client_costs_eight_good_clients_nothing(
    start_sidecar: StartSidecar, export_body: bytes
) -> None:
    """8 clients send valid exports concurrently while a ninth sends one export of poison
    spans of each kind; their first exports share one writer batch."""
    release = threading.Event()
    sc = start_sidecar(before_commit=lambda: release.wait(20))
    writer = sc.sidecar.writer
    assert writer is not None

    good = {
        c: [export(export_body, f"good{c}-{k}") for k in range(EXPORTS_PER_CLIENT)]
        for c in range(GOOD_CLIENTS)
    }
    bad: list[ExportTraceServiceRequest] = []
    for k, poison in enumerate(POISONS):
        msg, _ = export(export_body, f"bad-{k}")
        for span in _spans(msg):
            poison.apply(span)
        bad.append(msg)

    def client(exports: list[ExportTraceServiceRequest]) -> list[httpx.Response]:
        return [post(sc.otlp, m.SerializeToString()) for m in exports]

    with ThreadPoolExecutor(max_workers=GOOD_CLIENTS + 2) as pool:
        # The writer holds a first export in its (stalled) transaction, so that the first
        # exports of every client, the poison one included, queue up and share the next batch.
        opener_msg, opener_ids = export(export_body, "opener")
        opener = pool.submit(client, [opener_msg])
        wait_for(lambda: writer.depth >= SPANS, what="the opener in the writer")
        futures = {c: pool.submit(client, [m for m, _ in ex]) for c, ex in good.items()}
        poisoned = pool.submit(client, bad)
        wait_for(
            lambda: (
                sc.value("slokit_spans_received_total", protocol="http")
                >= SPANS * (2 + GOOD_CLIENTS)
                and writer.depth >= SPANS * (1 + GOOD_CLIENTS)
            ),
            what="every client's first export queued behind the opener",
        )
        release.set()
        answers = {c: f.result(60) for c, f in futures.items()}
        bad_answers = poisoned.result(60)
        assert opener.result(60)[0].status_code == 200

    stored = request_ids(sc)
    assert set(opener_ids) <= stored
    for c, responses in answers.items():
        assert [r.status_code for r in responses] == [200] * EXPORTS_PER_CLIENT, c
        for (_, ids), r in zip(good[c], responses, strict=True):
            assert not _response(r).HasField("partial_success")
            assert set(ids) <= stored  # 0 lost
    for poison, r in zip(POISONS, bad_answers, strict=True):
        assert r.status_code == 200, poison.name
        partial = _response(r).partial_success
        assert partial.rejected_spans == SPANS, poison.name
        assert poison.reason in partial.error_message, (poison.name, partial.error_message)
    assert not any(i.startswith("bad-") for i in stored)
    for reason in {p.reason for p in POISONS}:
        sent = SPANS * sum(p.reason == reason for p in POISONS)
        assert sc.value("slokit_spans_rejected_total", reason=reason) == sent, reason


@pytest.fixture(scope="module")
def one_sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    """One sidecar for the cheap per-kind checks (each uses its own request ids)."""
    lt = LoopThread()
    reg = CollectorRegistry()
    db = tmp_path_factory.mktemp("poison") / "sidecar.duckdb"
    sc = Sidecar(replace(BASE, db=str(db)), registry=reg)
    lt.call(sc.start())
    yield Running(sc, reg, db)
    lt.call(sc.stop())
    lt.close()


@pytest.mark.parametrize("poison", POISONS, ids=[p.name for p in POISONS])
def test_a_mixed_export_keeps_its_good_spans(
    one_sidecar: Running, export_body: bytes, poison: Poison
) -> None:
    sc = one_sidecar
    before = sc.value("slokit_spans_rejected_total", reason=poison.reason)
    msg, ids = export(export_body, f"mixed-{poison.name}")
    poison.apply(_spans(msg)[3])
    resp = post(sc.otlp, msg.SerializeToString())
    assert resp.status_code == 200
    partial = _response(resp).partial_success
    assert (partial.rejected_spans, poison.reason in partial.error_message) == (1, True)
    stored = request_ids(sc)
    assert set(ids) - {ids[3]} <= stored
    assert ids[3] not in stored
    assert sc.value("slokit_spans_rejected_total", reason=poison.reason) == before + 1


def test_a_poison_span_over_grpc_is_rejected_alone(
    one_sidecar: Running, export_body: bytes
) -> None:
    import grpc

    from slokit.sidecar.otlp_grpc import METHOD

    sc = one_sidecar
    msg, ids = export(export_body, "grpc-mixed")
    POISONS[0].apply(_spans(msg)[0])
    with grpc.insecure_channel(sc.grpc_target) as ch:
        call = ch.unary_unary(METHOD, request_serializer=None, response_deserializer=None)
        out = ExportTraceServiceResponse()
        out.ParseFromString(bytes(call(msg.SerializeToString(), timeout=10)))
    assert out.partial_success.rejected_spans == 1
    assert set(ids[1:]) <= request_ids(sc)


def test_a_deeply_nested_json_body_is_a_400(one_sidecar: Running) -> None:
    sc = one_sidecar
    for body in (
        b"[" * 2000 + b"]" * 2000,
        b'{"resourceSpans":' + b"[" * 2000 + b"]" * 2000 + b"}",
    ):
        resp = post(sc.otlp, body, "application/json")
        assert resp.status_code == 400, resp.text[:200]
        assert "nested" in resp.text
    assert post(sc.otlp, b"{}", "application/json").status_code == 200  # still serving


# -- scrapes: an odd value is a missing fact, counted; the scrape is kept ------------------------


@pytest.mark.parametrize("value", ["NaN", "+Inf", "1e308", "-3"])
def test_an_odd_counter_in_a_scrape_is_stored_missing_and_counted(
    start_sidecar: StartSidecar, target: TargetServer, value: str
) -> None:
    line = b'vllm:num_preemptions_total{engine="0",model_name="tiny"} '
    assert line + b"33.0\n" in target.body
    target.body = target.body.replace(line + b"33.0\n", line + value.encode() + b"\n")
    sc = start_sidecar(vllm_urls=(target.url,), scrape_interval_s=0.2)

    def rows(sql: str) -> list[tuple[Any, ...]]:
        cur = sc.committed().cursor()  # what a reader sees: the held samples committed first
        try:
            return cur.execute(sql).fetchall()
        finally:
            cur.close()

    engine = "SELECT preemptions_total, running, kv_usage_ratio FROM engine_samples"
    wait_for(lambda: len(rows(engine)) >= 1, what="an engine sample")
    assert rows(engine)[0] == (None, 0.0, 0.0)  # the rest of the scrape is kept
    # the scrape itself counts as up (on a busy machine a later one may time out: not tested)
    up = "SELECT count(*) FROM scrapes WHERE up AND samples > 0"
    wait_for(lambda: rows(up)[0][0] >= 1, what="a scrape stored as up")
    assert scrape_failures(sc, target.url, "garbage") == 0
    invalid = sc.value("slokit_sample_values_invalid_total", kind="vllm", field="preemptions_total")
    assert invalid >= 1


# -- the writer: a batch that still fails commits without its failing item -------------------


NOW = 1_795_958_000.0


def _frag(rid: str, **values: Any) -> RequestFragment:
    fields = {"arrival_ts": NOW, "e2e_s": 1.0, **values}
    return RequestFragment(request_id=rid, source="vllm", fragment_id=f"vllm:{rid}", **fields)


@dataclass
class Stalled:
    """A writer on a real DuckDB file that holds each batch until ``release`` is set."""

    writer: Writer
    entered: threading.Event  # the writer has taken a batch and waits
    release: threading.Event
    registry: CollectorRegistry
    store: Any

    def stored(self) -> set[str]:
        return stored_request_ids(self.store)


@pytest.fixture
def stalled(tmp_path: Path) -> Any:
    store = open_store(tmp_path / "w.duckdb")
    entered, release = threading.Event(), threading.Event()

    def hold() -> None:
        entered.set()
        release.wait(20)

    registry = CollectorRegistry()
    writer = Writer(store, metrics=SidecarMetrics(registry), before_commit=hold)
    writer.start()
    yield Stalled(writer, entered, release, registry, store)
    release.set()
    writer.stop()
    store.close()


# Values validation never lets through, injected past it: the store refuses each (no finish
# or first-token time follows from them, an int64 column cannot hold the count).
UNSTORABLE = {
    "NaN e2e": {"e2e_s": math.nan},
    "ttft of 1e300 s": {"ttft_s": 1e300},
    "token count past int64": {"output_tokens": 2**70},
}


@pytest.mark.parametrize("values", UNSTORABLE.values(), ids=UNSTORABLE.keys())
def test_the_writer_fails_only_the_item_the_store_refuses(
    stalled: Stalled, values: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    writer = stalled.writer
    opener = writer.submit("fragments", [_frag("opener")])
    assert stalled.entered.wait(10)  # the next items share one batch
    items = [writer.submit("fragments", [_frag(f"ok{i}-a"), _frag(f"ok{i}-b")]) for i in range(6)]
    poison = writer.submit("fragments", [_frag("victim-neighbour"), _frag("poison", **values)])
    items += [writer.submit("fragments", [_frag(f"late{i}")]) for i in range(5)]
    with caplog.at_level(logging.ERROR, logger="slokit.sidecar.writer"):
        stalled.release.set()
        assert opener.result(10) == 1
        assert [f.result(10) for f in items] == [2] * 6 + [1] * 5
        with pytest.raises(RecordsRefused) as refused:
            poison.result(10)
    assert refused.value.__cause__ is not None
    assert "Current transaction is aborted" not in str(refused.value)
    logged = caplog.text
    assert "vllm:poison" in logged  # which records
    assert "Current transaction is aborted" not in logged.split("committing them apart")[0]
    assert stalled.stored() == {"opener", *(f"ok{i}-{s}" for i in range(6) for s in "ab"),
                      *(f"late{i}" for i in range(5))}  # fmt: skip
    assert (
        stalled.registry.get_sample_value("slokit_write_refused_total", {"kind": "fragments"}) == 2
    )
    assert writer.refused_items == 1


def test_the_writer_isolates_a_scrape_item_the_store_refuses(
    stalled: Stalled, caplog: pytest.LogCaptureFixture
) -> None:
    writer = stalled.writer
    opener = writer.submit("scrapes", [ScrapeResult(NOW, "t", "vllm", "r", True)])
    assert stalled.entered.wait(10)
    good = [writer.submit("engine", [EngineSample(NOW + i, "pod-a", "m", running=i)])
            for i in range(4)]  # fmt: skip
    bad = writer.submit("engine", [EngineSample(NOW, None, "m")])  # type: ignore[arg-type]
    with caplog.at_level(logging.ERROR, logger="slokit.sidecar.writer"):
        stalled.release.set()
        assert opener.result(10) == 1
        assert [f.result(10) for f in good] == [1] * 4
        with pytest.raises(RecordsRefused) as refused:
            bad.result(10)
    cause = refused.value.__cause__
    assert cause is not None and str(cause) in caplog.text  # the database's own words
    n = stalled.store.con.execute("SELECT count(*) FROM engine_samples").fetchone()
    assert n == (4,)
    assert stalled.registry.get_sample_value("slokit_write_refused_total", {"kind": "engine"}) == 1


def test_an_export_the_store_refuses_is_answered_with_its_spans_rejected(
    stalled: Stalled,
) -> None:
    # Past validation (a store that refuses what validation let through): the receivers say
    # partial_success, not 503, since a retry of the same spans cannot help.
    ingest = OtlpIngest(stalled.writer, stalled.writer.metrics, max_bytes=1 << 20,
                        default_replica=None)  # fmt: skip
    decoded = DecodedTraces(fragments=[_frag("p1"), _frag("p2", ttft_s=1e300)], spans=3)
    decoded.reject("gen_ai.latency.e2e is not finite")
    stalled.release.set()
    accepted = asyncio.run(ingest.accept(decoded, "http", (b"", "application/x-protobuf", None)))
    assert accepted.rejected == 3
    assert "2 refused by the store" in accepted.error_message
    assert "1 gen_ai.latency.e2e is not finite" in accepted.error_message
    reg = stalled.registry
    assert (
        reg.get_sample_value("slokit_spans_rejected_total", {"reason": "refused by the store"}) == 2
    )


def test_a_failing_database_fails_the_batch_for_a_retry_without_refusing_records(
    stalled: Stalled,
) -> None:
    writer = stalled.writer
    opener = writer.submit("fragments", [_frag("opener")])
    assert stalled.entered.wait(10)
    items = [writer.submit("fragments", [_frag(f"a{i}")]) for i in range(3)]
    stalled.store.con.close()  # the database goes away: no record is at fault
    stalled.release.set()
    for fut in [opener, *items]:
        with pytest.raises(duckdb.Error) as err:
            fut.result(10)
        assert not isinstance(err.value, RecordsRefused)
    assert (
        stalled.registry.get_sample_value("slokit_write_refused_total", {"kind": "fragments"})
        is None
    )
    assert writer.refused_items == 0


def test_first_error_digs_the_cause_out_of_an_aborted_duckdb_transaction() -> None:
    # DuckDB answers every statement after a failed one with "transaction is aborted"; a
    # cleanup statement in a finally block raises that, and hides the first error.
    con = duckdb.connect()
    con.execute("BEGIN TRANSACTION")
    with pytest.raises(duckdb.Error) as raised:
        try:
            con.execute("SELECT CAST('nan'::DOUBLE AS BIGINT)").fetchall()
        finally:
            con.execute("SELECT 1").fetchall()
    assert "aborted" in str(raised.value)
    first = first_error(raised.value)
    assert isinstance(first, duckdb.ConversionException), first


def test_feedback_the_store_refuses_is_422_not_a_server_error(
    stalled: Stalled, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Past validation: the real store is made to refuse what it is given (a value error of
    # DuckDB's own), so the writer answers RecordsRefused; feedback must say 422, not crash.
    from aiohttp.test_utils import TestClient, TestServer

    from slokit.sidecar.api import Api

    def refuse(_: Any) -> None:
        raise duckdb.ConversionException("Conversion Error: injected")

    monkeypatch.setattr(stalled.store, "append_fragments", refuse)
    stalled.release.set()
    api = Api(stalled.store, stalled.writer, stalled.writer.metrics)

    async def post() -> tuple[int, dict[str, Any]]:
        async with TestClient(TestServer(api.app())) as client:
            resp = await client.post(
                "/v1/feedback", json={"request_id": "r1", "quality_pass": True}
            )
            return resp.status, await resp.json()

    status, body = asyncio.run(post())
    assert status == 422
    assert "refused" in body["error"]
