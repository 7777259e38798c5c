"""The lake: every pod's exported minutes read as one store (slokit.store.lake).

A fleet scenario (a scale-out behind a cache-unaware router, three replicas) runs on the
simulator in virtual time; each replica's data goes into its own store (its sidecar's), each
store is exported into one lake directory, and diagnose, explain and slo report over the lake
must answer exactly as over one store holding everything."""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pytest

import slokit
from slokit.analysis.diagnose import store_findings
from slokit.errors import NotFound
from slokit.records import EngineSample, RequestFragment
from slokit.store.db import Store, open_store
from slokit.store.lake import LakeFile, LakeReader, open_lake, store_columns
from slokit.store.lake_export import TABLES, ParquetExporter

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "diagnose"))  # the scenario harness lives there
from scenario_harness import (  # noqa: E402
    SCENARIO_DIR,
    Collected,
    Scenario,
    load_scenario,
    run_scenario_virtual,
)

SLO = REPO / "examples" / "slo" / "chat.yaml"
LAKE_DOC = REPO / "docs" / "lake.md"
README = REPO / "README.md"


def _same(a: object, b: object, path: str = "") -> None:
    """``a == b``, floats up to their last digits: DuckDB sums in parallel, so a float sum's
    order (and its last bit) varies from run to run, over one store as over the lake."""
    if isinstance(a, dict) and isinstance(b, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            _same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list | tuple) and isinstance(b, list | tuple):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and isinstance(b, float):
        assert math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12) or a == b or (a != a and b != b), (
            path
        )
    else:
        assert a == b, path


@dataclass
class Fleet:
    scenario: Scenario
    collected: Collected
    merged: Store
    lake: Path
    pods: dict[str, Store]


def _split(c: Collected) -> dict[str | None, Collected]:
    """Each replica's share: what its own sidecar would hold (a request's client record
    goes with its engine span)."""
    owner = {f.request_id: f.replica for f in c.fragments if f.replica is not None}
    out: dict[str | None, Collected] = {}

    def pod(replica: str | None) -> Collected:
        return out.setdefault(replica, Collected(started_at=c.started_at))

    for f in c.fragments:
        pod(owner.get(f.request_id, f.replica)).fragments.append(f)
    for e in c.engine:
        pod(e.replica).engine.append(e)
    for g in c.gpu:
        pod(g.replica).gpu.append(g)
    for s in c.scrapes:
        pod(s.replica).scrapes.append(s)
    return out


def _diagnose_args(sc: Scenario, c: Collected) -> dict[str, float]:
    """From the scale-out on, the minute before it as the baseline (the scenario's own)."""
    return {"since": c.started_at + sc.diagnose["since_s"], "baseline": sc.diagnose["baseline_s"]}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    sc = load_scenario(SCENARIO_DIR / "prefix_affinity_loss.yaml")
    collected = run_scenario_virtual(sc)
    lake = tmp_path_factory.mktemp("lake")
    merged = open_store(":memory:")
    collected.store_into(merged)
    # The findings explain shows: stored by each pod's sidecar for its replica; the fleet's
    # (no replica) by the first pod.
    diag = slokit.diagnose(merged, **_diagnose_args(sc, collected))
    window = (diag.since, diag.until)
    store_findings(merged, diag.findings, window=window)
    shares = _split(collected)
    assert None not in shares and len(shares) == 3
    pods: dict[str, Store] = {}
    first = sorted(k for k in shares if k is not None)[0]
    for replica, share in shares.items():
        assert replica is not None
        store = pods[replica] = open_store(":memory:")
        share.store_into(store)
        mine = [
            f
            for f in diag.findings
            if f.replica == replica or (f.replica is None and replica == first)
        ]
        store_findings(store, mine, window=window)
        end = collected.started_at + sc.duration_s + 3600  # every minute long closed
        exporter = ParquetExporter(str(lake), writer=f"sidecar-{replica}", clock=lambda e=end: e)
        assert exporter.export_closed_minutes(store.con)
    yield Fleet(sc, collected, merged, lake, pods)
    merged.close()
    for s in pods.values():
        s.close()


def test_the_lake_has_every_pods_files_in_minute_partitions(fleet: Fleet) -> None:
    files = sorted(p.relative_to(fleet.lake).as_posix() for p in fleet.lake.rglob("*.parquet"))
    assert {f.split("/")[0] for f in files} == {t.name for t in TABLES}
    pattern = re.compile(
        r"^[a-z_]+/date=\d{4}-\d{2}-\d{2}/hour=\d{2}/minute=\d{2}/replica=[^/]+/"
        r"part_sidecar-sim-vllm-\d\.parquet$"
    )
    assert all(pattern.match(f) for f in files), files[:5]
    engine = [f for f in files if f.startswith("engine_samples/")]
    assert {f.split("/")[4] for f in engine} == {f"replica=sim-vllm-{i}" for i in range(3)}
    assert any(
        "replica=__HIVE_DEFAULT_PARTITION__" in f for f in files if f.startswith("findings/")
    )


def test_diagnose_from_the_lake_is_the_merged_stores(fleet: Fleet) -> None:
    args = _diagnose_args(fleet.scenario, fleet.collected)
    local = slokit.diagnose(fleet.merged, **args).to_dict()
    with open_lake(fleet.lake) as lake:
        assert lake.bounds() == fleet.merged.reader().bounds()
        remote = slokit.diagnose(lake, **args).to_dict()
    _same(remote, local)
    assert "prefix_affinity_loss" in {f["rule"] for f in remote["findings"]}  # a fleet rule


def test_diagnose_of_a_relative_window_too(fleet: Fleet) -> None:
    with open_lake(fleet.lake) as lake:
        remote = slokit.diagnose(lake, since="90s", baseline="60s").to_dict()
    _same(remote, slokit.diagnose(fleet.merged, since="90s", baseline="60s").to_dict())


def test_explain_from_the_lake_is_the_merged_stores(fleet: Fleet) -> None:
    reader = fleet.merged.reader()
    ids = [reader.slowest_request()]
    for replica in sorted(fleet.pods):  # one request of each pod, late in the run
        recs = [r for r in reader.requests(None, None) if r["replica"] == replica]
        ids.append(recs[-5]["request_id"])
    with open_lake(fleet.lake) as lake:
        assert lake.slowest_request() == ids[0]
        for rid in ids:
            assert rid is not None
            local = slokit.explain(fleet.merged, rid, slo=SLO).to_dict()
            remote = slokit.explain(lake, rid, slo=SLO).to_dict()
            _same(remote, local, rid)
    assert any(slokit.explain(fleet.merged, rid).to_dict()["findings"] for rid in ids[1:])


def test_slo_report_from_the_lake_is_the_merged_stores(fleet: Fleet) -> None:
    local = slokit.slo_report(fleet.merged, SLO).to_dict()
    with open_lake(fleet.lake) as lake:
        _same(slokit.slo_report(lake, SLO).to_dict(), local)
        since = fleet.collected.started_at + 60
        _same(
            slokit.slo_report(lake, SLO, since=since).to_dict(),
            slokit.slo_report(fleet.merged, SLO, since=since).to_dict(),
        )


def test_every_table_reads_back_as_the_store_has_it(fleet: Fleet) -> None:
    with open_lake(fleet.lake) as lake:
        for t in TABLES:
            lake._scope(t.name, None, None)
            cols = [c for c, _ in store_columns()[t.name]]
            order = ", ".join(f'"{c}"' for c in cols[:4])
            sql = f"SELECT * FROM {t.name} ORDER BY {t.time_column}, replica, {order}"
            got = lake.con.execute(sql).fetchall()
            want = fleet.merged.con.execute(
                sql.replace("SELECT *", f"SELECT {', '.join(cols)}")
            ).fetchall()
            if t.stamp_column:  # when each store wrote the row
                i = cols.index(t.stamp_column)
                got = [r[:i] + r[i + 1 :] for r in got]
                want = [r[:i] + r[i + 1 :] for r in want]
            assert got == want, t.name
            types = lake.con.execute(f"DESCRIBE {t.name}").fetchall()
            assert [(r[0], r[1]) for r in types] == store_columns()[t.name]


# -- pruning --------------------------------------------------------------------------------


def _hours_store(hours: int, t0: float) -> Store:
    """Engine samples every 10 s and a request a minute, for ``hours`` hours."""
    store = open_store(":memory:")
    n = hours * 360
    store.append_engine_samples(
        [
            EngineSample(ts=t0 + 10 * i, replica="pod-a", model="m", running=1.0, waiting=0.0)
            for i in range(n)
        ]
    )
    store.append_fragments(
        [
            RequestFragment(
                fragment_id=f"f{i}", request_id=f"r{i}", source="vllm", replica="pod-a", model="m",
                arrival_ts=t0 + 60 * i + 1, first_token_ts=t0 + 60 * i + 1.5,
                finish_ts=t0 + 60 * i + 3, ttft_s=0.5, e2e_s=2.0, status="ok",
            )
            for i in range(hours * 60)
        ]
    )  # fmt: skip
    return store


def _export_all(out: Path, store: Store, now: float) -> None:
    """Tick until done (a tick writes at most an hour of minutes per table)."""
    exporter = ParquetExporter(str(out), writer="w", clock=lambda: now)
    while exporter.export_closed_minutes(store.con):
        pass


def _files_read(con: duckdb.DuckDBPyConnection, sql: str) -> int:
    plan = con.execute(f"EXPLAIN ANALYZE {sql}").fetchall()[0][1]
    return sum(int(n) for n in re.findall(r"Total Files Read:?\s*\"?(\d+)", plan))


def test_a_window_of_one_hour_reads_only_that_hours_files(tmp_path: Path) -> None:
    t0 = 1_700_002_800.0  # 23:00 UTC
    with _hours_store(3, t0) as store:
        _export_all(tmp_path, store, t0 + 4 * 3600)
    with open_lake(tmp_path) as lake:
        every = len(lake.files["requests"])
        assert every == 180 and len(lake.files["engine_samples"]) == 180
        hour = (t0 + 3600, t0 + 7200)
        summary = lake.request_summary(None, *hour)
        assert summary["n"] == 60
        scoped = lake.scoped["requests"]
        assert len(scoped) == 60 and all("date=2023-11-15/hour=00/" in p for p in scoped)
        assert _files_read(lake.con, "SELECT count(*) FROM requests") == 60
        series = lake.engine_series(hour[0], hour[1] - 10)  # [since, until]: both ends
        assert len(series["pod-a"]) == 360
        assert _files_read(lake.con, "SELECT count(*) FROM engine_samples") == 60
        lake.request("r1")  # no window: every file
        assert _files_read(lake.con, "SELECT count(*) FROM requests") == every


def test_lake_files_know_their_minutes() -> None:
    f = LakeFile.parse(
        "s3://b/l/requests/date=2024-01-02/hour=03/minute=04/replica=a/part_w.parquet"
    )
    assert (f.start, f.end - f.start) == (1704164640.0, 60.0)
    assert (
        LakeFile.parse("/l/requests/date=2024-01-02/hour=03/x.parquet").end - 1704164400.0 == 3600
    )
    assert LakeFile.parse("/l/requests/x.parquet").start == float("-inf")


# -- missing and partial lakes --------------------------------------------------------------


def test_a_missing_or_empty_lake_is_not_found(tmp_path: Path) -> None:
    with pytest.raises(NotFound, match="no lake at"), open_lake(tmp_path / "nope"):
        pass
    (tmp_path / "requests").mkdir()
    with pytest.raises(NotFound, match="no Parquet files"), open_lake(tmp_path):
        pass


def test_a_table_without_files_is_an_empty_view_with_the_stores_columns(tmp_path: Path) -> None:
    t0 = 1_700_002_800.0
    with _hours_store(1, t0) as store:
        store.con.execute("DELETE FROM engine_samples")
        _export_all(tmp_path, store, t0 + 7200)
    assert not (tmp_path / "engine_samples").exists()
    with open_lake(tmp_path) as lake:
        assert isinstance(lake, LakeReader)
        for t in ("engine_samples", "gpu_samples", "findings", "scrapes"):
            described = lake.con.execute(f"DESCRIBE {t}").fetchall()
            assert [(r[0], r[1]) for r in described] == store_columns()[t]
        assert lake.engine_series(None, None) == {}
        assert lake.bounds() == (t0 + 1, t0 + 59 * 60 + 3)


# -- docs -----------------------------------------------------------------------------------


def _doc_schema() -> dict[str, list[tuple[str, str]]]:
    """``docs/lake.md``'s tables: ``### <table>`` then rows ``| `column` | TYPE | meaning |``."""
    out: dict[str, list[tuple[str, str]]] = {}
    table = None
    for line in LAKE_DOC.read_text(encoding="utf-8").splitlines():
        if m := re.match(r"^### `(\w+)`", line):
            table = m.group(1)
            out[table] = []
        elif table and (m := re.match(r"^\| `(\w+)` \| `([^`]+)` \|", line)):
            out[table].append((m.group(1), m.group(2)))
    return out


def test_the_lake_doc_lists_every_column_of_the_store_schema() -> None:
    assert _doc_schema() == store_columns()


def _readme_query() -> str:
    text = README.read_text(encoding="utf-8")
    fleet = text[text.index("## Fleet") :]
    m = re.search(r"```sql\n(.*?)```", fleet, re.S)
    assert m, "README's Fleet section has a SQL example"
    return m.group(1)


def test_the_readme_query_runs_on_a_lake(fleet: Fleet) -> None:
    sql = _readme_query().replace("lake/", f"{fleet.lake.as_posix()}/")
    cur = duckdb.connect().execute(sql)
    rows = cur.fetchall()
    assert {r[0] for r in rows} == set(fleet.pods)
    by_pod = fleet.merged.con.execute(
        "SELECT replica, count(*) FROM requests WHERE replica IS NOT NULL GROUP BY ALL"
    ).fetchall()
    names = [d[0] for d in cur.description or []]
    assert dict((r[0], r[names.index("requests")]) for r in rows) == dict(by_pod)


def test_the_cli_reads_the_lake(fleet: Fleet, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from slokit.cli import main

    since = str(_diagnose_args(fleet.scenario, fleet.collected)["since"])
    res = CliRunner().invoke(
        main, ["diagnose", "--lake", str(fleet.lake), "--since", since, "--baseline", "60s"]
    )
    assert res.exit_code == 0, res.output
    assert "prefix_affinity_loss" in res.output
    res = CliRunner().invoke(main, ["diagnose", "--lake", str(tmp_path / "none")])
    assert res.exit_code == 3 and "no lake at" in res.output
