"""docs/diagnose.md's table of causal chains is the table the engine links with."""

from __future__ import annotations

import re
from pathlib import Path

from slokit.analysis.chains import CHAINS

DOC = Path(__file__).resolve().parents[2] / "docs" / "diagnose.md"


def _documented() -> set[tuple[str, str]]:
    text = DOC.read_text(encoding="utf-8")
    section = text.split("### Root cause, consequences and severity", 1)[1]
    table = section.split("\n\n")[2]  # the paragraph after the introduction
    pairs: set[tuple[str, str]] = set()
    for line in table.splitlines()[2:]:  # past the header and its rule
        cause, effects = (c.strip() for c in line.strip("|").split("|")[:2])
        for effect in re.findall(r"`([a-z_]+)`", effects):
            pairs.add((cause.strip("`"), effect))
    return pairs


def test_the_documented_chains_are_the_engines_chains() -> None:
    assert _documented() == {(c.cause, c.effect) for c in CHAINS}
