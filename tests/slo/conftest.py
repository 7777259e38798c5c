"""Fixtures for the SLO tests: the spec and the hand-computed record set."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from slo_builders import SPEC_YAML, known_fragments

from slokit.analysis.slo_spec import SloSpec, load_spec
from slokit.sources.runs import records_from_fragments


@pytest.fixture
def spec(tmp_path: Path) -> SloSpec:
    p = tmp_path / "slo.yaml"
    p.write_text(SPEC_YAML)
    return load_spec(p)


@pytest.fixture
def spec_path(tmp_path: Path) -> Path:
    p = tmp_path / "slo.yaml"
    p.write_text(SPEC_YAML)
    return p


@pytest.fixture
def known_records() -> list[dict[str, Any]]:
    return records_from_fragments(known_fragments())
