"""The scenario pack: every examples/scenarios/*.yaml, run on the simulator, is diagnosed
as the rule it reproduces and as none of the rules it rules out.

The table below is the contract (also in docs/diagnose.md); a fast test checks that the
scenario files say the same. ``R`` = must be reported, ``x`` = must not be reported,
``.`` = either (a plausible companion finding, e.g. queueing past the knee).

| scenario \\ rule            | queue | prefill | decode | kv | frontend | prefix | knee | throttle | xid | errors | spec | gap |
|----------------------------|-------|---------|--------|----|----------|--------|------|----------|-----|--------|------|-----|
| healthy                    |   x   |    x    |   x    | x  |    x     |   x    |  x   |    x     |  x  |   x    |  x   |  .  |
| queue_saturation           |   R   |    x    |   x    | x  |    x     |   x    |  .   |    x     |  x  |   x    |  x   |  .  |
| prefill_saturation         |   x   |    R    |   .    | x  |    x     |   x    |  .   |    x     |  x  |   x    |  x   |  .  |
| decode_saturation          |   x   |    x    |   R    | x  |    x     |   x    |  .   |    x     |  x  |   x    |  x   |  .  |
| kv_pressure                |   .   |    x    |   .    | R  |    x     |   x    |  .   |    x     |  x  |   x    |  x   |  .  |
| frontend_bound             |   x   |    x    |   x    | x  |    R     |   x    |  .   |    x     |  x  |   x    |  x   |  .  |
| prefix_affinity_loss       |   .   |    .    |   .    | x  |    x     |   R    |  .   |    x     |  x  |   x    |  x   |  .  |
| beyond_knee                |   .   |    x    |   x    | x  |    x     |   x    |  R   |    x     |  x  |   x    |  x   |  .  |
| gpu_throttle               |   .   |    .    |   .    | x  |    x     |   x    |  .   |    R     |  x  |   x    |  x   |  .  |
| gpu_xid                    |   x   |    x    |   x    | x  |    x     |   x    |  .   |    x     |  R  |   .    |  x   |  .  |
| error_burst                |   x   |    x    |   x    | x  |    x     |   x    |  .   |    x     |  x  |   R    |  x   |  .  |
| spec_decode_low_acceptance |   x   |    x    |   .    | x  |    x     |   x    |  .   |    x     |  x  |   x    |  R   |  .  |
| telemetry_gap              |   x   |    x    |   x    | x  |    x     |   x    |  .   |    x     |  x  |   x    |  x   |  R  |
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from scenario_harness import SCENARIO_DIR, all_scenarios, load_scenario, run_scenario

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
    assert _table(text) == TABLE


def _reported(doc: dict[str, Any], *, above_info: bool = False) -> set[str]:
    return {f["rule"] for f in doc["findings"] if not above_info or f["severity"] != "info"}


@pytest.mark.slow
@pytest.mark.parametrize("path", all_scenarios(), ids=lambda p: p.stem)
def test_scenario_is_diagnosed_as_its_rule(path: Any) -> None:
    sc = load_scenario(path)
    collected = asyncio.run(run_scenario(sc))
    with open_store(":memory:") as store:
        collected.store_into(store)
        doc = diagnose(store.con, **collected.diagnose_args(sc))
    summaries = [f"{f['severity']} {f['rule']}: {f['summary']}" for f in doc["findings"]]
    if sc.rule is None:
        assert _reported(doc, above_info=True) == set(), summaries
    else:
        assert sc.rule in _reported(doc), summaries
    assert not _reported(doc) & set(sc.rules_out), summaries
