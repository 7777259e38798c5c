"""``slokit ingest otlp`` stores the fragments of many files in one transaction (a whole DuckDB
row group goes to the file, not the WAL), and a file the store refuses is still reported alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from unittest.mock import patch

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from slokit import ingest
from slokit.errors import BadInput
from slokit.store.db import Store, open_store

FILES = 4


@pytest.fixture
def export_files(vllm_fixtures: Path, tmp_path: Path) -> list[Path]:
    """Real vLLM 0.32 ``llm_request`` spans (64 of them) split over four export files."""
    whole = ExportTraceServiceRequest()
    whole.ParseFromString((vllm_fixtures / "otlp" / "export_06.pb").read_bytes())
    spans = [s for rs in whole.resource_spans for ss in rs.scope_spans for s in ss.spans]
    folder = tmp_path / "otlp"
    folder.mkdir()
    paths = []
    for i in range(FILES):
        part = ExportTraceServiceRequest()
        rs = part.resource_spans.add()
        rs.resource.CopyFrom(whole.resource_spans[0].resource)
        ss = rs.scope_spans.add()
        ss.scope.CopyFrom(whole.resource_spans[0].scope_spans[0].scope)
        ss.spans.extend(spans[i::FILES])
        paths.append(folder / f"export-{i}.pb")
        paths[-1].write_bytes(part.SerializeToString())
    return paths


def _requests(store: Store) -> list[tuple[Any, ...]]:
    cols = [r[0] for r in store.con.execute("DESCRIBE requests").fetchall()]
    cols.remove("updated_at")
    sql = f"SELECT {', '.join(cols)} FROM requests ORDER BY request_id"
    return store.con.execute(sql).fetchall()


def test_the_files_of_one_batch_are_stored_in_one_append(export_files: list[Path]) -> None:
    with open_store(":memory:") as store:
        with patch.object(Store, "append_fragment_table", autospec=True,
                          side_effect=Store.append_fragment_table) as append:  # fmt: skip
            report = ingest.ingest_otlp(store, export_files)
        assert append.call_count == 1
        assert (report.files, report.fragments, report.requests) == (FILES, 64, 64)
        assert store.con.execute("SELECT count(*) FROM requests").fetchall() == [(64,)]


def test_a_full_batch_is_stored_before_the_next_file_is_read(
    export_files: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ingest, "OTLP_BATCH_ROWS", 20)  # 16 spans a file: every second file
    with open_store(":memory:") as store:
        with patch.object(Store, "append_fragment_table", autospec=True,
                          side_effect=Store.append_fragment_table) as append:  # fmt: skip
            ingest.ingest_otlp(store, export_files)
        assert [c.args[1].num_rows for c in append.call_args_list] == [32, 32]


def test_batches_store_what_one_file_at_a_time_stores(
    export_files: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    def clock() -> float:  # both ingest at one time: first_ingested_at is compared too
        return 1_800_000_000.0

    with open_store(":memory:", clock=clock) as batched:
        ingest.ingest_otlp(batched, export_files)
        monkeypatch.setattr(ingest, "OTLP_BATCH_ROWS", 1)
        with open_store(":memory:", clock=clock) as one_by_one:
            ingest.ingest_otlp(one_by_one, export_files)
            assert _requests(batched) == _requests(one_by_one)
            assert len(_requests(batched)) == 64


def test_a_file_the_store_refuses_is_reported_alone_and_its_batch_is_kept(
    export_files: list[Path],
) -> None:
    refused = ingest.decode_traces(export_files[1].read_bytes()).fragments[0].request_id
    real_append = Store.append_fragment_table

    def refuse_one_request(store: Store, table: pa.Table) -> Any:
        if pc.any(pc.equal(table.column("request_id"), refused)).as_py():
            raise BadInput(f"request fragments: a value out of range ({refused})")
        return real_append(store, table)

    with open_store(":memory:") as store:
        with patch.object(Store, "append_fragment_table", autospec=True,
                          side_effect=refuse_one_request):  # fmt: skip
            report = ingest.ingest_otlp(store, export_files)
        assert [path for path, _ in report.bad_files] == [str(export_files[1])]
        assert "a value out of range" in report.bad_files[0][1]
        assert (report.files, report.fragments) == (FILES - 1, 48)
        assert store.con.execute("SELECT count(*) FROM requests").fetchall() == [(48,)]
        reasons = store.con.execute("SELECT reason FROM ingest_rejections").fetchall()
        assert reasons == [("bad file",)]


def test_the_files_read_before_an_unexpected_failure_are_kept(export_files: list[Path]) -> None:
    """A failure that is no bad input (a bug, an interrupt) still ends the command, but the
    fragments of the files read before it were held in memory for one append: they go in."""
    real = ingest.decode_traces
    calls = []

    def third_fails(*args: Any, **kw: Any) -> Any:
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("not bad input: a bug")
        return real(*args, **kw)

    with open_store(":memory:") as store:
        with (
            patch.object(ingest, "decode_traces", side_effect=third_fails),
            pytest.raises(RuntimeError),
        ):
            ingest.ingest_otlp(store, export_files)
        assert store.con.execute("SELECT count(*) FROM requests").fetchall() == [(32,)]
