"""The scenario pack: every examples/scenarios/*.yaml, run on the simulator, is diagnosed
as the rule it reproduces and as none of the rules it rules out.

The pack runs on virtual time (``run_scenario_virtual``): deterministic, as fast as the CPU
allows, and a loaded machine cannot change the physics (in real time a starved event loop
stretched engine steps and turned one diagnosis into another). The HTTP, SSE and OTLP
paths in real time are covered by tests/sim and tests/load.

The table below is the contract (also in docs/diagnose.md); a fast test checks that the
scenario files say the same. ``R`` = must be reported, ``x`` = must not be reported,
``.`` = either (a plausible companion finding, e.g. queueing past the knee). The ``mixed_``
scenarios hold a cause and its consequences (their ranking: test_rca_accuracy.py).

| scenario \\ rule            | queue | prefill | decode | kv | frontend | prefix | knee | throttle | xid | errors | spec | gateway | gap |
|----------------------------|-------|---------|--------|----|----------|--------|------|----------|-----|--------|------|---------|-----|
| healthy                    |   x   |    x    |   x    | x  |    x     |   x    |  x   |    x     |  x  |   x    |  x   |    .    |  .  |
| queue_saturation           |   R   |    x    |   x    | x  |    x     |   x    |  .   |    x     |  x  |   x    |  x   |    .    |  .  |
| prefill_saturation         |   x   |    R    |   .    | x  |    x     |   x    |  .   |    x     |  x  |   x    |  x   |    .    |  .  |
| decode_saturation          |   x   |    x    |   R    | x  |    x     |   x    |  .   |    x     |  x  |   x    |  x   |    .    |  .  |
| kv_pressure                |   .   |    x    |   .    | R  |    x     |   x    |  .   |    x     |  x  |   x    |  x   |    .    |  .  |
| frontend_bound             |   x   |    x    |   x    | x  |    R     |   x    |  .   |    x     |  x  |   x    |  x   |    .    |  .  |
| prefix_affinity_loss       |   .   |    .    |   .    | x  |    x     |   R    |  .   |    x     |  x  |   x    |  x   |    .    |  .  |
| beyond_knee                |   .   |    x    |   x    | x  |    x     |   x    |  R   |    x     |  x  |   x    |  x   |    .    |  .  |
| gpu_throttle               |   .   |    .    |   .    | x  |    x     |   x    |  .   |    R     |  x  |   x    |  x   |    .    |  .  |
| gpu_xid                    |   x   |    x    |   x    | x  |    x     |   x    |  .   |    x     |  R  |   .    |  x   |    .    |  .  |
| error_burst                |   x   |    x    |   x    | x  |    x     |   x    |  .   |    x     |  x  |   R    |  x   |    .    |  .  |
| spec_decode_low_acceptance |   x   |    x    |   .    | x  |    x     |   x    |  .   |    x     |  x  |   x    |  R   |    .    |  .  |
| gateway_queueing           |   x   |    x    |   x    | x  |    .     |   x    |  .   |    x     |  x  |   x    |  x   |    R    |  .  |
| telemetry_gap              |   x   |    x    |   x    | x  |    x     |   x    |  .   |    x     |  x  |   x    |  x   |    .    |  R  |
| mixed_kv_decode            |   .   |    x    |   .    | R  |    x     |   x    |  .   |    x     |  x  |   x    |  x   |    .    |  .  |
| mixed_prefix_knee          |   .   |    .    |   x    | .  |    x     |   R    |  .   |    x     |  x  |   x    |  x   |    .    |  .  |
| mixed_throttle_burst       |   .   |    .    |   .    | x  |    x     |   x    |  .   |    R     |  x  |   x    |  x   |    .    |  .  |
"""

from __future__ import annotations

import functools
import itertools
from pathlib import Path
from typing import Any

import pytest
from scenario_harness import (
    SCENARIO_DIR,
    Collected,
    Phase,
    Scenario,
    all_scenarios,
    load_scenario,
    run_scenario_virtual,
)

from slokit.analysis.diagnose import diagnose
from slokit.analysis.rules import RULE_IDS
from slokit.store.db import open_store

_COLUMNS = (
    "queue_saturation",
    "prefill_saturation",
    "decode_saturation",
    "kv_pressure",
    "frontend_bound",
    "prefix_affinity_loss",
    "beyond_knee",
    "gpu_throttle",
    "gpu_xid",
    "error_burst",
    "spec_decode_low_acceptance",
    "gateway_queueing",
    "telemetry_gap",
)


def _table(text: str) -> dict[str, dict[str, str]]:
    rows = [
        ln
        for ln in text.splitlines()
        if ln.startswith("| ") and "---" not in ln and ln.count("|") == len(_COLUMNS) + 2
    ]
    table = {}
    for ln in rows[1:]:
        cells = [c.strip() for c in ln.strip("|").split("|")]
        table[cells[0]] = dict(zip(_COLUMNS, cells[1:], strict=True))
    return table


TABLE = _table(__doc__ or "")


def test_table_columns_are_the_rule_ids() -> None:
    assert set(_COLUMNS) == set(RULE_IDS)


def test_every_scenario_file_matches_its_table_row() -> None:
    names = {p.stem for p in all_scenarios()}
    assert names == set(TABLE)
    for path in all_scenarios():
        sc = load_scenario(path)
        row = TABLE[sc.name]
        assert sc.name == path.stem
        expected = [r for r, v in row.items() if v == "R"]
        assert ([sc.rule] if sc.rule else []) == expected, sc.name
        assert set(sc.rules_out) == {r for r, v in row.items() if v == "x"}, sc.name


@pytest.mark.parametrize("doc", ["README.md", "docs/diagnose.md"])
def test_the_documented_table_is_this_one(doc: str) -> None:
    text = (SCENARIO_DIR.parents[1] / doc).read_text()
    # The README shows the single-cause incidents; the mixed ones are in docs/diagnose.md.
    expected = (
        {k: v for k, v in TABLE.items() if not k.startswith("mixed_")}
        if doc == "README.md"
        else TABLE
    )
    assert _table(text) == expected


def _reported(doc: dict[str, Any], *, above_info: bool = False) -> set[str]:
    return {f["rule"] for f in doc["findings"] if not above_info or f["severity"] != "info"}


@functools.cache
def diagnosed(path: Path) -> dict[str, Any]:
    """The diagnosis of a scenario run on virtual time (deterministic, so each scenario runs
    once per session: test_rca_accuracy.py reads the same documents)."""
    sc = load_scenario(path)
    collected = run_scenario_virtual(sc)
    with open_store(":memory:") as store:
        collected.store_into(store)
        return diagnose(store.reader(), **collected.diagnose_args(sc))


@pytest.mark.slow
@pytest.mark.parametrize("path", all_scenarios(), ids=lambda p: p.stem)
def test_scenario_is_diagnosed_as_its_rule(path: Any) -> None:
    sc = load_scenario(path)
    doc = diagnosed(path)
    summaries = [f"{f['severity']} {f['rule']}: {f['summary']}" for f in doc["findings"]]
    if sc.rule is None:
        assert _reported(doc, above_info=True) == set(), summaries
    else:
        assert sc.rule in _reported(doc), summaries
    assert not _reported(doc) & set(sc.rules_out), summaries


def _burst(duration_s: float = 20.0) -> Scenario:
    """A short incident: a capped batch, a steady load and a burst half-way."""
    return Scenario(
        name="burst",
        rule=None,
        rules_out=[],
        sim={"replicas": 1, "model": "7b", "gpu": "l4", "max_num_seqs": 4},
        speed=1.0,
        duration_s=duration_s,
        scrape_interval_s=1.0,
        load=[
            Phase(at_s=0, duration_s=duration_s - 2, rate=1),
            Phase(at_s=duration_s / 2, duration_s=4, rate=4),
        ],
    )


def _timeline(c: Collected) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """What a run measured, without the random trace and span ids."""
    keys = ("source", "request_id", "arrival_ts", "first_token_ts", "finish_ts")
    keys += ("client_ttft_s", "queue_s", "prefill_s", "decode_s", "output_tokens", "status")
    frags = sorted(tuple(getattr(f, k) for k in keys) for f in c.fragments)
    engine = [(e.ts, e.running, e.waiting, e.kv_usage_ratio) for e in c.engine]
    return frags, engine


def test_a_scenario_on_virtual_time_gives_the_same_telemetry_every_run() -> None:
    first, second = run_scenario_virtual(_burst()), run_scenario_virtual(_burst())
    assert len(first.fragments) > 0 and len(first.engine) > 0
    assert _timeline(first) == _timeline(second)


def test_a_scenario_on_virtual_time_has_every_kind_of_record_on_simulated_time() -> None:
    sc = _burst()
    c = run_scenario_virtual(sc)
    sources = {f.source for f in c.fragments}
    assert {"client", "vllm"} <= sources, sources
    assert {s.kind for s in c.scrapes} == {"vllm", "dcgm"} and all(s.up for s in c.scrapes)
    assert len(c.gpu) > 0
    # one scrape per replica every scrape_interval_s of simulated time, from the start
    ts = sorted({e.ts for e in c.engine})
    assert ts[0] == pytest.approx(c.started_at)
    assert all(b - a == pytest.approx(sc.scrape_interval_s) for a, b in itertools.pairwise(ts))
    assert ts[-1] - ts[0] >= sc.duration_s - sc.scrape_interval_s
    # the burst queues: the capped batch makes later arrivals wait in the engine
    assert max(e.waiting or 0 for e in c.engine) > 0
