"""Fixtures for the generator tests: the example SLO spec and the real promtool."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from slokit.analysis.slo_spec import SloSpec, load_spec

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_SPEC = "examples/slo/chat.yaml"


@pytest.fixture(scope="session")
def spec() -> SloSpec:
    return load_spec(REPO / EXAMPLE_SPEC)


@pytest.fixture(scope="session")
def promtool() -> str:
    """Path of promtool (Debian package ``prometheus``); its absence is an error, not a skip."""
    path = shutil.which("promtool")
    if path is None:
        raise RuntimeError(
            "promtool not found: install the Debian package 'prometheus' (scripts/system-deps.sh)"
        )
    return path
