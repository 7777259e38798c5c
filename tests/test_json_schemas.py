"""The public contract in docs/schema/ holds for real output.

The real vLLM captures (tests/fixtures/) go into a DuckDB file through the CLI, with engine
samples just before and after the requests, and ``diagnose --save`` stores its findings;
then ``explain --json`` and ``diagnose --json`` must validate against their JSON Schemas,
and the schemas must reject documents that break the contract.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from click.testing import CliRunner
from referencing import Registry, Resource

from slokit.analysis.slo_spec import parse_spec
from slokit.cli import main
from slokit.errors import BadInput

REPO = Path(__file__).resolve().parents[1]
SCHEMAS = REPO / "docs" / "schema"
SCHEMA_NAMES = ("explain", "diagnose", "slo-spec")
EXAMPLE_SLO = REPO / "examples" / "slo" / "chat.yaml"
# The captured requests arrived 2026-11-29T13:18:49.316Z and took at most ~3 s.
BEFORE_LOAD = "2026-11-29T13:18:45Z"
AFTER_LOAD = "2026-11-29T13:19:00Z"

Doc = dict[str, Any]


def _schema(name: str) -> Doc:
    loaded: Doc = json.loads((SCHEMAS / f"{name}.schema.json").read_text())
    return loaded


def _validator(name: str) -> jsonschema.protocols.Validator:
    registry: Registry[Any] = Registry().with_resources(
        (s["$id"], Resource.from_contents(s)) for s in map(_schema, SCHEMA_NAMES)
    )
    schema = _schema(name)
    cls = jsonschema.validators.validator_for(schema)
    return cls(schema, registry=registry, format_checker=cls.FORMAT_CHECKER)


def _errors(name: str, doc: Any) -> list[str]:
    return [f"{list(e.absolute_path)}: {e.message}" for e in _validator(name).iter_errors(doc)]


def _cli(*args: str) -> str:
    res = CliRunner().invoke(main, list(args))
    assert res.exit_code == 0, f"slokit {' '.join(args)} -> {res.exit_code}: {res.output}"
    return res.output


@pytest.fixture(scope="module")
def db(vllm_fixtures: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("schemas") / "slokit.duckdb")
    _cli("ingest", "otlp", str(vllm_fixtures / "otlp"), "--replica", "pod-a", "--db", path)
    for name, ts in (("metrics_idle.prom", BEFORE_LOAD), ("metrics_after_load.prom", AFTER_LOAD)):
        _cli(
            "ingest", "metrics", str(vllm_fixtures / name), "--instance", "pod-a",
            "--ts", ts, "--db", path,
        )  # fmt: skip
    _cli("diagnose", "--save", "--db", path)
    return path


@pytest.fixture(scope="module")
def explain_doc(db: str) -> Doc:
    doc: Doc = json.loads(_cli("explain", "r24", "--json", "--slo", str(EXAMPLE_SLO), "--db", db))
    return doc


@pytest.fixture(scope="module")
def diagnose_doc(db: str) -> Doc:
    doc: Doc = json.loads(_cli("diagnose", "--json", "--db", db))
    return doc


@pytest.mark.parametrize("name", SCHEMA_NAMES)
def test_each_schema_is_a_valid_json_schema(name: str) -> None:
    schema = _schema(name)
    jsonschema.validators.validator_for(schema).check_schema(schema)


def test_explain_json_of_a_real_request_matches_its_schema(explain_doc: Doc) -> None:
    # The optional parts are filled, so their schemas are exercised too.
    assert explain_doc["slo"] is not None and explain_doc["slo"]["class"] == "default"
    assert explain_doc["context"]["replica_state_at_arrival"] is not None
    assert explain_doc["findings"], "diagnose --save stored no finding overlapping r24"
    assert _errors("explain", explain_doc) == []


@pytest.mark.parametrize("request_id", ["r0", "cmpl-r31-0", "r63"])
def test_explain_json_without_an_slo_spec_matches_its_schema(db: str, request_id: str) -> None:
    doc = json.loads(_cli("explain", request_id, "--json", "--db", db))
    assert doc["slo"] is None
    assert _errors("explain", doc) == []


def test_diagnose_json_of_the_real_captures_matches_its_schema(diagnose_doc: Doc) -> None:
    assert diagnose_doc["findings"], "expected at least the telemetry_gap finding (no GPU data)"
    assert _errors("diagnose", diagnose_doc) == []


def _set(path: list[Any], value: Any) -> Callable[[Doc], None]:
    def mutate(doc: Doc) -> None:
        node = doc
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value

    return mutate


def _drop(key: str) -> Callable[[Doc], None]:
    return lambda doc: doc.pop(key)


BROKEN_EXPLAIN = [
    pytest.param(_drop("dominant"), id="missing dominant"),
    pytest.param(_set(["dominant"], "slow"), id="dominant outside its enum"),
    pytest.param(_set(["surprise"], 1), id="undocumented top-level key"),
    pytest.param(_set(["components", "queue_s"], "12 ms"), id="duration as text"),
    pytest.param(_set(["timeline", 0, "ts"], "29/11/2026 13:18"), id="timestamp not ISO 8601"),
    pytest.param(_set(["findings", 0, "severity"], "fatal"), id="unknown severity"),
    pytest.param(_set(["slo", "outcome"], "meh"), id="unknown SLO outcome"),
]


@pytest.mark.parametrize("mutate", BROKEN_EXPLAIN)
def test_the_explain_schema_rejects_a_broken_document(
    explain_doc: Doc, mutate: Callable[[Doc], None]
) -> None:
    doc = copy.deepcopy(explain_doc)
    mutate(doc)
    assert _errors("explain", doc) != []


BROKEN_DIAGNOSE = [
    pytest.param(_drop("coverage"), id="missing coverage"),
    pytest.param(_set(["findings", 0, "rule"], "made_up_rule"), id="rule id not in the contract"),
    pytest.param(_set(["findings", 0, "confidence"], 1.5), id="confidence above 1"),
    pytest.param(_set(["findings", 0, "runbook"], "see the wiki"), id="runbook not a file"),
    pytest.param(_set(["window", "baseline", "from"], "yesterday"), id="unknown baseline origin"),
    pytest.param(_set(["coverage", "rules", "kv_pressure"], {"status": "ran"}), id="ran, no count"),
]


@pytest.mark.parametrize("mutate", BROKEN_DIAGNOSE)
def test_the_diagnose_schema_rejects_a_broken_document(
    diagnose_doc: Doc, mutate: Callable[[Doc], None]
) -> None:
    doc = copy.deepcopy(diagnose_doc)
    mutate(doc)
    assert _errors("diagnose", doc) != []


def test_the_example_slo_spec_matches_its_schema() -> None:
    spec = yaml.safe_load(EXAMPLE_SLO.read_text())
    parse_spec(spec, str(EXAMPLE_SLO))  # slokit accepts it too
    assert _errors("slo-spec", spec) == []


MINIMAL_SPEC = {"slokit": "v1", "service": "chat", "classes": [{"name": "a", "objective": 0.99}]}

BROKEN_SPECS = [
    pytest.param({"slokit": "v2"}, id="another version"),
    pytest.param({"service": ""}, id="empty service"),
    pytest.param({"classes": []}, id="no classes"),
    pytest.param({"classes": [{"name": "a", "objective": 1.5}]}, id="objective above 1"),
    pytest.param({"classes": [{"name": "a", "objective": 0}]}, id="objective zero"),
    pytest.param(
        {"classes": [{"name": "a", "objective": 0.9, "good_when": {"p99_ms": 5}}]},
        id="unknown bound",
    ),
    pytest.param(
        {"classes": [{"name": "a", "objective": 0.9, "good_when": {"ttft_ms": -1}}]},
        id="negative bound",
    ),
    pytest.param(
        {"classes": [{"name": "a", "objective": 0.9, "match": {"prompt": "x"}}]},
        id="match on a field that is not a request field",
    ),
    pytest.param({"classes": [{"name": "a", "objective": 0.9, "slo": 1}]}, id="unknown class key"),
    pytest.param({"period": "a month"}, id="period not a duration"),
    pytest.param({"service": "../../escape"}, id="service not a file name"),
    pytest.param({"service": "s" * 64}, id="service too long"),
    pytest.param({"classes": [{"name": "a\nb", "objective": 0.9}]}, id="class name with newline"),
    pytest.param(
        {"classes": [{"name": "a", "objective": 0.9, "match": {"model": []}}]},
        id="match on an empty list",
    ),
    pytest.param({"cost": {"gpus_per_replica": 0.5}}, id="half a GPU"),
    pytest.param({"cost": {"gpu_hour": 2}}, id="unknown cost key"),
    pytest.param({"quality": {"require_pass": "no"}}, id="require_pass not a boolean"),
    pytest.param({"qualityy": {"require_pass": True}}, id="unknown top-level key"),
]


@pytest.mark.parametrize("change", BROKEN_SPECS)
def test_a_spec_slokit_refuses_is_refused_by_the_schema(change: Doc) -> None:
    spec = {**MINIMAL_SPEC, **change}
    with pytest.raises(BadInput):
        parse_spec(copy.deepcopy(spec), "spec.yaml")
    assert _errors("slo-spec", spec) != []


def test_the_minimal_spec_is_accepted_by_slokit_and_the_schema() -> None:
    parse_spec(copy.deepcopy(MINIMAL_SPEC), "spec.yaml")
    assert _errors("slo-spec", MINIMAL_SPEC) == []
