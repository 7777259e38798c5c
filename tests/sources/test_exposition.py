"""Prometheus text / OpenMetrics parsing: what is accepted, and what is rejected (with the line)."""

from __future__ import annotations

import math
import re

import pytest

from slokit.errors import BadInput
from slokit.sources.exposition import parse_exposition, parse_openmetrics_history


def samples(families):
    return {(s.name, tuple(sorted(s.labels.items()))): s for f in families for s in f.samples}


def test_real_vllm_scrape_parses_into_families(vllm_after_load):
    fams = {f.name: f for f in parse_exposition(vllm_after_load)}
    assert fams["vllm:num_preemptions"].type == "counter"
    (s,) = fams["vllm:num_preemptions"].samples
    assert (s.name, s.labels, s.value) == (
        "vllm:num_preemptions_total",
        {"engine": "0", "model_name": "tiny"},
        33.0,
    )
    assert fams["vllm:time_to_first_token_seconds"].type == "histogram"


def test_bytes_input_is_decoded_as_utf8():
    fams = parse_exposition('# TYPE a gauge\na{x="é"} 1\n'.encode())
    assert fams[0].samples[0].labels == {"x": "é"}


def test_classic_text_timestamps_are_milliseconds_and_come_out_as_seconds():
    (fam,) = parse_exposition("# TYPE a gauge\na 1 1700000000500\n")
    assert fam.samples[0].timestamp == pytest.approx(1700000000.5)


def test_openmetrics_timestamps_are_seconds():
    (fam,) = parse_exposition("# TYPE a gauge\na 1 1700000000.5\n# EOF\n")
    assert fam.samples[0].timestamp == pytest.approx(1700000000.5)


def test_a_negative_gauge_named_like_a_count_is_allowed():
    (fam,) = parse_exposition("# TYPE temp_delta_count gauge\ntemp_delta_count -4\n")
    assert fam.samples[0].value == -4.0


def test_nan_gauge_is_allowed():
    (fam,) = parse_exposition("# TYPE a gauge\na NaN\n")
    assert math.isnan(fam.samples[0].value)


@pytest.mark.parametrize("value", ["NaN", "+Inf", "-Inf", "1e308", "-3"])
def test_an_odd_counter_value_parses_and_is_left_to_its_field(value):
    # Valid exposition (Prometheus stores it); vllm_metrics/dcgm make it a missing fact.
    (fam,) = parse_exposition(f"# TYPE c_total counter\nc_total {value}\n")
    assert repr(fam.samples[0].value) == repr(float(value))


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("# TYPE a gauge\na 1\nthis is garbage\n", 3, "malformed"),
        ('# TYPE a gauge\na{x="1"} 1\na{x="1"} 2\n', 3, "duplicate"),
        ('# TYPE a gauge\na{x="1"} 1\na{x="1"} 2\n# EOF\n', 3, "duplicate"),
        ('# TYPE h histogram\nh_bucket{le="abc"} 1\nh_sum 1\nh_count 1\n', 2, "le="),
        ('# TYPE h histogram\nh_bucket{le="1"} 1\nh_sum 1\nh_count 1\n# EOF\n', 5, "+Inf"),
        ("a{ 1\n", 1, "malformed"),
        ("# TYPE a gauge\na 1\n\x00\n", 3, "NUL"),
    ],
    ids=[
        "garbage",
        "duplicate",
        "duplicate-om",
        "bad-le",
        "om-histogram-without-inf",
        "unclosed-brace",
        "nul",
    ],
)
def test_malformed_exposition_raises_badinput_naming_the_line(text, line, words):
    with pytest.raises(BadInput, match=rf"^line {line}: .*{re.escape(words)}"):
        parse_exposition(text)


def test_invalid_utf8_names_the_line():
    with pytest.raises(BadInput, match=r"^line 3: invalid UTF-8"):
        parse_exposition(b'# TYPE a gauge\na 1\na{x="\xff"} 2\n')


# --- OpenMetrics history ---------------------------------------------------------------

HISTORY = """\
# HELP lat Latency.
# TYPE lat histogram
lat_bucket{instance="r0",le="0.1"} 1 1700000000
lat_bucket{instance="r0",le="0.1"} 3 1700000015
lat_bucket{instance="r0",le="+Inf"} 2 1700000000
lat_bucket{instance="r0",le="+Inf"} 5 1700000015
lat_count{instance="r0"} 2 1700000000
lat_count{instance="r0"} 5 1700000015
lat_sum{instance="r0"} 0.3 1700000000
lat_sum{instance="r0"} 1.25 1700000015
# TYPE up gauge
up{instance="r0"} 1 1700000000.250
# EOF
"""


def test_history_reads_a_histogram_with_many_timestamped_points():
    fams = {f.name: f for f in parse_openmetrics_history(HISTORY)}
    lat = fams["lat"]
    assert lat.type == "histogram"
    assert len(lat.samples) == 8
    assert {s.timestamp for s in lat.samples} == {1700000000.0, 1700000015.0}
    assert fams["up"].samples[0].timestamp == 1700000000.25


def test_prometheus_client_alone_cannot_read_that_history():
    # The reason parse_openmetrics_history exists (prometheus_client 0.26).
    with pytest.raises(BadInput):
        parse_exposition(HISTORY)


@pytest.mark.parametrize("value", ["NaN", "+Inf", "-Inf", "1e308", "-1"])
def test_history_keeps_an_odd_counter_value_for_its_field_to_judge(value):
    (fam,) = parse_openmetrics_history(f"# TYPE c counter\nc_total {value} 5\n# EOF\n")
    assert repr(fam.samples[0].value) == repr(float(value))


def test_history_label_escapes_are_unescaped():
    (fam,) = parse_openmetrics_history('a{x="q\\"uo\\\\te\\n"} 1 5\n# EOF\n')
    assert fam.samples[0].labels == {"x": 'q"uo\\te\n'}


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("a 1 5\n", 1, "missing '# EOF'"),
        ("a 1 5\n# EOF\nb 1 5\n", 3, "after # EOF"),
        ("a 1 5\n\n# EOF\n", 2, "blank"),
        ("a one 5\n# EOF\n", 1, "invalid value"),
        ("a 1 later\n# EOF\n", 1, "invalid timestamp"),
        ('a{x="1",x="2"} 1 5\n# EOF\n', 1, "duplicate label"),
        ("a 1 5\na 2 5\n# EOF\n", 2, "duplicate sample"),
        ("# TYPE a sometype\n# EOF\n", 1, "unknown metric type"),
        ("a{x=1} 1 5\n# EOF\n", 1, "malformed labels"),
    ],
)
def test_malformed_history_raises_badinput_naming_the_line(text, line, words):
    with pytest.raises(BadInput, match=rf"^line {line}: .*{re.escape(words)}"):
        parse_openmetrics_history(text)
