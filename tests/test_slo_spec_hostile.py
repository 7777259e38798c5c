"""Hostile SLO specs and generator options: a one-line BadInput (exit 2) naming the field and
the line, never a traceback; nothing hangs or grows without bound; generated files stay valid."""

from __future__ import annotations

import shutil
import subprocess
import time
import tracemalloc
import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import pytest
from click.testing import CliRunner

from slokit.analysis.gate import junit_xml
from slokit.analysis.gate._checks import Check, GateResult
from slokit.analysis.slo_spec import MAX_SPEC_BYTES, SloClass, load_spec
from slokit.cli import main
from slokit.errors import BadInput
from slokit.generate.alerts import AlertOptions, build_alert_files, dump_yaml, slo_rule_file
from slokit.generate.burnrate import prom_duration
from slokit.generate.promql import selector
from slokit.lab.workload import load_workload

HEAD = "slokit: v1\nservice: chat\n"
CLASS = "classes:\n  - name: a\n    good_when: {ttft_ms: 1000}\n    objective: 0.99\n"
GOOD = HEAD + CLASS


def write(tmp_path: Path, text: str | bytes, name: str = "slo.yaml") -> Path:
    p = tmp_path / name
    if isinstance(text, bytes):
        p.write_bytes(text)
    else:
        p.write_text(text, encoding="utf-8")
    return p


def refused(tmp_path: Path, text: str | bytes) -> str:
    """The one-line message `slokit alerts build` exits 2 with."""
    p = write(tmp_path, text)
    out = tmp_path / "out" / "rules"  # ../../x would land in tmp_path
    res = CliRunner().invoke(main, ["alerts", "build", "--slo", str(p), "--out", str(out)])
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("slokit: "), res.output
    return lines[0]


# --- 1: every field is type-checked -----------------------------------------------------------

BIG = "9" * 400


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ("quality: x\n", ":1: quality: must be a mapping"),
        ("quality: [1]\n", "quality: must be a mapping"),
        ("quality: 5\n", "quality: must be a mapping"),
        ("quality: {require_pass: 'no'}\n", ":7: quality.require_pass: must be true or false"),
        ("quality: {require: true}\n", "quality: unknown keys ['require']"),
        ("cost: 5\n", "cost: must be a mapping"),
        ("cost: [gpu_hour_usd]\n", "cost: must be a mapping"),
        ("cost: {gpu_hour: 1}\n", "cost: unknown keys ['gpu_hour']"),
        ("gate: [1]\n", "gate: must be a mapping"),
        ("gate: x\n", "gate: must be a mapping"),
        ("cost: {gpus_per_replica: .nan}\n", "cost.gpus_per_replica: must be a finite number"),
        ("cost: {gpus_per_replica: .inf}\n", "cost.gpus_per_replica: must be a finite number"),
        ("cost: {gpus_per_replica: 0.5}\n", "cost.gpus_per_replica: must be a whole number"),
        ("cost: {gpus_per_replica: 1000001}\n", "cost.gpus_per_replica: must be at most"),
        (f"cost: {{gpus_per_replica: {BIG}}}\n", "cost.gpus_per_replica: must be a finite number"),
        (f"gate: {{min_requests: {BIG}}}\n", ":7: gate.min_requests: must be a finite number"),
        (f"gate:\n  regression: {{seed: {BIG}}}\n", ":8: gate.regression.seed: must be a finite"),
        ("gate: {min_requests: 1" + "0" * 5000 + "}\n", ":7: number too large"),
        ("period: [30d]\n", "period: not a duration"),
        ("extra: 1\n", "the spec: unknown keys ['extra']"),
        ("service: other\n", ":7: duplicate key 'service'"),
    ],
)
def test_a_field_of_the_wrong_type_is_refused_naming_it(
    tmp_path: Path, extra: str, says: str
) -> None:
    assert says in refused(tmp_path, GOOD + extra)


def test_a_huge_integer_in_a_bound_names_the_bound(tmp_path: Path) -> None:
    msg = refused(tmp_path, HEAD + CLASS.replace("1000", BIG))
    assert "slo.yaml:5: classes[0].good_when.ttft_ms: must be a finite number" in msg
    assert "401 digits" in msg and BIG not in msg


@pytest.mark.parametrize(
    ("match", "says"),
    [
        ("{slo_class: []}", "non-empty list"),
        ("{slo_class: [{a: 1}]}", "must be a string, number or boolean"),
        ("[1]", "classes[0].match: must be a mapping"),
    ],
)
def test_match_values_are_scalars(tmp_path: Path, match: str, says: str) -> None:
    text = GOOD.replace("    objective", f"    match: {match}\n    objective")
    assert says in refused(tmp_path, text)


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(GOOD.encode() + b"# \xff\xfe\n", id="latin-1 bytes"),
        pytest.param(b"\xff\xfe" + "slokit: v1\n".encode("utf-16-le") + b"\x00\xd8", id="utf-16"),
    ],
)
def test_a_file_that_is_not_text_is_refused(tmp_path: Path, data: bytes) -> None:
    assert "not UTF-" in refused(tmp_path, data)


def test_utf16_with_a_byte_order_mark_is_yaml(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, GOOD.encode("utf-16")))
    assert spec.service == "chat"


def test_deep_nesting_is_refused_without_recursion_error(tmp_path: Path) -> None:
    assert "nested deeper than 64 levels" in refused(tmp_path, GOOD + "x: " + "[" * 5000 + "\n")
    assert "nested deeper" in refused(tmp_path, GOOD + "x: " + "{a: " * 5000 + "\n")


def test_a_yaml_error_is_one_line_with_its_line(tmp_path: Path) -> None:
    assert refused(tmp_path, GOOD + "x: [\n").startswith("slokit: ")
    msg = refused(tmp_path, HEAD + "classes: a: b\n")
    assert "slo.yaml:3: not valid YAML: mapping values are not allowed here" in msg


def test_a_file_over_the_size_limit_is_refused_unread(tmp_path: Path) -> None:
    msg = refused(tmp_path, GOOD + "#" * MAX_SPEC_BYTES + "\n")
    assert "larger than 1 MiB" in msg


# --- 2: alias bombs ---------------------------------------------------------------------------


def bomb(levels: int, where: str) -> str:
    rows = ['a0: &a0 ["x","x","x","x","x","x","x","x","x"]']
    rows += [f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, levels)]
    return "\n".join(rows) + "\n" + where


@pytest.mark.parametrize(
    "where",
    [
        # the objective: its error message showed the whole expansion
        pytest.param(GOOD.replace("0.99", "*a8"), id="objective"),
        pytest.param(GOOD.replace("chat", "*a8"), id="service"),
        pytest.param(GOOD + "period: *a8\n", id="period"),
        pytest.param(GOOD + "gate: {min_attainment: *a8}\n", id="gate"),
        pytest.param(GOOD + "quality: {require_pass: *a8}\n", id="quality"),
        pytest.param(GOOD, id="unused"),  # still refused: it is not a spec
    ],
)
def test_an_alias_bomb_fails_fast_in_bounded_memory(tmp_path: Path, where: str) -> None:
    p = write(tmp_path, bomb(9, where))
    tracemalloc.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(BadInput, match="more than 50000 YAML nodes"):
            load_spec(p)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert time.monotonic() - t0 < 5
    assert peak < 50 * 2**20


def test_a_recursive_alias_is_refused(tmp_path: Path) -> None:
    assert "refers to a node that holds it" in refused(tmp_path, GOOD + "gate: &g {x: *g}\n")


def test_a_few_aliases_are_fine(tmp_path: Path) -> None:
    text = (
        HEAD + "classes:\n"
        "  - {name: a, objective: 0.9, good_when: &fast {ttft_ms: 500, e2e_ms: 9000}}\n"
        "  - {name: b, objective: 0.9, good_when: *fast}\n"
    )
    spec = load_spec(write(tmp_path, text))
    assert [c.bounds_ms() for c in spec.classes] == [{"ttft_ms": 500, "e2e_ms": 9000}] * 2


def test_an_error_message_shows_a_long_value_cut_short(tmp_path: Path) -> None:
    msg = refused(tmp_path, GOOD.replace("0.99", "[" + ",".join(["x" * 100] * 1000) + "]"))
    assert "classes[0].objective: must be a number" in msg and len(msg) < 500


LONG = "[" + ",".join(["x" * 100] * 1000) + "]"


@pytest.mark.parametrize(
    ("gate", "field"),
    [
        ("{max_burn_rate: @V}", "gate.max_burn_rate"),
        ("{min_requests: @V}", "gate.min_requests"),
        ("{percentiles: {a: {ttft_p95_ms: @V}}}", "gate.percentiles.a.ttft_p95_ms"),
        ("{regression: {metrics: @V}}", "gate.regression"),
        ("{regression: {confidence: @V}}", "gate.regression.confidence"),
        ("{regression: {? " + "k" * 20_000 + " : 1}}", "gate.regression: unknown keys"),
        ("{? " + "k" * 20_000 + " : 1}", "gate: unknown keys"),
    ],
)
def test_a_gate_error_shows_a_long_value_cut_short(tmp_path: Path, gate: str, field: str) -> None:
    msg = refused(tmp_path, GOOD + "gate: " + gate.replace("@V", LONG) + "\n")
    assert field in msg and len(msg) < 500, msg[:600]


def test_a_workload_error_shows_a_long_value_cut_short(tmp_path: Path) -> None:
    p = write(tmp_path, "classes:\n  - name: chat\n    input: {dist: fixed, value: " + LONG
              + "}\n    output: 8\n", "workload.yaml")  # fmt: skip
    with pytest.raises(BadInput) as err:
        load_workload(p)
    assert "value" in str(err.value) and len(str(err.value)) < 500, str(err.value)[:600]


# --- 3: numbers are finite --------------------------------------------------------------------


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf", ".NaN", ".Inf"])
@pytest.mark.parametrize(
    ("template", "field"),
    [
        pytest.param(GOOD.replace("1000", "@V"), "classes[0].good_when.ttft_ms", id="bound"),
        pytest.param(GOOD.replace("0.99", "@V"), "classes[0].objective", id="objective"),
        pytest.param(GOOD + "cost: {gpu_hour_usd: @V}\n", "cost.gpu_hour_usd", id="gpu_hour"),
        pytest.param(
            GOOD + "gate: {percentiles: {a: {ttft_p95_ms: @V}}}\n", "gate.percentiles.a", id="pct"
        ),
        pytest.param(GOOD + "gate: {max_burn_rate: @V}\n", "gate.max_burn_rate", id="burn"),
    ],
)
def test_nan_and_infinity_are_refused(
    tmp_path: Path, template: str, field: str, value: str
) -> None:
    assert field in refused(tmp_path, template.replace("@V", value))


def test_cost_cannot_overflow_to_infinity(tmp_path: Path) -> None:
    assert "must be at most" in refused(tmp_path, GOOD + "cost: {gpu_hour_usd: 1.0e+300}\n")


# --- 4: names that end up in file names, PromQL, XML ------------------------------------------


@pytest.mark.parametrize(
    "service",
    ["../../escape", "{tmp}/abs", "a/b", "s" * 300, '"a\\0b"', "..", "-rf", '"a\\nb"', "a b"],
)
def test_a_service_name_that_is_not_a_safe_file_name_is_refused(
    tmp_path: Path, service: str
) -> None:
    service = service.replace("{tmp}", str(tmp_path))
    msg = refused(tmp_path, GOOD.replace("service: chat", f"service: {service}"))
    assert "slo.yaml:1: service: must be 1 to 63" in msg and len(msg) < 400
    assert not list(tmp_path.rglob("*.rules.yaml"))


def test_the_rule_writer_refuses_a_service_built_in_code(tmp_path: Path) -> None:
    spec = replace(load_spec(write(tmp_path, GOOD)), service="../x")
    with pytest.raises(BadInput, match="cannot name a file"):
        build_alert_files(spec, AlertOptions())


@pytest.mark.parametrize("name", ['"a\\nb"', '"c\\e[31mred"', "a{{b}}", "a$model", "=~.*", "a|b"])
def test_a_class_name_with_unsafe_characters_is_refused(tmp_path: Path, name: str) -> None:
    msg = refused(tmp_path, GOOD.replace("name: a", f"name: {name}"))
    assert "slo.yaml:4: classes[0].name: must be 1 to 63" in msg


def test_a_unicode_class_name_is_accepted(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, GOOD.replace("name: a", "name: интерактив")))
    assert spec.classes[0].name == "интерактив"


# --- 5: generated files are valid -------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--evaluation-interval", "banana"], "evaluation interval: not a Prometheus duration"),
        (["--evaluation-interval", "0s"], "evaluation interval: must be above 0"),
        (["--evaluation-interval", "1m\n"], "not a Prometheus duration"),
        (["--evaluation-interval", "9" * 30 + "y"], "at most 292y"),
        (["--evaluation-interval", "1" * 100 + "s"], "not a Prometheus duration"),
        (["--window-scale", "nan"], "window scale (--window-scale) must be a finite number"),
        (["--window-scale", "inf"], "must be a finite number > 0"),
        (["--window-scale", "0"], "must be a finite number > 0"),
        (["--window-scale", "1e-300"], "longer than a Prometheus duration can be"),
        (["--window-scale", "1e300"], "at least 1ms"),
    ],
)
def test_bad_generator_options_are_refused(tmp_path: Path, args: list[str], says: str) -> None:
    p = write(tmp_path, GOOD)
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["alerts", "build", "--slo", str(p), "--out", str(out), *args])
    assert res.exit_code == 2, res.output
    assert says in res.output and len(res.output.strip().splitlines()) == 1
    assert not out.exists()


def test_prom_duration_refuses_what_prometheus_cannot_hold() -> None:
    for seconds in (float("inf"), float("nan"), 1e300):
        with pytest.raises(BadInput):
            prom_duration(seconds)


def test_selector_escapes_like_a_promql_string() -> None:
    assert selector({"class": '=a"b\\c\nd\te\x01'}) == '{class="a\\"b\\\\c\\nd\\te\\x01"}'
    # "=" makes a value that starts with an operator literal
    assert selector({"class": "==~.*"}) == '{class="=~.*"}'
    assert selector({"class": "=~.*"}) == '{class=~".*"}'


@pytest.fixture(scope="module")
def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool not installed")
    return path


def test_rules_for_class_names_with_any_characters_pass_promtool(
    tmp_path: Path, promtool: str
) -> None:
    """Names the loader refuses, built in code: the generators still quote them right."""
    spec = load_spec(write(tmp_path, GOOD))
    names = ['a"b', "c\\d", "e\nf", "g\x1bh", "=~.*", "!=x"]
    spec = replace(spec, classes=tuple(SloClass(n, 0.99, ttft_ms=1000.0) for n in names))
    opts = AlertOptions(evaluation_interval="1m30s")
    out = write(tmp_path, dump_yaml(slo_rule_file(spec, opts), "test"), "rules.yaml")
    res = subprocess.run(
        [promtool, "check", "rules", str(out)], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stdout + res.stderr


def test_junit_with_control_characters_in_names_parses() -> None:
    result = GateResult(
        "s\x01<&>",
        cast(Any, None),  # the JUnit writer reads no report
        [
            Check("c\x1b[31mred", "attainment >= 0.9", False, "66% \x00 \ud800 \ufffe"),
            Check("c\x1b", "burn_rate <= 1", True, "ok \x07"),
            Check("c\x02", "min_requests", None, "none \x0b"),
        ],
    )
    root = ET.fromstring(junit_xml(result))
    cases = list(root.iter("testcase"))
    assert cases[0].get("classname") == "slo.s\ufffd<&>.c\ufffd[31mred"
    failure = cases[0].find("failure")
    assert failure is not None and failure.get("message") == "66% \ufffd \ufffd \ufffd"
