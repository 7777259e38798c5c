"""One window resolver: ``--since 15m`` means the same window through the CLI, the sidecar's
``/api/diagnose`` and the library, because all three resolve it in ``slokit.store.window``."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
from click.testing import CliRunner
from sidecar_harness import StartSidecar

import slokit
from slokit.cli import main
from slokit.records import EngineSample, RequestFragment


def _store_with_40_minutes(db: Path) -> tuple[float, float]:
    """Engine samples every 10 s over 40 minutes, and a request in each minute."""
    t0 = 1_790_000_000.0
    samples = [
        EngineSample(ts=t0 + 10 * i, replica="pod-a", model="m", running=2, waiting=i % 3)
        for i in range(241)
    ]
    frags = [
        RequestFragment(
            request_id=f"r{m}", source="vllm", fragment_id=f"f{m}", replica="pod-a",
            arrival_ts=t0 + 60 * m, e2e_s=0.5, ttft_s=0.1,
        )
        for m in range(40)
    ]  # fmt: skip
    with slokit.open_store(db, read_only=False) as store:
        store.append_engine_samples(samples)
        store.append_fragments(frags)
        return store.reader().bounds()  # type: ignore[return-value]


def test_a_relative_since_is_the_same_window_in_the_cli_the_api_and_the_library(
    start_sidecar: StartSidecar, tmp_path: Path
) -> None:
    db = tmp_path / "w.duckdb"
    lo, hi = _store_with_40_minutes(db)
    since = "15m"
    res = CliRunner().invoke(main, ["diagnose", "--db", str(db), "--since", since, "--json"])
    assert res.exit_code == 0, res.output
    cli_window = json.loads(res.output)["window"]
    library = slokit.window(db, since)
    assert library.since == hi - 900 and lo < library.since

    sc = start_sidecar(db=db)
    api = httpx.get(f"{sc.api}/api/diagnose", params={"since": since}, timeout=60)
    assert api.status_code == 200, api.text
    assert api.json()["window"] == cli_window
    assert cli_window["since"] == library.to_json()["since"]


def test_an_unreadable_bound_is_the_same_error_in_the_cli_and_the_api(
    start_sidecar: StartSidecar, tmp_path: Path
) -> None:
    db = tmp_path / "w.duckdb"
    _store_with_40_minutes(db)
    res = CliRunner().invoke(main, ["diagnose", "--db", str(db), "--since", "1e400"])
    assert res.exit_code == 2
    sc = start_sidecar(db=db)
    api = httpx.get(f"{sc.api}/api/diagnose", params={"since": "1e400"}, timeout=60)
    assert api.status_code == 400
    assert api.json()["error"] in res.output
