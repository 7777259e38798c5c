"""Record writing, URLs, percentiles and the progress callback."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from load_fake_server import FakeVllm

from slokit.errors import BadInput
from slokit.lab.load import (
    LoadConfig,
    Progress,
    RecordWriter,
    format_progress,
    models_url,
    percentile,
    request_url,
    run_load,
)


def test_the_writer_flushes_each_full_batch_before_close(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    writer = RecordWriter(path, batch=2, flush_interval_s=3600)
    for i in range(3):
        writer.write({"request_id": str(i)})
    assert [json.loads(x)["request_id"] for x in path.read_text().splitlines()] == ["0", "1"]
    writer.close()
    assert len(path.read_text().splitlines()) == 3


def test_the_writer_flushes_after_its_interval_even_when_the_batch_is_not_full(
    tmp_path: Path,
) -> None:
    now = [0.0]
    path = tmp_path / "r.jsonl"
    writer = RecordWriter(path, batch=100, flush_interval_s=0.5, clock=lambda: now[0])
    writer.write({"a": 1})
    assert path.read_text() == ""
    now[0] = 0.6
    writer.write({"a": 2})
    assert len(path.read_text().splitlines()) == 2
    writer.close()


def test_an_unwritable_records_path_is_bad_input(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    with pytest.raises(BadInput, match="cannot write records"):
        RecordWriter(tmp_path / "f" / "r.jsonl")


@pytest.mark.parametrize(
    ("base", "endpoint", "url"),
    [
        ("http://h:8000", "completions", "http://h:8000/v1/completions"),
        ("http://h:8000/", "chat", "http://h:8000/v1/chat/completions"),
        ("http://h:8000/v1", "completions", "http://h:8000/v1/completions"),
        ("http://h/gw/v1/chat/completions", "completions", "http://h/gw/v1/chat/completions"),
    ],
)
def test_request_url_accepts_a_base_or_a_full_endpoint_url(
    base: str, endpoint: str, url: str
) -> None:
    assert request_url(base, endpoint) == url  # type: ignore[arg-type]


def test_models_url_sits_beside_the_completions_path() -> None:
    assert models_url("http://h/gw/v1/completions") == "http://h/gw/v1/models"
    assert models_url("http://h:8000") == "http://h:8000/v1/models"


def test_percentile_interpolates_between_ranks() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == pytest.approx(2.5)
    assert percentile([5.0], 99) == 5.0
    assert percentile([], 50) is None


def test_progress_is_reported_while_the_run_goes(fake_vllm: FakeVllm) -> None:
    seen: list[Progress] = []
    cfg = LoadConfig(
        url=fake_vllm.url, duration_s=0.6, rate=10.0, progress_interval_s=0.2, model="tiny"
    )
    asyncio.run(run_load(cfg, on_progress=seen.append))
    assert len(seen) >= 2
    assert seen[-1].sent >= seen[0].sent
    assert format_progress(seen[-1]).startswith("[")


def test_an_unreachable_server_without_model_asks_for_model() -> None:
    cfg = LoadConfig(url="http://127.0.0.1:9", duration_s=1.0, rate=1.0)
    with pytest.raises(BadInput, match="pass --model"):
        asyncio.run(run_load(cfg))
