"""``slokit load`` on the command line: flags to library, records to file, errors to exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from load_fake_server import FakeVllm, serve_fake_vllm

from slokit.cli import main
from slokit.lab.load import RECORD_KEYS


def test_load_writes_records_and_prints_the_summary(fake_vllm: FakeVllm, tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    res = CliRunner().invoke(
        main,
        [
            "load",
            "--url",
            fake_vllm.url,
            "--rate",
            "10",
            "--duration",
            "0.5s",
            "--out",
            str(out),
            "--run-id",
            "cli",
            "--header",
            "X-Tenant=acme",
        ],
    )
    assert res.exit_code == 0, res.output
    assert "sent 5  ok 5" in res.output
    assert "achieved" in res.output
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert [tuple(r) for r in recs] == [RECORD_KEYS] * 5
    assert fake_vllm.received[0]["headers"]["x-tenant"] == "acme"


def test_load_json_prints_a_machine_readable_summary(fake_vllm: FakeVllm) -> None:
    res = CliRunner().invoke(
        main, ["load", "--url", fake_vllm.url, "--users", "1", "--duration", "0.2", "--json"]
    )
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output)
    assert summary["mode"] == "closed" and summary["ok"] == summary["sent"] > 0


def test_a_repeated_url_sends_to_each_replica_in_turn(
    fake_vllm: FakeVllm, vllm_fixtures: Path
) -> None:
    with serve_fake_vllm(vllm_fixtures) as second:
        res = CliRunner().invoke(
            main,
            [
                *("load", "--url", fake_vllm.url, "--url", second.url, "--arrival", "constant"),
                *("--rate", "10", "--duration", "0.4s", "--no-progress"),
            ],
        )
    assert res.exit_code == 0, res.output
    assert (len(fake_vllm.received), len(second.received)) == (2, 2)


def test_a_repeated_url_that_is_not_http_is_exit_2(fake_vllm: FakeVllm) -> None:
    res = CliRunner().invoke(
        main,
        ["load", "--url", fake_vllm.url, "--url", "pod-b:8000", "--rate", "1", "--duration", "1"],
    )
    assert res.exit_code == 2
    assert "'pod-b:8000'" in res.output


def test_load_sweep_prints_one_row_per_rate(fake_vllm: FakeVllm, tmp_path: Path) -> None:
    res = CliRunner().invoke(
        main,
        [
            "load",
            "--url",
            fake_vllm.url,
            "--sweep",
            "4,8",
            "--duration",
            "0.5",
            "--out",
            str(tmp_path / "s.jsonl"),
        ],
    )
    assert res.exit_code == 0, res.output
    table = res.output.split("sweep\n", 1)[1].splitlines()
    assert [row.split()[0] for row in table[1:]] == ["4", "8"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.rate4.jsonl", "s.rate8.jsonl"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--duration", "5"], "exactly one of --rate"),
        (["--rate", "1", "--users", "2", "--duration", "5"], "exactly one of --rate"),
        (["--rate", "1", "--duration", "soon"], "--duration"),
        (["--sweep", "5,x", "--duration", "5"], "--sweep"),
        (["--rate", "1", "--duration", "5", "--header", "novalue"], "--header"),
        (["--rate", "1", "--duration", "5", "--drain=-1"], "--drain must be zero or positive"),
        (["--rate", "1", "--duration", "5", "--drain", "later"], "--drain"),
        (["--rate", "1", "--duration", "5", "--workload", "/nonexistent.yaml"], "cannot read"),
    ],
)
def test_bad_flags_exit_2_with_a_one_line_reason(args: list[str], message: str) -> None:
    res = CliRunner().invoke(main, ["load", "--url", "http://127.0.0.1:9", *args])
    assert res.exit_code == 2
    assert message in res.output
    assert "Traceback" not in res.output
