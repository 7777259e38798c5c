"""Fixtures for the load generator's tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from load_fake_server import FakeVllm, serve_fake_vllm


@pytest.fixture
def fake_vllm(vllm_fixtures: Path) -> Iterator[FakeVllm]:
    """A vLLM-like SSE server built from the real captures; tests tune ``.behaviour``."""
    with serve_fake_vllm(vllm_fixtures) as server:
        yield server
