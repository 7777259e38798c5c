"""Diagnosis accuracy measured like a root-cause-analysis benchmark, over the scenario pack.

Every examples/scenarios/*.yaml names its true cause(s) (``root_cause``) and the rules it
rules out (``rules_out``). Each is run on virtual time (the same documents as
test_scenario_pack.py: :func:`test_scenario_pack.diagnosed` runs each scenario once per
session) and scored:

* rank: where the true cause stands in the ranking: diagnose's ``root_causes`` first, then
  the other findings at warning or above in the document's order;
* AC@1: the true cause ranked first (a scenario without a cause: no root cause at all);
* AC@3: the true cause among the first three;
* false alarms: findings at warning or above of a rule the scenario rules out.

AC@1 must be 100% with no false alarm, and the table in docs/diagnose.md ("Accuracy") must
be the one measured here. Print it with ``.venv/bin/python tests/diagnose/test_rca_accuracy.py``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from scenario_harness import SCENARIO_DIR, all_scenarios, load_scenario
from test_scenario_pack import diagnosed

DOC = SCENARIO_DIR.parents[1] / "docs" / "diagnose.md"
BEGIN, END = "<!-- accuracy:begin -->", "<!-- accuracy:end -->"
_ALARM = ("warning", "critical")


@dataclass(frozen=True)
class Score:
    scenario: str
    causes: list[str]
    rank: int | None  # of the best-ranked true cause; None: not ranked (or no cause)
    ac1: bool
    ac3: bool
    false_alarms: list[str]


def rule_of(finding_id: str) -> str:
    """``queue_saturation@pod-a#2`` -> ``queue_saturation``."""
    return re.split(r"[@#]", finding_id, maxsplit=1)[0]


def ranking(doc: dict[str, Any]) -> list[str]:
    """Rules in the order on-call reads them: root causes, then the other alarms."""
    alarms = [f for f in doc["findings"] if f["severity"] in _ALARM]
    ordered = [rule_of(i) for i in doc.get("root_causes", [])]
    ordered += [f["rule"] for f in alarms]
    return list(dict.fromkeys(ordered))


def score(path: Path, doc: dict[str, Any]) -> Score:
    sc = load_scenario(path)
    ranked = ranking(doc)
    ranks = [ranked.index(c) + 1 for c in sc.root_cause if c in ranked]
    rank = min(ranks) if ranks else None
    if sc.root_cause:
        ac1, ac3 = rank == 1, rank is not None and rank <= 3
    else:  # nothing wrong: nothing may be named a cause
        ac1 = ac3 = not doc.get("root_causes") and not ranked
    alarms = sorted(
        {f["rule"] for f in doc["findings"] if f["severity"] in _ALARM} & set(sc.rules_out)
    )
    return Score(sc.name, sc.root_cause, rank, ac1, ac3, alarms)


def render(scores: list[Score]) -> str:
    """The Markdown table of docs/diagnose.md's Accuracy section."""
    yes = {True: "yes", False: "no"}
    lines = [
        "| scenario | true cause | rank | AC@1 | AC@3 | false alarms |",
        "|----------|------------|------|------|------|--------------|",
    ]
    for s in scores:
        lines.append(
            f"| {s.scenario} | {', '.join(s.causes) or '(none)'} | {s.rank or '-'} | "
            f"{yes[s.ac1]} | {yes[s.ac3]} | {', '.join(s.false_alarms) or '0'} |"
        )
    n = len(scores)
    ac1 = sum(s.ac1 for s in scores)
    ac3 = sum(s.ac3 for s in scores)
    alarms = sum(len(s.false_alarms) for s in scores)
    lines.append(f"| **total ({n})** | | | **{ac1 / n:.0%}** | **{ac3 / n:.0%}** | **{alarms}** |")
    return "\n".join(lines)


def documented() -> str:
    text = DOC.read_text()
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[start:end].strip()


def measure() -> list[Score]:
    return [score(p, diagnosed(p)) for p in all_scenarios()]


@pytest.fixture(scope="module")
def scores() -> list[Score]:
    out = measure()
    print("\n" + render(out))
    return out


def test_every_scenario_names_its_true_cause() -> None:
    for path in all_scenarios():
        sc = load_scenario(path)
        assert sc.root_cause == ([sc.rule] if sc.rule else []), sc.name


def test_the_ranking_reads_root_causes_first() -> None:
    doc = {
        "root_causes": ["kv_pressure@pod-a"],
        "findings": [
            {"rule": "queue_saturation", "severity": "critical"},
            {"rule": "kv_pressure", "severity": "warning"},
            {"rule": "prefix_affinity_loss", "severity": "info"},
        ],
    }
    assert ranking(doc) == ["kv_pressure", "queue_saturation"]
    assert rule_of("queue_saturation@pod-a#2") == "queue_saturation"


@pytest.mark.slow
def test_the_true_cause_is_ranked_first_everywhere(scores: list[Score]) -> None:
    missed = [(s.scenario, s.rank) for s in scores if not s.ac1]
    assert missed == [], render(scores)


@pytest.mark.slow
def test_no_false_alarms(scores: list[Score]) -> None:
    alarms = {s.scenario: s.false_alarms for s in scores if s.false_alarms}
    assert alarms == {}, render(scores)


@pytest.mark.slow
def test_the_documented_accuracy_is_what_was_measured(scores: list[Score]) -> None:
    assert documented() == render(scores), "update docs/diagnose.md's Accuracy table"


if __name__ == "__main__":
    print(render(measure()))
