"""Fragments without a request id join the request of their trace id, in any order."""

from __future__ import annotations

import itertools

from slokit.records import RequestFragment
from slokit.store import _trace_join
from slokit.store.db import open_store
from slokit.store.reader import LocalReader

TRACE = "ab" * 16


def _vllm() -> RequestFragment:
    return RequestFragment(
        "r1", "vllm", "vllm:1", trace_id=TRACE, replica="engine-0", arrival_ts=1_700_000_000.0,
        e2e_s=1.0, queue_s=0.1, prefill_s=0.2, decode_s=0.7,
    )  # fmt: skip


def _gateway() -> RequestFragment:
    return RequestFragment(
        _trace_join.TRACE_ONLY_ID, "gateway", "gateway:1", trace_id=TRACE,
        arrival_ts=1_699_999_999.9, gateway_e2e_s=1.25, http_status=200, status="ok",
    )  # fmt: skip


def _routing() -> RequestFragment:
    return RequestFragment(
        _trace_join.TRACE_ONLY_ID, "gateway", "gateway:2", trace_id=TRACE, gateway_routing_s=0.004
    )


def _row(store: object) -> tuple[object, ...]:
    con = store.con  # type: ignore[attr-defined]
    return con.execute(
        "SELECT request_id, replica, gateway_e2e_s, e2e_s, http_status, status, sources "
        "FROM requests ORDER BY request_id"
    ).fetchall()


def test_trace_only_fragments_join_in_any_order_and_on_reingest() -> None:
    frags = [_vllm(), _gateway(), _routing()]
    results = set()
    for perm in itertools.permutations(frags):
        with open_store(":memory:", clock=lambda: 1_700_000_000.0) as store:
            for f in perm:
                store.append_fragments([f])
            for f in perm:  # re-ingest changes nothing
                store.append_fragments([f])
            results.add(repr(_row(store)))
            assert store.con.execute("SELECT count(*) FROM pending_trace_fragments").fetchall() == [
                (0,)
            ]
            rec = LocalReader(store.con).request("r1")
            assert rec is not None and rec["gateway_routing_s"] == 0.004
    assert results == {repr([("r1", "engine-0", 1.25, 1.0, 200, "ok", ["gateway", "vllm"])])}


def test_a_batch_with_both_joins_at_once() -> None:
    with open_store(":memory:") as store:
        store.append_fragments([_gateway(), _vllm()])
        assert _row(store)[0][0] == "r1"


def test_fragments_that_never_join_are_counted() -> None:
    now = [1_700_000_000.0]
    with open_store(":memory:", clock=lambda: now[0]) as store:
        no_trace = RequestFragment(_trace_join.TRACE_ONLY_ID, "gateway", "gateway:9")
        result = store.append_fragments([_gateway(), no_trace])
        assert result.unjoined == {"no_trace_id": 1}
        now[0] += _trace_join.PENDING_MAX_AGE_S + 1
        other = RequestFragment("r2", "vllm", "vllm:2", trace_id="cd" * 16)
        result = store.append_fragments([other])
        assert result.unjoined == {"expired": 1}
        assert store.con.execute("SELECT count(*) FROM requests").fetchall() == [(1,)]
        assert LocalReader(store.con).unjoined(None, None) == {"expired": 1, "no_trace_id": 1}
        # the partner arriving after the expiry no longer joins
        store.append_fragments([_vllm()])
        assert _row(store)[0][2] is None


def test_a_trace_only_fragment_twice_in_one_batch_waits_and_joins_once() -> None:
    with open_store(":memory:") as store:
        store.append_fragments([_gateway(), _gateway()])
        count = "SELECT count(*) FROM {}"
        assert store.con.execute(count.format("pending_trace_fragments")).fetchall() == [(1,)]
        store.append_fragments([_vllm(), _gateway()])
        assert store.con.execute(count.format("pending_trace_fragments")).fetchall() == [(0,)]
        assert store.con.execute(count.format("request_fragments")).fetchall() == [(2,)]
        assert _row(store) == [("r1", "engine-0", 1.25, 1.0, 200, "ok", ["gateway", "vllm"])]


def test_a_joined_fragment_left_pending_by_a_crash_expires_without_being_counted() -> None:
    now = [1_700_000_000.0]
    with open_store(":memory:", clock=lambda: now[0]) as store:
        store.append_fragments([_gateway()])
        store.append_fragments([_vllm()])  # joins: stored under r1, no longer pending
        # a crash between the join's commit and the removal of its pending row
        store.con.execute(
            "INSERT INTO pending_trace_fragments SELECT * REPLACE ('' AS request_id) "
            "FROM request_fragments WHERE fragment_id = 'gateway:1'"
        )
        _trace_join._pending_rows.pop(store, None)
        now[0] += _trace_join.PENDING_MAX_AGE_S + 1
        result = store.append_fragments(
            [RequestFragment("r2", "vllm", "vllm:2", trace_id="cd" * 16)]
        )
        assert result.unjoined == {}
        assert store.con.execute("SELECT count(*) FROM pending_trace_fragments").fetchall() == [
            (0,)
        ]
        assert _row(store)[0] == ("r1", "engine-0", 1.25, 1.0, 200, "ok", ["gateway", "vllm"])
