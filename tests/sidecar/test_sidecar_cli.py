"""`slokit sidecar` parses its flags into the config and refuses unsafe binds."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from slokit.cli import main


def test_help_lists_the_contract_flags() -> None:
    out = CliRunner().invoke(main, ["sidecar", "--help"]).output
    for flag in ("--vllm-url", "--dcgm-url", "--nvml / --no-nvml", "--otlp-http", "--otlp-grpc",
                 "--listen", "--db", "--slo", "--config", "--replica", "--scrape-interval",
                 "--token", "--forward-otlp", "--parquet-dir"):  # fmt: skip
        assert flag in out


def test_listening_beyond_loopback_without_a_token_exits_2() -> None:
    res = CliRunner().invoke(
        main, ["sidecar", "--listen", "0.0.0.0:9464"], env={"SLOKIT_TOKEN": ""}
    )
    assert res.exit_code == 2
    assert "token" in res.output


def test_a_bad_config_file_exits_2(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("nope: 1\n")
    res = CliRunner().invoke(main, ["sidecar", "--config", str(p)])
    assert res.exit_code == 2
    assert "unknown keys" in res.output
