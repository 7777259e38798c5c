"""The diagnose document, its window, persistence, and the ``slokit diagnose`` command."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import jsonschema
import pytest
from click.testing import CliRunner
from diag_synth import END, INCIDENT, T0, Run, after, engine, gpu, requests

from slokit.analysis.diagnose import run_diagnosis, store_findings
from slokit.analysis.explain import explain_request
from slokit.analysis.rules import RULE_IDS, all_rules
from slokit.cli import main
from slokit.client import SidecarClient
from slokit.errors import BadInput, NotFound
from slokit.store.db import Store, open_store
from slokit.timeutil import iso, parse_time

REPO = Path(__file__).resolve().parents[2]


def queue_incident(store: Store) -> None:
    store.append_fragments(requests(queue_s=after(INCIDENT, 0.02, 1.5)))
    store.append_engine_samples(engine(waiting=after(INCIDENT, 0, 37)))
    store.append_gpu_samples(gpu())


def test_every_rule_id_is_registered_once_with_a_runbook() -> None:
    assert [r.id for r in all_rules()] == list(RULE_IDS)
    for rule_id in RULE_IDS:
        text = (REPO / "runbooks" / f"{rule_id}.md").read_text()
        assert text.startswith(f"# {rule_id}")


def test_document_has_the_contract_keys(store: Store, run: Run) -> None:
    queue_incident(store)
    doc = run()
    assert set(doc) == {"window", "root_causes", "findings", "coverage"}
    f = doc["findings"][0]
    assert set(f) == {
        "rule",
        "severity",
        "confidence",
        "replica",
        "start",
        "end",
        "summary",
        "evidence",
        "runbook",
        "id",
        "caused_by",
        "explains",
        "impact",
    }
    assert doc["root_causes"] == [f["id"]] == ["queue_saturation@pod-a"]
    assert json.loads(json.dumps(doc)) == doc  # plain JSON all the way down


def test_no_window_means_all_the_data_not_wall_clock(store: Store, run: Run) -> None:
    queue_incident(store)
    w = run()["window"]
    assert w["since"] == "2026-11-29T13:13:20.000Z"  # T0
    assert w["baseline"]["from"] == "window start"


def test_a_window_with_history_before_it_uses_that_history_as_baseline(
    store: Store, run: Run
) -> None:
    queue_incident(store)
    doc = run(since=INCIDENT - 60, until=END)
    assert doc["window"]["baseline"] == {
        "since": "2026-11-29T13:13:20.000Z",
        "until": "2026-11-29T13:17:20.000Z",
        "from": "history",
    }
    assert {f["rule"] for f in doc["findings"]} == {"queue_saturation"}


def test_empty_store_is_not_found(store: Store, run: Run) -> None:
    with pytest.raises(NotFound):
        run()


def test_window_without_data_is_not_found(store: Store, run: Run) -> None:
    queue_incident(store)
    with pytest.raises(NotFound):
        run(since=END + 3600, until=END + 7200)


def test_inverted_window_is_bad_input(store: Store, run: Run) -> None:
    queue_incident(store)
    with pytest.raises(BadInput):
        run(since=END, until=T0)


def test_stored_findings_reach_explain_and_rerun_does_not_duplicate(store: Store) -> None:
    queue_incident(store)
    for _ in range(2):
        result = run_diagnosis(store.reader())
        store_findings(store, result.findings, window=(result.since, result.until))
    count = store.con.execute("SELECT count(*) FROM findings").fetchone()
    assert count is not None and count[0] == len(result.findings) == 1
    late = next(
        f
        for f in requests(queue_s=after(INCIDENT, 0.02, 1.5))
        if f.arrival_ts and f.arrival_ts > INCIDENT + 60
    )
    doc = explain_request(store.reader(), late.request_id)
    assert [f["rule"] for f in doc["findings"]] == ["queue_saturation"]
    assert doc["runbook"] == "runbooks/queue_saturation.md"


def test_a_sliding_window_keeps_one_finding_for_an_ongoing_incident(store: Store) -> None:
    """Diagnoses of windows that start later and later (the sidecar's ticks, a `--save` of
    another window): the later ones no longer hold the incident's start. Explain of a request
    inside it names the incident once."""
    queue_incident(store)
    starts = []
    for since in (INCIDENT - 120, INCIDENT + 5, INCIDENT + 15):
        result = run_diagnosis(store.reader(), since=since)
        assert [f.rule for f in result.findings] == ["queue_saturation"]
        starts.append(result.findings[0].start_ts)
        store_findings(store, result.findings, window=(result.since, result.until))
    assert starts[-1] > starts[0]  # the last run saw the incident from its window's start
    rows = store.con.execute("SELECT epoch(start_ts) FROM findings").fetchall()
    assert rows == [(pytest.approx(starts[0]),)]  # one finding, from when it began
    late = next(
        f
        for f in requests(queue_s=after(INCIDENT, 0.02, 1.5))
        if f.arrival_ts and f.arrival_ts > INCIDENT + 180
    )
    doc = explain_request(store.reader(), late.request_id)
    assert [f["rule"] for f in doc["findings"]] == ["queue_saturation"]


def test_data_of_a_single_instant_is_nothing_to_diagnose_not_bad_input(store: Store) -> None:
    """One scrape saved to a file and ingested: no window was asked for, so it is exit 3."""
    store.append_engine_samples(engine(start=T0, end=T0 + 1, every_s=5))
    with pytest.raises(NotFound, match="single instant"):
        run_diagnosis(store.reader())


@pytest.fixture
def db_file(tmp_path: Path) -> str:
    path = str(tmp_path / "s.duckdb")
    with open_store(path) as s:
        queue_incident(s)
    return path


def test_cli_json_reports_the_finding(db_file: str) -> None:
    res = CliRunner().invoke(main, ["diagnose", "--json", "--db", db_file])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["findings"][0]["rule"] == "queue_saturation"


def test_cli_text_has_one_line_per_finding_then_coverage(db_file: str) -> None:
    res = CliRunner().invoke(main, ["diagnose", "--db", db_file])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[0].startswith("Root cause: queue_saturation on pod-a: TTFT p95")
    line = next(ln for ln in lines[1:] if "queue_saturation" in ln)
    assert line.startswith("CRITICAL") and "pod-a" in line
    assert line.endswith("runbooks/queue_saturation.md")
    assert "coverage:" in res.output


def test_cli_relative_since_counts_back_from_the_newest_data(db_file: str) -> None:
    res = CliRunner().invoke(main, ["diagnose", "--json", "--db", db_file, "--since", "2m"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["window"]["baseline"]["from"] == "history"


def test_cli_window_without_data_exits_3(db_file: str) -> None:
    res = CliRunner().invoke(
        main,
        [
            "diagnose",
            "--db",
            db_file,
            "--since",
            "2030-01-01T00:00:00Z",
            "--until",
            "2030-01-02T00:00:00Z",
        ],
    )
    assert res.exit_code == 3


def test_a_window_reaching_before_the_data_is_the_data_as_cli_and_api_see_it(
    db_file: str,
) -> None:
    # 1970 to 2100 holds only the data: the window is kept to it (not 130 years of buckets)
    res = CliRunner().invoke(
        main, ["diagnose", "--json", "--db", db_file, "--since", "0", "--until", "4102444800"]
    )
    assert res.exit_code == 0, res.output
    whole = CliRunner().invoke(main, ["diagnose", "--json", "--db", db_file])
    assert json.loads(res.output)["window"] == json.loads(whole.output)["window"]


def test_cli_bad_time_exits_2(db_file: str) -> None:
    res = CliRunner().invoke(main, ["diagnose", "--db", db_file, "--since", "yesterday"])
    assert res.exit_code == 2 and "not a time" in res.output


def test_a_baseline_holding_a_stored_finding_says_so(db_file: str) -> None:
    """Twenty seconds into the incident the hour before is no longer quiet enough: nothing
    stands out, and the document names the incident found earlier that its baseline holds."""
    CliRunner().invoke(main, ["diagnose", "--save", "--db", db_file])
    res = CliRunner().invoke(
        main, ["diagnose", "--json", "--since", str(INCIDENT + 20), "--db", db_file]
    )
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["findings"] == []
    assert doc["coverage"]["baseline_findings"] == [
        {
            "rule": "queue_saturation",
            "replica": "pod-a",
            "since": iso(INCIDENT),
            "until": iso(INCIDENT + 300),
        }
    ]
    schema = json.loads((REPO / "docs/schema/diagnose.schema.json").read_text())
    jsonschema.validators.validator_for(schema)(schema).validate(doc)
    text = CliRunner().invoke(main, ["diagnose", "--since", str(INCIDENT + 20), "--db", db_file])
    assert "the baseline holds findings stored earlier" in text.output
    assert f"queue_saturation on pod-a {iso(INCIDENT)} .. " in text.output


def test_a_baseline_without_stored_findings_names_none(db_file: str) -> None:
    res = CliRunner().invoke(
        main, ["diagnose", "--json", "--since", str(INCIDENT + 20), "--db", db_file]
    )
    assert "baseline_findings" not in json.loads(res.output)["coverage"]


def test_cli_save_stores_the_findings(db_file: str) -> None:
    res = CliRunner().invoke(main, ["diagnose", "--db", db_file, "--save"])
    assert res.exit_code == 0, res.output
    with open_store(db_file, read_only=True) as s:
        row = s.con.execute("SELECT rule FROM findings").fetchall()
    assert row == [("queue_saturation",)]


def test_sidecar_client_passes_the_window_through() -> None:
    seen: dict[str, str] = {}

    def handler(request: httpx.Request) -> httpx.Response:
        seen.update(request.url.params)
        return httpx.Response(200, json={"window": {}, "findings": [], "coverage": {}})

    client = SidecarClient("http://sidecar", transport=httpx.MockTransport(handler))
    assert client.diagnose("15m", None)["findings"] == []
    assert seen == {"since": "15m"}


def test_cli_baseline_sets_how_much_history_is_the_baseline(db_file: str) -> None:
    res = CliRunner().invoke(
        main, ["diagnose", "--json", "--db", db_file, "--since", "2m", "--baseline", "1m"]
    )
    assert res.exit_code == 0, res.output
    base = json.loads(res.output)["window"]["baseline"]
    assert base["from"] == "history"
    assert parse_time(base["until"]) - parse_time(base["since"]) == pytest.approx(60)


def test_every_finding_is_plain_json_with_many_rules_firing(store: Store, run: Run) -> None:
    store.append_fragments(
        requests(queue_s=after(INCIDENT, 0.02, 1.5), error_every=after(INCIDENT, 0, 3))
    )
    store.append_engine_samples(
        engine(
            kv=after(INCIDENT, 0.4, 0.99),
            preemptions_per_s=after(INCIDENT, 0, 0.5),
            waiting=after(INCIDENT, 0, 30),
            prefix_hit_ratio=after(INCIDENT, 0.8, 0.1),
            spec_drafts_per_s=50,
            spec_accepted_per_draft=after(INCIDENT, 2.4, 0.2),
            reset_at=INCIDENT + 100,
        )
    )
    store.append_gpu_samples(gpu(clock=after(INCIDENT, 1980, 900), xid=after(INCIDENT, 0, 48)))
    doc = run()
    fired = {f["rule"] for f in doc["findings"]}
    assert {
        "queue_saturation",
        "kv_pressure",
        "prefix_affinity_loss",
        "gpu_throttle",
        "gpu_xid",
        "error_burst",
        "spec_decode_low_acceptance",
        "telemetry_gap",
    } <= fired
    assert json.loads(json.dumps(doc, allow_nan=False)) == doc
