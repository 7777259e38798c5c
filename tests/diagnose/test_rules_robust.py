"""Rules never crash on odd stored values, and a rule that does crash is never silent.

Stores written before validation existed (or by other tools) may hold NaN, infinities, 1e308
or negative counters; analysis reads them as missing facts.
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Iterator
from typing import Any

import pytest
from diag_synth import T0, after, engine, gpu, requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slokit.analysis.diagnose import render_text, run_diagnosis
from slokit.analysis.rules import all_rules
from slokit.records import Finding
from slokit.store.db import Store, open_store

END = T0 + 240.0
INCIDENT = T0 + 120.0

ODD = [math.nan, math.inf, -math.inf, 1e308, -1e308, -5.0, 5e-324, 2.0**63, 0.0]
ENGINE_FIELDS = [
    "running", "waiting", "kv_usage_ratio", "preemptions_total", "prompt_tokens_total",
    "generation_tokens_total", "prefix_cache_queries_total", "prefix_cache_hits_total",
    "request_success_total", "num_gpu_blocks", "block_size",
]  # fmt: skip
GPU_FIELDS = [
    "util_ratio", "mem_used_mib", "mem_total_mib", "power_w", "temperature_c", "sm_clock_mhz",
    "dram_active_ratio", "tensor_active_ratio", "energy_j", "xid_last",
]  # fmt: skip
REQUEST_COLUMNS = ["queue_s", "ttft_s", "prefill_s", "e2e_s", "tpot_s", "client_ttft_s"]

# An incident that takes most rules deep: queueing, a full KV pool with preemptions, a clock
# drop and an XID on the GPU.
REQUESTS = requests(end=END, every_s=2.0, queue_s=after(INCIDENT, 0.02, 1.5))
ENGINE = engine(end=END, every_s=2.0, kv=after(INCIDENT, 0.3, 1.0),
                preemptions_per_s=after(INCIDENT, 0, 2), waiting=after(INCIDENT, 1, 37))  # fmt: skip
GPU = gpu(end=END, every_s=5.0, clock=after(INCIDENT, 1980, 1200), xid=after(INCIDENT, 0, 79))


@pytest.fixture(scope="module")
def base_store() -> Iterator[Store]:
    with open_store(":memory:") as s:
        yield s


def _load(store: Store, eng: list[Any], gp: list[Any]) -> None:
    with store.transaction() as con:
        for table in ("requests", "request_fragments", "engine_samples", "gpu_samples"):
            con.execute(f"DELETE FROM {table}")
    store.append_fragments(REQUESTS)
    store.append_engine_samples(eng)
    store.append_gpu_samples(gp)


def _failed(doc_coverage: dict[str, Any]) -> dict[str, str]:
    return {r: s["reason"] for r, s in doc_coverage["rules"].items() if s["status"] == "failed"}


_mutation = st.tuples(st.integers(0, 10_000), st.sampled_from(ODD))


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(
    eng_muts=st.lists(st.tuples(st.sampled_from(ENGINE_FIELDS), _mutation), max_size=5),
    gpu_muts=st.lists(st.tuples(st.sampled_from(GPU_FIELDS), _mutation), max_size=3),
    req_muts=st.lists(st.tuples(st.sampled_from(REQUEST_COLUMNS), _mutation), max_size=3),
)
def test_no_rule_crashes_on_odd_stored_values(
    base_store: Store,
    eng_muts: list[tuple[str, tuple[int, float]]],
    gpu_muts: list[tuple[str, tuple[int, float]]],
    req_muts: list[tuple[str, tuple[int, float]]],
) -> None:
    eng, gp = copy.deepcopy(ENGINE), copy.deepcopy(GPU)
    for name, (i, v) in eng_muts:
        setattr(eng[i % len(eng)], name, v)
    for name, (i, v) in gpu_muts:
        setattr(gp[i % len(gp)], name, v)
    _load(base_store, eng, gp)
    # Request rows as an old store may hold them (the merge refuses NaN where it converts).
    for column, (i, v) in req_muts:
        rid = REQUESTS[i % len(REQUESTS)].request_id
        base_store.con.execute(f"UPDATE requests SET {column} = ? WHERE request_id = ?", [v, rid])
    result = run_diagnosis(base_store.reader())
    assert _failed(result.coverage) == {}
    render_text(result.to_json())


def test_kv_pressure_is_still_reported_with_a_1e308_counter_sample(base_store: Store) -> None:
    eng = copy.deepcopy(ENGINE)
    eng[len(eng) // 2 + 10].preemptions_total = 1e308
    _load(base_store, eng, GPU)
    result = run_diagnosis(base_store.reader())
    assert _failed(result.coverage) == {}
    assert "kv_pressure" in {f.rule for f in result.findings}


def test_gpu_xid_reports_two_xids_of_one_bucket(base_store: Store) -> None:
    gp = copy.deepcopy(GPU)
    t = next(g.ts for g in gp if g.ts >= INCIDENT + 30)
    twin = copy.deepcopy(next(g for g in gp if g.ts == t))
    twin.gpu, twin.xid_last = "1", 48.0  # a second GPU of the replica, another XID
    _load(base_store, ENGINE, [*gp, twin])
    (f,) = [f for f in run_diagnosis(base_store.reader()).findings if f.rule == "gpu_xid"]
    assert f.evidence["xids"] == [48, 79] and f.evidence["gpus"] == ["0", "1"]


class _Broken:
    id = "kv_pressure"
    needs = ("engine",)

    def evaluate(self, ctx: Any) -> list[Finding]:
        raise OverflowError("cannot convert float infinity to integer")


def test_a_crashing_rule_is_listed_logged_and_headlined(
    base_store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    _load(base_store, ENGINE, GPU)
    rules = [r for r in all_rules() if r.id != "kv_pressure"] + [_Broken()]
    with caplog.at_level(logging.DEBUG, logger="slokit.analysis.diagnose"):
        doc = run_diagnosis(base_store.reader(), rules=rules).to_json()
    reason = "OverflowError: cannot convert float infinity to integer"
    assert doc["coverage"]["failed"] == {"kv_pressure": reason}
    assert "queue_saturation" in doc["coverage"]["ran"]  # the others still ran
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [r.getMessage() for r in errors] == [
        f"rule kv_pressure failed, its findings are missing: {reason}"
    ]
    assert errors[0].exc_info is None  # one line; the traceback is at debug level
    lines = render_text(doc).splitlines()
    assert lines[0].startswith("Root cause: ")
    # right after the root cause and the window: the root cause may miss that rule's findings
    failed = lines.index(f"RULE FAILED kv_pressure: {reason} (its findings are missing)")
    assert lines[failed - 2].startswith("window ") and failed <= 5
