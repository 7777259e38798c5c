"""Sidecar config: YAML file < SLOKIT_* env < flags, and clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from slokit.errors import BadInput
from slokit.sidecar.config import Target, load_config


def _yaml(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "sidecar.yaml"
    p.write_text(text)
    return p


def test_flags_win_over_env_which_wins_over_the_file(tmp_path: Path) -> None:
    f = _yaml(tmp_path, "db: file.duckdb\nscrape_interval_s: 5\nreplica: from-file\nnvml: true\n")
    env = {"SLOKIT_DB": "env.duckdb", "SLOKIT_SCRAPE_INTERVAL_S": "2"}
    cfg = load_config(f, env=env, flags={"db": "flag.duckdb", "replica": None})
    assert cfg.db == "flag.duckdb"
    assert cfg.scrape_interval_s == 2.0
    assert cfg.replica == "from-file"
    assert cfg.nvml is True


def test_scrape_timeout_stays_below_the_interval() -> None:
    cfg = load_config(env={}, flags={"scrape_interval_s": 1.0, "scrape_timeout_s": 5.0})
    assert cfg.timeout_s < 1.0
    assert load_config(env={}, flags={"scrape_interval_s": 2.0}).timeout_s == pytest.approx(1.6)


def test_list_values_come_from_flags_env_or_yaml(tmp_path: Path) -> None:
    f = _yaml(tmp_path, "vllm_urls: [http://a:8000/metrics]\n")
    assert load_config(f, env={}).vllm_urls == ("http://a:8000/metrics",)
    env = {"SLOKIT_VLLM_URLS": "http://b/metrics, http://c/metrics"}
    assert load_config(f, env=env).vllm_urls == ("http://b/metrics", "http://c/metrics")
    assert load_config(f, env=env, flags={"vllm_urls": ("http://d/metrics",)}).vllm_urls == (
        "http://d/metrics",
    )


def test_targets_name_their_replica() -> None:
    one = load_config(env={}, flags={"vllm_urls": ("http://v:8000/metrics",), "replica": "pod-1",
                                     "dcgm_urls": ("http://d:9400/metrics",)})  # fmt: skip
    assert one.targets() == [Target("http://v:8000/metrics", "vllm", "pod-1"),
                             Target("http://d:9400/metrics", "dcgm", "pod-1")]  # fmt: skip
    two = load_config(env={}, flags={"vllm_urls": ("gpu0=http://v:8000/metrics",
                                                   "http://v:8001/metrics")})  # fmt: skip
    assert [t.replica for t in two.targets()] == ["gpu0", "v:8001"]


def test_an_empty_receiver_address_turns_it_off() -> None:
    cfg = load_config(env={"SLOKIT_OTLP_GRPC": ""}, flags={"otlp_http": ""})
    assert cfg.otlp_http is None and cfg.otlp_grpc is None
    assert cfg.listen == "127.0.0.1:9464"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("dbb: x\n", "unknown keys"),
        ("scrape_interval_s: fast\n", "scrape_interval_s"),
        ("- a\n", "mapping"),
        ("a: [\n", "not valid YAML"),
    ],
)
def test_a_bad_file_is_a_clear_error(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(BadInput, match=message):
        load_config(_yaml(tmp_path, text), env={})


def test_a_scrape_target_must_be_a_url() -> None:
    with pytest.raises(BadInput, match="http"):
        load_config(env={}, flags={"vllm_urls": ("localhost:8000",)}).validate()


def test_connection_limits_have_defaults_and_come_from_env_or_flags() -> None:
    cfg = load_config(env={})
    assert (cfg.header_timeout_s, cfg.body_timeout_s, cfg.idle_timeout_s) == (10.0, 30.0, 75.0)
    assert (cfg.api_max_connections, cfg.otlp_max_connections) == (128, 256)
    env = {"SLOKIT_HEADER_TIMEOUT_S": "2.5", "SLOKIT_API_MAX_CONNECTIONS": "64"}
    cfg = load_config(env=env, flags={"otlp_max_connections": 32}).validate()
    assert cfg.header_timeout_s == 2.5
    assert (cfg.api_max_connections, cfg.otlp_max_connections) == (64, 32)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("header_timeout_s", "0"),
        ("header_timeout_s", "-1"),
        ("body_timeout_s", "nan"),
        ("idle_timeout_s", "inf"),
        ("api_max_connections", "0"),
        ("otlp_max_connections", "7"),
    ],
)
def test_a_connection_limit_out_of_range_is_refused(key: str, value: str) -> None:
    with pytest.raises(BadInput, match=key):
        load_config(env={"SLOKIT_" + key.upper(): value}).validate()


@pytest.mark.parametrize(
    ("token", "reason"),
    [
        (" ", "blank"),
        ("", "blank"),
        ("\t\n", "blank"),
        ("two words", "visible ASCII"),
        ("line\nbreak", "visible ASCII"),
        ("tab\tinside", "visible ASCII"),
        ("s3crét", "visible ASCII"),
        ("nul\x00", "visible ASCII"),
    ],
)
def test_a_token_that_cannot_travel_in_a_header_is_refused(token: str, reason: str) -> None:
    with pytest.raises(BadInput, match=reason):
        load_config(env={}, flags={"token": token, "listen": "0.0.0.0:9464"}).validate()
    with pytest.raises(BadInput, match=reason):  # on loopback too: it is a mistake anywhere
        load_config(env={}, flags={"token": token}).validate()


def test_sidecar_with_a_blank_token_exits_2_with_a_one_line_reason(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from slokit.cli import main

    res = CliRunner().invoke(main, ["sidecar", "--token", " ", "--listen", "0.0.0.0:0",
                                    "--db", str(tmp_path / "s.duckdb")])  # fmt: skip
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("slokit: ") and "blank" in lines[0]
    assert not (tmp_path / "s.duckdb").exists()


def test_the_journal_lives_beside_the_database_by_default() -> None:
    cfg = load_config(env={"SLOKIT_DB": "/data/s.duckdb"})
    assert cfg.commit_interval_s == 5.0
    assert cfg.validate().journal_path() == "/data/s.duckdb.journal"
    off = {"SLOKIT_COMMIT_INTERVAL_S": "0", "SLOKIT_DB": "/data/s.duckdb"}
    assert load_config(env=off).journal_path() is None  # each batch committed before its ack
    env = {"SLOKIT_COMMIT_INTERVAL_S": "0.5", "SLOKIT_JOURNAL": "/fast/j"}
    assert load_config(env=env).journal_path() == "/fast/j"
    memory = {"SLOKIT_COMMIT_INTERVAL_S": "1", "SLOKIT_DB": ":memory:"}
    assert load_config(env=memory).journal_path() is None  # nothing to make durable


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "61"])
def test_a_commit_interval_out_of_range_is_refused(value: str) -> None:
    with pytest.raises(BadInput, match="commit_interval_s"):
        load_config(env={"SLOKIT_COMMIT_INTERVAL_S": value}).validate()


def test_duckdb_runs_one_thread_unless_told_otherwise() -> None:
    assert load_config(env={}).db_threads == 1
    assert load_config(env={"SLOKIT_DB_THREADS": "0"}).validate().db_threads == 0  # per core
    assert load_config(env={}, flags={"db_threads": 4}).validate().db_threads == 4


def test_duckdbs_allocator_background_thread_is_on_unless_told_otherwise() -> None:
    assert load_config(env={}).validate().db_allocator_background_threads is True
    env = {"SLOKIT_DB_ALLOCATOR_BACKGROUND_THREADS": "false"}
    assert load_config(env=env).validate().db_allocator_background_threads is False


@pytest.mark.parametrize("value", ["-1", "1025"])
def test_a_thread_count_out_of_range_is_refused(value: str) -> None:
    with pytest.raises(BadInput, match="db_threads"):
        load_config(env={"SLOKIT_DB_THREADS": value}).validate()


def test_scraped_samples_are_committed_every_five_seconds_unless_told_otherwise() -> None:
    assert load_config(env={}).validate().sample_commit_interval_s == 5.0
    each_tick = {"SLOKIT_SAMPLE_COMMIT_INTERVAL_S": "0"}
    assert load_config(env=each_tick).validate().sample_commit_interval_s == 0.0


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "61"])
def test_a_sample_commit_interval_out_of_range_is_refused(value: str) -> None:
    with pytest.raises(BadInput, match="sample_commit_interval_s"):
        load_config(env={"SLOKIT_SAMPLE_COMMIT_INTERVAL_S": value}).validate()


def test_the_store_keeps_150000_requests_and_a_day_unless_told_otherwise() -> None:
    cfg = load_config(env={}).validate()
    assert (cfg.retention_requests, cfg.retention_s) == (150_000, 86_400.0)
    keep_all = {"SLOKIT_RETENTION_REQUESTS": "0", "SLOKIT_RETENTION_S": "0"}
    cfg = load_config(env=keep_all).validate()
    assert (cfg.retention_requests, cfg.retention_s) == (0, 0.0)


@pytest.mark.parametrize(
    ("key", "value"),
    [("RETENTION_REQUESTS", "999"), ("RETENTION_REQUESTS", "-1"), ("RETENTION_S", "899"),
     ("RETENTION_S", "-5"), ("RETENTION_S", "nan"), ("RETENTION_S", "inf")],
)  # fmt: skip
def test_a_retention_below_what_the_findings_read_is_refused(key: str, value: str) -> None:
    with pytest.raises(BadInput, match=key.lower()):
        load_config(env={f"SLOKIT_{key}": value}).validate()


def test_a_lake_holds_back_at_most_100000_requests_unless_told_otherwise() -> None:
    assert load_config(env={}).validate().lake_hold_requests == 100_000
    none = load_config(env={"SLOKIT_LAKE_HOLD_REQUESTS": "0"}).validate()
    assert none.lake_hold_requests == 0  # the lake holds nothing past retention_requests
    with pytest.raises(BadInput, match="lake_hold_requests"):
        load_config(env={"SLOKIT_LAKE_HOLD_REQUESTS": "-1"}).validate()
