"""Fixtures for the diagnose tests: an empty in-memory store and a runner."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from diag_synth import Run

from slokit.analysis.diagnose import diagnose
from slokit.store.db import Store, open_store


@pytest.fixture
def store() -> Iterator[Store]:
    with open_store(":memory:") as s:
        yield s


@pytest.fixture
def run(store: Store) -> Run:
    """Diagnose the fixture store (all its data unless since/until are given)."""

    def _run(**kw: Any) -> dict[str, Any]:
        return diagnose(store.reader(), **kw)

    return _run
