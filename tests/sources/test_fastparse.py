"""The fast exposition parser gives exactly what prometheus_client's path gives, or defers to it.

Each test compares ``parse_exposition(text)`` (fast path first) with
``parse_exposition(text, fast=False)`` (prometheus_client alone): the same families, types,
help texts, sample names, labels, values (NaN included), timestamps, or the same BadInput.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Gauge, Histogram, Info, Summary, generate_latest
from prometheus_client import Counter as PromCounter

from slokit.errors import BadInput
from slokit.lab.sim.dcgm import GpuModel
from slokit.lab.sim.engine import EngineConfig, EngineCore, make_request, simulate
from slokit.lab.sim.metrics import VllmMetrics
from slokit.lab.sim.roofline import GPUS, MODELS, Roofline
from slokit.sources import fastparse
from slokit.sources.dcgm import gpu_samples_from_families, parse_dcgm_metrics
from slokit.sources.exposition import MetricFamily, parse_exposition
from slokit.sources.fastparse import parse_text
from slokit.sources.vllm_metrics import engine_samples_from_families, parse_vllm_metrics

REPO = Path(__file__).resolve().parents[2]
#: Every exposition file in the repository (OpenMetrics history files excluded: other parser).
FIXTURES = sorted(p for p in (REPO / "tests").rglob("*.prom"))

_SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _flat(families: list[MetricFamily]) -> list[tuple[Any, ...]]:
    """Families as comparable data: values and timestamps by repr, so NaN equals NaN and
    -0.0 differs from 0.0."""
    return [
        (
            f.name,
            f.type,
            f.help,
            [(s.name, list(s.labels.items()), repr(s.value), repr(s.timestamp)) for s in f.samples],
        )
        for f in families
    ]


def _outcome(text: str | bytes, *, fast: bool) -> tuple[str, Any]:
    try:
        return ("ok", _flat(parse_exposition(text, fast=fast)))
    except BadInput as exc:
        return ("BadInput", str(exc))


def _assert_same(text: str | bytes) -> tuple[str, Any]:
    fast = _outcome(text, fast=True)
    assert fast == _outcome(text, fast=False)
    return fast


def _sim_vllm() -> str:
    cfg = EngineConfig(num_gpu_blocks=64, max_num_batched_tokens=512)
    core = EngineCore(cfg, Roofline(MODELS["7b"], GPUS["h100"]))
    metrics = VllmMetrics("tiny", cfg, 1 << 30)
    core.listeners.append(metrics)
    core.set_spec_decode(2, 0.6)
    reqs = [make_request(f"r{i}", list(range(i, i + 200)), 100) for i in range(8)]
    simulate(core, [(0.01 * i, r) for i, r in enumerate(reqs)])
    return metrics.render().decode()


def _sim_dcgm() -> str:
    gpu = GpuModel(GPUS["h100"], MODELS["7b"], 16, lambda: 1000.0, pod="sim-vllm-0")
    return gpu.render().decode()


# --- every exposition we have -------------------------------------------------------------


def test_the_repository_has_exposition_fixtures():
    names = {p.name for p in FIXTURES}
    assert {"metrics_after_load.prom", "metrics_idle.prom", "dcgm_two_gpus.prom"} <= names


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name)
def test_every_fixture_takes_the_fast_path(path: Path):
    assert parse_text(path.read_text()) is not None


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name)
def test_every_fixture_gives_the_same_families_as_prometheus_client(path: Path):
    kind, families = _assert_same(path.read_bytes())
    assert kind == "ok" and families


@pytest.mark.parametrize("render", [_sim_vllm, _sim_dcgm], ids=["sim-vllm", "sim-dcgm"])
def test_the_simulators_expositions_take_the_fast_path_with_the_same_families(render):
    text = render()
    assert parse_text(text) is not None
    assert _assert_same(text)[0] == "ok"


def test_a_second_scrape_of_the_same_series_reads_its_new_values():
    # The fast path remembers series texts between scrapes; only the values may change.
    first = '# TYPE a gauge\na{x="1"} 1\na{x="2"} 2\n'
    second = '# TYPE a gauge\na{x="1"} 5\na{x="2"} NaN\n'
    parse_exposition(first)
    (fam,) = parse_exposition(second)
    assert fam.samples[0].value == 5.0
    assert math.isnan(fam.samples[1].value)
    assert _assert_same(second)[0] == "ok"


def test_the_remembered_series_stay_bounded_when_a_target_changes_its_series_every_scrape():
    for scrape in range(3):
        text = "# TYPE a gauge\n" + "".join(
            f'a{{scrape="{scrape}",i="{i}"}} {i}\n' for i in range(fastparse._CACHE_MAX // 2 + 1)
        )
        assert _assert_same(text)[0] == "ok"
        assert len(fastparse._SERIES_CACHE) <= fastparse._CACHE_MAX


@pytest.mark.parametrize(
    "second",
    [
        'a{x="1"} 1 1700000000000\n',  # a remembered series, now with a timestamp
        'a{x="1"} 1_0\n',  # ... with a value prometheus_client refuses
        'a{x="1"} 0x1\n',
        'a{x="1"}  1\n',
        'a{x="1"} -0\n',
    ],
    ids=["timestamp", "underscore", "hex", "two-spaces", "minus-zero"],
)
def test_a_remembered_series_with_an_odd_value_is_still_read_as_prometheus_client_reads_it(
    second: str,
):
    parse_exposition('# TYPE a gauge\na{x="1"} 1\n')
    _assert_same("# TYPE a gauge\n" + second)


# --- real producers with hostile contents ---------------------------------------------------

_LABEL_VALUES = st.text(
    alphabet=st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=12
)
_VALUES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1e308, -1e-308, 2.0**53, 2.0**63, 5e-324]),
    st.integers(min_value=-(2**62), max_value=2**62).map(float),
)


@_SETTINGS
@given(
    a=_LABEL_VALUES,
    b=_LABEL_VALUES,
    value=_VALUES,
    observations=st.lists(st.floats(min_value=-1e6, max_value=1e6), max_size=5),
    doc=st.text(
        alphabet=st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=20
    ),
)
def test_prometheus_client_output_with_any_label_values_takes_the_fast_path_unchanged(
    a: str, b: str, value: float, observations: list[float], doc: str
):
    reg = CollectorRegistry()
    PromCounter("c", doc or "d", ["a", "b"], registry=reg).labels(a=a, b=b).inc(1)
    Gauge("g", "gauge", ["a", "b"], registry=reg).labels(a=a, b=b).set(value)
    h = Histogram("h_seconds", "hist", ["a"], registry=reg, buckets=(0.1, 1.0, 1e3))
    s = Summary("s", "summary", ["b"], registry=reg)
    for x in observations:
        h.labels(a=a).observe(x)
        s.labels(b=b).observe(x)
    Info("build", "info", registry=reg).info({"version": a, "commit": b})
    text = generate_latest(reg).decode()
    assert parse_text(text) is not None
    assert _assert_same(text)[0] == "ok"


# --- hand-written odd and hostile text ----------------------------------------------------

_NAMES = st.sampled_from(["a", "a_total", "vllm:x", "h", "DCGM_FI_DEV_GPU_UTIL", "_total"])
_SUFFIXES = st.sampled_from(["", "", "_total", "_bucket", "_sum", "_count", "_created", "_x"])
_TYPES = st.sampled_from(
    ["counter", "gauge", "histogram", "summary", "untyped", "info", "unknown", "bogus", "gauge x"]
)
_LABEL_NAMES = st.sampled_from(["x", "le", "model_name", "__name__", "__x", "1x", "x y"])
_RAW_LABEL_VALUES = st.text(
    alphabet=st.sampled_from(['"', "\\", "n", "t", "}", "{", ",", "=", " ", "\t", "#", "é", "\r"]),
    max_size=6,
)
_VALUE_TOKENS = st.sampled_from(
    [
        "1", "0", "-0", "+0", "-0.0", "1.5", "-3", "1e3", "1E-3", ".5", "5.", "+Inf", "-Inf",
        "Inf", "inf", "infinity", "NaN", "nan", "1e308", "1e999", "-1e999", "1" + "0" * 400,
        "9223372036854775794", "1_0", "0x1", "١", "", "abc", "1.2.3", "--1",
    ]
)  # fmt: skip
_TS_TOKENS = st.sampled_from(
    [None, None, "1700000000500", "1700000000.5", "-1", "0", "NaN", "1e999", "1" + "0" * 400, "x"]
)
_SEPARATORS = st.sampled_from([" ", " ", " ", "  ", "\t", ""])


def _escaped(raw: str, properly: bool) -> str:
    if not properly:
        return raw
    return raw.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@st.composite
def _sample_lines(draw: st.DrawFn, family: str) -> str:
    name = family + draw(_SUFFIXES)
    labels = draw(
        st.lists(
            st.tuples(_LABEL_NAMES, _RAW_LABEL_VALUES, st.booleans()),
            max_size=3,
        )
    )
    body = ",".join(f'{k}="{_escaped(v, ok)}"' for k, v, ok in labels)
    if labels or draw(st.booleans()):
        body = "{" + body + draw(st.sampled_from(["", "", ","])) + "}"
    line = name + body + draw(_SEPARATORS) + draw(_VALUE_TOKENS)
    ts = draw(_TS_TOKENS)
    if ts is not None:
        line += draw(_SEPARATORS) + ts
    return line


@st.composite
def _expositions(draw: st.DrawFn) -> str:
    lines: list[str] = []
    for family in draw(st.lists(_NAMES, max_size=4)):
        if draw(st.booleans()):
            doc = draw(st.sampled_from(["", "doc", "a\\\\b\\nc", "  lead", 'q"uote', "\\t"]))
            lines.append(f"# HELP {family} {doc}".rstrip(" ") if doc else f"# HELP {family}")
        if draw(st.booleans()):
            lines.append(f"# TYPE {family} {draw(_TYPES)}")
        for _ in range(draw(st.integers(0, 3))):
            lines.append(draw(_sample_lines(family)))
            if draw(st.integers(0, 9)) == 0:
                lines.append(lines[-1])  # a duplicate series
            if draw(st.integers(0, 9)) == 0:
                lines.append(draw(st.sampled_from(["", "#", "# comment", "  ", "#HELP a b"])))
    eol = draw(st.sampled_from(["\n", "\n", "\r\n"]))
    return "".join(line + eol for line in lines)


@_SETTINGS
@given(_expositions())
def test_odd_and_hostile_text_gives_what_prometheus_client_gives(text: str):
    _assert_same(text)


@pytest.mark.parametrize(
    "text",
    [
        "# TYPE a gauge\na 1\nthis is garbage\n",
        '# TYPE a gauge\na{x="1"} 1\na{x="1"} 2\n',
        '# TYPE a gauge\na{x="1",y="2"} 1\na{y="2",x="1"} 2\n',
        '# TYPE a gauge\na{x="\\t"} 1\na{x="\\\\t"} 2\n',
        '# TYPE h histogram\nh_bucket{le="abc"} 1\nh_sum 1\nh_count 1\n',
        '# TYPE h histogram\nh_bucket{le="NaN"} 1\nh_sum 1\nh_count 1\n',
        "# TYPE h histogram\nh_bucket 1\nh_sum 1\nh_count 1\n",
        "a{ 1\n",
        "a 1 2 3 x\n",
        "# TYPE a\na 1\n",
        "# TYPE a bogus\na 1\n",
        "# TYPE _total counter\n_total 1\n",
        'a{x="1",x="2"} 1\n',
        'a{__name__="b"} 1\n',
        'a{__x="b"} 1\n',
        'a{x="1} 1\n',
        "a 1" + "0" * 400 + "\n",
        "a 1 1" + "0" * 400 + "\n",
        "a one\n",
        "a\n",
        "a 1\n\x00\n",
        "a 1",
        b'a{x="\xff"} 1\n',
    ],
    ids=[
        "garbage",
        "duplicate",
        "duplicate-reordered",
        "duplicate-by-escape",
        "bad-le",
        "nan-le",
        "no-le",
        "unclosed-brace",
        "extra-fields",
        "type-without-type",
        "unknown-type",
        "empty-counter-name",
        "duplicate-label",
        "name-label",
        "reserved-label",
        "unclosed-quote",
        "value-past-double",
        "timestamp-past-double",
        "word-value",
        "no-value",
        "nul",
        "truncated",
        "invalid-utf8",
    ],
)
def test_garbage_raises_the_same_badinput_on_both_paths(text: str | bytes):
    kind, message = _assert_same(text)
    assert kind == "BadInput", message


def test_openmetrics_text_is_left_to_the_openmetrics_parser():
    text = (
        "# TYPE c counter\nc_total 3.0\nc_created 1700000000.0\n"
        '# TYPE a gauge\na{x="1"} 1 1700000000.5\n# EOF\n'
    )
    fams = {f.name: f for f in parse_exposition(text)}
    assert [s.name for s in fams["c"].samples] == ["c_total"]  # _created: a start time, dropped
    assert fams["a"].samples[0].timestamp == 1700000000.5
    assert _assert_same(text)[0] == "ok"


# --- end to end: the same records ---------------------------------------------------------

_VLLM_FIXTURES = [p for p in FIXTURES if p.name.startswith("metrics_")]


def _with_values(text: str, tokens: list[str]) -> str:
    """``text`` with the value of its sample lines replaced, in turn, by ``tokens``."""
    out, k = [], 0
    for line in text.split("\n"):
        if line and not line.startswith("#"):
            head, _, _ = line.rpartition(" ")
            line = f"{head} {tokens[k % len(tokens)]}"
            k += 1
        out.append(line)
    return "\n".join(out)


@pytest.mark.parametrize("path", _VLLM_FIXTURES, ids=lambda p: p.name)
def test_vllm_scrape_gives_the_same_engine_samples_on_both_paths(path: Path):
    text = path.read_text()
    fast_invalid: Counter[str] = Counter()
    slow_invalid: Counter[str] = Counter()
    fast = parse_vllm_metrics(text, ts=1.0, replica="r", invalid=fast_invalid)
    slow = engine_samples_from_families(
        parse_exposition(text, fast=False), ts=1.0, replica="r", invalid=slow_invalid
    )
    assert fast and fast == slow
    assert fast_invalid == slow_invalid


@_SETTINGS
@given(
    st.lists(
        st.sampled_from(["NaN", "+Inf", "-Inf", "-1", "1e308", "9007199254740993", "0.5", "7"]),
        min_size=1,
        max_size=7,
    )
)
def test_vllm_scrape_with_odd_values_gives_the_same_engine_samples_and_counts(tokens: list[str]):
    text = _with_values(_sim_vllm(), tokens)
    fast_invalid: Counter[str] = Counter()
    slow_invalid: Counter[str] = Counter()
    fast = parse_vllm_metrics(text, ts=1.0, replica="r", invalid=fast_invalid)
    slow = engine_samples_from_families(
        parse_exposition(text, fast=False), ts=1.0, replica="r", invalid=slow_invalid
    )
    assert fast == slow
    assert fast_invalid == slow_invalid


@pytest.mark.parametrize(
    "text",
    [
        (REPO / "tests" / "sources" / "data" / "dcgm_two_gpus.prom").read_text(),
        _sim_dcgm(),
        _with_values(_sim_dcgm(), ["NaN", "-5", "2147483632", "1e308", "-Inf"]),
    ],
    ids=["fixture", "sim", "sim-odd-values"],
)
def test_dcgm_scrape_gives_the_same_gpu_samples_on_both_paths(text: str):
    fast_invalid: Counter[str] = Counter()
    slow_invalid: Counter[str] = Counter()
    fast = parse_dcgm_metrics(text, ts=1.0, invalid=fast_invalid)
    slow = gpu_samples_from_families(
        parse_exposition(text, fast=False), ts=1.0, invalid=slow_invalid
    )
    assert fast and fast == slow
    assert fast_invalid == slow_invalid
