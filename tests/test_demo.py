"""`make demo` end to end, shortened: simulated replicas, sidecar, load, findings, explain."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
def test_demo_runs_the_main_job_and_names_the_incident(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    res = subprocess.run(
        [sys.executable, "-m", "slokit", "demo", "--scale", "0.6", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    text = res.stdout + res.stderr
    assert res.returncode == 0, text
    # The burst on replica 0 shows as queue saturation, the KV shrink on replica 1 as KV pressure.
    assert "queue_saturation" in text and "sim-vllm-0" in text
    assert "kv_pressure" in text and "sim-vllm-1" in text
    assert "$ slokit explain" in text and "cause: " in text
    assert "attainment" in text
    # What the load generator cuts at a phase's end is incomplete, never a timeout or an
    # error: each phase plus its drain stays below the request timeout.
    counts = r"sent (\d+), ok (\d+), errors (\d+), timeouts (\d+), incomplete (\d+)"
    runs = re.findall(counts, text)
    assert len(runs) == 4 and all(t == "0" for *_, t, _ in runs), text
    assert all(int(s) == int(o) + int(e) + int(i) for s, o, e, _, i in runs), text
    assert not re.search(r"^ *(INFO|WARNING|CRITICAL) +error_burst ", text, re.M), text
    assert (out / "report.html").stat().st_size > 10_000
    assert (out / "slokit.duckdb").exists()
