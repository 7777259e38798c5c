"""Arbitrary input never escapes the parsers as anything but BadInput."""

from __future__ import annotations

import contextlib
import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slokit.errors import BadInput
from slokit.sources.exposition import parse_exposition, parse_openmetrics_history
from slokit.sources.files import parse_load_jsonl, parse_quality, parse_vllm_bench
from slokit.sources.vllm_metrics import parse_vllm_metrics

# Lines built from the pieces the grammar is made of, so the fuzzer reaches deep branches
# (labels, values, timestamps, histograms) instead of failing on the first character.
_TOKENS = st.sampled_from(
    [
        "# TYPE ",
        "# HELP ",
        "# UNIT ",
        "# EOF",
        "# ",
        "vllm:e2e_request_latency_seconds",
        "_bucket",
        "_sum",
        "_count",
        "_total",
        "_created",
        "vllm:num_preemptions",
        "a",
        "{",
        "}",
        '{le="',
        '"}',
        '"',
        "=",
        ",",
        'model_name="m"',
        'engine="0"',
        "le",
        " ",
        "\t",
        "\\",
        "\\n",
        "1",
        "0",
        "-1",
        "1.5",
        "NaN",
        "+Inf",
        "-Inf",
        "1e308",
        "1e999",
        "1_0",
        "0x1",
        "counter",
        "gauge",
        "histogram",
        "summary",
        "info",
        "stateset",
        "untyped",
        "unknown",
        "é",
        "\x00",
        "\r",
        "1700000000",
        "1700000000000",
        ' # {a="b"} 1',
    ]
)
_LINE = st.lists(_TOKENS, max_size=12).map("".join)
_GRAMMAR_TEXT = st.lists(_LINE, max_size=12).map(lambda ls: "\n".join(ls) + "\n")
_ANY_TEXT = st.one_of(st.text(max_size=300), _GRAMMAR_TEXT)

_FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _only_badinput(fn, arg) -> None:
    with contextlib.suppress(BadInput):  # anything else propagates and fails the test
        fn(arg)


@_FUZZ
@given(_ANY_TEXT)
def test_exposition_raises_nothing_but_badinput(text):
    _only_badinput(parse_exposition, text)


@_FUZZ
@given(st.binary(max_size=300))
def test_exposition_bytes_raise_nothing_but_badinput(data):
    _only_badinput(parse_exposition, data)


@_FUZZ
@given(_ANY_TEXT)
def test_history_raises_nothing_but_badinput(text):
    _only_badinput(parse_openmetrics_history, text)


@_FUZZ
@given(_ANY_TEXT)
def test_vllm_metrics_raise_nothing_but_badinput(text):
    _only_badinput(lambda t: parse_vllm_metrics(t, ts=0.0, replica="r"), text)


# --- request files: any JSON values under the expected keys --------------------------------

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=6,
)
_FUZZ_JSON = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
_LOAD_KEYS = ["request_id", "send_ts", "ttft_s", "e2e_s", "itl_s", "output_tokens", "status"]
_BENCH_KEYS = ["ttfts", "itls", "latencies", "input_lens", "output_lens", "errors", "request_ids"]


@_FUZZ_JSON
@given(st.lists(st.dictionaries(st.sampled_from(_LOAD_KEYS), _JSON), max_size=3))
def test_load_jsonl_raises_nothing_but_badinput(records):
    text = "".join(json.dumps(r) + "\n" for r in records)
    _only_badinput(lambda t: parse_load_jsonl(t, name="f"), text)


@_FUZZ_JSON
@given(st.dictionaries(st.sampled_from(_BENCH_KEYS), st.lists(_JSON, max_size=3)))
def test_vllm_bench_raises_nothing_but_badinput(doc):
    _only_badinput(lambda t: parse_vllm_bench(t, name="f"), json.dumps(doc))


@_FUZZ_JSON
@given(st.one_of(st.text(max_size=200), st.lists(_JSON).map(json.dumps)))
def test_quality_raises_nothing_but_badinput(text):
    _only_badinput(lambda t: parse_quality(t, name="f"), text)
