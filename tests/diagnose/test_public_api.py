"""The public Python API: what ``help(slokit)`` shows, that importing it is cheap, and that
the examples of docs/api.md run against a store the simulator filled."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from scenario_harness import SCENARIO_DIR, load_scenario, run_scenario_virtual

import slokit

REPO = Path(__file__).resolve().parents[2]
API_DOC = REPO / "docs" / "api.md"
CURATED = ("diagnose", "explain", "slo_report", "html_report", "gate", "open_store", "Reader",
           "LocalReader", "Window", "window", "load_spec", "Diagnosis", "Explanation")  # fmt: skip


def test_help_shows_the_curated_api() -> None:
    out = subprocess.run(
        [sys.executable, "-c", "import slokit; help(slokit)"],
        capture_output=True, text=True, check=True, env={"PAGER": "cat", "TERM": "dumb"},
    ).stdout  # fmt: skip
    for name in CURATED:
        assert re.search(rf"\b{name}\b", out), name


def test_every_public_name_resolves() -> None:
    for name in slokit.__all__:
        assert getattr(slokit, name) is not None, name


def test_importing_slokit_loads_neither_duckdb_nor_pandas() -> None:
    code = "import sys, slokit; print(sorted(m for m in ('duckdb', 'pandas', 'pyarrow') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def _python_blocks(doc: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", doc, re.S)


@pytest.fixture(scope="module")
def filled_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``slokit.duckdb`` holding a virtual-time queue saturation, and ``slo.yaml``."""
    where = tmp_path_factory.mktemp("api")
    collected = run_scenario_virtual(load_scenario(SCENARIO_DIR / "queue_saturation.yaml"))
    with slokit.open_store(where / "slokit.duckdb", read_only=False) as store:
        collected.store_into(store)
    shutil.copy(REPO / "examples" / "slo" / "chat.yaml", where / "slo.yaml")
    return where


def test_the_api_doc_examples_print_a_diagnosis_an_explanation_and_an_slo_report(
    filled_store: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    blocks = _python_blocks(API_DOC.read_text(encoding="utf-8"))
    assert len(blocks) == 3
    monkeypatch.chdir(filled_store)
    namespace: dict[str, object] = {}
    for block in blocks:
        exec(compile(block, str(API_DOC), "exec"), namespace)  # the doc's own examples
    out = capsys.readouterr().out
    assert re.search(r"^(critical|warning)\s+queue_saturation\s+TTFT p95", out, re.M), out
    assert "rules that ran:" in out
    assert re.search(r"dominant: queue\nQueued .* behind \d+ waiting requests", out), out
    assert re.search(r"^attainment \d+\.\d%", out, re.M)
    assert "SLO report for" in out
