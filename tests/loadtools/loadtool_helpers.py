"""Helpers for running real load tools: each tool's venv (scripts/loadtools-env.sh), a local
tokenizer (no hub download), an offline environment, the model and the request ids the
simulator served.

A tool's tests skip when its venv is absent, unless ``SLOKIT_REQUIRE_LOADTOOLS`` is set: then
they fail.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from slokit.ids import checked_request_id

REPO = Path(__file__).resolve().parents[2]
SLO = REPO / "examples" / "slo" / "chat.yaml"

#: A byte-level BPE without merges (one token per byte), saved as tokenizer.json plus
#: tokenizer_config.json: ``transformers.AutoTokenizer.from_pretrained(dir)`` loads it offline.
_BUILD_TOKENIZER = """
import sys
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
alphabet = pre_tokenizers.ByteLevel.alphabet()
vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
for ch in sorted(alphabet):
    vocab[ch] = len(vocab)
tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
fast = PreTrainedTokenizerFast(
    tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="</s>"
)
fast.save_pretrained(sys.argv[1])
"""


def tool_bin(tool: str) -> Path:
    """``.venv-<tool>/bin``; skips (or fails under SLOKIT_REQUIRE_LOADTOOLS) when absent."""
    bin_dir = REPO / f".venv-{tool}" / "bin"
    if not (bin_dir / "python").exists():
        why = f"{tool} is not installed in .venv-{tool} (run `make loadtools-env`)"
        if os.environ.get("SLOKIT_REQUIRE_LOADTOOLS"):
            pytest.fail(why + "; SLOKIT_REQUIRE_LOADTOOLS is set")
        pytest.skip(why)
    return bin_dir


def build_tokenizer(bin_dir: Path, out: Path) -> Path:
    """A local tokenizer directory built with the tool venv's tokenizers/transformers."""
    subprocess.run(
        [str(bin_dir / "python"), "-c", _BUILD_TOKENIZER, str(out)],
        check=True,
        timeout=120,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
    )
    return out


def offline_env(home: Path) -> dict[str, str]:
    """The tool's environment: caches under ``home`` (the tokenizer is a local directory; the
    hub's offline switches are left unset, as AIPerf's record processor then mistakes that
    directory for a repo id)."""
    return {
        **os.environ,
        "HF_HOME": str(home / "hf"),
        "HOME": str(home),
        "NO_COLOR": "1",
    }


def served_model(url: str) -> str:
    """The model the OpenAI-compatible server at ``url`` serves (its first ``/v1/models``)."""
    with urllib.request.urlopen(url + "/v1/models", timeout=10) as r:
        return str(json.load(r)["data"][0]["id"])


def served_ids(spans: InMemorySpanExporter, want: set[str], wait_s: float = 15.0) -> set[str]:
    """The request ids the simulator served (its ``gen_ai.request.id``, normalized), waited
    for until they cover ``want`` or ``wait_s`` passed (spans are exported in batches)."""
    deadline = time.monotonic() + wait_s
    while True:
        out: set[str] = set()
        for span in spans.get_finished_spans():
            raw = (span.attributes or {}).get("gen_ai.request.id")
            if isinstance(raw, str):
                out.add(checked_request_id(raw, from_span=True))
        if want <= out or time.monotonic() > deadline:
            return out
        time.sleep(0.2)
