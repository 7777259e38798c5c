"""Capacity planning from tokens: KV bytes, resident tokens, replicas with headroom, N+1."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from slo_builders import frag

from slokit.analysis.capacity import (
    kv_shape,
    plan,
    sustainable_work,
)
from slokit.analysis.slo_spec import SloSpec
from slokit.cli import main
from slokit.errors import BadInput
from slokit.sources.files import parse_metrics_file
from slokit.sources.runs import records_from_fragments
from slokit.store.db import open_store

TINY = {"num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
        "head_dim": 64, "hidden_size": 128, "dtype": "bfloat16"}  # fmt: skip


def test_kv_bytes_per_token_of_the_tiny_llama() -> None:
    # 2 (K, V) x 2 layers x 1 KV head x 64 x 2 bytes
    assert kv_shape(TINY).bytes_per_token == 512


def test_a_70b_class_config_with_gqa_and_fp8_kv() -> None:
    cfg = {"num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
           "hidden_size": 8192, "torch_dtype": "bfloat16"}  # fmt: skip
    assert kv_shape(cfg).bytes_per_token == 2 * 80 * 8 * 128 * 2  # 327,680
    assert kv_shape(cfg, kv_dtype="fp8").bytes_per_token == 2 * 80 * 8 * 128


def test_a_config_without_layers_is_bad_input() -> None:
    with pytest.raises(BadInput, match="num_hidden_layers"):
        kv_shape({"num_attention_heads": 2}, where="cfg.json")


def test_resident_tokens_come_from_the_real_vllm_cache_config(vllm_fixtures: Path) -> None:
    recs = parse_metrics_file(
        (vllm_fixtures / "metrics_after_load.prom").read_text(),
        name="after_load",
        instance="tiny-0",
        default_ts=1_700_000_000.0,
    )
    with open_store(":memory:") as store:
        store.append_engine_samples(recs.engine_samples)
        cache = store.reader().cache_config()
    assert cache == {"num_gpu_blocks": 128.0, "block_size": 128.0}
    # the capture's own kv_cache_size_tokens is 16384
    assert plan(cache=cache).get("resident_tokens_per_replica").value == 16384


def test_resident_tokens_from_kv_memory_without_cache_config() -> None:
    p = plan(shape=kv_shape(TINY), kv_memory_bytes=2**30)
    assert p.get("resident_tokens_per_replica").value == 2**30 // 512


def test_replicas_for_a_target_mix_with_headroom_and_n_plus_1() -> None:
    # 10 req/s x (300 + 100) tokens = 4000 tokens/s; one replica sustains 1000 at rho 0.8
    # -> 4000 / 800 = 5 replicas, 6 with N+1.
    p = plan(sustainable_tokens_per_s=1000.0, mix=(300.0, 100.0), arrival_rps=10.0, rho=0.8)
    assert p.get("replicas_needed").value == 5
    assert p.get("replicas_n_plus_1").value == 6
    assert "rho 0.8" in p.get("replicas_needed").assumes


def _step(run: str, rate: float, n: int, t0: float, ttft: float) -> list[Any]:
    return [frag(f"{run}-{k + 1}", slo_class="interactive", replica="r0",
                 arrival_ts=t0 + k / rate, client_ttft_s=ttft, tpot_s=0.01, client_e2e_s=1.0,
                 prompt_tokens=90, output_tokens=10)
            for k in range(n)]  # fmt: skip


def test_sustainable_work_is_the_fastest_step_meeting_the_slo(spec: SloSpec) -> None:
    recs = records_from_fragments(
        _step("s1", 1.0, 11, 0.0, 0.1) + _step("s2", 2.0, 21, 100.0, 0.1)
        + _step("s3", 4.0, 41, 200.0, 0.9)
    )  # fmt: skip
    sw = sustainable_work(recs, spec)
    assert sw is not None and sw.step == "s2" and not sw.lower_bound
    # 21 requests x 100 tokens over 100..111 s (last arrival at 110 s, E2E 1 s)
    assert sw.tokens_per_s == pytest.approx(2100 / 11)


def test_capacity_cli_prints_each_number_with_its_assumptions(
    tmp_path: Path, spec_path: Path
) -> None:
    db = tmp_path / "s.duckdb"
    with open_store(db) as store:
        store.append_fragments(_step("s1", 1.0, 11, 0.0, 0.1))
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    res = CliRunner().invoke(main, [
        "capacity", "--slo", str(spec_path), "--db", str(db), "--model-config", str(tmp_path),
        "--arrival-rps", "5", "--json",
    ])  # fmt: skip
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["kv_bytes_per_token"]["value"] == 512
    # 1100 tokens over 11 s = 100 tokens/s; 5 req/s x 100 tokens / (100 x 0.8) = 6.25 -> 7
    assert doc["replicas_needed"]["value"] == 7
    assert "lower bound" in doc["sustainable_tokens_per_s_per_replica"]["assumes"]
    assert doc["replicas_n_plus_1"]["value"] == 8
