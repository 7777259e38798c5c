"""Workload files: YAML classes and JSONL prompts, parsed strictly, sampled reproducibly."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest

from slokit.errors import BadInput
from slokit.lab.workload import load_workload, parse_prompts_jsonl, parse_workload_yaml

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "workloads"


def _yaml(classes: str) -> str:
    return "classes:\n" + classes


def test_the_example_workload_parses_into_its_three_classes() -> None:
    w = load_workload(EXAMPLES / "chat_mix.yaml")
    assert [c.name for c in w.classes] == ["chat", "agent", "batch"]
    chat = w.classes[0]
    assert chat.slo_class == "interactive"
    assert chat.shared_prefix is not None and chat.shared_prefix.count == 4
    assert w.classes[1].task_size == 3
    assert w.classes[1].output.dist == "fixed" and w.classes[1].output.value == 64


def test_the_example_prompt_file_parses() -> None:
    w = load_workload(EXAMPLES / "prompts.jsonl")
    assert len(w.prompts) == 3
    assert w.prompts[2].ignore_eos is True
    assert w.prompts[1].tenant == "poets"


def test_classes_are_drawn_by_weight() -> None:
    w = parse_workload_yaml(
        _yaml(
            "  - {name: a, weight: 3, input: 4, output: 2}\n"
            "  - {name: b, weight: 1, input: 4, output: 2}\n"
        )
    )
    s = w.sampler(random.Random(0), "r")
    counts = Counter(s.next().slo_class for _ in range(4000))
    assert counts["a"] / 4000 == pytest.approx(0.75, abs=0.03)


def test_fixed_lengths_give_exact_prompt_words_and_max_tokens_with_ignore_eos() -> None:
    w = parse_workload_yaml(_yaml("  - {name: a, input: {dist: fixed, value: 50}, output: 7}\n"))
    spec = w.sampler(random.Random(0), "r").next()
    assert len(spec.prompt.split()) == 50
    assert spec.max_tokens == 7
    assert spec.ignore_eos is True


def test_uniform_and_lognormal_lengths_stay_within_their_bounds() -> None:
    w = parse_workload_yaml(
        _yaml(
            "  - name: a\n"
            "    input: {dist: lognormal, median: 100, sigma: 1.5, min: 10, max: 300}\n"
            "    output: {dist: uniform, min: 5, max: 9}\n"
        )
    )
    s = w.sampler(random.Random(0), "r")
    specs = [s.next() for _ in range(500)]
    assert {sp.max_tokens for sp in specs} == {5, 6, 7, 8, 9}
    lengths = [sp.input_words for sp in specs]
    assert min(lengths) == 10 and max(lengths) == 300
    assert sorted(lengths)[250] == pytest.approx(100, rel=0.25)


def test_shared_prefix_starts_the_given_fraction_of_prompts_with_one_of_count_prefixes() -> None:
    w = parse_workload_yaml(
        _yaml(
            "  - name: a\n"
            "    input: 64\n"
            "    output: 4\n"
            "    shared_prefix: {fraction: 0.5, length: 32, count: 3}\n"
        )
    )
    s = w.sampler(random.Random(0), "r")
    prompts = [s.next().prompt.split() for _ in range(2000)]
    prefixed = [p for p in prompts if p[0].startswith("[a-")]
    assert len(prefixed) / 2000 == pytest.approx(0.5, abs=0.04)
    assert len({" ".join(p[:32]) for p in prefixed}) == 3
    assert all(len(p) == 64 for p in prompts)


def test_prefixes_do_not_depend_on_the_seed_so_a_warm_cache_stays_warm() -> None:
    text = _yaml(
        "  - {name: a, input: 40, output: 4, shared_prefix: {fraction: 1, length: 20, count: 1}}\n"
    )
    a = parse_workload_yaml(text).sampler(random.Random(1), "r").next().prompt.split()[:20]
    b = parse_workload_yaml(text).sampler(random.Random(2), "r").next().prompt.split()[:20]
    assert a == b


def test_task_size_groups_consecutive_requests_of_a_class_under_one_task_id() -> None:
    w = parse_workload_yaml(_yaml("  - {name: a, input: 4, output: 2, task_size: 3}\n"))
    s = w.sampler(random.Random(0), "run7")
    ids = [s.next().task_id for _ in range(7)]
    assert ids == ["run7-t1"] * 3 + ["run7-t2"] * 3 + ["run7-t3"]


def test_a_class_without_task_size_has_no_task_id() -> None:
    w = parse_workload_yaml(_yaml("  - {name: a, input: 4, output: 2}\n"))
    assert w.sampler(random.Random(0), "r").next().task_id is None


def test_the_same_seed_draws_the_same_prompts() -> None:
    w = load_workload(EXAMPLES / "chat_mix.yaml")
    sa, sb = w.sampler(random.Random(5), "r"), w.sampler(random.Random(5), "r")
    assert [sa.next() for _ in range(20)] == [sb.next() for _ in range(20)]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("classes: []\n", "non-empty list"),
        ("- a\n", "mapping with 'classes'"),
        ("classes: [\n", "not valid YAML"),
        ("workload: v2\nclasses: [{name: a, input: 1, output: 1}]\n", "unsupported workload"),
        (_yaml("  - {input: 1, output: 1}\n"), "'name' is required"),
        (_yaml("  - {name: a, output: 1}\n"), "'input' length distribution is required"),
        (_yaml("  - {name: a, input: 1, output: 1, colour: red}\n"), "unknown key.*colour"),
        (_yaml("  - {name: a, input: {dist: gamma}, output: 1}\n"), "one of fixed, uniform"),
        (_yaml("  - {name: a, input: {dist: uniform, min: 9, max: 3}, output: 1}\n"), "below min"),
        (_yaml("  - {name: a, input: 0, output: 1}\n"), r"classes\[0\] \(a\)\.input\.value"),
        (_yaml("  - {name: a, input: 1, output: 1, weight: -1}\n"), "weight"),
        (_yaml("  - {name: a, input: 1, output: 1, task_size: 0}\n"), "task_size"),
        (
            _yaml("  - {name: a, input: 1, output: 1, shared_prefix: {fraction: 2, length: 3}}\n"),
            "fraction",
        ),
        (
            _yaml("  - {name: a, input: 1, output: 1}\n  - {name: a, input: 1, output: 1}\n"),
            "duplicate class names: a",
        ),
    ],
)
def test_a_malformed_workload_is_bad_input_that_says_where(text: str, message: str) -> None:
    with pytest.raises(BadInput, match=message):
        parse_workload_yaml(text, source="w.yaml")


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", r"p.jsonl:2: not valid JSON"),
        ('{"max_tokens": 3}', r"p.jsonl:2: 'prompt'"),
        ('{"prompt": "hi"}', r"p.jsonl:2: max_tokens"),
        ('{"prompt": "hi", "max_tokens": 3, "extra": 1}', "unknown key"),
        ('{"prompt": "hi", "max_tokens": 3, "slo_class": 5}', "'slo_class' must be a string"),
    ],
)
def test_a_malformed_prompt_line_is_bad_input_with_its_line_number(line: str, message: str) -> None:
    text = '{"prompt": "ok", "max_tokens": 1}\n' + line + "\n"
    with pytest.raises(BadInput, match=message):
        parse_prompts_jsonl(text, source="p.jsonl")


def test_an_empty_prompt_file_is_bad_input() -> None:
    with pytest.raises(BadInput, match="no prompts"):
        parse_prompts_jsonl("\n\n", source="p.jsonl")


def test_a_missing_workload_file_is_bad_input(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="cannot read workload"):
        load_workload(tmp_path / "nope.yaml")
