"""slokit.lab.tiny_model parts that need no ML libraries (the build itself runs in .venv-vllm,
and is covered by the vllm-marked tests that serve it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slokit.lab.tiny_model import (
    STAMP_NAME,
    TinyModelSpec,
    build_tiny_model,
    build_with_interpreter,
    corpus,
    is_built,
)


def test_corpus_is_the_same_for_the_same_seed() -> None:
    assert list(corpus(3, 50)) == list(corpus(3, 50))


def test_corpus_differs_between_seeds() -> None:
    assert list(corpus(3, 50)) != list(corpus(4, 50))


def test_corpus_mixes_words_and_numbers() -> None:
    tokens = " ".join(corpus(0, 200)).split()
    assert any(t.strip(".,?!:").isdigit() for t in tokens)
    assert any(t.strip(".,?!:").isalpha() for t in tokens)


def test_default_spec_is_the_shape_vllm_cpu_accepts() -> None:
    spec = TinyModelSpec()
    assert spec.head_dim == 64  # the CPU attention kernel rejects head_dim 16
    assert (spec.hidden_size, spec.num_attention_heads, spec.num_key_value_heads) == (128, 2, 1)
    assert spec.max_position_embeddings == 4096


def test_a_directory_without_a_stamp_is_not_built(tmp_path: Path) -> None:
    assert not is_built(tmp_path / "model")


def test_a_stamp_of_another_spec_is_not_a_build_of_this_one(tmp_path: Path) -> None:
    (tmp_path / STAMP_NAME).write_text(json.dumps(TinyModelSpec(seed=1).stamp()))
    assert is_built(tmp_path, TinyModelSpec(seed=1))
    assert not is_built(tmp_path, TinyModelSpec(seed=2))


def test_a_corrupt_stamp_is_not_a_build(tmp_path: Path) -> None:
    (tmp_path / STAMP_NAME).write_text("{not json")
    assert not is_built(tmp_path)


def test_a_matching_build_is_kept_without_rebuilding(tmp_path: Path) -> None:
    (tmp_path / STAMP_NAME).write_text(json.dumps(TinyModelSpec().stamp()))
    result = build_tiny_model(tmp_path)
    assert not result.built


def test_a_foreign_non_empty_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not a tiny-model build"):
        build_tiny_model(tmp_path)
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_a_subprocess_build_only_varies_the_seed(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="only the seed"):
        build_with_interpreter(tmp_path, Path("python"), TinyModelSpec(vocab_size=500))
