"""`slokit demo --engine vllm`: the demo on two real vLLM servers on the CPU."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_demo_on_real_vllm_names_the_queue_burst_and_loses_no_request(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "demo"
    res = subprocess.run(
        [sys.executable, "-m", "slokit", "demo", "--engine", "vllm", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    text = res.stdout + res.stderr
    assert res.returncode == 0, text
    # Every load run's requests fit the tiny model (its workload is sized for its tokenizer).
    runs = re.findall(r"sent (\d+), ok (\d+), errors (\d+)", text)
    assert len(runs) == 4 and all(int(e) == 0 for _, _, e in runs), text
    # ... and no client gives up: every request sent is answered (none cut, none timed out)
    assert all(sent == ok for sent, ok, _ in runs), text
    assert re.search(r"^(WARNING|CRITICAL) +queue_saturation +vllm-0 ", text, re.M), text
    assert not re.search(r"^(INFO|WARNING|CRITICAL) +(kv_pressure|error_burst) ", text, re.M)
    assert "cause: Queued" in text and "sources=client,vllm" in text
    assert (out / "report.html").stat().st_size > 10_000
