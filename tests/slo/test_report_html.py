"""`slokit report --out report.html`: a self-contained page with every plot drawn."""

from __future__ import annotations

import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from slo_builders import frag

from slokit.cli import main
from slokit.records import EngineSample, Finding
from slokit.store.db import open_store

PLOTS = (
    "throughput_vs_concurrency",
    "latency_vs_rate",
    "active_sequences",
    "completion_timeline",
    "slowest_decomposition",
)


class _Plots(HTMLParser):
    """Counts the data marks inside each <figure data-plot=...>; collects fetched URLs."""

    def __init__(self) -> None:
        super().__init__()
        self.marks: dict[str, int] = {}
        self.current: str | None = None
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        plot = a.get("data-plot")
        if tag == "figure" and plot:
            self.current = plot
            self.marks[plot] = 0
        if self.current and "mark" in (a.get("class") or "").split():
            self.marks[self.current] += 1
        for key in ("src", "href"):
            if a.get(key):
                self.urls.append(str(a[key]))

    def handle_endtag(self, tag: str) -> None:
        if tag == "figure":
            self.current = None


def _sweep(run: str, rate: float, n: int, t0: float, ttft: float, *, tokens: int) -> list[Any]:
    return [
        frag(f"{run}-{k + 1}", slo_class="interactive", replica="r0", arrival_ts=t0 + k / rate,
             client_ttft_s=ttft, tpot_s=0.02, client_e2e_s=ttft + 0.02 * (tokens - 1),
             queue_s=ttft / 2, prefill_s=ttft / 2, decode_s=0.02 * (tokens - 1),
             output_tokens=tokens + (k % 3) * 10, prompt_tokens=100)
        for k in range(n)
    ]  # fmt: skip


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "s.duckdb"
    with open_store(path) as store:
        store.append_fragments(
            _sweep("sw-s1", 2.0, 20, 0.0, 0.1, tokens=20)
            + _sweep("sw-s2", 4.0, 40, 20.0, 0.2, tokens=40)
            + _sweep("sw-s3", 8.0, 80, 40.0, 0.9, tokens=60)
        )
        store.append_engine_samples(
            [EngineSample(ts=float(t), replica="r0", model="m", running=float(t % 7),
                          waiting=float(t % 3)) for t in range(0, 52, 2)]
        )  # fmt: skip
        store.append_findings([
            Finding("beyond_knee", "warning", 0.8, "r0", 40.0, 50.0,
                    "tail <explodes> at 8 req/s", {}, "runbooks/beyond_knee.md"),
        ])  # fmt: skip
    return path


def _render(tmp_path: Path, db: Path, spec_path: Path) -> tuple[str, Path]:
    out = tmp_path / "report.html"
    res = CliRunner().invoke(
        main, ["report", "--out", str(out), "--slo", str(spec_path), "--db", str(db)]
    )
    assert res.exit_code == 0, res.output
    return out.read_text(), out


def test_every_plot_is_drawn_with_data(tmp_path: Path, db: Path, spec_path: Path) -> None:
    page, _ = _render(tmp_path, db, spec_path)
    p = _Plots()
    p.feed(page)
    assert set(p.marks) == set(PLOTS)
    assert p.marks["throughput_vs_concurrency"] == 3  # one point per load run
    assert p.marks["latency_vs_rate"] == 6  # TTFT and TPOT per run
    assert p.marks["active_sequences"] == 52  # running and waiting, 26 samples
    assert p.marks["completion_timeline"] == 140
    assert p.marks["slowest_decomposition"] == 12 * 3  # queue, prefill, decode (no "other")


def test_the_page_needs_no_network(tmp_path: Path, db: Path, spec_path: Path) -> None:
    page, _ = _render(tmp_path, db, spec_path)
    p = _Plots()
    p.feed(page)
    assert p.urls == []
    assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", page)


def test_the_page_shows_attainment_cost_and_escaped_findings(
    tmp_path: Path, db: Path, spec_path: Path
) -> None:
    page, _ = _render(tmp_path, db, spec_path)
    assert "<h2>SLO attainment</h2>" in page and "per successful task" in page
    assert "tail &lt;explodes&gt; at 8 req/s" in page
    assert "Max goodput" in page and "4.00 req/s" in page  # the 8 req/s step misses


def test_findings_are_listed_most_severe_first(tmp_path: Path) -> None:
    with open_store(tmp_path / "f.duckdb") as store:
        store.append_findings([
            Finding("telemetry_gap", "info", 0.9, None, 30.0, 50.0, "no GPU", {}, "runbooks/telemetry_gap.md"),
            Finding("queue_saturation", "warning", 0.8, "r0", 20.0, 50.0, "q", {}, "runbooks/queue_saturation.md"),
            Finding("kv_pressure", "critical", 0.9, "r1", 10.0, 50.0, "kv", {}, "runbooks/kv_pressure.md"),
            Finding("error_burst", "warning", 0.7, "r0", 40.0, 50.0, "e", {}, "runbooks/error_burst.md"),
        ])  # fmt: skip
        found = store.reader().findings(None, None)
    assert [f["rule"] for f in found] == [
        "kv_pressure",
        "error_burst",  # the newer warning first
        "queue_saturation",
        "telemetry_gap",
    ]


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.chromium
def test_headless_chromium_renders_a_readable_screenshot(
    tmp_path: Path, db: Path, spec_path: Path
) -> None:
    browser = _chromium()
    if browser is None:
        pytest.skip("chromium not installed (Debian package `chromium`)")
    _, html_file = _render(tmp_path, db, spec_path)
    png = tmp_path / "report.png"
    proc = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         f"--screenshot={png}", "--window-size=1400,2600", html_file.as_uri()],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0 and png.exists(), proc.stderr[-2000:]
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (1400, 2600)
    # A blank page compresses to a few KiB; drawn plots and tables do not.
    assert len(data) > 60_000
