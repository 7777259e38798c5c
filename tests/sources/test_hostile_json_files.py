"""Every per-request file reader, fed JSON that Python's parser or ``float`` cannot hold:
a clear BadInput naming the file, never another exception (each once escaped as a
traceback with exit 1: ``ValueError``, ``RecursionError``, ``OverflowError``)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from slokit.errors import BadInput
from slokit.sources.files import parse_quality, parse_requests_file

TESTS = Path(__file__).resolve().parents[1]
LOADTOOLS = TESTS / "fixtures" / "loadtools"
BENCH = TESTS / "sources" / "data" / "vllm-bench-tiny.json"

#: A file and the number in it that is replaced: real captures of each tool.
FILES = {
    "aiperf": (LOADTOOLS / "aiperf-profile_export.jsonl", r'"request_start_ns": *[0-9.e+-]+'),
    "guidellm": (LOADTOOLS / "guidellm-0.8.1-run.json", r'"time_to_first_token_ms": *[0-9.e+-]+'),
    "inference-perf": (
        LOADTOOLS / "inference-perf-per_request_lifecycle_metrics.json",
        r'"end_time": *[0-9.e+-]+',
    ),
    "vllm-bench": (BENCH, r'"ttfts": *\[[0-9.e+-]+'),
}
HOSTILE = {
    "5000-digit-int": "1" * 5000,  # past Python's int-from-string limit
    "int-past-float": "1" + "0" * 400,  # a JSON number, no float holds it
    "nested-past-the-stack": "[" * 100_000 + "]" * 100_000,
}


@pytest.mark.parametrize("value", HOSTILE.values(), ids=HOSTILE.keys())
@pytest.mark.parametrize("tool", FILES.keys())
def test_a_load_tools_file_with_a_value_python_cannot_hold_is_bad_input(
    tool: str, value: str
) -> None:
    path, pattern = FILES[tool]
    text = path.read_text()
    matches = list(re.finditer(pattern, text))  # the last: AIPerf's first record is warmup
    assert matches, f"{path.name} no longer holds {pattern}"
    found = matches[-1]
    key = found.group(0).split(":", 1)[0]
    opener = "[" if "[" in found.group(0) else ""
    hostile = text[: found.start()] + f"{key}: {opener}{value}" + text[found.end() :]
    with pytest.raises(BadInput, match=re.escape(path.name)):
        parse_requests_file(hostile, name=path.name, now=2e9)


@pytest.mark.parametrize("value", HOSTILE.values(), ids=HOSTILE.keys())
def test_a_records_line_with_a_value_python_cannot_hold_is_bad_input(value: str) -> None:
    line = '{"request_id": "r1", "status": "ok", "ttft_s": ' + value + "}\n"
    with pytest.raises(BadInput, match=r"l\.jsonl:1"):
        parse_requests_file(line, name="l.jsonl")


@pytest.mark.parametrize("value", HOSTILE.values(), ids=HOSTILE.keys())
def test_a_quality_line_with_a_value_python_cannot_hold_is_bad_input(value: str) -> None:
    line = '{"request_id": "r1", "quality_pass": ' + value + "}\n"
    with pytest.raises(BadInput, match=r"q\.jsonl:1"):
        parse_quality(line, name="q.jsonl")


def test_a_line_separator_inside_a_json_string_does_not_end_the_line() -> None:
    """JSON Lines ends lines at \\n only; U+2028 and U+0085 are legal raw in a JSON string."""
    rows = [
        json.dumps({"request_id": f"r{i}", "status": "ok", "model": f"m{sep}x"}, ensure_ascii=False)
        for i, sep in enumerate(["\u2028", "\u0085", "\u2029"])
    ]
    frags = parse_requests_file("\n".join(rows) + "\n", name="l.jsonl")
    assert [(f.request_id, f.model) for f in frags] == [
        ("r0", "m\u2028x"),
        ("r1", "m\u0085x"),
        ("r2", "m\u2029x"),
    ]
