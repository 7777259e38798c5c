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
        # 0.9: the baseline phase (35 s at scale 1) stays longer than diagnose's three
        # 10 s buckets of history, which the incident is judged against.
        [sys.executable, "-m", "slokit", "demo", "--scale", "0.9", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=900,  # a hang guard, not a bound
        check=False,
    )
    text = res.stdout + res.stderr
    assert res.returncode == 0, text
    # The burst on replica 0 shows as queue saturation, the KV shrink on replica 1 as KV
    # pressure: both root causes, each judged against the quiet baseline phase before it.
    assert re.search(r"^Root cause: .*kv_pressure on sim-vllm-1", text, re.M), text
    assert re.search(r"^Root cause: .*queue_saturation on sim-vllm-0", text, re.M), text
    assert re.search(r"^(WARNING|CRITICAL) +queue_saturation +sim-vllm-0 ", text, re.M), text
    assert re.search(r"^(WARNING|CRITICAL) +kv_pressure +sim-vllm-1 ", text, re.M), text
    assert "from history)" in text  # the incident's baseline is the phase before it
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
